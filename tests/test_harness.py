"""The test harness itself: which tests are marked `latex`, a build shared by the xdist workers,
and the prewarmed `snakemake` processes (tests/conftest.py, tests/once.py, tests/prewarmed.py)."""

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import conftest
import once
import prewarmed
import pytest


def builds_the_paper(stats_dir, tmp_path, build_paper):
    return build_paper(stats_dir, tmp_path)


def only_writes_tables(stats_dir, write_stats):
    return write_stats(stats_dir)


def fixture(func) -> list:
    return [SimpleNamespace(func=func)]


def item(function=None, **fixtures) -> SimpleNamespace:
    return SimpleNamespace(function=function,
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=fixtures))


def test_a_test_that_compiles_the_paper_is_marked_latex_and_no_other():
    assert conftest.compiles_latex(item(builds_the_paper))
    assert not conftest.compiles_latex(item(only_writes_tables))
    # through a fixture of its own
    assert conftest.compiles_latex(item(only_writes_tables, pdf=fixture(builds_the_paper)))


# a pytest worker's build through once(): counts its runs in `builds`, takes SECONDS, then
# returns its result or raises
WORKER = f"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from once import once
stem, seconds, fails = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "fails"
def build():
    with open(stem.parent / "builds", "a") as count:
        count.write("x")
    (stem.parent / "started").touch()
    time.sleep(seconds)
    if fails:
        raise RuntimeError("snakemake failed: disk full")
    return {{"workdir": "/tmp/dag"}}
print(json.dumps(once(stem, build)))
"""


DAG = {"workdir": "/tmp/dag"}


def workers(tmp_path, *runs: tuple[float, str]) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "dag"), str(seconds),
                              fails], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seconds, fails in runs]


def finished(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of each."""
    outputs = [p.communicate(timeout=60) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def test_workers_racing_for_one_build_run_it_once_and_all_get_its_result(tmp_path):
    results = finished(workers(tmp_path, (0.5, "works"), (0.5, "works")))
    assert (tmp_path / "builds").read_text() == "x"
    assert [(code, json.loads(out)) for code, out, _ in results] == [(0, DAG), (0, DAG)]


def test_a_failed_build_fails_every_worker_and_is_not_run_again(tmp_path):
    results = finished(workers(tmp_path, (0.5, "fails"), (0.5, "fails")))
    assert (tmp_path / "builds").read_text() == "x"
    assert all(code != 0 and "snakemake failed: disk full" in err for code, _, err in results)
    assert sum("failed in another pytest worker" in err for _, _, err in results) == 1


def test_a_build_whose_worker_was_killed_is_built_by_the_next(tmp_path):
    (killed,) = workers(tmp_path, (60, "works"))
    while not (tmp_path / "started").exists():
        assert killed.poll() is None, killed.communicate()
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    [(code, out, err)] = finished(workers(tmp_path, (0, "works")))
    assert (code, json.loads(out)) == (0, DAG), err
    assert (tmp_path / "builds").read_text() == "xx"


def test_without_xdist_a_shared_build_is_a_plain_call(tmp_path_factory, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    calls = []
    built = [once.build_once("plain", tmp_path_factory, lambda: calls.append(1) or "dag")
             for _ in range(2)]
    assert built == ["dag", "dag"] and calls == [1, 1]
    assert not list(tmp_path_factory.getbasetemp().parent.glob("plain.*"))


def test_a_prewarmed_script_has_its_own_directory_environment_streams_and_status(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import os, sys\nprint(os.getcwd(), os.environ['WHO'], sys.argv[1:])\n"
                      "print('to stderr', file=sys.stderr)\nsys.exit(3)\n")
    (tmp_path / "here").mkdir()
    out = prewarmed.run([str(script), "-n", "x"], tmp_path / "here", {"WHO": "test"}, 60)
    assert out.returncode == 3
    assert out.stdout == f"{tmp_path / 'here'} test ['-n', 'x']\n"
    assert out.stderr == "to stderr\n"


def test_a_prewarmed_script_past_its_timeout_is_killed(tmp_path):
    script = Path(tmp_path / "sleeps.py")
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        prewarmed.run([str(script)], tmp_path, {}, 1)
