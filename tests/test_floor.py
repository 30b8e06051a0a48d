"""The memory-bandwidth floor: a copy's bandwidth, a model's weight bytes, and each pair's
models' step over weight bytes / bandwidth, from the speculative study's rows."""

import math

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from decodelab.engines.cuda import floor, graphs
from decodelab.engines.speculative import torch_device
from decodelab.studies.speculative import tables as speculative_tables
from decodelab.studies.speculative.paper import floor_table as floor_tex


def test_copy_bandwidth_is_measured_and_positive():
    bandwidth = floor.copy_bandwidth("cpu", nbytes=8 * 2**20, repeats=3)
    assert math.isfinite(bandwidth) and bandwidth > 1e8  # any machine copies 100 MB/s


def tiny_gpt():
    config = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    return AutoModelForCausalLM.from_config(config).eval()


class OutsideTorch:
    """What a llama.cpp engine shows the loops: logits land on the CPU, no weights in torch."""
    device = torch.device("cpu")

    def parameters(self):
        yield torch.empty(0)


def test_weight_bytes_counts_every_parameter_at_its_width():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3).half())
    assert floor.weight_bytes(model) == (10 * 20 + 20) * 4 + (20 * 3 + 3) * 2
    gpt = tiny_gpt()
    assert floor.weight_bytes(graphs.Engine(gpt, capture=False)) == floor.weight_bytes(gpt)
    assert math.isnan(floor.weight_bytes(OutsideTorch()))


class OffloadedOutsideTorch(OutsideTorch):
    """A llama.cpp engine that computes on a GPU and counts its own weights."""
    compute_device = "cuda"

    def weight_bytes(self) -> float:
        return 123.0


def test_an_engine_outside_torch_is_measured_where_it_computes():
    """A llama.cpp role's bandwidth is its compute device's, not the CPU's where its logits land:
    a GPU torch cannot reach gives no bandwidth rather than the CPU's."""
    offloaded = OffloadedOutsideTorch()
    assert floor.weight_bytes(offloaded) == 123.0
    got = floor.columns(tiny_gpt(), offloaded)
    assert got["target_bandwidth"] > 1e8
    if torch.cuda.is_available():
        assert floor.compute_device(offloaded) == torch.device("cuda", 0)
    else:
        assert floor.compute_device(offloaded) is None and math.isnan(got["draft_bandwidth"])


def test_only_torch_models_have_a_torch_device():
    """What decides a level-3 fork and a bandwidth measurement: an engine outside torch has no
    torch device, though its logits land on one."""
    model = tiny_gpt()
    assert torch_device(model) == torch_device(graphs.Engine(model, capture=False))
    assert torch_device(model).type == "cpu" and torch_device(OutsideTorch()) is None


def rows(pair: str, method: str, step_s: float, repeat: int, **extra) -> dict:
    """A greedy row whose steps after the prompt's took `step_s` each."""
    return {"pair": pair, "method": method, "mode": "greedy", "repeat": repeat,
            "step_s": step_s, "pair_target": "t",
            "pair_draft": "d", "pair_target_device": "cuda", "pair_draft_device": "cpu",
            "target_weight_bytes": 2e9, "draft_weight_bytes": 1e8, "target_bandwidth": 4e12,
            "draft_bandwidth": 5e10, **extra}


def test_floor_table_sets_each_role_alone_against_its_floor():
    runs = pd.DataFrame([rows("p", "autoregressive", 2e-3, r) for r in (0, 1)]
                        + [rows("p", "draft_autoregressive", 4e-3, r) for r in (0, 1)]
                        + [rows("p", "speculative", 9.0, 0)]
                        + [rows("p", "autoregressive", 9.0, 0) | {"mode": "sampled"}])
    table = speculative_tables.floor_table(runs).set_index("role")
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
    assert speculative_tables.floor_table(runs).empty


def test_the_paper_table_shows_the_ratio_or_says_nothing_was_measured():
    runs = pd.DataFrame([rows("p", "autoregressive", 2e-3, 0)])
    tex = floor_tex(speculative_tables.floor_table(runs))
    assert r"\texttt{p} & target & \texttt{t} & cuda, eager & 2,000 & 4,000 & 2.00 & 0.500 & " \
           r"4.00$\times$" in tex
    assert "no bandwidth measured" in floor_tex(pd.DataFrame())
