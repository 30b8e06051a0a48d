"""The memory-bandwidth floor: a copy's bandwidth, a model's weight bytes, and each pair's
models' step over weight bytes / bandwidth, from the speculative study's rows."""

import math

import pandas as pd
import pytest
import torch

from decodelab import floor, stats
from decodelab.paper.speculative import floor_table as floor_tex


def test_copy_bandwidth_is_measured_and_positive():
    bandwidth = floor.copy_bandwidth("cpu", nbytes=8 * 2**20, repeats=3)
    assert math.isfinite(bandwidth) and bandwidth > 1e8  # any machine copies 100 MB/s


def test_weight_bytes_counts_every_parameter_at_its_width():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3).half())
    assert floor.weight_bytes(model) == (10 * 20 + 20) * 4 + (20 * 3 + 3) * 2
    assert math.isnan(floor.weight_bytes(object()))  # an engine without parameters


def rows(pair: str, method: str, total_s: float, repeat: int, **extra) -> dict:
    """A greedy row of 11 tokens whose prompt took 1 ms: (total_s - 1 ms) / 10 per token."""
    return {"pair": pair, "method": method, "mode": "greedy", "repeat": repeat,
            "tokens": [0] * 11, "total_s": total_s, "prefill_s": 1e-3, "pair_target": "t",
            "pair_draft": "d", "pair_target_device": "cuda", "pair_draft_device": "cpu",
            "target_weight_bytes": 2e9, "draft_weight_bytes": 1e8, "target_bandwidth": 4e12,
            "draft_bandwidth": 5e10, **extra}


def test_floor_table_sets_each_role_alone_against_its_floor():
    runs = pd.DataFrame([rows("p", "autoregressive", 1e-3 + 10 * 2e-3, r) for r in (0, 1)]
                        + [rows("p", "draft_autoregressive", 1e-3 + 10 * 4e-3, r) for r in (0, 1)]
                        + [rows("p", "speculative", 9.0, 0)]
                        + [rows("p", "autoregressive", 9.0, 0) | {"mode": "sampled"}])
    table = stats.floor_table(runs).set_index("role")
    target, draft = table.loc["target"], table.loc["draft"]
    assert target["floor_s"] == pytest.approx(2e9 / 4e12)  # 0.5 ms
    assert target["step_s"] == pytest.approx(2e-3) and target["over_floor"] == pytest.approx(4)
    assert draft["floor_s"] == pytest.approx(2e-3) and draft["over_floor"] == pytest.approx(2)
    assert (target["model"], target["device"], target["engine"]) == ("t", "cuda", "eager")
    assert (draft["model"], draft["device"], draft["n"]) == ("d", "cpu", 2)


def test_rows_from_before_the_floor_give_no_table():
    runs = pd.DataFrame([rows("p", "autoregressive", 1.0, 0)]).drop(
        columns=["target_bandwidth", "draft_bandwidth", "target_weight_bytes",
                 "draft_weight_bytes"])
    assert stats.floor_table(runs).empty


def test_the_paper_table_shows_the_ratio_or_says_nothing_was_measured():
    runs = pd.DataFrame([rows("p", "autoregressive", 1e-3 + 10 * 2e-3, 0)])
    tex = floor_tex(stats.floor_table(runs))
    assert r"\texttt{p} & target & \texttt{t} & cuda, eager & 2,000 & 4,000 & 2.00 & 0.500 & " \
           r"4.00$\times$" in tex
    assert "no bandwidth measured" in floor_tex(pd.DataFrame())
