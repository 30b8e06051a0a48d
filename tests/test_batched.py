import json

import numpy as np
import pandas as pd
import pytest
import torch
from costs import CONTEXT, COST
from llama import tiny_llama, tokens

from decodelab import batched, batchstudy, cli, models, sources
from decodelab import equivalence as eq
from decodelab.config import Batched, Sampling
from decodelab.decode import decode
from decodelab.errors import DecodelabError
from decodelab.scheduler import Posterior, round_k
from decodelab.sparse_kv import Policy

BUDGET = 16
LENGTHS = {1: (7,), 3: (3, 11, 6), 5: (5, 1, 9, 14, 2)}  # prompt lengths per batch size
RUNS = 300  # per rule, in the sampled-law check
SPARSE = Policy("sink_window", budget=8)


@pytest.fixture(scope="module", params=["gpt2-tiny", "llama-tiny"])
def model(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("m") / request.param
    sources.prepare({"source": "init", "preset": request.param, "seed": 1}, out)
    return models.load(out, "cpu")


@pytest.fixture(scope="module")
def draft(model):
    """The target with slightly perturbed weights: it mostly agrees, so rows accept different
    counts and roll back partway."""
    out = type(model)(model.config).eval()
    out.load_state_dict(model.state_dict())
    with torch.no_grad():
        for param in out.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0))
                       * 0.3 * param.std().nan_to_num(0))
    return out


def prompts(batch, vocab=8192):
    return [tokens(n, seed=10 * batch + i, vocab=vocab) for i, n in enumerate(LENGTHS[batch])]


def alone(model, batch):
    return [decode(model, torch.tensor([p]), BUDGET).tokens for p in prompts(batch)]


def per_row_k(row, result):
    return (1, 4, 2, 0, 3)[row]


@pytest.mark.parametrize("batch", LENGTHS)
def test_every_batched_mode_gives_each_row_its_greedy_tokens_alone(model, draft, batch):
    want = alone(model, batch)
    runs = {"autoregressive": batched.autoregressive(model, prompts(batch), BUDGET),
            "synchronized": batched.synchronized(model, draft, prompts(batch), BUDGET, 3),
            "unsynchronized": batched.unsynchronized(model, prompts(batch), BUDGET, per_row_k,
                                                     SPARSE)}
    for name, out in runs.items():
        assert [r.tokens for r in out.rows] == want, name
    sync = runs["synchronized"].rows
    rounds = list(zip(*(r.accepted for r in sync), strict=False))
    if batch > 1:  # rows accepted different counts in one round: per-row rollback ran
        assert any(len(set(n)) > 1 for n in rounds)
        assert 0 < sum(map(sum, (r.accepted for r in sync))) < sum(r.proposed for r in sync)
    unsync = runs["unsynchronized"]
    assert [r.proposals[0] for r in unsync.rows] == [per_row_k(i, None) for i in range(batch)]
    alone_forwards = sum(r.draft_forwards + r.target_calls for r in unsync.rows)
    assert unsync.forwards < alone_forwards or batch == 1  # rows shared forwards


def test_a_full_view_drafts_exactly_the_target_in_the_mixed_forward(model):
    out = batched.unsynchronized(model, prompts(5), BUDGET, per_row_k, Policy("full"))
    assert [r.tokens for r in out.rows] == alone(model, 5)
    assert all(r.proposal_acceptance == 1.0 for r in out.rows if r.proposed)
    # The control: a small view is not the target, so some drafts are rejected.
    sparse = batched.unsynchronized(model, prompts(5), BUDGET, per_row_k, SPARSE)
    assert sum(r.proposed for r in sparse.rows) > sum(sum(r.accepted) for r in sparse.rows)


def test_squeezing_out_the_holes_changes_no_token(model, draft, monkeypatch):
    compactions = []
    monkeypatch.setattr(batched, "SLACK", 0)
    monkeypatch.setattr(batched, "compact", lambda rows, real=batched.compact: (
        compactions.append(rows.slots), real(rows)))
    want = alone(model, 3)
    assert [r.tokens for r in batched.synchronized(model, draft, prompts(3), BUDGET, 3).rows
            ] == want
    assert [r.tokens for r in batched.unsynchronized(model, prompts(3), BUDGET, per_row_k,
                                                     SPARSE).rows] == want
    assert compactions


