import copy
from pathlib import Path

import pytest
import torch
import yaml
from llama import LLAMA, ORACLE, draft_logits, tiny_llama

from decodelab.backends import models, sources, train
from decodelab.config.check import schema_problem
from decodelab.config.settings import DraftObjective, draft_objective
from decodelab.core.errors import DecodelabError
from decodelab.engines import budgetdraft
from decodelab.engines.decode import cache_kwarg
from decodelab.engines.sparse_kv import POLICIES, Policy, row_of, select_rows
from decodelab.engines.speculative import feed

ROOT = Path(__file__).resolve().parents[1]
ROBUST = {"objective": "budget_robust", "continuation": 16, "budgets": [24, 40],
          "budget_weights": [0.6, 0.4], "teacher": "t", "arch": "llama", "seq_len": 96}


def without_none(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if v is not None}


def objective(**changes) -> DraftObjective:
    return draft_objective(without_none(ROBUST | changes))


def sequences(n, length, seed=0, vocab=64):
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=2)


@pytest.mark.parametrize("name", POLICIES)
def test_the_sparse_branch_equals_the_masked_full_cache_forward_and_drafting(
        model, oracle_model, name):
    # Two rows (retrieval selects differently per row), 96-token prefixes, 6 continuation tokens.
    x = sequences(2, 102, seed=1)
    prefix, continuation = x[:, :96], x[:, 96:]
    policy = Policy(name, budget=40, seed=3)
    with torch.no_grad():
        cache, queries = budgetdraft.prefill(model, prefix, name == "retrieval")
        selection = select_rows(policy, cache, queries)
        got = budgetdraft.sparse_branch(model, cache, queries, continuation, policy)
        full = model(input_ids=continuation, **{cache_kwarg(model): copy.deepcopy(cache)}).logits
        for i in range(2):
            row = [kept[i] for kept in selection]
            ORACLE.update(selection=row, n=96)
            want = feed(oracle_model, copy.deepcopy(row_of(cache, i)), continuation[i])
            torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)
            drafted = draft_logits(model, row_of(cache, i), row, continuation[i].tolist())
            torch.testing.assert_close(got[i], drafted, atol=1e-5, rtol=1e-5)
    if name == "full":
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    else:  # the selection matters
        assert (got - full).abs().max() > 1e-3
    if name == "retrieval":
        assert any(not torch.equal(kept[0], kept[1]) for kept in selection)


def test_a_drafter_equal_to_its_teacher_has_zero_loss_only_on_the_full_cache():
    model = tiny_llama(seed=2)
    model.lm_head.weight.data *= 10  # peaked: a random model's near-uniform laws hide the cache
    x, gen = sequences(2, 96, seed=2), torch.Generator().manual_seed(0)
    with torch.no_grad():
        exact = budgetdraft.loss(model, model, x, objective(sparse_policy="full"), gen)
        sparse = budgetdraft.loss(model, model, x, objective(sparse_policy="sink_window"), gen)
        blind = budgetdraft.loss(model, model, x, objective(objective="no_prefix", budgets=None,
                                                           budget_weights=None), gen)
    assert abs(exact.item()) < 1e-6
    assert sparse.item() > 1e-3 and blind.item() > 1e-3


def spec(**changes) -> dict:
    return {"seed": 0, "lr": 3e-3, "steps": 20, "seq_len": 64, "batch_size": 2} | ROBUST | changes


@pytest.mark.parametrize("changes", [
    {}, {"sparse_weight": 0.0}, {"budgets": [32], "budget_weights": [1.0]},
    {"sparse_policy": "random_chunks"},
    {"objective": "no_prefix", "budgets": None, "budget_weights": None}],
    ids=["robust", "full-only", "fixed", "random-chunks", "no-prefix"])
