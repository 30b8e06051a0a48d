"""`snakemake` runs forked from a process that has imported Snakemake once.

Importing Snakemake and collecting its plugins cost each `snakemake` process about 3 s of CPU
before it reads the Snakefile, and the tests start about sixty. A forkserver does both once
(tests/snakemake_warm.py); every run is still a process of its own, forked from it: its own
working directory, environment, standard streams (stdin /dev/null) and exit status, running the
`snakemake` script (or tests/job_plan.py) as `python SCRIPT ARGS` would.
"""

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

CONTEXT = multiprocessing.get_context("forkserver")
# __main__: pytest, once; a module that fails to import is skipped, so snakemake.cli stays
CONTEXT.set_forkserver_preload(["__main__", "snakemake.cli", "snakemake_warm"])


def run_script(cmd: list[str], cwd: str, env: dict, out: str, err: str) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # what an interpreter started with this environment would put first on sys.path
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    stale = [name for name in sys.modules if name.split(".")[0] == "decodelab"]
    for name in stale:  # imported by the forkserver from its own environment's path
        del sys.modules[name]
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    sys.argv = list(cmd)
    runpy.run_path(cmd[0], run_name="__main__")  # SystemExit's code: the exit status


def run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """As `subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)`, for a command
    whose first item is a Python script: the `snakemake` entry point, tests/job_plan.py."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        proc = CONTEXT.Process(target=run_script, args=(cmd, str(cwd), env, out, err))
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(cmd, proc.exitcode, out.read_text(), err.read_text())
