"""The long-context study: the verb's rows, its statistics (planted alpha and speedup, with the
negative controls they must reject), the controls on real runs, its rules and its config."""

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from dag import copy_workflow, planned_jobs, snakemake
from llama import LLAMA, PERIOD, planted_copies, tiny_llama, tokens

from decodelab import cli
from decodelab.analysis.theory import expected_speedup
from decodelab.backends import sources, train
from decodelab.config.check import schema_problem, with_defaults
from decodelab.config.settings import (
    Confidence,
    LongJob,
    LongVerificationJob,
    Settings,
    check_long,
    check_positions,
    load_settings,
)
from decodelab.core.errors import DecodelabError
from decodelab.core.io import read_raw
from decodelab.engines import speculative
from decodelab.engines.decode import new_cache
from decodelab.engines.sparse_kv import POLICIES
from decodelab.studies.long import run as longstudy
from decodelab.studies.long import tables as longstats

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
# The columns README.md documents for results/<host>/long/<device>/rep<r>.parquet.
COLUMNS = ["method", "length", "kv_budget", "policy", "drafter", "mode", "k", "document",
           "document_name", "tokens", "accepted", "proposals", "alpha", "proposal_acceptance",
           "total_s", "draft_step_s", "step_s", "draft_kv_bytes", "verifier_kv_bytes",
           "peak_bytes", "rss_bytes", "target", "backend", "repeat"]
SPEC = {"drafters": ["self"], "device": "cpu", "dtype": "float32", "lengths": [40, 56],
        "kv_budgets": [24, 32], "policies": list(POLICIES), "ks": [2], "modes": ["greedy",
                                                                                  "sampled"],
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "documents": 2, "budget": 6, "seed": 0}


# -----------------------------------------------------------------------------
# the verb


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """One process of the verb on a tiny init Llama (random ids for documents)."""
    tmp = tmp_path_factory.mktemp("long")
    sources.prepare({"source": "init", "preset": "llama-tiny", "seed": 1}, tmp / "m")
    out = tmp / "rep0.parquet"
    code = cli.main(["long", "--target-dir", str(tmp / "m"), "--target", "tiny",
                     "--backend", "cpu", "--spec", json.dumps(SPEC), "--repeat", "0",
                     "--machine", '{"preflight": "off"}', "--threads", "1", "--out", str(out)])
    assert code == 0
    return read_raw(out, "long")


def test_the_verb_writes_the_documented_columns_and_its_grid(raw):
    assert set(COLUMNS) <= set(raw.columns)
    assert len(raw) == longstudy.expected_rows(LongJob.from_spec(SPEC))[0]
    spec = raw[raw["method"] == "speculative"]
    # full runs once per L; the other policies once per budget
    assert len(spec) == 2 * 2 * 2 * (1 + 3 * 2)
    assert (raw["backend"] == "cpu").all() and (raw["target"] == "tiny").all()
    assert spec["tokens"].map(len).eq(6).all()
    assert (spec["draft_kv_bytes"] <= spec["verifier_kv_bytes"]).all()
    sparse = spec[spec["policy"] != "full"]
    assert (sparse["draft_kv_bytes"] < sparse["verifier_kv_bytes"]).all()


def test_the_full_cache_is_accepted_whole_in_greedy_mode(raw):
    # The positive control; and greedy output is the target's own, for every policy.
    spec = raw[(raw["method"] == "speculative") & (raw["mode"] == "greedy")]
    full = spec[spec["policy"] == "full"]
    assert (full["proposal_acceptance"] == 1.0).all() and (full["alpha"] == 1.0).all()
    base = raw[(raw["method"] == "autoregressive") & (raw["mode"] == "greedy")]
    own = {(r.length, r.document): list(r.tokens) for r in base.itertuples()}
    assert all(list(r.tokens) == own[(r.length, r.document)] for r in spec.itertuples())


def test_kv_bytes_are_the_cache_tensors_bytes():
    model = tiny_llama(seed=1)
    cache = new_cache(model)
    with torch.no_grad():
        speculative.feed(model, cache, torch.tensor(tokens(37)))
    held = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    assert longstudy.kv_bytes(model.config, 37, 4) == held


def test_documents_are_heldout_files_long_enough(tmp_path):
    sources.prepare(LLAMA, tmp_path / "m")  # its small corpus holds out one file
    held = train.split(train.corpus_files(LLAMA["corpus_mb"]))[1]
    [(name, ids)] = longstudy.heldout_documents(tmp_path / "m", 1, 64, seed=0)
    assert [name] == [rel for rel, _ in held] and len(ids) >= 64
    with pytest.raises(DecodelabError, match="config 'long.documents': 2 held-out documents"):
        longstudy.heldout_documents(tmp_path / "m", 2, 64, seed=0)


