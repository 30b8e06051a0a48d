"""The quantized study without llama.cpp: its config keys and checks, what the DAG plans from
them (conversions, verify-cost jobs, the converter's refusals as skipped rows), and its tables
from raw rows (a serial and a batch-parallel backend told apart; greedy divergences counted)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from decodelab.analysis import stability, stats
from decodelab.config import settings as cfg
from decodelab.config.check import schema_problem
from decodelab.config.settings import Confidence, Pair, Settings, Stability
from decodelab.core.errors import DecodelabError
from decodelab.studies.quantized.tables import peer_table, speculative_table, verify_cost_table

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
QUANTIZED = "config/quantized.yaml"
CI = Confidence(bootstrap_resamples=200, seed=0)


def validated(path: str = "config.yaml") -> dict:
    config = yaml.safe_load((ROOT / path).read_text())
    validate(config, str(SCHEMA))
    return config


def with_pair(peer: tuple[str, ...] = (), **pair) -> Settings:
    """The quantized profile with pair `x` added (and config quantized.peer set, when given)."""
    config = validated(QUANTIZED)
    config["speculative"]["pairs"]["x"] = {"target": "target", "draft": "draft",
                                          "target_device": "cpu", "draft_device": "cpu", **pair}
    if peer:
        config["quantized"]["peer"] = list(peer)
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


LLAMA_PAIR = {"target_backend": "llamacpp", "target_quant": "Q4_0", "draft_backend": "llamacpp",
              "draft_quant": "Q8_0"}


@pytest.mark.parametrize("peer, pair, message", [
    ("nope", LLAMA_PAIR, r"'quantized\.peer'.*no pair named 'nope'"),
    ("x", {"target_backend": "llamacpp", "target_quant": "Q4_0"},
     r"'quantized\.peer'.*'x' needs target_backend and draft_backend llamacpp"),
    ("x", {**LLAMA_PAIR, "draft_device": "cuda"}, r"'quantized\.peer'.*draft on cuda"),
])
def test_a_peer_pair_that_llama_cpp_cannot_run_is_refused_by_key(peer, pair, message):
    with pytest.raises(DecodelabError, match=message):
        cfg.check_quantized(with_pair(peer=(peer,), **pair))
    cfg.check_quantized(with_pair(peer=("x",), **LLAMA_PAIR))  # the control passes


def test_the_quantized_profile_runs_the_peer_on_its_llama_cpp_pairs():
    s = Settings.from_config(validated(QUANTIZED))
    assert s.quantized.peer and all(s.speculative.pairs[n].quant("draft") for n in s.quantized.peer)
    assert Settings.from_config(validated()).quantized.peer == ()


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


def judged(runs: pd.DataFrame) -> pd.DataFrame:
    """The verify-cost table of `runs` with the parallelism study's verdicts of them."""
    return verify_cost_table(runs, CI, stability.verdicts(runs, stats.PARALLELISM, Stability()))


def test_the_verify_cost_table_tells_serial_from_batch_parallel():
    serial = judged(timing_rows("llama.cpp-Q4_0-cpu", 1.0))
    parallel = judged(timing_rows("llama.cpp-Q4_0-cpu", 0.0))
    assert list(serial["k"]) == [1, 4, 8]
    np.testing.assert_allclose(serial["ratio"], serial["k"] + 1, rtol=0.06)
    np.testing.assert_allclose(serial["extra_per_token"], 1.0, atol=0.06)
    np.testing.assert_allclose(parallel["extra_per_token"], 0.0, atol=0.06)
    assert set(serial["quantization"]) == {"Q4_0"} and set(serial["device"]) == {"cpu"}
    assert verify_cost_table(pd.DataFrame(), CI, pd.DataFrame()).empty


def test_a_verify_cost_ratio_is_unstable_when_either_of_its_passes_is():
    """One process whose one-token passes ran 3x slower makes every ratio unstable, naming the
    one-token side; the same rows undisturbed are all stable (the negative control)."""
    quiet = timing_rows("llama.cpp-Q4_0-cpu", 1.0)
    assert judged(quiet)["stable"].all()
    slow = (quiet["repeat"] == 0) & (quiet["tokens"] == 1)
    disturbed = judged(quiet.assign(seconds=quiet["seconds"].where(~slow, quiet["seconds"] * 3)))
    assert not disturbed["stable"].any()
    assert disturbed["unstable_reason"].str.startswith("1 token: cv between processes").all()
    with pytest.raises(DecodelabError, match="no stability verdict"):
        verify_cost_table(quiet, CI, stability.verdicts(
            timing_rows("llama.cpp-F16-cpu", 1.0), stats.PARALLELISM, Stability()))