def test_the_objective_trains_a_drafter_toward_its_teacher(changes):
    teacher = tiny_llama(seed=9)
    teacher.lm_head.weight.data *= 10  # peaked: far from the drafter's near-uniform start
    data = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(3))
    drafter = tiny_llama(seed=1)
    settings = without_none(spec(**changes))
    held_out = sequences(4, 64, seed=11)

    def held_out_loss():  # one fixed batch and budget draw: no step-to-step noise
        with torch.no_grad():
            return budgetdraft.loss(drafter, teacher, held_out, draft_objective(settings),
                                    torch.Generator().manual_seed(0)).item()

    before = held_out_loss()
    assert len(train.train(drafter, data, settings, teacher)) == 20
    assert held_out_loss() < 0.9 * before


def test_budgets_are_drawn_with_their_weights():
    gen = torch.Generator().manual_seed(0)
    drawn = [budgetdraft.draw_policy(objective(), gen).budget for _ in range(2000)]
    assert set(drawn) == {24, 40}
    assert 0.55 < drawn.count(24) / 2000 < 0.65


# the config keys


def test_the_objective_is_typed_with_budgetdrafts_defaults():
    o = objective(budget_weights=[])
    assert (o.sparse_weight, o.sparse_policy, o.budget_weights) == (0.5, "retrieval", (1.0, 1.0))
    assert draft_objective({"seq_len": 96}) is None


@pytest.mark.parametrize("changes, key", [
    ({"objective": "argmax"}, "objective"),
    ({"teacher": None}, "objective"),
    ({"arch": "gpt2"}, "objective"),
    ({"distill": 0.5}, "distill"),
    ({"continuation": None}, "continuation"),
    ({"continuation": 96}, "continuation"),
    ({"budgets": None}, "budgets"),
    ({"budgets": [24, 80]}, "budgets"),
    ({"budgets": [24.5]}, "budgets"),
    ({"budget_weights": [1.0]}, "budget_weights"),
    ({"budget_weights": [1.0, 0.0]}, "budget_weights"),
    ({"sparse_weight": -1}, "sparse_weight"),
    ({"objective": "no_prefix"}, "budget_weights"),
    ({"objective": None}, "continuation"),
])
def test_bad_objective_keys_are_clear_errors(changes, key):
    with pytest.raises(DecodelabError, match=f"key '{key}'"):
        draft_objective(without_none(ROBUST | changes))


def test_a_budget_below_the_policys_minimum_is_refused_at_validation(tmp_path):
    bad = LLAMA | ROBUST | {"seq_len": 64, "budgets": [16], "budget_weights": [1.0]}
    with pytest.raises(DecodelabError, match="at least 23 tokens, got 16"):
        train.validate(bad, tmp_path)


def test_the_schema_knows_the_keys():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    schema = ROOT / "workflow/schemas/config.schema.yaml"
    config["models"]["draft"] |= {"objective": "budget_robust", "continuation": 16,
                                  "budgets": [24], "sparse_weight": 0.5,
                                  "sparse_policy": "retrieval", "budget_weights": [1.0]}
    assert schema_problem(config, schema) is None
    for key, value in (("objective", "argmax"), ("budgets", [0]), ("sparse_policy", "lru"),
                       ("budget_weights", [-1]), ("sparse_weight", -0.1)):
        broken = copy.deepcopy(config)
        broken["models"]["draft"][key] = value
        assert key in (schema_problem(broken, schema) or ""), key


# the source


@pytest.mark.slow
def test_a_budget_robust_drafter_is_a_train_source_recording_its_objective(tmp_path):
    sources.prepare(LLAMA, tmp_path / "t")
    draft = LLAMA | ROBUST | {"seq_len": 64, "budgets": [24, 32], "budget_weights": [.7, .3],
                              "steps": 8}
    sources.prepare(draft, tmp_path / "d", teacher_dir=tmp_path / "t")
    info = models.read_manifest(tmp_path / "d")
    assert info["draft_objective"]["budgets"] == [24, 32]
    assert info["objective"] == ("KL(teacher || model) on the last 16 tokens: full cache + "
                                 "0.5 * sparse cache (retrieval, budgets 24/32, weights 0.7/0.3)")
    assert info["teacher"] == "t" and 0 <= info["greedy_agreement"] <= 1
    assert models.load(tmp_path / "d", "cpu").config.model_type == "llama"
