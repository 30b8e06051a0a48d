import copy

import pytest
import torch
from llama import ORACLE, draft_logits, tiny_llama, tokens
from transformers import DynamicCache

from decodelab.core.errors import DecodelabError
from decodelab.engines.sparse_kv import POLICIES, Policy, QueryProbe, sparse_view
from decodelab.engines.speculative import feed


def full_cache(model, ids):
    """The full cache of `ids` and the queries of its latest token, per layer."""
    cache = DynamicCache(config=model.config)
    with QueryProbe(model) as probe:
        feed(model, cache, torch.tensor(ids))
    return cache, probe.at(-1)


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("n", [100, 141])
def test_sparse_draft_equals_a_masked_full_cache_forward(model, oracle_model, name, n):
    context, ids = tokens(n), tokens(4, seed=1)
    cache, queries = full_cache(model, context)
    selection = Policy(name, budget=40, seed=3).select(cache, queries)
    for kept in selection:
        assert kept.shape[1] == n if name == "full" else 40 - 16 < kept.shape[1] <= 40
        assert bool((kept.diff(dim=-1) > 0).all())
    got = draft_logits(model, cache, selection, ids)
    ORACLE.update(selection=selection, n=n)
    oracle_cache = copy.deepcopy(cache)
    want = torch.stack([feed(oracle_model, oracle_cache, torch.tensor([t]))[-1] for t in ids])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    dense = torch.stack([feed(model, cache, torch.tensor([t]))[-1] for t in ids])
    if name == "full":
        torch.testing.assert_close(got, dense, atol=1e-5, rtol=1e-5)
    else:  # the selection matters: the sparse draft is not the full one
        assert (got - dense).abs().max() > 1e-3


def test_the_oracle_rejects_a_draft_at_physical_positions(model, oracle_model):
    # Negative control: the default position_ids (the view's length) rotate queries wrongly.
    cache, _ = full_cache(model, tokens(100))
    selection = Policy("sink_window", budget=40).select(cache)
    wrong = feed(model, sparse_view(cache, selection), torch.tensor([5]))[-1]
    ORACLE.update(selection=selection, n=100)
    want = feed(oracle_model, copy.deepcopy(cache), torch.tensor([5]))[-1]
    assert (wrong - want).abs().max() > 1e-3


def test_retrieval_differs_per_head_and_keeps_chunk_zero_and_the_window(model):
    cache, queries = full_cache(model, tokens(200))
    selection = Policy("retrieval", budget=48).select(cache, queries)
    assert any(not torch.equal(kept[0], kept[1]) for kept in selection)
    for kept in selection:
        assert bool((kept[:, :8] == torch.arange(8)).all())
        assert bool((kept[:, -8:] == torch.arange(192, 200)).all())


@pytest.mark.parametrize("name", POLICIES)
def test_a_budget_covering_the_context_keeps_everything(model, name):
    cache, queries = full_cache(model, tokens(60))
    for kept in Policy(name, budget=60).select(cache, queries):
        assert torch.equal(kept, torch.arange(60).expand(2, -1))


def test_random_chunks_are_seeded():
    cache, _ = full_cache(tiny_llama(), tokens(300))
    a, b, c = (Policy("random_chunks", 64, seed).select(cache)[0] for seed in (1, 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_policies_are_clear_errors():
    with pytest.raises(DecodelabError, match="unknown sparse-KV policy 'lru'"):
        Policy("lru", 64)
    with pytest.raises(DecodelabError, match="at least 23 tokens, got 16"):
        Policy("retrieval", 16)


def test_the_probe_records_the_queries_attention_uses(model, oracle_model):
    cache, _ = full_cache(model, tokens(50))
    ORACLE.update(selection=[torch.arange(49).expand(2, -1)] * 2, n=49)
    with QueryProbe(oracle_model) as probe:
        feed(oracle_model, cache, torch.tensor([7]))
    for layer, q in enumerate(probe.at(-1)):
        torch.testing.assert_close(q, ORACLE["queries"][layer])


def test_retrieval_scores_chunks_against_the_query(model):
    # The chunk whose keys best match the given query wins, whichever way the query points.
    cache, queries = full_cache(model, tokens(200))
    keys = cache.layers[0].keys[0]
    for chunk in (3, 17):
        target = keys[:, chunk * 8:(chunk + 1) * 8].mean(1)  # [h_kv, d]
        pointed = [target.repeat_interleave(2, 0) * 100] + queries[1:]
        kept = Policy("retrieval", budget=32).select(cache, pointed)[0]
        assert bool((kept[:, 8:16] == torch.arange(chunk * 8, chunk * 8 + 8)).all())


def test_retrieval_without_queries_is_a_clear_error(model):
    cache, _ = full_cache(model, tokens(100))
    with pytest.raises(DecodelabError, match="queries"):
        Policy("retrieval", budget=32).select(cache)
