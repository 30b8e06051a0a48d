import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from llama import LLAMA, PERIOD, planted_copies, tiny_llama, tokens
from transformers import DynamicCache

from decodelab.backends import models, sources, train
from decodelab.config import settings as cfg
from decodelab.config.check import schema_problem
from decodelab.config.settings import Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines.decode import decode
from decodelab.engines.longctx import SeparateDraft, first_draft_log_probs, generate
from decodelab.engines.sparse_kv import POLICIES, Policy
from decodelab.engines.speculative import Spans, feed
from decodelab.studies.verification import equivalence as eq

ROOT = Path(__file__).resolve().parents[1]
RUNS = 300  # per rule, in the sampled-law check


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=4)


@pytest.mark.parametrize("name", POLICIES)
def test_greedy_self_speculation_equals_target_greedy(model, name):
    prompt = tokens(120, seed=2)
    want = decode(model, torch.tensor([prompt]), 30).tokens
    for k in (1, 3, 6):
        got = generate(model, prompt, 30, k, Policy(name, budget=32, seed=1))
        assert got.tokens == want, f"K={k}"
        assert sum(got.accepted) + got.target_calls == 30


@pytest.mark.parametrize("name", POLICIES)
def test_a_budget_covering_the_context_drafts_exactly_the_target(model, name):
    for mode in (Sampling(), Sampling(temperature=1.0)):
        out = generate(model, tokens(50), 33, 4, Policy(name, budget=100), mode,
                       torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
        assert out.proposal_acceptance == 1.0
        assert out.target_calls == 7  # 6 calls of 4+1 tokens, then one of 2+1 for the last 3


def test_a_small_budget_is_rejected_sometimes(model):
    # The control of the one above: the sparse draft is not the target's. Its law is close to
    # the target's: a run of 40 tokens keeps every proposal about one time in three, of 120
    # about one in eight; 4 runs of 120.
    rates = [generate(model, tokens(200), 120, 4, Policy("sink_window", budget=8),
                      Sampling(temperature=1.0), torch.Generator().manual_seed(seed),
                      torch.Generator().manual_seed(seed + 1)).proposal_acceptance
             for seed in range(4)]
    assert min(rates) < 1.0


def two_token_counts(model, prompt, rule, runs, policy, s, drafter=None):
    counts = {}
    for i in range(runs):
        out = generate(model, prompt, 2, 1, policy, s, torch.Generator().manual_seed(2 * i),
                       torch.Generator().manual_seed(2 * i + 1), accept=rule, drafter=drafter)
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
    return counts


def peaked_llama(seed):
    model = tiny_llama(seed=seed, vocab=8)
    model.lm_head.weight.data *= 10  # peaked enough that the sparse draft's law is far from p
    return model


@pytest.mark.parametrize("drafter_seed", [None, pytest.param(7, marks=pytest.mark.slow)],
                         ids=["self", "drafter"])
def test_sampled_sparse_speculation_emits_the_target_law(one_thread, drafter_seed):
    # Two tokens at vocabulary 8: the law of (x1, x2) against the target's, enumerated; the rule
    # that keeps every draft token (it emits the sparse draft's law) must be rejected.
    model = peaked_llama(6)
    drafter = None if drafter_seed is None else peaked_llama(drafter_seed)
    prompt, s = tokens(24, seed=3, vocab=8), Sampling(temperature=1.0)
    with torch.inference_mode():
        law = eq.ar_law(lambda ctx: torch.softmax(
            model(torch.tensor([prompt + list(ctx)])).logits[0, -1].double(), -1), 2)
    outcomes = sorted(law)
    expected = np.array([law[y] for y in outcomes])
    policy = Policy("sink_window", budget=5)
    p_values = {}
    for name in ("correct", "accept_all"):
        counts = two_token_counts(model, prompt, eq.SAMPLERS[name], RUNS, policy, s, drafter)
        observed = np.array([counts.get(y, 0) for y in outcomes])
        assert observed.sum() == RUNS
        p_values[name] = eq.goodness_of_fit(observed, expected)["p_value"]
    assert p_values["correct"] > 1e-3, p_values
    assert p_values["accept_all"] < 1e-3, p_values


# a separate drafter with its own sparse cache


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(seed=5)


@pytest.mark.parametrize("name", POLICIES)
def test_greedy_with_a_sparse_drafter_equals_target_greedy(model, drafter, name):
    prompt = tokens(120, seed=2)
    want = decode(model, torch.tensor([prompt]), 30).tokens
    for k in (1, 4):
        got = generate(model, prompt, 30, k, Policy(name, budget=32, seed=1), drafter=drafter)
        assert got.tokens == want, f"K={k}"
        assert sum(got.accepted) + got.target_calls == 30
        assert got.draft_forwards == got.proposed + got.target_calls  # one catch-up per call


@pytest.mark.parametrize("name", POLICIES)
def test_a_drafter_equal_to_the_target_with_a_covering_budget_is_always_accepted(model, name):
    twin = copy.deepcopy(model)
    for mode in (Sampling(), Sampling(temperature=1.0)):
        out = generate(model, tokens(50), 33, 4, Policy(name, budget=100), mode,
                       torch.Generator().manual_seed(0), torch.Generator().manual_seed(1),
                       drafter=twin)
        assert out.proposal_acceptance == 1.0


def test_a_twin_drafter_with_a_small_budget_is_rejected_sometimes(model):
    # The control of the one above, once for every policy there (it uses none of them): a small
    # budget makes the twin's draft differ from the target's (4 runs, as in the control of the
    # self-drafting test).
    twin = copy.deepcopy(model)
    rates = [generate(model, tokens(200), 120, 4, Policy("sink_window", budget=8),
                      Sampling(temperature=1.0), torch.Generator().manual_seed(seed),
                      torch.Generator().manual_seed(seed + 1), drafter=twin).proposal_acceptance
             for seed in range(4)]
    assert min(rates) < 1.0


def test_the_drafters_full_cache_holds_every_accepted_token_as_full_attention_computes_it(
        drafter):
    seq = tokens(90, seed=4)
    draft = SeparateDraft(drafter, None)
    for end in (60, 61, 75, 90):  # the prompt, then acceptances of 0, 13 and 14 tokens
        draft.view(seq[:end], Policy("sink_window", budget=16), Spans(), torch.device("cpu"))
    assert draft.passes == 4
    fresh = DynamicCache(config=drafter.config)
    with torch.no_grad():
        feed(drafter, fresh, torch.tensor(seq[:89]))
    for ours, want in zip(draft.cache.layers, fresh.layers, strict=True):
        torch.testing.assert_close(ours.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, want.values, atol=1e-5, rtol=1e-5)


def test_a_drafter_of_another_vocabulary_is_a_clear_error(model):
    with pytest.raises(DecodelabError, match="vocabularies differ"):
        generate(model, tokens(20), 4, 2, Policy("full"), drafter=tiny_llama(vocab=32))


def test_a_one_token_prompt_starts_from_an_empty_cache(model):
    want = decode(model, torch.tensor([[3]]), 40).tokens
    assert generate(model, [3], 40, 3, Policy("retrieval", budget=24)).tokens == want


def test_an_empty_prompt_is_a_clear_error(model):
    with pytest.raises(DecodelabError, match="at least one token"):
        generate(model, [], 4, 2, Policy("full"))


def test_retrieval_beats_random_chunks_on_planted_copies(copier, one_thread):
    model, loss = copier
    assert loss < 0.1  # it copies
    prompts = [seq[:PERIOD + 10].tolist() for seq in planted_copies(3, PERIOD, seed=1000)]
    acceptance = {name: np.mean([generate(model, p, 24, 4, Policy(name, 32, seed=i))
                                 .proposal_acceptance for i, p in enumerate(prompts)])
                  for name in POLICIES}
    assert acceptance["full"] == 1.0
    assert acceptance["retrieval"] > acceptance["random_chunks"] + 0.2, acceptance
    assert acceptance["random_chunks"] < 0.5, acceptance


# the long-context model source


def test_a_train_llama_is_a_rotary_model_on_the_hashed_corpus(tmp_path):
    sources.prepare(LLAMA, tmp_path / "m")
    model = models.load(tmp_path / "m", "cpu")
    assert model.config.model_type == "llama"
    info = models.read_manifest(tmp_path / "m")
    assert info["family"] == "llama"
    assert info["corpus"]["sha256"] == train.corpus_digest(train.corpus_files(0.4))
    assert info["final_train_loss"] < info["initial_train_loss"]
    assert cfg.model_family(LLAMA) == "llama"
    assert cfg.model_family(LLAMA | {"arch": "gpt2"}) == "gpt2"


def test_an_unknown_arch_is_refused_by_key(tmp_path):
    with pytest.raises(DecodelabError, match="'arch'"):
        sources.prepare(LLAMA | {"arch": "mamba"}, tmp_path / "m")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["models"]["target"]["arch"] = "mamba"
    assert "arch" in schema_problem(config, ROOT / "workflow/schemas/config.schema.yaml")
    config["models"]["target"]["arch"] = "llama"
    assert schema_problem(config, ROOT / "workflow/schemas/config.schema.yaml") is None


@pytest.mark.parametrize("name", ["sink_window", "retrieval"])
@pytest.mark.parametrize("separate", [False, True], ids=["self", "drafter"])
def test_the_first_draft_steps_law_is_the_engines(model, drafter, name, separate):
    # With K = 1 every draft is a proposal's first: the law the rule received at each proposal
    # must be first_draft_log_probs' at that token (the verification's log-ratio statistic).
    laws = []

    def recording(p, q, drafted, generator=None):
        laws.append(q[0].log())
        return eq.SAMPLERS["correct"](p, q, drafted, generator)

    prompt, policy = tokens(60, seed=8), Policy(name, budget=24)
    out = generate(model, prompt, 12, 1, policy, Sampling(temperature=1.0),
                   torch.Generator().manual_seed(0), torch.Generator().manual_seed(1),
                   accept=recording, drafter=drafter if separate else None)
    ids, at = prompt + out.tokens, len(prompt)
    want = first_draft_log_probs(drafter if separate else model, policy, ids, at)
    for law, n in zip(laws, out.accepted, strict=True):  # proposals at len(prompt), ...
        torch.testing.assert_close(law[ids[at]].float(), want[at - len(prompt)], atol=1e-4,
                                   rtol=1e-4)
        at += n + 1
    # the control: the full cache's law is another one
    full = eq.full_log_probs(model)(ids, len(prompt))
    assert (full - want).abs().max() > 1e-2
