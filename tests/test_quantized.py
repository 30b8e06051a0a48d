"""The quantized backend: GGUF conversion with llama.cpp's converter, the llama.cpp engine's
logits and KV-cache rollback, speculative decoding over it with the project's rejection rule, and
the verify cost (K+1 tokens over 1) on the CPU build."""

import json
import os
import shutil

import pandas as pd
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make quantized-tools)")

from decodelab.backends import gguf_convert, llamapeer, models, sources
from decodelab.backends.llamacpp import Engine  # noqa: E402
from decodelab.config.settings import GREEDY, QUANT_TYPES, Sampling, SpeculativeJob  # noqa: E402
from decodelab.core.errors import DecodelabError  # noqa: E402
from decodelab.engines.cuda import floor
from decodelab.engines.decode import decode, first_divergence, margin
from decodelab.engines.speculative import generate  # noqa: E402
from decodelab.studies.quantized.run import verify_cost, with_divergence  # noqa: E402
from decodelab.studies.speculative import run as study  # noqa: E402

QUANTIZED = ("Q8_0", "Q4_0")


@pytest.fixture(scope="session")
def ggufs(tiny_pair, tmp_path_factory) -> dict:
    """The tiny trained pair (its own BPE tokenizer), copied and converted once to every type:
    {"target": {type: path}, "draft": {...}, "dirs": {role: model dir}}."""
    root = tmp_path_factory.mktemp("gguf")
    out = {"dirs": {}}
    for role, src in zip(("target", "draft"), tiny_pair, strict=True):
        shutil.copytree(src, root / role)
        out["dirs"][role] = root / role
        out[role] = {t: gguf_convert.convert(root / role, t, root / f"{role}-gguf")
                     for t in QUANT_TYPES}
    return out


def prompt(n=12, seed=0, vocab=512):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine_logits(engine, ids):
    return engine(torch.tensor([ids]), past_key_values=engine.new_cache()).logits[0]


@torch.inference_mode()
def test_f16_gguf_logits_match_pytorch(ggufs):
    """F16 weights round each to 11 significant bits (relative 2^-11); through one layer and the
    head that stays well under 1% of the logits' spread, which is the tolerance. A different
    model (the draft) must fail it."""
    ids = prompt()
    want = models.load(ggufs["dirs"]["target"], "cpu")(torch.tensor([ids])).logits[0].float()
    tolerance = 0.01 * float(want.std())
    got = engine_logits(Engine(ggufs["target"]["F16"]), ids)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) < tolerance
    other = engine_logits(Engine(ggufs["draft"]["F16"]), ids)
    assert float((other - want).abs().max()) > tolerance


@pytest.mark.parametrize("preset", ["gpt2-tiny", "bloom-tiny"])
@torch.inference_mode()
def test_a_model_without_a_tokenizer_converts_in_the_vocabulary_less_mode(tmp_path, preset):
    """`init` models have no tokenizer: GPT-2 and BLOOM, ids in and logits out, same tolerance."""
    sources.prepare({"source": "init", "preset": preset, "seed": 1}, tmp_path / preset)
    ids = prompt(vocab=8192)
    want = models.load(tmp_path / preset, "cpu")(torch.tensor([ids])).logits[0].float()
    got = engine_logits(Engine(gguf_convert.convert(tmp_path / preset, "F16", tmp_path)), ids)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) < 0.01 * float(want.std())


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_rollback_equals_a_fresh_evaluation_of_the_accepted_prefix(ggufs, qtype):
    """The accepted prefix and the rejected draft tokens go in as one batch, as in a verify
    pass; after the rollback the next token's logits equal those after the prefix alone (bit
    for bit on the CPU build; 1e-5 leaves room for another backend's batched kernels)."""
    engine = Engine(ggufs["target"][qtype])
    ids, rejected, nxt = prompt(), prompt(5, seed=1), prompt(1, seed=2)
    engine(torch.tensor([ids]), past_key_values=(cache := engine.new_cache()))
    want = engine(torch.tensor([nxt]), past_key_values=cache).logits[0, -1]

    cache = engine.new_cache()
    engine(torch.tensor([ids + rejected]), past_key_values=cache)
    cache.crop(-len(rejected))
    assert cache.get_seq_length() == len(ids)
    got = engine(torch.tensor([nxt]), past_key_values=cache).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    # The negative control: the same token after the rejected ones, not rolled back.
    stale = engine(torch.tensor([nxt]), past_key_values=cache).logits[0, -1]
    assert not torch.allclose(stale, want, rtol=1e-5, atol=1e-5)


