import subprocess
from pathlib import Path

import pytest
from test_workflow import copy_workflow, snakemake

from decodelab import models

TINY_TRAIN = {"source": "train", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 128,
              "vocab_size": 512, "corpus_mb": 0.3, "seq_len": 32, "batch_size": 4, "steps": 10,
              "lr": 0.003, "seed": 1}


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[str, str]:
    """A `train` target and a draft distilled from it, tiny: (target_dir, draft_dir)."""
    root = tmp_path_factory.mktemp("pair")
    models.prepare(TINY_TRAIN, root / "target")
    draft = TINY_TRAIN | {"n_embd": 16, "steps": 5, "seed": 2, "teacher": "target",
                          "distill": 1.0}
    models.prepare(draft, root / "draft", teacher_dir=root / "target")
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
