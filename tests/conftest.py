import copy
import functools
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
from once import build_once

# The controller of a pytest-xdist run only hands out tests: it imports none of torch,
# transformers or Matplotlib (6 s before it starts the workers); the fixtures below import them.
if "PYTEST_XDIST_WORKER" in os.environ:
    import torch

    # One torch thread in each pytest-xdist worker: two workers already share the two cores,
    # and the tests' tiny models gain nothing from a second thread but contention.
    # test_batched, test_equivalence and test_figures_paper took 220 s of CPU with torch's
    # default (2 threads) and 75 s with one, on 2 cores with other work. A serial run (the
    # planted-load pass) keeps the default; subprocesses (verbs, Snakemake jobs) keep theirs.
    torch.set_num_threads(1)

# a call of the LaTeX build: tests/fixtures.py's helper or latexmk itself
LATEX_BUILD = re.compile(r"\b(build_paper|latexmk)\(")


@pytest.fixture
def one_thread():
    """One torch thread for a test of thousands of tiny forwards: threads only contend here."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def uncaptured_engines(monkeypatch) -> list:
    """`graphs.engine`'s own choice and cache sizing on the CPU: the graph engines it builds
    run uncaptured (no CUDA here) and are listed here as built."""
    from decodelab.engines.cuda import graphs

    built = []

    class Uncaptured(graphs.Engine):
        def __init__(self, model, **kwargs):
            super().__init__(model, capture=False, **kwargs)
            built.append(self)

    monkeypatch.setattr(graphs, "require_cuda", lambda *args: None)
    monkeypatch.setattr(graphs, "Engine", Uncaptured)
    return built


@pytest.fixture
def workdir(tmp_path):
    from dag import copy_workflow

    return copy_workflow(tmp_path)


@functools.cache
def calls_latex(function) -> bool:
    """Whether `function`'s source calls the LaTeX build (read once per function: a fixture or a
    parametrized test is shared by many items)."""
    return bool(LATEX_BUILD.search(inspect.getsource(function)))


def compiles_latex(item: pytest.Item) -> bool:
    """Whether the test's body, or a fixture it uses, calls the LaTeX build."""
    defs = getattr(item, "_fixtureinfo", None)
    fixtures = [d[-1].func for d in defs.name2fixturedefs.values()] if defs else []
    functions = [getattr(item, "function", None), *fixtures]
    return any(calls_latex(f) for f in functions if f is not None)


def reads_the_default_dag(item: pytest.Item) -> bool:
    return "default_dag" in getattr(item, "fixturenames", ())


# The files that took longest in `make test-fast` (9-40 s each of its 2.5 minutes on 2 cores),
# longest first: given out first, so that no long file starts while the other worker is running
# out of work; the short files after them even out the two workers' ends.
LONGEST_FILES = ("test_figures_paper.py", "test_hostile_models.py", "test_batched.py",
                 "test_workflow.py", "test_hub.py", "test_equivalence.py", "test_quantized.py",
                 "test_containers.py", "test_verify.py", "test_selection.py",
                 "test_hostile_config.py", "test_train.py", "test_regime_depth.py",
                 "test_longstudy.py", "test_artifact.py", "test_longctx.py", "test_models.py",
                 "test_sampling.py", "test_config.py", "test_speculative.py")


def length_rank(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]):
    """Mark `latex` every test that compiles the paper, before `-m "not latex"` deselects it.

    Then, once `-m` has deselected, order the tests that will run. The default DAG is the
    longest build of a full run. The file of the first test that reads it goes first, its
    readers first; the other files that read it go last, their readers last; the rest in
    between, LONGEST_FILES first. Under `--dist loadfile --no-loadscope-reorder` (the Makefile)
    one worker starts the DAG at once and waits on it while the other runs every other file, and
    a worker takes a file when it runs out. Where no test that runs reads it (`make test-fast`),
    LONGEST_FILES alone orders the files."""
    for item in items:
        if compiles_latex(item):
            item.add_marker(pytest.mark.latex)
    yield  # the other hooks, `-m`'s deselection among them
    readers = [item for item in items if reads_the_default_dag(item)]
    first = readers[0].path if readers else None
    files = {item.path for item in readers}

    def rank(item: pytest.Item) -> tuple[int, int]:
        reads = reads_the_default_dag(item)
        if item.path == first:
            return 0, not reads
        return (2, reads) if item.path in files else (1, length_rank(item))

    items.sort(key=rank)


