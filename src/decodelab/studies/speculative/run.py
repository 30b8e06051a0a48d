"""The speculative-decoding study, one process at a time: a shuffled grid of K x mode x prompt for
one draft/target configuration, with the target's autoregressive baselines, the draft's own step
cost and Hugging Face assisted generation timed beside it; and verification parallelism.

Two baselines: `autoregressive` runs the target alone in the speculative engine's own loop
(`speculative.autoregressive`: same forward path and cache, synchronized at the start and the
end), the one every speedup is over; `autoregressive_stepped` is the latency study's harness
(`decode.decode`, synchronized after every step), kept to show what an unfair baseline adds."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pandas as pd
import torch
from tqdm import tqdm

from decodelab.backends import machine, models
from decodelab.backends.devices import fingerprint, now, set_sdp_backends
from decodelab.backends.llamacpp import load_role, quantized_roles
from decodelab.backends.train import heldout_prompts
from decodelab.config.settings import PASSES, ParallelismJob, SpeculativeJob, parallelism_span
from decodelab.engines.cuda import floor, graphs
from decodelab.engines.decode import decode, new_cache
from decodelab.engines.speculative import (
    Result,
    autoregressive,
    check_vocab,
    feed,
    generate,
    rollback,
)


def generators(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def engine_columns(out: Result) -> dict:
    """Where a run's time went: forward passes, the prompt's, and the engine's own overhead."""
    return {"total_s": out.total_s, "prefill_s": out.prefill_s, "draft_s": out.draft_s,
            "draft_prefill_s": out.draft_prefill_s,
            "draft_prefill_passes": out.draft_prefill_passes, "verify_s": out.verify_s,
            "overhead_s": out.overhead_s, "overhead_share": out.overhead_share,
            "overhead_per_call_s": out.overhead_s / out.target_calls}


def run_speculative(target, draft, prompt, cfg, spec: SpeculativeJob, seed) -> dict:
    s = spec.sampling.in_mode(cfg["mode"])
    out = generate(target, draft, prompt, spec.budget, cfg["k"], s,
                   generators(draft.device.type, seed), generators(target.device.type, seed + 1))
    return {"tokens": out.tokens, **engine_columns(out), "accepted": out.accepted,
            "proposals": out.proposals, "proposed": out.proposed, "target_calls": out.target_calls,
            "proposal_acceptance": out.proposal_acceptance, "alpha": out.alpha(cfg["k"]),
            "tokens_per_call": out.tokens_per_call, "draft_forwards": out.draft_forwards,
            "host_gap_s": out.host_gap_s, "host_gap_share": out.host_gap_share}


def run_autoregressive(model, prompt, cfg, spec, seed) -> dict:
    """The fair baseline: `model` alone in the speculative engine's loop."""
    s = spec.sampling.in_mode(cfg["mode"])
    out = autoregressive(model, prompt, spec.budget, s, generators(model.device.type, seed))
    return {"tokens": out.tokens, **engine_columns(out),
            "step_s": (out.total_s - out.prefill_s) / max(spec.budget - 1, 1),
            "target_calls": out.target_calls}


def run_stepped(model, prompt, cfg, spec, seed, role) -> dict:
    """The latency study's harness: a host sync after every step."""
    s = spec.sampling.in_mode(cfg["mode"])
    ids = torch.tensor([prompt], device=model.device)
    out = decode(model, ids, spec.budget, use_cache=True, temperature=s.temperature,
                 top_k=s.top_k, top_p=s.top_p, generator=generators(model.device.type, seed),
                 role=role)
    return {"tokens": out.tokens, "total_s": out.prefill_s + out.decode_s,
            "prefill_s": out.prefill_s, "step_s": out.decode_s / max(len(out.step_s), 1),
            "target_calls": len(out.tokens)}


@torch.inference_mode()
def run_hf_assisted(target, draft, prompt, cfg, spec, seed) -> dict:
    """`generate(assistant_model=...)` with a constant K, greedy, the full budget (no EOS)."""
    draft.generation_config.num_assistant_tokens = cfg["k"]
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    ids = torch.tensor([prompt], device=target.device)
    start = now(target.device)
    out = target.generate(ids, assistant_model=draft, do_sample=False,
                          max_new_tokens=spec.budget, eos_token_id=None, pad_token_id=0)
    total = now(target.device) - start
    return {"tokens": out[0, len(prompt):].tolist(), "total_s": total}