def greedy_agreement(target: Engine, draft, ids: list[int], budget: int, k: int) -> dict:
    """Speculative greedy output against the target's own one-token-at-a-time greedy output;
    where they part, the target's top-2 logit margin there and how far its batched and its
    one-token logits differ at that position."""
    own = decode(target, torch.tensor([ids]), budget).tokens
    got = generate(target, draft, ids, budget, k, GREEDY).tokens
    at = first_divergence(got, own)
    if at is None:
        return {"diverges_at": None}
    prefix = ids + own[:at]
    serial = target(torch.tensor([prefix[:len(ids)]]), past_key_values=(c := target.new_cache()))
    for token in own[:at]:
        serial = target(torch.tensor([[token]]), past_key_values=c)
    batched = engine_logits(target, prefix)[-1]
    return {"diverges_at": at, "margin": margin(target, prefix),
            "rounding": float((batched - serial.logits[0, -1]).abs().max())}


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_greedy_speculative_over_a_quantized_target_equals_its_own_greedy(ggufs, qtype):
    """Equal, or parted only where the target's top two logits are closer than its batched and
    one-token evaluations differ (llama.cpp#25618): rounding, reported, never hidden."""
    target = Engine(ggufs["target"][qtype])
    drafts = {"llama.cpp": Engine(ggufs["draft"][qtype]),
              "pytorch": models.load(ggufs["dirs"]["draft"], "cpu")}
    for name, draft in drafts.items():
        for seed in range(2):
            for k in (1, 4, 8):
                found = greedy_agreement(target, draft, prompt(seed=seed), 24, k)
                if found["diverges_at"] is not None:
                    print(f"{qtype} {name} draft seed {seed} K={k}: {found}")
                    assert found["margin"] <= 2 * found["rounding"], found


def test_sampled_speculative_over_llama_cpp_runs_with_the_projects_rule(ggufs):
    target, draft = Engine(ggufs["target"]["Q4_0"]), Engine(ggufs["draft"]["Q8_0"])
    s = Sampling(temperature=1.0, top_k=0, top_p=1.0)
    out = generate(target, draft, prompt(), 20, 4, s, torch.Generator().manual_seed(0),
                   torch.Generator().manual_seed(1))
    assert len(out.tokens) == 20
    assert all(0 <= t < target.config.vocab_size for t in out.tokens)
    assert out.proposed > 0 and 0 <= out.proposal_acceptance <= 1


def test_verify_cost_gives_k_plus_one_over_one_ratios_on_the_cpu_build(ggufs):
    ks, inner = [1, 4], 3
    rows = verify_cost(Engine(ggufs["target"]["Q4_0"]), ks, context=16, inner=inner, seed=0)
    assert len(rows) == study.parallelism_rows(ks, inner)[0]
    assert set(rows["tokens"]) == {1, 2, 5}
    assert set(rows["backend"]) == {"llama.cpp-Q4_0-cpu"}
    assert rows["llama_cpp_python"].iloc[0] == gguf_convert.llama_cpp_version()
    median = rows.groupby("tokens")["seconds"].median()
    ratios = median.drop(1) / median[1]
    assert (ratios > 0).all() and ratios.notna().all()


def test_an_unsupported_architecture_is_refused_by_name(tmp_path):
    sources.prepare({"source": "init", "preset": "opt-tiny"}, tmp_path / "opt")
    with pytest.raises(DecodelabError, match="OPTForCausalLM"):
        gguf_convert.convert(tmp_path / "opt", "F16", tmp_path / "gguf")
    assert not gguf_convert.gguf_path(tmp_path / "gguf", "F16").exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_gguf_that_does_not_load_is_an_error_naming_the_file(ggufs, tmp_path, damage):
    good = ggufs["target"]["F16"].read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file" * 100 if damage == "garbage" else good[:len(good) // 2])
    with pytest.raises(DecodelabError, match=str(bad)):
        Engine(bad)


