import inspect
import os
import re
import subprocess
from pathlib import Path

# Before torch loads OpenMP: threads that wait sleep instead of spinning. With two pytest workers
# on two cores a spinning thread starves the one it waits for: a tiny-model test took 210 s of
# CPU instead of 43 (tests/test_speculative.py, greedy). Timing only; subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
from test_workflow import copy_workflow, snakemake

from decodelab import sources

TESTS = Path(__file__).parent
# a call of the LaTeX build: tests/fixtures.py's helper or latexmk itself
LATEX_BUILD = re.compile(r"\b(build_paper|latexmk)\(")


def compiles_latex(item: pytest.Item) -> bool:
    """Whether the test's body, or a fixture it uses, calls the LaTeX build."""
    defs = getattr(item, "_fixtureinfo", None)
    fixtures = [d[-1].func for d in defs.name2fixturedefs.values()] if defs else []
    functions = [getattr(item, "function", None), *fixtures]
    return any(LATEX_BUILD.search(inspect.getsource(f)) for f in functions if f is not None)


def shared_fixture(item: pytest.Item) -> str | None:
    """What the test shares with others, built once per xdist worker: the first session fixture
    of tests/ it uses (the default DAG, the SLURM cluster, the tiny pair), else its module when
    it uses a module fixture of tests/."""
    info = getattr(item, "_fixtureinfo", None)
    ours = {name: defs[-1].scope for name, defs in (info.name2fixturedefs if info else {}).items()
            if Path(inspect.getfile(defs[-1].func)).parent == TESTS}
    session = sorted(name for name, scope in ours.items() if scope == "session")
    if session:
        return session[0]
    return item.module.__name__ if "module" in ours.values() else None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `latex` every test that compiles the paper, so `-m "not latex"` leaves it out, and
    put the tests that share a costly fixture in one group (`pytest -n 2 --dist loadgroup`)."""
    for item in items:
        if compiles_latex(item):
            item.add_marker(pytest.mark.latex)
        group = shared_fixture(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


TINY_TRAIN = {"source": "train", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 128,
              "vocab_size": 512, "corpus_mb": 0.3, "seq_len": 32, "batch_size": 4, "steps": 10,
              "lr": 0.003, "seed": 1}


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[str, str]:
    """A `train` target and a draft distilled from it, tiny: (target_dir, draft_dir)."""
    root = tmp_path_factory.mktemp("pair")
    sources.prepare(TINY_TRAIN, root / "target")
    draft = TINY_TRAIN | {"n_embd": 16, "steps": 5, "seed": 2, "teacher": "target",
                          "distill": 1.0}
    sources.prepare(draft, root / "draft", teacher_dir=root / "target")
    return str(root / "target"), str(root / "draft")


@pytest.fixture(scope="session")
def default_dag(tmp_path_factory) -> Path:
    """The default DAG run once to the PDF in a copy of the workflow (minutes): every e2e test
    reads this one run and changes nothing in it."""
    workdir = copy_workflow(tmp_path_factory.mktemp("default-dag"))
    snakemake(workdir, timeout=3600)  # ~13 min on a quiet 2-core machine; 30+ seen when slow
    return workdir


@pytest.fixture(scope="session")
def default_report(default_dag) -> subprocess.CompletedProcess:
    """`make report` on the default run: results/report.html and what Snakemake said."""
    return snakemake(default_dag, "--report", "results/report.html")