def test_the_scheduler_drives_the_mixed_batch(model):
    def scheduled(row, result):
        posterior = Posterior()
        for proposed, accepted in zip(result.proposals, result.accepted, strict=True):
            posterior = posterior.update(proposed, accepted)
        return round_k(posterior, COST, 5, CONTEXT, 6)

    out = batched.unsynchronized(model, prompts(5), BUDGET, scheduled, Policy("full"))
    assert [r.tokens for r in out.rows] == alone(model, 5)
    assert max(max(r.proposals) for r in out.rows) > 1  # full acceptance raised K


def test_bad_requests_are_clear_errors(model):
    with pytest.raises(DecodelabError, match="selects per layer"):
        batched.unsynchronized(model, prompts(3), 4, per_row_k, Policy("retrieval", budget=32))
    with pytest.raises(DecodelabError, match="at least one token"):
        batched.autoregressive(model, [[1, 2], []], 4)
    with pytest.raises(DecodelabError, match="2 generators for a batch of 3"):
        batched.autoregressive(model, prompts(3), 4, Sampling(temperature=1.0),
                               [torch.Generator()] * 2)


def batched_spec(**edit) -> dict:
    section = {"target": "t", "draft": "d", "batches": [1, 2], "contexts": [16, 32],
               "budget": 4, "k": 2, "kv_budget": 8, "rounds": 1, **edit}
    return Batched.from_config(section, seed=3).job_spec()


def test_the_batched_verb_writes_every_mode_and_the_cost_timings(model_dir, tmp_path):
    out, costs = tmp_path / "throughput.parquet", tmp_path / "costs.parquet"
    assert cli.main(["batched", "--target-dir", str(model_dir), "--draft-dir", str(model_dir),
              "--backend", "cpu", "--spec", json.dumps(batched_spec()), "--repeat", "0",
              "--machine", '{"preflight": "off"}', "--costs", str(costs), "--out", str(out)]) == 0
    rows = pd.read_parquet(out)
    assert sorted(rows["mode"].unique()) == sorted(batchstudy.MODES)
    assert len(rows) == len(batchstudy.MODES) * 2 * 2
    assert (rows["tokens"] == 4 * rows["batch"]).all() and (rows["tokens_per_s"] > 0).all()
    assert len(pd.read_parquet(costs)) == 2 * 2 * len(batchstudy.WIDTHS)


def peaked_llama(seed):
    model = tiny_llama(seed=seed, vocab=8)
    model.lm_head.weight.data *= 10  # peaked enough that a wrong rule's law is far from p
    return model


def second_row_counts(run, rule, runs):
    """The law of row 1's two tokens in a batch of three prompts of different lengths."""
    counts = {}
    for i in range(runs):
        gens = [[torch.Generator().manual_seed(6 * i + 2 * r + j) for r in range(3)]
                for j in (0, 1)]
        out = run(rule, gens)
        counts[tuple(out.rows[1].tokens)] = counts.get(tuple(out.rows[1].tokens), 0) + 1
    return counts


@pytest.mark.parametrize("mode", ["synchronized", "unsynchronized"])
def test_a_sampled_row_of_a_batch_keeps_the_target_law(one_thread, mode):
    # The cheapest level that sees the whole loop (as test_longctx's): two tokens at vocabulary
    # 8, their law enumerated from the target alone; keeping every draft token must be rejected.
    target, draft = peaked_llama(6), peaked_llama(7)
    batch, s = [tokens(n, seed=n, vocab=8) for n in (5, 24, 13)], Sampling(temperature=1.0)
    with torch.inference_mode():
        law = eq.ar_law(lambda ctx: torch.softmax(
            target(torch.tensor([batch[1] + list(ctx)])).logits[0, -1].double(), -1), 2)

    def run(rule, gens):
        if mode == "synchronized":
            return batched.synchronized(target, draft, batch, 2, 1, s, *gens, accept=rule)
        return batched.unsynchronized(target, batch, 2, batched.fixed(1),
                                      Policy("sink_window", budget=5), s, *gens, accept=rule)

    outcomes = sorted(law)
    expected = np.array([law[y] for y in outcomes])
    p_values = {}
    for name in ("correct", "accept_all"):
        counts = second_row_counts(run, eq.SAMPLERS[name], RUNS)
        observed = np.array([counts.get(y, 0) for y in outcomes])
        assert observed.sum() == RUNS
        p_values[name] = eq.goodness_of_fit(observed, expected)["p_value"]
    assert p_values["correct"] > 1e-3, p_values
    assert p_values["accept_all"] < 1e-3, p_values
