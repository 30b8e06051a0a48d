"""The quantized study without llama.cpp: its config keys and checks, what the DAG plans from
them (conversions, verify-cost jobs, the converter's refusals as skipped rows), and its tables
from raw rows (a serial and a batch-parallel backend told apart; greedy divergences counted)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from decodelab import config as cfg
from decodelab.config import Confidence, Pair, Settings
from decodelab.configcheck import schema_problem
from decodelab.errors import DecodelabError
from decodelab.quantized_stats import speculative_table, verify_cost_table

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
QUANTIZED = "config/quantized.yaml"
CI = Confidence(bootstrap_resamples=200, seed=0)


def validated(path: str = "config.yaml") -> dict:
    config = yaml.safe_load((ROOT / path).read_text())
    validate(config, str(SCHEMA))
    return config


def with_pair(**pair) -> Settings:
    config = validated(QUANTIZED)
    config["speculative"]["pairs"]["x"] = {"target": "target", "draft": "draft",
                                          "target_device": "cpu", "draft_device": "cpu", **pair}
    return Settings.from_config(config)


def test_the_quantized_profile_passes_every_check_and_plans_each_model_and_type():
    s = Settings.from_config(validated(QUANTIZED))
    cfg.check_quantized(s)
    plan = cfg.quantized_plan(s, ["cpu"])
    models = [m for m in s.quantized.models if m != "opt-tiny"]
    assert {(m, t) for m, t, _ in plan["verify"]} == {(m, t) for m in models
                                                      for t in cfg.QUANT_TYPES}
    assert ("draft", "Q8_0") in plan["convert"] and ("draft", "Q4_0") in plan["convert"]
    assert plan["skipped"] == [("opt-tiny", cfg.unconvertible("opt-tiny", s.models["opt-tiny"]))]
    assert "opt" in plan["skipped"][0][1]
    # a device this host lacks plans no verify-cost job
    assert cfg.quantized_plan(s, ["cuda"])["verify"] == []


def test_a_pytorch_pair_keeps_its_job_spec_and_a_llama_cpp_role_states_its_keys():
    """Raw files are stamped with the pair's job spec: a PyTorch pair's is what it was before
    the backend keys, so its runs are not redone."""
    plain = {"target": "t", "draft": "d", "target_device": "cpu", "draft_device": "cpu"}
    assert Pair.from_spec(plain).job_spec() == {**plain, "dtype": "float32"}
    mixed = Pair.from_spec({**plain, "target_backend": "llamacpp", "target_quant": "Q4_0"})
    assert mixed.job_spec() == {**plain, "dtype": "float32", "target_backend": "llamacpp",
                                "target_quant": "Q4_0"}
    assert mixed.quant("target") == "Q4_0" and mixed.quant("draft") is None


@pytest.mark.parametrize("pair, message", [
    ({"target_backend": "llamacpp"}, r"'speculative\.pairs\.x\.target_quant'.*needs the GGUF"),
    ({"draft_quant": "Q8_0"}, r"'speculative\.pairs\.x\.draft_quant'.*runs in PyTorch"),
    ({"draft_backend": "llamacpp", "draft_quant": "Q4_0", "draft_device": "mps"},
     r"'speculative\.pairs\.x\.draft_device'.*cpu or cuda"),
    ({"target": "opt-tiny", "target_backend": "llamacpp", "target_quant": "F16"},
     r"'speculative\.pairs\.x\.target_backend'.*no class for the opt architecture"),
])
def test_a_wrong_llama_cpp_role_is_one_error_naming_its_key(pair, message):
    with pytest.raises(DecodelabError, match=message):
        cfg.check_quantized(with_pair(**pair))


def test_an_unknown_model_in_config_quantized_is_refused_by_name():
    config = validated(QUANTIZED)
    config["quantized"]["models"] = ["nope"]
    with pytest.raises(DecodelabError, match=r"'quantized\.models'.*'nope'"):
        cfg.check_quantized(Settings.from_config(config))


@pytest.mark.parametrize("change, key", [
    ({"target_quant": "Q5_K"}, "target_quant"),
    ({"draft_backend": "mlx"}, "draft_backend"),
])
def test_the_schema_refuses_an_unknown_backend_or_type(change, key):
    config = yaml.safe_load((ROOT / QUANTIZED).read_text())
    config["speculative"]["pairs"]["q4-q8"].update(change)
    problem = schema_problem(config, SCHEMA)
    assert problem and key in problem


def test_the_default_profile_plans_nothing_quantized():
    s = Settings.from_config(validated())
    assert cfg.quantized_plan(s, ["cpu"]) == {"verify": [], "skipped": [], "convert": []}


def timing_rows(backend: str, per_token: float, ks=(1, 4, 8), repeats=3) -> pd.DataFrame:
    """Raw verify-cost rows whose K+1-token pass costs 1 + per_token * K one-token passes."""
    rng = np.random.default_rng(0)
    rows = [{"backend": backend, "quantization": "Q4_0", "llama_device": "cpu", "model": "m",
             "context": 128, "repeat": r, "tokens": n,
             "seconds": 0.01 * (1 + per_token * (n - 1)) * rng.uniform(0.98, 1.02)}
            for r in range(repeats) for n in (1, *[k + 1 for k in ks]) for _ in range(3)]
    return pd.DataFrame(rows)


def test_the_verify_cost_table_tells_serial_from_batch_parallel():
    serial = verify_cost_table(timing_rows("llama.cpp-Q4_0-cpu", 1.0), CI)
    parallel = verify_cost_table(timing_rows("llama.cpp-Q4_0-cpu", 0.0), CI)
    assert list(serial["k"]) == [1, 4, 8]
    np.testing.assert_allclose(serial["ratio"], serial["k"] + 1, rtol=0.06)
    np.testing.assert_allclose(serial["extra_per_token"], 1.0, atol=0.06)
    np.testing.assert_allclose(parallel["extra_per_token"], 0.0, atol=0.06)
    assert set(serial["quantization"]) == {"Q4_0"} and set(serial["device"]) == {"cpu"}
    assert verify_cost_table(pd.DataFrame(), CI).empty


def speculative_runs(diverge_at: int | None) -> pd.DataFrame:
    own = list(range(10))
    ours = own if diverge_at is None else own[:diverge_at] + [99] * (10 - diverge_at)
    rows = []
    for prompt in range(2):
        rows.append({"method": "autoregressive", "mode": "greedy", "k": 0, "tokens": own})
        rows.append({"method": "speculative", "mode": "greedy", "k": 4,
                     "tokens": ours if prompt == 0 else own,
                     "diverges_at": np.nan if diverge_at is None or prompt else diverge_at,
                     "divergence_margin": np.nan if diverge_at is None or prompt else 0.01})
        rows[-2]["prompt"] = rows[-1]["prompt"] = prompt
    return pd.DataFrame(rows).assign(pair="q", repeat=0, pair_target_backend="llamacpp",
                                     pair_target_quant="Q4_0")


def test_the_speculative_table_reports_a_divergence_with_its_position_and_margin():
    speedup = pd.DataFrame([{"pair": "q", "mode": "greedy", "k": 4, "speedup": 1.2,
                             "ci_low": 1.1, "ci_high": 1.3},
                            {"pair": "other", "mode": "greedy", "k": 4, "speedup": 2.0,
                             "ci_low": 1.9, "ci_high": 2.1}])
    parted = speculative_table(speculative_runs(diverge_at=3), speedup).iloc[0]
    assert (parted["pair"], parted["target_quant"], parted["draft_backend"]) == (
        "q", "Q4_0", "pytorch")
    assert parted["agree"] == 0.5 and parted["diverged"] == 1
    assert parted["first_divergence"] == 3 and parted["min_margin"] == 0.01
    agreed = speculative_table(speculative_runs(diverge_at=None), speedup)
    assert len(agreed) == 1  # the PyTorch pair's row stays in speculative_speedup only
    assert agreed.iloc[0]["agree"] == 1.0 and agreed.iloc[0]["diverged"] == 0


def test_the_paper_says_serial_or_batch_parallel_from_the_data(tmp_path):
    """The sentence follows the measured cost per extra token: a planted serial backend reads
    serial, a planted batch-parallel one batch-parallel; Metal stays not run."""
    from decodelab import tables
    from decodelab.paper import quantized

    runs = pd.concat([timing_rows("llama.cpp-Q4_0-cpu", 1.0),
                      timing_rows("llama.cpp-F16-cpu", 0.0).assign(quantization="F16")])
    verify = verify_cost_table(runs, CI)
    tables.write_group(tmp_path, "quantized", {"verify_cost": verify,
                                               "speculative": speculative_table(pd.DataFrame(),
                                                                                pd.DataFrame())})
    part = quantized.parts(tmp_path, {"stats": {"confidence": 0.95}})
    assert part.flags["QuantizedReady"]
    sentence = part.macros["QuantSerialSentence"]
    assert "serial on \\texttt{llama.cpp-Q4\\_0-cpu}" in sentence
    assert "batch-parallel on \\texttt{llama.cpp-F16-cpu}" in sentence
    assert part.macros["QuantMetal"] == "not run"

    empty = tmp_path / "empty"
    tables.write_group(empty, "quantized", {"verify_cost": verify.iloc[0:0],
                                            "speculative": speculative_table(pd.DataFrame(),
                                                                             pd.DataFrame())})
    none = quantized.parts(empty, {})
    assert not none.flags["QuantizedReady"] and none.macros["QuantSerialSentence"] == "--"


def test_a_pytorch_target_has_its_agreement_but_no_divergence_counts():
    """Divergence positions are measured against a llama.cpp target; with a PyTorch target the
    table leaves them empty instead of reading zero."""
    runs = speculative_runs(diverge_at=None).drop(columns=["pair_target_backend",
                                                           "pair_target_quant"])
    runs = runs.drop(columns=["diverges_at", "divergence_margin"]).assign(
        pair_draft_backend="llamacpp", pair_draft_quant="Q4_0")
    speedup = pd.DataFrame([{"pair": "q", "mode": "greedy", "k": 4, "speedup": 1.2,
                             "ci_low": 1.1, "ci_high": 1.3}])
    row = speculative_table(runs, speedup).iloc[0]
    assert row["target_backend"] == "pytorch" and row["draft_quant"] == "Q4_0"
    assert row["agree"] == 1.0 and np.isnan(row["diverged"]) and np.isnan(row["min_margin"])