METHODS = {
    "speculative": lambda t, d, p, c, s, seed: run_speculative(t, d, p, c, s, seed),
    "autoregressive": lambda t, d, p, c, s, seed: run_autoregressive(t, p, c, s, seed),
    "autoregressive_stepped": lambda t, d, p, c, s, seed: run_stepped(t, p, c, s, seed, "target"),
    "draft_autoregressive": lambda t, d, p, c, s, seed: run_autoregressive(d, p, c, s, seed),
    "hf_assisted": lambda t, d, p, c, s, seed: run_hf_assisted(t, d, p, c, s, seed),
}


BASELINES = ["autoregressive", "autoregressive_stepped", "draft_autoregressive"]


def make_grid(spec: SpeculativeJob, same_device: bool) -> list[dict]:
    prompts = range(spec.prompts)
    grid = [{"method": "speculative", "mode": m, "k": k, "prompt": p}
            for m, k, p in itertools.product(spec.modes, spec.ks, prompts)]
    grid += [{"method": method, "mode": m, "k": 0, "prompt": p}
             for method, m, p in itertools.product(
                 BASELINES, spec.modes, prompts)]
    if spec.hf_assisted and same_device and "greedy" in spec.modes:
        grid += [{"method": "hf_assisted", "mode": "greedy", "k": k, "prompt": p}
                 for k, p in itertools.product(spec.ks, prompts)]
    return grid


def hf_peer(pair: dict) -> bool:
    """HF assisted generation runs beside ours: both models in PyTorch, on one device."""
    return pair["target_device"] == pair["draft_device"] and not quantized_roles(pair)


def expected_rows(spec: SpeculativeJob, pair: dict) -> tuple[int, str]:
    """How many rows one process writes, and what they are made of: its raw file's stamp."""
    grid = make_grid(spec, hf_peer(pair))
    methods = ", ".join(f"{n} {m}" for m, n in Counter(c["method"] for c in grid).items())
    return len(grid), (f"K in {list(spec.ks)} x modes {list(spec.modes)} x "
                       f"{spec.prompts} prompts: {methods}")


def load_pair(target_dir, draft_dir, pair: dict):
    target = load_role(target_dir, pair, "target")
    draft = load_role(draft_dir, pair, "draft")
    check_vocab(target, draft)
    return target, draft


def run(target_dir: str, draft_dir: str, pair_name: str, pair: dict, spec: SpeculativeJob,
        repeat: int,
        progress: bool = True) -> pd.DataFrame:
    job = machine.Job()
    set_sdp_backends(spec.sdp_backends, "speculative.sdp_backends")
    key, longest = f"speculative.pairs.{pair_name}.engine", spec.prompt_len + spec.budget
    target, draft = (graphs.engine(m, pair.get("engine", "eager"), key, longest,
                                   max(spec.ks, default=0))
                     for m in load_pair(target_dir, draft_dir, pair))
    prompts = heldout_prompts(target_dir, spec.prompts, spec.prompt_len, spec.seed)
    grid = make_grid(spec, hf_peer(pair))
    shuffle_seed = spec.seed + 7919 * repeat
    random.Random(shuffle_seed).shuffle(grid)
    # Warm-up, untimed; a graph engine at every K and mode, so that it has captured each graph.
    graphed = isinstance(target, graphs.Engine) or isinstance(draft, graphs.Engine)
    ks, modes = (spec.ks, spec.modes) if graphed else ([2], spec.modes[:1])
    warm_up = [("speculative", k, mode) for mode in modes for k in ks]
    baselines = [(method, 0, mode) for mode in modes
                 for method in ("autoregressive", "autoregressive_stepped")]
    for method, k, mode in [*warm_up, *baselines]:
        METHODS[method](target, draft, prompts[0], {"mode": mode, "k": k}, spec, 0)
    floor_columns = floor.columns(target, draft)
    rows = []
    desc = f"speculative {pair_name} rep{repeat}"
    for order, cfg in enumerate(tqdm(grid, desc=desc, disable=not progress, mininterval=1)):
        seed = spec.seed + 1_000 * repeat + order
        with machine.watched() as load:
            result = METHODS[cfg["method"]](target, draft, prompts[cfg["prompt"]], cfg, spec,
                                            seed)
        rows.append({"order": order, **cfg, **result, "sample_seed": seed, **load})
    meta = {"pair": pair_name, **{f"pair_{k}": v for k, v in pair.items()}, "repeat": repeat,
            "budget": spec.budget, "prompt_len": spec.prompt_len,
            "shuffle_seed": shuffle_seed, **fingerprint(pair["target_device"], spec.job_spec()),
            **floor_columns, **job.columns()}
    return pd.DataFrame([{**meta, **row} for row in rows])


