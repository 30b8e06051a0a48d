"""A session fixture's costly build done once for all pytest-xdist workers of a run.

Each worker has its own session, so a session fixture would be built once per worker (the
default DAG twice: 13+ minutes each). The first worker to take the lock builds and writes the
result, JSON, beside the workers' base temp directories; the others wait on the lock and read
it. A build that raised is recorded as such, and fails every worker's tests that use it.
"""

import fcntl
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest


def build_once(name: str, tmp_path_factory: pytest.TempPathFactory, build: Callable[[], object]
               ) -> object:
    """build()'s result (JSON-able), built once per pytest run; without xdist, build()."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build()
    return once(tmp_path_factory.getbasetemp().parent / name, build)


def once(stem: Path, build: Callable[[], object]) -> object:
    """build() run by the first process to take `stem.lock`, its result read by the others from
    `stem.json`; a build that raised is not done: each later caller fails, naming its error."""
    marker = stem.with_suffix(".json")
    with open(stem.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process ends, killed or not
        if marker.exists():
            done = json.loads(marker.read_text())
            if "error" in done:
                pytest.fail(f"{stem.name} failed in another pytest worker:\n{done['error']}",
                            pytrace=False)
            return done["result"]
        try:
            result = build()
        except BaseException as exc:
            write(marker, {"error": "".join(traceback.format_exception_only(exc))})
            raise
        write(marker, {"result": result})
        return result


def write(path: Path, content: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(content))
    partial.replace(path)
