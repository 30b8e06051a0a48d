import json

import numpy as np
import pandas as pd
import pytest
import torch
from costs import CONTEXT, COST
from llama import PERIOD, planted_copies, tiny_llama, tokens

from decodelab import cli
from decodelab.backends import models, sources
from decodelab.config.settings import Batched, Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines import batched, refresh
from decodelab.engines.decode import decode
from decodelab.engines.scheduler import Posterior, round_k
from decodelab.engines.sparse_kv import Policy, chunk_layout
from decodelab.studies.batched import run as batchstudy
from decodelab.studies.verification import equivalence as eq

BUDGET = 16
LENGTHS = {1: (7,), 3: (3, 11, 6), 5: (5, 1, 9, 14, 2)}  # prompt lengths per batch size
RUNS = 300  # per rule, in the sampled-law check
SPARSE = Policy("sink_window", budget=8)
CHUNKED = Policy("sink_window", budget=refresh.MIN_BUDGET)  # the smallest refreshed view
LONG = (40, 3, 60, 30)  # prompt lengths, most beyond the refreshed view


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


def long_prompts(vocab):
    return [tokens(n, seed=n, vocab=vocab) for n in LONG]


@pytest.mark.parametrize("layer", ["first", "last"])
def test_a_refreshed_batch_gives_each_row_its_greedy_tokens_alone(model, layer):
    prompts_ = long_prompts(model.config.vocab_size)
    want = [decode(model, torch.tensor([p]), BUDGET).tokens for p in prompts_]
    at = 0 if layer == "first" else model.config.num_hidden_layers - 1
    out = batched.unsynchronized(model, prompts_, BUDGET, per_row_k, CHUNKED, refresh=at)
    assert [r.tokens for r in out.rows] == want
    assert model.config._attn_implementation == "sdpa"  # the refresh layer's attention is gone
    # The control: a view covering every prompt drafts exactly the target.
    full = batched.unsynchronized(model, prompts_, BUDGET, per_row_k,
                                  Policy("sink_window", budget=100), refresh=at)
    assert all(r.proposal_acceptance == 1.0 for r in full.rows if r.proposed)


