"""The long-context study, one process at a time: a shuffled grid of context length L x KV budget
B x policy x drafter x mode x K x held-out document for one long-context target, with the target
alone in the same loop (`speculative.autoregressive`, the fair baseline) at every L, mode and
document, all in this process.

A drafter is `self` (the target drafts from a sparse view of its own cache: `longctx.generate`)
or a separate small model with its own sparse cache (`longctx.generate(..., drafter=model)`).
Each row keeps the per-call accepted counts (`alpha` and `proposal_acceptance` as in
`speculative.Result`), the draft's cost per drafted token beside the target's decode step (the
cost ratio c), the draft view's and the verifier's KV bytes, and the allocator's peak where the
device has one (CUDA).

Prompts are the first L tokens of held-out documents (whole files of the target's held-out
split, the same documents at every L), so the statistics resample documents.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from decodelab.backends import machine, models
from decodelab.backends.devices import fingerprint, memory_snapshot, reset_peak_memory
from decodelab.backends.train import PROMPT_CORPUS_MB, corpus_files, encode, split, texts
from decodelab.config.settings import LongJob
from decodelab.core.errors import DecodelabError
from decodelab.engines import longctx
from decodelab.engines.sparse_kv import Policy
from decodelab.studies.speculative.run import engine_columns, generators, run_autoregressive

SELF = "self"  # the target drafts from its own sparse cache


def heldout_files(model_dir: str | Path) -> list[tuple[str, list[int]]] | None:
    """Every held-out file as (name, token ids): a `train` model's own held-out files (a
    pretrained model's: this standard library's); None for a model without a tokenizer."""
    from transformers import AutoTokenizer

    if not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    manifest = models.read_manifest(model_dir)
    corpus_mb = manifest["spec"]["corpus_mb"] if manifest.get("source") == "train" \
        else PROMPT_CORPUS_MB
    held = split(corpus_files(corpus_mb))[1]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    return [(name, ids) for (name, _), ids in zip(held, encode(tokenizer, texts(held)),
                                                  strict=True)]


def vocab_size(model_dir: str | Path) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir, trust_remote_code=False).vocab_size


def heldout_documents(model_dir: str | Path, n: int, length: int, seed: int, key: str = "long"
                      ) -> list[tuple[str, list[int]]]:
    """n distinct held-out documents of at least `length` tokens, as (name, token ids), drawn
    by seed (`heldout_files`), or, for a model without a tokenizer (`init`), seeded random ids.
    `key`: the config section that asked, named in the error when too few are that long."""
    gen = torch.Generator().manual_seed(seed)
    files = heldout_files(model_dir)
    if files is None:
        return [(f"random{i}", torch.randint(vocab_size(model_dir), (length,),
                                             generator=gen).tolist()) for i in range(n)]
    docs = [(name, ids) for name, ids in files if len(ids) >= length]
    if len(docs) < n:
        lengths = "lengths" if key == "long" else "length"
        raise DecodelabError(f"config '{key}.documents': {n} held-out documents of at least "
                             f"{length} tokens wanted, the target's held-out files have "
                             f"{len(docs)}; ask for fewer or shorter (config '{key}.{lengths}')")
    chosen = sorted(torch.randperm(len(docs), generator=gen)[:n].tolist())
    return [docs[i] for i in chosen]


def kv_bytes(config, tokens: int, element_size: int) -> int:
    """Bytes of keys and values for `tokens` positions in every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * tokens * element_size


def element_size(model) -> int:
    return next(model.parameters()).element_size()


def run_speculative(target, drafter, prompt: list[int], cfg: dict, spec: LongJob, seed: int
                    ) -> dict:
    s = spec.sampling.in_mode(cfg["mode"])
    policy = Policy(cfg["policy"], cfg["kv_budget"], seed=seed)
    out = longctx.generate(target, prompt, spec.budget, cfg["k"], policy, s,
                           generators(target.device.type, seed),
                           generators(target.device.type, seed + 1), drafter=drafter)
    draft = drafter if drafter is not None else target
    held = len(prompt) + spec.budget
    view = held if cfg["policy"] == "full" else min(cfg["kv_budget"], held)
    return {"tokens": out.tokens, **engine_columns(out), "accepted": out.accepted,
            "proposals": out.proposals, "proposed": out.proposed, "target_calls": out.target_calls,
            "proposal_acceptance": out.proposal_acceptance, "alpha": out.alpha(cfg["k"]),
            "tokens_per_call": out.tokens_per_call, "draft_forwards": out.draft_forwards,
            # c's numerator: every draft second (view rebuilds, a drafter's catch-up passes)
            # per drafted token, so that K c t_target is a call's draft time, as theory has it
            "draft_step_s": out.draft_s / out.proposed if out.proposed else float("nan"),
            "draft_kv_bytes": kv_bytes(draft.config, view, element_size(draft))}


