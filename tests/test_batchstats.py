import json

import numpy as np
import pandas as pd
import pytest
from costs import COST

from decodelab import cli
from decodelab.config.settings import Batched, Confidence, Settings, check_batched
from decodelab.core import tables
from decodelab.core.errors import DecodelabError
from decodelab.engines.sparse_kv import min_budget
from decodelab.studies.batched import paper as paper_batched
from decodelab.studies.batched import run as batchstudy
from decodelab.studies.batched import tables as batchstats

CI = Confidence(bootstrap_resamples=200)


def spec(**edit) -> dict:
    section = {"target": "target", "draft": "draft", "batches": [1, 2], "contexts": [32, 48],
               "budget": 4, "k": 2, "kv_budget": 8, "rounds": 2, **edit}
    return Batched.from_config(section, seed=5).job_spec()


def test_prompts_are_held_out_text_of_every_length_and_differ_by_round(tiny_pair):
    target, _ = tiny_pair
    stream = batchstudy.heldout_stream(target, 40, 5)
    one, other = (batchstudy.prompts(stream, 3, 40, batchstudy.prompt_seed(5, 0, r))
                  for r in (0, 1))
    assert [len(p) for p in one] == [20, 30, 40] and one != other
    text = stream.tolist()
    assert all(any(text[i:i + len(p)] == p for i in range(len(text))) for p in one)
    assert batchstudy.prompt_seed(5, 1, 0) != batchstudy.prompt_seed(5, 0, 1)


def test_the_stage_verbs_write_every_table(tiny_pair, tmp_path):
    target, draft = tiny_pair
    runs, costs = [], []
    refreshed = spec(contexts=[56, 64], kv_budget=24, refresh_layer=0)
    for r in (0, 1):
        runs.append(tmp_path / f"rep{r}.parquet")
        costs.append(tmp_path / f"rep{r}_costs.parquet")
        assert cli.main(["batched", "--target-dir", target, "--draft-dir", draft, "--backend",
                         "cpu", "--spec", json.dumps(refreshed), "--repeat", str(r), "--machine",
                         '{"preflight": "off"}', "--costs", str(costs[-1]),
                         "--out", str(runs[-1])]) == 0
    assert cli.main(["batched-stats", "--spec", json.dumps(CI.job_spec()), "--out",
                     str(tmp_path / "stats"), "--runs", *map(str, runs),
                     "--costs", *map(str, costs)]) == 0
    t = tables.read_group(tmp_path / "stats", "batched")
    throughput = t["throughput"]
    assert len(throughput) == (len(batchstudy.MODES) + 1) * 2 * 2
    assert (throughput["n"] == 4).all()
    by_mode = throughput.set_index("mode")
    assert np.allclose(by_mode.loc["autoregressive", "speedup"], 1)
    assert np.allclose(by_mode.loc["unsynchronized", "over_unsynchronized"], 1)
    assert (by_mode.loc["refreshed", "refresh_layer"] == 0).all()
    assert by_mode.loc["refreshed", "over_unsynchronized"].notna().all()
    assert (throughput["tokens_per_s"] > 0).all()
    c = t["costs"]
    assert len(c) == 4 and np.allclose(c["ceiling"], 3 / c["overhead"])
    assert (c["verify_tokens"] == max(batchstudy.WIDTHS)).all()
    assert set(t["simulator"]["scenario"]) == set(batchstats.SCENARIOS)
    section = paper_batched.parts(tmp_path / "stats", {})
    assert section.flags == {"BatchedReady": True}
    assert "--" not in section.macros["BatchedUnsyncSentence"]
    assert "layer 0" in section.macros["BatchedRefreshSentence"]
    assert section.files["tab_batched.tex"].count(r"CPU & ") == 4


def test_a_rounding_error_above_one_is_no_interval_above_one():
    rows = pd.DataFrame({"ci_low": [1 + 1e-14, 1.01, 0.9], "ci_high": [1.2, 1.3, 1 - 1e-14]})
    assert paper_batched.above(rows) == "1 of 3" and paper_batched.below(rows) == "0 of 3"


def test_one_run_gives_no_interval():
    assert np.isnan(batchstats.mean_ci(np.array([1.2]), CI)[1:]).all()