def test_the_refresh_layer_reads_everything_and_the_others_its_choice(model, monkeypatch):
    """Per forward, the masks each layer got: the refresh layer every slot of a drafting row's
    cache, the layers after it the chunks of most attention mass under the budget, a verifying
    row its committed slots everywhere."""
    seen = []
    original = refresh.RefreshLayer.attention

    def spy(self, module, query, key, value, attention_mask, **kwargs):
        state = (self.full.clone(), self.committed.clone(), self.drafting.clone())
        seen.append((state, module.layer_idx, self.mask(module.layer_idx, attention_mask),
                     query, key, kwargs.get("scaling")))
        return original(self, module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(refresh.RefreshLayer, "attention", spy)
    at, layers = 1, model.config.num_hidden_layers
    batched.unsynchronized(model, long_prompts(model.config.vocab_size), 6, per_row_k, CHUNKED,
                           refresh=at)
    forwards = [seen[i:i + layers] for i in range(0, len(seen), layers)]
    checked = 0
    for calls in forwards:
        full, committed_slots, drafting = calls[0][0]
        visible = [call[2][:, 0, 0] == 0 for call in calls]  # [B, S + w]: what query 0 sees
        slots = full.shape[1]
        for row in range(full.shape[0]):
            committed = committed_slots[row].nonzero()[:, 0]
            if not drafting[row]:  # verifying (or done): one mask in every layer
                assert all(call[2][row].equal(calls[0][2][row]) for call in calls)
                continue
            assert visible[at][row, :slots].equal(full[row])
            _, _, _, query, key, scaling = calls[at]
            q = query[row, :, 0].float()
            allowed = full[row].nonzero()[:, 0]
            scores = torch.stack([(q[h] @ key[row, h * key.shape[1] // q.shape[0]][allowed].T)
                                  * scaling for h in range(q.shape[0])]).softmax(-1)
            mass = scores[:, torch.isin(allowed, committed)].sum(0)
            after = visible[-1][row, :slots] & committed_slots[row]
            n, window = len(committed), refresh.MIN_BUDGET
            if n <= window:
                assert after.sum() == n
                continue
            kept = committed[kept_positions(mass, window)]
            assert after.nonzero()[:, 0].equal(kept) and len(kept) <= window
            checked += 1
    assert checked > 0


def kept_positions(mass, budget):
    """The oracle of `refresh.chunk_view` for one row in order: chunk 0, the prefix chunks of
    most mass (the chunked layout of `sparse_kv`), the recent tail."""
    n = len(mass)
    if n <= budget:
        return torch.arange(n)
    prefix, picks = chunk_layout(n, budget)
    scores = mass[:prefix].reshape(-1, 8).sum(-1)
    scores[0] = torch.inf
    chunks = scores.topk(picks).indices.sort().values
    return torch.cat([(chunks[:, None] * 8 + torch.arange(8)).flatten(), torch.arange(prefix, n)])


def test_the_kept_chunks_are_those_of_most_mass():
    mass = torch.zeros(64)
    mass[[17, 42, 43]] = 1.0  # chunks 2 and 5; room for chunk 0 and two more beside the tail

    def view(mass, committed, budget):
        return refresh.chunk_view(mass[None], committed[None], budget)[0].nonzero()[:, 0]

    every = torch.ones(64, dtype=torch.bool)
    assert view(mass, every, 39).tolist() == [*range(8), *range(16, 24), *range(40, 48),
                                              *range(56, 64)]
    assert view(mass, every, 31).tolist() == [*range(8), *range(40, 48), *range(56, 64)]
    # Holes in the slot table: the layout counts committed tokens, not slots.
    holes = torch.ones(80, dtype=torch.bool)
    holes[[3, 30, 31, 50, 51, 52, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79]] = False
    spread = torch.zeros(80)
    spread[holes] = mass
    assert view(spread, holes, 39).equal(holes.nonzero()[:, 0][view(mass, every, 39)])
    assert view(mass[:20], every[:20], 23).tolist() == list(range(20))


def test_the_refresh_layer_finds_a_copy_outside_the_window(copier, one_thread):
    model, loss = copier
    assert loss < 0.1  # it copies from PERIOD tokens back
    prompts_ = [seq[:PERIOD + n].tolist()
                for seq, n in zip(planted_copies(4, PERIOD, seed=1000), (6, 10, 14, 8),
                                  strict=True)]
    view = Policy("sink_window", budget=32)

    def acceptance(**kw):
        out = batched.unsynchronized(model, prompts_, 24, batched.fixed(4), view, **kw)
        return sum(sum(r.accepted) for r in out.rows) / sum(r.proposed for r in out.rows)

    assert acceptance() < 0.2  # sink and window miss the copied token
    assert acceptance(refresh=1) > 0.8


def test_a_refresh_layer_the_model_lacks_is_a_clear_error(model):
    with pytest.raises(DecodelabError, match="'batched.refresh_layer': layer 9 of a model"):
        batched.unsynchronized(model, prompts(3), 4, per_row_k, CHUNKED, refresh=9)
    with pytest.raises(DecodelabError, match="view of at least 23 tokens, got 8"):
        batched.unsynchronized(model, prompts(3), 4, per_row_k, SPARSE, refresh=0)


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


@pytest.mark.parametrize("mode", ["synchronized", "unsynchronized", "refreshed"])
def test_a_sampled_row_of_a_batch_keeps_the_target_law(one_thread, mode, monkeypatch):
    # The cheapest level that sees the whole loop (as test_longctx's): two tokens at vocabulary
    # 8, their law enumerated from the target alone; keeping every draft token must be rejected.
    # In the refreshed batch the refresh keeps none of the cache for the layers after it: a
    # view of the 23 tokens of most mass drafts so close to this target that the control passes.
    monkeypatch.setattr(refresh, "chunk_view",
                        lambda mass, committed, budget: torch.zeros_like(committed))
    target, draft = peaked_llama(6), peaked_llama(7)
    batch, s = [tokens(n, seed=n, vocab=8) for n in (5, 24, 13)], Sampling(temperature=1.0)
    with torch.inference_mode():
        law = eq.ar_law(lambda ctx: torch.softmax(
            target(torch.tensor([batch[1] + list(ctx)])).logits[0, -1].double(), -1), 2)

    def run(rule, gens):
        if mode == "synchronized":
            return batched.synchronized(target, draft, batch, 2, 1, s, *gens, accept=rule)
        if mode == "refreshed":
            return batched.unsynchronized(target, batch, 2, batched.fixed(1), CHUNKED, s, *gens,
                                          accept=rule, refresh=0)
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