TINY_TRAIN = {"source": "train", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 128,
              "vocab_size": 512, "corpus_mb": 0.3, "seq_len": 32, "batch_size": 4, "steps": 10,
              "lr": 0.003, "seed": 1}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny `init` GPT-2 that tests read and never change."""
    from decodelab.backends import sources

    out = tmp_path_factory.mktemp("m") / "gpt2-tiny"
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, out)
    return out


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[str, str]:
    """A `train` target and a draft distilled from it, tiny, for all xdist workers:
    (target_dir, draft_dir)."""
    from decodelab.backends import sources

    def train() -> list[str]:
        root = tmp_path_factory.mktemp("pair")
        sources.prepare(TINY_TRAIN, root / "target")
        draft = TINY_TRAIN | {"n_embd": 16, "steps": 5, "seed": 2, "teacher": "target",
                              "distill": 1.0}
        sources.prepare(draft, root / "draft", teacher_dir=root / "target")
        return [str(root / "target"), str(root / "draft")]
    return tuple(build_once("tiny-pair", tmp_path_factory, train))


@pytest.fixture(scope="module")
def oracle_model(model):
    """The test module's `model` on the oracle attention: ORACLE says what it attends to."""
    oracle = copy.deepcopy(model)
    oracle.set_attn_implementation("sparse_oracle")
    return oracle


@pytest.fixture(scope="session")
def copier(tmp_path_factory):
    """A 2-layer Llama trained in seconds to copy from PERIOD tokens back, trained once for all
    xdist workers: (model, its last training loss)."""
    import torch
    from llama import COPY_VOCAB, PERIOD, planted_copies, tiny_llama

    def train() -> dict:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        model = tiny_llama(seed=0, vocab=COPY_VOCAB).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(120):
            x = planted_copies(8, PERIOD, seed=step)
            logits = model(input_ids=x[:, :-1], use_cache=False).logits[:, PERIOD:]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                     x[:, PERIOD + 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.set_num_threads(threads)
        weights = tmp_path_factory.mktemp("copier") / "copier.pt"
        torch.save(model.state_dict(), weights)
        return {"weights": str(weights), "loss": loss.item()}
    trained = build_once("copier", tmp_path_factory, train)
    model = tiny_llama(seed=0, vocab=COPY_VOCAB)
    model.load_state_dict(torch.load(trained["weights"]))
    return model.eval(), trained["loss"]


@pytest.fixture(scope="session")
def default_dag(tmp_path_factory) -> Path:
    """The default DAG at the end-to-end test's sizes (dag.E2E_SIZES) run once to the
    PDF in a copy of the workflow, for all xdist workers: every e2e test reads this one run and
    changes nothing in it."""
    from dag import copy_workflow, e2e_configfile, snakemake

    def run() -> str:
        workdir = copy_workflow(tmp_path_factory.mktemp("default-dag"))
        snakemake(workdir, "--configfile", e2e_configfile(workdir), timeout=3600)
        return str(workdir)
    return Path(build_once("default-dag", tmp_path_factory, run))


@pytest.fixture(scope="session")
def default_report(default_dag, tmp_path_factory) -> subprocess.CompletedProcess:
    """`make report` on the default run: results/report.html and what Snakemake said."""
    from dag import snakemake

    def report() -> dict:
        return vars(snakemake(default_dag, "--report", "results/report.html", "--configfile",
                              str(default_dag / "e2e.yaml")))
    return subprocess.CompletedProcess(**build_once("default-report", tmp_path_factory, report))