# -----------------------------------------------------------------------------
# statistics on planted rows

CI = Confidence(bootstrap_resamples=1000, seed=3)


def planted_runs(alpha: float, speedup: float, c: float, k: int = 4, documents: int = 12,
                 calls: int = 30, seed: int = 0) -> pd.DataFrame:
    """Raw rows whose draft tokens are each accepted with probability `alpha` (until the first
    rejection), the target alone `speedup` times slower than speculation (5% noise) and the
    draft step c times the target's."""
    rng = np.random.default_rng(seed)
    rows = []
    for doc in range(documents):
        accepted = []
        for _ in range(calls):
            n = 0
            while n < k and rng.random() < alpha:
                n += 1
            accepted.append(n)
        spec_s = 1.0 + 0.05 * rng.standard_normal()
        key = {"target": "t", "backend": "cpu", "length": 512, "mode": "greedy",
               "document": doc}
        rows.append({**key, "method": "speculative", "drafter": "self", "policy": "retrieval",
                     "kv_budget": 64, "k": k, "accepted": accepted, "proposals": [k] * calls,
                     "tokens": [0] * (sum(accepted) + calls), "target_calls": calls,
                     "total_s": spec_s, "draft_step_s": c * 0.01, "draft_kv_bytes": 10,
                     "verifier_kv_bytes": 100, "peak_bytes": np.nan, "rss_bytes": 1e9})
        rows.append({**key, "method": "autoregressive", "drafter": "", "policy": "",
                     "kv_budget": 0, "k": 0, "total_s": speedup * (1.0 + 0.05 *
                                                                   rng.standard_normal()),
                     "step_s": 0.01})
    return pd.DataFrame(rows)


def test_the_intervals_cover_the_planted_values_and_reject_wrong_ones():
    t = longstats.tables(planted_runs(alpha=0.6, speedup=2.0, c=0.25), CI)
    acc, speed = t["acceptance"].iloc[0], t["speedup"].iloc[0]
    assert acc["ci_low"] <= 0.6 <= acc["ci_high"]
    assert not acc["ci_low"] <= 0.75 <= acc["ci_high"]  # the negative control
    assert speed["ci_low"] <= 2.0 <= speed["ci_high"]
    assert not speed["ci_low"] <= 1.5 <= speed["ci_high"]
    assert speed["cost_ratio"] == pytest.approx(0.25)
    assert speed["predicted"] == pytest.approx(expected_speedup(acc["alpha"], 4, 0.25))
    assert acc["n"] == speed["n"] == 12


def test_no_runs_give_empty_tables_with_their_columns():
    t = longstats.tables(pd.DataFrame(), CI)
    assert all(len(df) == 0 and len(df.columns) for df in t.values())


# -----------------------------------------------------------------------------
# the negative control on a trained model


def test_random_chunks_accept_less_than_retrieval_on_planted_copies(copier, one_thread):
    model, _ = copier
    prompts = [seq[:PERIOD + 10].tolist() for seq in planted_copies(6, PERIOD, seed=2000)]
    spec = LongJob.from_spec({**SPEC, "budget": 24})
    rows = []
    for policy in ("retrieval", "random_chunks"):
        for doc, prompt in enumerate(prompts):
            cfg = {"policy": policy, "kv_budget": 32, "k": 4, "mode": "greedy"}
            out = longstudy.run_speculative(model, None, prompt, cfg, spec, seed=doc)
            rows.append({**cfg, **out, "method": "speculative", "target": "copier",
                         "backend": "cpu", "drafter": "self", "length": len(prompt),
                         "document": doc})
    acc = longstats.acceptance_table(longstats.per_document(pd.DataFrame(rows)), CI)
    by = acc.set_index("policy")
    assert by.loc["retrieval", "ci_low"] > by.loc["random_chunks", "ci_high"], by


# -----------------------------------------------------------------------------
# config and DAG


def config(**long) -> dict:
    c = yaml.safe_load((ROOT / "config.yaml").read_text())
    c["long"] = {**c["long"], **long}
    return c


def long_settings(c: dict) -> Settings:
    return Settings.from_config(with_defaults(c, yaml.safe_load(SCHEMA.read_text())))


def test_the_default_and_gpu_profiles_plan_the_study():
    for profile in ("config.yaml", "config/long.yaml"):
        s = load_settings(ROOT / profile, SCHEMA)
        check_long(s)
        given = yaml.safe_load((ROOT / profile).read_text())["long"]
        spec = json.loads(json.dumps(s.long.job_spec()))  # as the rule passes it
        apart = ("target", "repeats", "verification")  # the study's hash ignores the last
        assert {k: spec[k] for k in given if k not in apart} == {
            k: v for k, v in given.items() if k not in apart}
        assert spec["seed"] == s.seed and not set(apart) & set(spec)
        assert s.position_needs()[s.long.target][0] == s.long.longest
        job = json.loads(json.dumps(s.long.verification_spec()))
        assert job == {"check": given["verification"], "device": s.long.device,
                       "dtype": s.long.dtype, "seed": s.seed}
        assert LongVerificationJob.from_spec(job).check == s.long.verification