def test_the_speedups_pair_the_runs_of_the_same_prompts():
    rows = [{"backend": "cpu", "batch": 2, "context": 64, "k": 3, "process": p, "round": r,
             "mode": mode, "tokens_per_s": base * factor, "acceptance": 0.5}
            for p, r, base in ((0, 0, 100.0), (0, 1, 400.0), (1, 0, 50.0))
            for mode, factor in (("autoregressive", 1), ("self_synchronized", 2),
                                 ("unsynchronized", 3))]
    out = batchstats.throughput_table(pd.DataFrame(rows), CI).set_index("mode")
    # unpaired means would give 3 x 183 / 183 = 3 too; the medians 300 / 100 do not pair
    assert out.loc["unsynchronized", "speedup"] == pytest.approx(3)
    assert out.loc["unsynchronized", "ci_low"] == pytest.approx(3)
    assert out.loc["unsynchronized", "over_synchronized"] == pytest.approx(1.5)
    assert out.loc["unsynchronized", "n"] == 3


def planted_costs(cost, batches, contexts) -> pd.DataFrame:
    """Forward timings of a planted cost model; a draft is a one-token forward, as here."""
    rows = [{"backend": "cuda", "batch": b, "context": c, "tokens": w, "process": 0,
             "seconds": cost.t_verify(b, c, w)}
            for b in batches for c in contexts for w in batchstudy.WIDTHS]
    return pd.DataFrame(rows)


def test_verification_stops_being_free_as_the_batch_grows():
    # A planted forward: weights read once (10 ms), then 0.1 ms per token fed: at batch 64 a
    # K+1-token verification is compute-bound and no draft can make speculation pay.
    from decodelab.engines.scheduler import CostModel

    cost = CostModel(draft=(0.01, 1e-4, 0.0), verify=(0.01, 1e-4, 0.0))  # draft: unused
    out = batchstats.cost_table(batchstats.fits(planted_costs(cost, [1, 8, 64, 256], [256, 512])),
                                k=4)
    out = out.groupby("batch")["ceiling"].mean()
    assert out[1] > 4 and out.is_monotonic_decreasing and out[256] < 1.5
    expected = 5 / (cost.t_verify(256, 256, 5) / cost.t_draft(256, 256))
    assert out[256] == pytest.approx(expected, rel=1e-6)


def test_the_simulated_scheduler_gains_only_where_acceptance_varies():
    # KV-bound: a verification reads every row's context, a sparse draft only its 64 tokens
    costs = planted_costs(COST, [4, 8], [2048, 4096])
    out = batchstats.simulator_table(batchstats.fits(costs), k=4, kv_budget=64, ci=CI)
    cell = out[(out["batch"] == 8) & (out["context"] == 4096)].set_index("scenario")
    assert cell.loc["mixed", "gain"] > 1.03 and cell.loc["mixed", "ci_low"] > 1
    assert (abs(out.loc[out["scenario"] == "alike", "gain"] - 1) < 0.03).all()  # the control
    assert (cell["fixed_over_autoregressive"] > 1).all()


def test_a_draft_as_dear_as_the_target_never_pays_in_the_simulator():
    # The same timings with the draft's view as long as the context: K* stays at its least.
    costs = planted_costs(COST, [4, 8], [2048, 4096])
    out = batchstats.simulator_table(batchstats.fits(costs), k=4, kv_budget=4096,
                                     ci=CI)
    assert (out["fixed_over_autoregressive"] < 1).all() and (out["best_fixed_k"] == 1).all()


def settings_with(**batched) -> Settings:
    from test_config import validated

    config = validated()
    section = {"target": "target", "draft": "draft", "batches": [1], "contexts": [96], **batched}
    return Settings.from_config({**config, "batched": section})


@pytest.mark.parametrize("edit, match", [
    ({"target": "nope"}, "batched.target': no model named 'nope'"),
    ({"draft": "nope"}, "batched.draft': no model named 'nope'"),
    ({"kv_budget": 48}, "batched.kv_budget': 48 tokens is no sparse view"),
    ({"policy": "random_chunks", "kv_budget": 16}, "keeps at least 23"),
    ({"policy": "retrieval", "kv_budget": 32}, "batched.policy': retrieval selects per layer"),
    ({"refresh_layer": 0, "kv_budget": 16}, "refresh layer keeps chunks, at least 23"),
    ({"refresh_layer": 6}, "batched.refresh_layer': layer 6 of 'target', a model of 6 layers"),
])
def test_bad_batched_sections_name_their_key(edit, match):
    with pytest.raises(DecodelabError, match=match):
        check_batched(settings_with(**edit))


def test_the_least_budgets_are_those_of_the_sparse_views():
    check_batched(settings_with(policy="sink_window", kv_budget=min_budget("sink_window")))
    check_batched(settings_with(policy="random_chunks", kv_budget=min_budget("random_chunks")))
    check_batched(settings_with(refresh_layer=0, kv_budget=min_budget("retrieval")))
    with pytest.raises(DecodelabError):
        check_batched(settings_with(policy="sink_window",
                                    kv_budget=min_budget("sink_window") - 1))
