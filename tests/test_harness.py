"""The test harness itself: which tests are marked `latex`, which share an xdist worker, and the
prewarmed `snakemake` processes (tests/conftest.py, tests/prewarmed.py)."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

import conftest
import prewarmed
import pytest


def builds_the_paper(stats_dir, tmp_path, build_paper):
    return build_paper(stats_dir, tmp_path)


def only_writes_tables(stats_dir, write_stats):
    return write_stats(stats_dir)


def fixture(func, scope: str = "function") -> list:
    return [SimpleNamespace(func=func, scope=scope)]


def item(function=None, module="test_x", **fixtures) -> SimpleNamespace:
    return SimpleNamespace(function=function, module=SimpleNamespace(__name__=module),
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=fixtures))


def test_a_test_that_compiles_the_paper_is_marked_latex_and_no_other():
    assert conftest.compiles_latex(item(builds_the_paper))
    assert not conftest.compiles_latex(item(only_writes_tables))
    # through a fixture of its own
    assert conftest.compiles_latex(item(only_writes_tables, pdf=fixture(builds_the_paper)))


def test_tests_sharing_a_costly_fixture_share_a_group():
    session = fixture(builds_the_paper, "session")  # a function of tests/, as a fixture
    module = fixture(only_writes_tables, "module")
    assert conftest.shared_fixture(item(module="test_a", dag=session, tree=module)) == "dag"
    assert conftest.shared_fixture(item(module="test_a", tree=module)) == "test_a"
    assert conftest.shared_fixture(item(module="test_a", each=fixture(only_writes_tables))) is None
    outside = fixture(pytest.approx, "session")  # not a fixture of tests/: never a group
    assert conftest.shared_fixture(item(module="test_a", tmp_path_factory=outside)) is None


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
