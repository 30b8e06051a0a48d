"""scripts/gpu_pair.py's verdict part (`--parts verdict`), the pipelined loop's overhead with its
verdict compiled and not, at its CPU size (`--smoke`: nothing captured)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor needs a C++ compiler on a CPU")
def test_the_verdict_part_times_both_verdicts_side_by_side(tmp_path):
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "scripts/gpu_pair.py", "--smoke", "--parts", "verdict",
                          "--deadline", "600", "--out", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "FAILED" not in run.stdout
    df = pd.read_csv(tmp_path / "stats/verdict.csv")
    cells = df.groupby(["mode", "k", "verdict"]).size()
    assert set(cells.index) == {(m, k, v) for m in ("greedy", "sampled") for k in (1, 3)
                                for v in ("compiled", "eager")}
    assert set(cells) == {2}  # repeats 0 and 1; the capture and compilation run is dropped
    assert ((df.overhead_us > 0) & (df.overhead_us < df.iteration_us)).all()
    assert df.overhead_share.between(0, 1, inclusive="neither").all()