@pytest.mark.parametrize("edit, message", [
    ({"target": "nosuch"}, "config 'long.target': no model named 'nosuch' in 'models'"),
    ({"target": "target"}, "config 'long.target': model 'target' is a gpt2 model; the "
                           "long-context study needs rotary positions"),
    ({"drafters": ["self", "draft"]}, "config 'long.drafters': model 'draft' is a gpt2 model"),
    ({"drafters": ["ghost"]}, "config 'long.drafters': no model named 'ghost'"),
], ids=["unknown target", "gpt2 target", "gpt2 drafter", "unknown drafter"])
def test_a_bad_long_model_is_refused_by_key(edit, message):
    with pytest.raises(DecodelabError) as err:
        check_long(long_settings(config(**edit)))
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("edit, key", [
    ({"kv_budgets": [8]}, "long.kv_budgets[0]"), ({"policies": ["sinks"]}, "long.policies[0]"),
    ({"documents": 1}, "long.documents"), ({"device": "tpu"}, "long.device"),
    ({"lenghts": [64]}, "long.lenghts"),
])
def test_a_bad_long_value_is_refused_by_the_schema_naming_it(edit, key):
    assert schema_problem(config(**edit), SCHEMA).startswith(f"config '{key}'")


def verification(**edit) -> dict:
    c = config()
    c["long"]["verification"] = {**c["long"]["verification"], **edit}
    return c


@pytest.mark.parametrize("edit, message", [
    ({"drafter": "long-target"}, "config 'long.verification.drafter': 'long-target' is not one "
                                 "of 'long.drafters' (self)"),
    ({"kv_budget": 16}, "config 'long.verification.kv_budget': policy 'retrieval' keeps at "
                        "least 23 tokens, got 16"),
    ({"kv_budget": 128}, "config 'long.verification.kv_budget': 128 tokens is no sparse view "
                         "of a 128-token context"),
], ids=["drafter not in the study", "budget under the policy's least", "budget covers L"])
def test_a_bad_long_verification_is_refused_by_key(edit, message):
    with pytest.raises(DecodelabError) as err:
        check_long(long_settings(verification(**edit)))
    assert str(err.value).startswith(message)
    check_long(long_settings(verification(policy="full", kv_budget=128)))  # no view: no budget


@pytest.mark.parametrize("edit, key", [
    ({"policy": "sinks"}, "long.verification.policy"), ({"length": 8}, "long.verification.length"),
    ({"tokens": 10}, "long.verification.tokens"), ({"lenght": 64}, "long.verification.lenght"),
])
def test_a_bad_long_verification_value_is_refused_by_the_schema_naming_it(edit, key):
    assert schema_problem(verification(**edit), SCHEMA).startswith(f"config '{key}'")


def test_a_target_too_short_for_the_verification_context_is_refused_by_key():
    s = long_settings(verification(length=300, kv_budget=64))
    with pytest.raises(DecodelabError, match=r"the 367 tokens of config 'long.verification' "
                                             r"\(length 300 \+ verification.real.budget 64 "
                                             r"\+ K 3\)"):
        check_positions(s, s.position_needs())


def test_the_schema_lists_the_policies_of_sparse_kv():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["properties"]["long"]["properties"]["policies"]["items"]["enum"] == \
        list(POLICIES)


def test_a_target_too_short_for_the_longest_context_is_refused_by_key():
    s = long_settings(config(lengths=[256, 1024]))
    with pytest.raises(DecodelabError, match=r"fewer than the 1051 tokens of config 'long' "
                                             r"\(longest length 1024 \+ budget 24 \+ K 3\)"):
        check_positions(s, s.position_needs())


def test_the_dag_plans_the_study_and_no_long_section_plans_empty_tables(tmp_path):
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    workdir = copy_workflow(tmp_path / "with")
    jobs = planned_jobs(snakemake(workdir, "-n", "--cores", "1").stdout)
    assert jobs["long"] == 2 and jobs["long_stats"] == 1 and jobs["long_figures"] == 2
    workdir = copy_workflow(tmp_path / "without")
    c = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    del c["long"]
    (workdir / "none.yaml").write_text(yaml.safe_dump(c))
    jobs = planned_jobs(snakemake(workdir, "-n", "--cores", "1", "--configfile",
                                  str(workdir / "none.yaml")).stdout)
    assert "long" not in jobs and jobs["long_stats"] == 1