def run_baseline(target, drafter, prompt: list[int], cfg: dict, spec: LongJob, seed: int
                 ) -> dict:
    """The fair baseline: the target alone in the speculative engine's loop."""
    return run_autoregressive(target, prompt, cfg, spec, seed)


METHODS = {"speculative": run_speculative, "autoregressive": run_baseline}


def make_grid(spec: LongJob) -> list[dict]:
    docs = range(spec.documents)
    grid = []
    for length, policy, drafter, mode, k, doc in itertools.product(
            spec.lengths, spec.policies, spec.drafters, spec.modes, spec.ks, docs):
        for budget in [0] if policy == "full" else spec.kv_budgets:
            grid.append({"method": "speculative", "length": length, "kv_budget": budget,
                         "policy": policy, "drafter": drafter, "mode": mode, "k": k,
                         "document": doc})
    grid += [{"method": "autoregressive", "length": length, "kv_budget": 0, "policy": "",
              "drafter": "", "mode": mode, "k": 0, "document": doc}
             for length, mode, doc in itertools.product(spec.lengths, spec.modes, docs)]
    return grid


def expected_rows(spec: LongJob) -> tuple[int, str]:
    """How many rows one process writes, and what they are made of: its raw file's stamp."""
    grid = make_grid(spec)
    methods = ", ".join(f"{n} {m}" for m, n in Counter(c["method"] for c in grid).items())
    return len(grid), (f"L in {list(spec.lengths)} x B in {list(spec.kv_budgets)} x "
                       f"policies {list(spec.policies)} x drafters {list(spec.drafters)} "
                       f"x modes {list(spec.modes)} x K in {list(spec.ks)} x "
                       f"{spec.documents} documents: {methods}")


def load_drafters(drafter_dirs: dict[str, str], spec: LongJob, backend: str) -> dict:
    """Drafter name -> model (None for `self`); every named drafter needs its directory."""
    missing = [d for d in spec.drafters if d != SELF and d not in drafter_dirs]
    if missing:
        raise DecodelabError(f"config 'long.drafters': no model directory given for "
                             f"{', '.join(missing)}")
    return {d: None if d == SELF else models.load(drafter_dirs[d], backend, spec.dtype,
                                                  role="draft")
            for d in spec.drafters}


def measured(method, target, drafter, prompt, cfg, spec, seed) -> dict:
    """One run with the machine's state while it ran and the memory it took."""
    reset_peak_memory(target.device)
    with machine.watched() as load:
        result = METHODS[method](target, drafter, prompt, cfg, spec, seed)
    memory = memory_snapshot(target.device)
    return {**result, **load, "peak_bytes": memory["mem_cuda_peak_bytes"],
            "rss_bytes": memory["rss_bytes"]}


def run(target_dir: str, target_name: str, drafter_dirs: dict[str, str], backend: str,
        spec: LongJob, repeat: int, progress: bool = True) -> pd.DataFrame:
    job = machine.Job()
    target = models.load(target_dir, backend, spec.dtype, role="target")
    drafters = load_drafters(drafter_dirs, spec, backend)
    # Documents long enough for `document_tokens` (default the longest L): a run of one length
    # alone then draws the documents the whole grid would.
    shortest = spec.document_tokens or max(spec.lengths)
    docs = heldout_documents(target_dir, spec.documents, shortest, spec.seed)
    grid = make_grid(spec)
    shuffle_seed = spec.seed + 7919 * repeat
    random.Random(shuffle_seed).shuffle(grid)
    warm = {"length": min(spec.lengths), "mode": spec.modes[0], "k": min(spec.ks),
            "policy": spec.policies[0], "kv_budget": min(spec.kv_budgets)}
    for method in METHODS:  # warm-up, untimed
        METHODS[method](target, drafters[spec.drafters[0]], docs[0][1][:warm["length"]],
                        warm, spec, 0)
    element = element_size(target)
    rows = []
    desc = f"long {target_name} rep{repeat}"
    for order, cfg in enumerate(tqdm(grid, desc=desc, disable=not progress, mininterval=1)):
        seed = spec.seed + 1_000 * repeat + order
        name, ids = docs[cfg["document"]]
        prompt = ids[:cfg["length"]]
        result = measured(cfg["method"], target, drafters.get(cfg["drafter"]), prompt, cfg,
                          spec, seed)
        rows.append({"order": order, **cfg, "document_name": name, **result,
                     "verifier_kv_bytes": kv_bytes(target.config, len(prompt) + spec.budget,
                                                   element),
                     "sample_seed": seed})
    meta = {"target": target_name, "repeat": repeat, "budget": spec.budget,
            "dtype": spec.dtype, "shuffle_seed": shuffle_seed,
            **fingerprint(backend, spec.job_spec()), **job.columns()}
    return pd.DataFrame([{**meta, **row} for row in rows])