def test_divergence_columns_name_the_position_and_margin_where_greedy_sequences_part(ggufs):
    """A planted divergence at position 5 is found there with the target's margin at that
    prefix; an equal sequence gets none (the negative control)."""
    target = Engine(ggufs["target"]["Q8_0"])
    ids = prompt()
    own = decode(target, torch.tensor([ids]), 12).tokens
    planted = own[:5] + [(own[5] + 1) % target.config.vocab_size] + own[6:]
    runs = pd.DataFrame([
        {"method": "autoregressive", "mode": "greedy", "prompt": 0, "tokens": own},
        {"method": "speculative", "mode": "greedy", "prompt": 0, "tokens": own},
        {"method": "speculative", "mode": "greedy", "prompt": 0, "tokens": planted},
        {"method": "speculative", "mode": "sampled", "prompt": 0, "tokens": planted}])
    out = with_divergence(runs, target, [ids])
    assert out["diverges_at"].isna().tolist() == [True, True, False, True]
    assert out["diverges_at"][2] == 5
    assert out["divergence_margin"][2] == pytest.approx(margin(target, ids + own[:5]))


def test_a_cpu_build_refuses_a_cuda_engine_by_name(ggufs):
    with pytest.raises(DecodelabError, match="CPU build.*GGML_CUDA"):
        Engine(ggufs["target"]["Q4_0"], device="cuda")


def test_the_verify_cost_verb_writes_a_stamped_raw_file(ggufs, tmp_path):
    from decodelab.cli import main
    from decodelab.core.io import read_raw

    out = tmp_path / "rep0.parquet"
    spec = '{"ks": [1, 2], "context": 8, "inner": 2, "seed": 0, "dtype": "Q4_0"}'
    main(["verify-cost", "--gguf", str(ggufs["target"]["Q4_0"]), "--model", "target",
          "--device", "cpu", "--spec", spec, "--repeat", "0", "--threads", "1",
          "--out", str(out)])
    rows = read_raw(out, "parallelism")
    assert len(rows) == study.parallelism_rows([1, 2], 2)[0]
    assert set(rows["backend"]) == {"llama.cpp-Q4_0-cpu"} and set(rows["model"]) == {"target"}
    assert rows["llama_cpp_gpu_offload"].eq(False).all()