def parallelism_job(model_dir: str, model_name: str, backend: str, spec: ParallelismJob,
                    repeat: int) -> pd.DataFrame:
    """One parallelism process (`decodelab parallelism`): `parallelism` on the target in the
    job's dtype, its rows stamped with the job."""
    set_sdp_backends(spec.sdp_backends, "speculative.sdp_backends")
    model = models.load(model_dir, backend, spec.dtype, role="target")
    df = parallelism(model, spec.ks, spec.context, spec.inner, spec.seed + repeat)
    meta = {"backend": backend, "model": model_name, "repeat": repeat,
            **fingerprint(backend, spec.job_spec())}
    return df.assign(**meta)


def parallelism_rows(ks: list[int], inner: int) -> tuple[int, str]:
    """How many rows one parallelism process writes, and what they are made of."""
    return (len(ks) + 1) * inner, f"1 and K+1 tokens for K in {list(ks)} x {inner} inner repeats"


def starts(ns: list[int], context: int, rng: random.Random) -> list[int]:
    """Per pass of ns[i] tokens, the context length it starts from: one that no other pass of as
    many tokens starts from. `generate` meets a new key length at every call, and cuDNN
    attention builds a plan per new length (results/reference/cuda-h200/diagnostics/cudnn_sdpa):
    a fixed length would hide that cost."""
    free = {n: rng.sample(range(context, context + ns.count(n)), ns.count(n)) for n in set(ns)}
    return [free[n].pop() for n in ns]


def seek(model, cache, ctx: torch.Tensor, length: int) -> None:
    """Leave `cache` holding exactly ctx[:length] (untimed)."""
    rollback(cache, length)
    have = cache.get_seq_length()
    if have < length:
        feed(model, cache, ctx[have:length])


@torch.inference_mode()
def parallelism(model, ks: list[int], context: int, inner: int, seed: int) -> pd.DataFrame:
    """Target forward time on K+1 tokens over its time on 1 token at about the same context:
    each row is the mean of PASSES passes, each from a context length in [context, context +
    parallelism_span) that no other pass of as many tokens starts from."""
    job = machine.Job()
    device = model.device
    gen = torch.Generator().manual_seed(seed)
    longest = context + parallelism_span(inner) + max(ks) + 1
    ctx = torch.randint(0, model.config.vocab_size, (longest,), generator=gen).to(device)
    cache = new_cache(model)
    models.require_finite(feed(model, cache, ctx[:context]), model, "target", "on the context")
    rng = random.Random(seed)
    trials = [n for n in [1, *[k + 1 for k in ks]] for _ in range(inner)]
    rng.shuffle(trials)
    trials = [1, 2, *trials]  # the first two rows warm up
    begin = iter(starts([n for n in trials for _ in range(PASSES)], context, rng))
    rows = []
    for n in trials:
        with machine.watched() as load:
            seconds = 0.0
            for _ in range(PASSES):
                at = next(begin)
                seek(model, cache, ctx, at)
                tokens = ctx[at:at + n]
                start = now(device)
                logits = feed(model, cache, tokens)
                seconds += now(device) - start
        rows.append({"tokens": n, "seconds": seconds / PASSES, "passes": PASSES, **load})
    models.require_finite(logits, model, "target", "in the last timed pass")
    return pd.DataFrame(rows[2:]).assign(context=context, **job.columns())