def peer_rows(ar_s: float, spec_s: float, accepted: int, drafted: int) -> pd.DataFrame:
    """llama-peer's raw rows: per-token seconds for the autoregressive and K = 4 runs."""
    rows = [{"pair": "q4-q8", "mode": "greedy", "repeat": r, "prompt": p, "method": method,
             "k": k, "tokens": 64.0, "seconds": 64 * s * (1 + 0.01 * p), "accepted": a,
             "drafted": d}
            for r in range(3) for p in range(2)
            for method, k, s, a, d in (("autoregressive", 0, ar_s, 0, 0),
                                       ("speculative", 4, spec_s, accepted, drafted))]
    return pd.DataFrame(rows)


def test_the_peer_table_is_llama_cpps_speedup_over_its_own_decoding_beside_decodelabs():
    ours = pd.DataFrame([{"pair": "q4-q8", "mode": "greedy", "k": 4, "speedup": 1.3}])
    acceptance = pd.DataFrame([{"pair": "q4-q8", "mode": "greedy", "k": 4,
                                "proposal_acceptance": 0.6}])
    faster = peer_table(peer_rows(0.01, 0.005, 30, 40), ours, acceptance, CI).iloc[0]
    assert faster["peer_speedup"] == pytest.approx(2.0)
    assert faster["ci_low"] <= 2.0 <= faster["ci_high"] and faster["n"] == 3
    assert faster["peer_acceptance"] == pytest.approx(0.75)
    assert faster["peer_tokens_per_s"] == pytest.approx(1 / 0.005, rel=0.02)
    assert (faster["decodelab_speedup"], faster["decodelab_proposal_acceptance"]) == (1.3, 0.6)
    slower = peer_table(peer_rows(0.01, 0.02, 10, 40), ours, acceptance, CI).iloc[0]
    assert slower["peer_speedup"] == pytest.approx(0.5) and slower["ci_high"] < 1
    assert peer_table(pd.DataFrame(), ours, acceptance, CI).empty


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
    from decodelab.core import tables
    from decodelab.studies.quantized import paper as quantized

    runs = pd.concat([timing_rows("llama.cpp-Q4_0-cpu", 1.0),
                      timing_rows("llama.cpp-F16-cpu", 0.0).assign(quantization="F16")])
    verify = judged(runs)
    no_peer = peer_table(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), CI)
    tables.write_group(tmp_path, "quantized", {"verify_cost": verify, "peer": no_peer,
                                               "speculative": speculative_table(pd.DataFrame(),
                                                                                pd.DataFrame())})
    part = quantized.parts(tmp_path, {"stats": {"confidence": 0.95}})
    assert part.flags["QuantizedReady"]
    sentence = part.macros["QuantSerialSentence"]
    assert "serial on \\texttt{llama.cpp-Q4\\_0-cpu}" in sentence
    assert "batch-parallel on \\texttt{llama.cpp-F16-cpu}" in sentence
    assert part.macros["QuantMetal"] == "not run"
    assert part.macros["QuantVerifyStable"] == f"{len(verify)} of {len(verify)}"
    assert not part.flags["QuantPeerRan"]

    empty = tmp_path / "empty"
    tables.write_group(empty, "quantized", {"verify_cost": verify.iloc[0:0], "peer": no_peer,
                                            "speculative": speculative_table(pd.DataFrame(),
                                                                             pd.DataFrame())})
    none = quantized.parts(empty, {})
    assert not none.flags["QuantizedReady"] and none.macros["QuantSerialSentence"] == "--"


def test_the_paper_sets_llama_cpps_own_speedup_beside_decodelabs(tmp_path):
    from decodelab.core import tables
    from decodelab.studies.quantized import paper as quantized

    ours = pd.DataFrame([{"pair": "q4-q8", "mode": "greedy", "k": 4, "speedup": 1.3}])
    acceptance = pd.DataFrame([{"pair": "q4-q8", "mode": "greedy", "k": 4,
                                "proposal_acceptance": 0.6}])
    tables.write_group(tmp_path, "quantized", {
        "verify_cost": judged(timing_rows("llama.cpp-Q4_0-cpu", 1.0)),
        "speculative": speculative_table(pd.DataFrame(), pd.DataFrame()),
        "peer": peer_table(peer_rows(0.01, 0.005, 30, 40), ours, acceptance, CI)})
    part = quantized.parts(tmp_path, {"stats": {"confidence": 0.95}})
    assert part.flags["QuantPeerRan"]
    sentence = part.macros["QuantPeerSentence"]
    assert "reaches 2.00 over its own" in sentence and "75.0\\% of drafted" in sentence
    assert sentence.endswith("reaches 1.30")
    assert "\\texttt{q4-q8} & greedy & 4 & 2.00" in part.files["tab_quantized_peer.tex"]


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