def test_the_verify_verb_checks_a_quantized_pairs_sampled_mode_at_level_three(ggufs, tmp_path,
                                                                               capsys):
    """The equivalence levels apply to a pair with llama.cpp roles: level 3's tests run on the
    GGUF target and draft; the correct rule is kept, and the log-ratio test rejects both wrong
    rules (the negative controls). A llama.cpp role without its file is named."""
    from decodelab.cli import main

    spec = {"alpha": 0.01, "k": 3, "seeds": 1, "seed": 0,
            "exact": {"random_pairs": 1, "vocab_sizes": [2], "concentrations": [1.0],
                      "real_positions": 1, "block_vocab": 2, "block_ks": [1]},
            "monte_carlo": {"draws": 1, "vocab": 2, "block_draws": 1},
            "real": {"tokens": 4000, "budget": 24, "top": 30, "prompts": 2, "power_tokens": 60,
                     "greedy_prompts": 2}}
    pair = {"target": "target", "draft": "draft", "target_device": "cpu", "draft_device": "cpu",
            "dtype": "float32", "target_backend": "llamacpp", "target_quant": "Q8_0",
            "draft_backend": "llamacpp", "draft_quant": "Q8_0"}
    args = ["verify", "--level", "real", "--spec", json.dumps(spec),
            "--target-dir", str(ggufs["dirs"]["target"]), "--draft-dir",
            str(ggufs["dirs"]["draft"]), "--pair", "q8-q8", "--pair-spec", json.dumps(pair),
            "--target-gguf", str(ggufs["target"]["Q8_0"]), "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "none.json")]) == 2
    assert "runs its draft in llama.cpp" in capsys.readouterr().err
    assert not (tmp_path / "none.json").exists()
    out = tmp_path / "real_q8-q8.json"
    assert main([*args, "--draft-gguf", str(ggufs["draft"]["Q8_0"]), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    p = {(r["check"], r["sampler"]): r["p_value"] for r in report["results"]}
    assert report["pair"] == "q8-q8" and len(p) == 6
    assert p[("two-sample chi-square", "correct")] > 0.01
    assert p[("log-ratio t-test", "correct")] > 0.01
    assert p[("log-ratio t-test", "accept_all")] < 0.01
    assert p[("log-ratio t-test", "resample_from_p")] < 0.01
    assert report["greedy"][0]["prompts"] == 2


PEER_BUILT = all(os.access(llamapeer.programs_dir() / name, os.X_OK)
                 for name in (llamapeer.SPECULATIVE, llamapeer.AUTOREGRESSIVE))
needs_peer = pytest.mark.skipif(not PEER_BUILT, reason="llama.cpp's llama-speculative and "
                                "llama-completion are not built (make quantized-peer)")
PEER_SPEC = {"prompts": 1, "prompt_len": 16, "budget": 24, "ks": [1, 4],
             "modes": ["greedy", "sampled"], "temperature": 1.0, "top_k": 0, "top_p": 1.0,
             "hf_assisted": False, "seed": 3}
PEER_JOB = SpeculativeJob.from_spec(PEER_SPEC)


@needs_peer
def test_the_llama_peer_verb_runs_llama_cpps_own_speculative_on_the_gguf_pair(ggufs, tmp_path):
    from decodelab.cli import main
    from decodelab.core.io import read_raw

    out = tmp_path / "rep0.parquet"
    main(["llama-peer", "--pair", "q8-q8", "--target-gguf", str(ggufs["target"]["Q8_0"]),
          "--draft-gguf", str(ggufs["draft"]["Q8_0"]), "--target-dir",
          str(ggufs["dirs"]["target"]), "--device", "cpu", "--spec", json.dumps(PEER_SPEC),
          "--repeat", "0", "--threads", "1", "--out", str(out)])
    rows = read_raw(out, "llama_peer")
    assert len(rows) == llamapeer.expected_rows(PEER_JOB)[0] == 6
    ar, spec = (rows[rows["method"] == m] for m in ("autoregressive", "speculative"))
    assert (ar["tokens"] == 24).all() and ar["evals"].between(23, 24).all()
    assert (spec["tokens"] > 24).all()  # llama-speculative stops past the budget
    assert (spec["drafted"] > 0).all() and (spec["drafted"] % spec["k"] == 0).all()
    assert spec["acceptance"].between(0, 1).all()
    assert (rows["seconds"] > 0).all() and (rows["prompt_tokens"] > 1).all()
    assert set(rows["pair"]) == {"q8-q8"} and rows["background_cpu_share"].notna().all()


@needs_peer
def test_the_peer_accepts_the_greedy_drafts_of_the_target_itself(ggufs):
    """The target drafting for itself is accepted (almost) always in greedy mode: llama.cpp's
    acceptance count is read right; the distilled draft's is lower (the negative control)."""
    target = ggufs["target"]["Q8_0"]
    prompt = llamapeer.prompt_texts(ggufs["dirs"]["target"], PEER_JOB)[0]
    same, other = (llamapeer.speculative_row(target, draft, prompt, 4, "greedy", PEER_JOB, 1,
                                             "cpu", 0)
                   for draft in (target, ggufs["draft"]["Q8_0"]))
    assert same["acceptance"] >= 0.9, same
    assert other["acceptance"] < same["acceptance"], (same, other)


def test_a_missing_peer_program_is_an_error_naming_its_build(ggufs, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODELAB_LLAMA_PEER", str(tmp_path))
    with pytest.raises(DecodelabError, match=r"llama-completion is not built.*quantized-peer"):
        llamapeer.peer_job("q8-q8", ggufs["target"]["Q8_0"], ggufs["draft"]["Q8_0"],
                           ggufs["dirs"]["target"], PEER_JOB, 0, 1, "cpu")


def test_the_peer_refuses_a_model_without_a_tokenizer(model_dir):
    with pytest.raises(DecodelabError, match=r"has no tokenizer.*vocabulary-less"):
        llamapeer.prompt_texts(model_dir, PEER_JOB)


def test_a_llama_cpp_role_has_its_weight_bytes_and_its_devices_bandwidth(ggufs):
    """The bandwidth floor of a quantized role: llama.cpp's count of its tensors' bytes, which
    shrinks with the type (16 bits a weight in F16, 8.5 in Q8_0, 4.5 in Q4_0, where a tensor's
    rows allow), and the copy bandwidth of the CPU it computes on."""
    n = sum(p.numel() for p in models.load(ggufs["dirs"]["target"], "cpu").parameters())
    sizes = {t: floor.weight_bytes(Engine(ggufs["target"][t])) for t in ("F16", "Q8_0", "Q4_0")}
    assert 1.5 * n < sizes["F16"] < 4 * n
    assert sizes["Q4_0"] < sizes["Q8_0"] < sizes["F16"]
    columns = floor.columns(Engine(ggufs["target"]["Q8_0"]), Engine(ggufs["draft"]["F16"]))
    assert columns["target_weight_bytes"] == sizes["Q8_0"]
    assert columns["target_bandwidth"] == columns["draft_bandwidth"] > 1e8  # one CPU, once
