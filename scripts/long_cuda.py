"""The long-context study on one CUDA host without Snakemake (scripts/long_cuda.sh runs it): train
config/long.yaml's long-context target and its four sparse drafters
(`decodelab.engines.budgetdraft`: budget-robust, one fixed budget, full cache only, no-prefix
control), then run the long-context study (`decodelab.studies.long.run`, what the `long` verb runs)
at each --lengths entry in turn, self-speculation beside the four drafters, and its tables
(`decodelab.studies.long.tables`).

Models go to --models; one whose manifest exists is not trained again, so a second call on a warm
machine goes straight to the study. Under --out: models/<name>/ (manifests and configs),
raw/long/L<length>.parquet, stats/long_*.csv. Every step checks the deadline first and is
skipped, said so, past it. `--smoke` shrinks everything to a check of the logic in about a minute
(on CUDA where there is one).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import traceback
from pathlib import Path

import torch
from gpu_pair import Deadline, log  # scripts/ is on the path of a script run from it

from decodelab.analysis import stats
from decodelab.backends import sources
from decodelab.config.settings import LongJob, load_settings
from decodelab.core import tables
from decodelab.core.io import write_raw
from decodelab.studies.long import run as longstudy
from decodelab.studies.long import tables as longstats

TARGET = "long-target"
DRAFTERS = ("long-robust", "long-fixed", "long-fullonly", "long-noprefix")
TRAIN_S = {TARGET: 150, **dict.fromkeys(DRAFTERS, 75)}  # guesses, for the deadline
SMOKE_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMOKE_MODEL = {"n_layer": 1, "n_embd": 64, "n_head": 2, "n_positions": 640, "corpus_mb": 0.5,
               "seq_len": 320, "batch_size": 2, "steps": 6, "vocab_size": 512,
               "device": SMOKE_DEVICE}
SMOKE_DRAFT = {"continuation": 32}
SMOKE_BUDGETS = [32, 64]
SMOKE_LENGTHS = [256]
SMOKE_STUDY = {"kv_budgets": [32, 64], "ks": [2], "documents": 1, "budget": 8,
               "device": SMOKE_DEVICE, "policies": ["full", "retrieval"],
               "dtype": "bfloat16" if SMOKE_DEVICE == "cuda" else "float32"}


def model_spec(settings, name: str, smoke: bool) -> dict:
    spec = dict(settings.models[name])
    if not smoke:
        return spec
    spec |= SMOKE_MODEL
    if "objective" in spec:
        spec |= SMOKE_DRAFT
    if "budgets" in spec:
        spec["budgets"] = SMOKE_BUDGETS[:len(spec["budgets"])]
        spec.pop("budget_weights", None)  # equal weights
    return spec


def train_models(settings, models: Path, out: Path, deadline: Deadline, smoke: bool
                 ) -> list[str]:
    """The target, then each drafter the deadline allows; the names that are ready."""
    torch.backends.cuda.matmul.allow_tf32 = True
    ready = []
    for name in (TARGET, *DRAFTERS):
        where = models / name
        if not (where / "decodelab.json").is_file():
            if not deadline.allows(f"training {name}", 1 if smoke else TRAIN_S[name]):
                continue
            spec = model_spec(settings, name, smoke)
            log(f"training {name}: {json.dumps(spec)}")
            teacher = models / spec["teacher"] if "teacher" in spec else None
            try:
                sources.prepare(spec, where, teacher_dir=teacher)
            except Exception:
                log(f"FAILED training {name}:\n{traceback.format_exc()}")
                continue
        manifest = json.loads((where / "decodelab.json").read_text())
        log(f"{name}: {manifest['parameters']} parameters, {manifest['objective']}, held-out "
            f"loss {manifest['heldout_loss']:.3f}, {manifest['train_seconds']} s training"
            + (f", greedy agreement {manifest['greedy_agreement']:.3f}"
               if "greedy_agreement" in manifest else ""))
        keep = out / "models" / name
        keep.mkdir(parents=True, exist_ok=True)
        for f in ("decodelab.json", "config.json"):
            shutil.copy(where / f, keep / f)
        ready.append(name)
    return ready


def run_study(settings, models: Path, out: Path, drafters: list[str], lengths: list[int],
              shrink: dict, deadline: Deadline, smoke: bool) -> list[Path]:
    """One raw file per context length, shortest first, while the deadline allows; `shrink`
    overrides config 'long' keys (fewer documents or K for a short device budget)."""
    raw = []
    for length in lengths:
        given = settings.long.job_spec() | shrink | {"lengths": [length],
                                                     "drafters": ["self", *drafters]}
        spec = LongJob.from_spec(given | SMOKE_STUDY if smoke else given)
        runs = len(longstudy.make_grid(spec))
        if not deadline.allows(f"the study at L={length} ({runs} runs)",
                               1 if smoke else runs * length / 8192 * 0.4):  # a guess
            break
        start = time.perf_counter()
        df = longstudy.run(str(models / TARGET), TARGET,
                           {d: str(models / d) for d in drafters}, spec.device, spec, 0,
                           progress=False)
        path = out / "raw/long" / f"L{length}.parquet"
        write_raw(df, path, *longstudy.expected_rows(spec))
        raw.append(path)
        log(f"study L={length}: {len(df)} rows in {time.perf_counter() - start:.0f} s")
    return raw


def write_stats(settings, raw: list[Path], out: Path) -> None:
    frames = longstats.tables(stats.read_raw_runs(raw, "long"), settings.stats)
    for path in tables.write_group(out / "stats", "long", frames):
        log(f"wrote {path}")
    acceptance = frames["acceptance"]
    if len(acceptance):
        print(acceptance.to_string(max_rows=200), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deadline", type=float, default=550, help="seconds for everything")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--config", default="config/long.yaml")
    parser.add_argument("--documents", type=int, help="instead of config long.documents")
    parser.add_argument("--ks", type=int, nargs="+", help="instead of config long.ks")
    parser.add_argument("--document-tokens", type=int, help="draw documents of at least this "
                        "many tokens (default the longest --lengths): the same documents at "
                        "every length when each call runs one")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    deadline = Deadline(args.deadline)
    settings = load_settings(args.config)
    ready = train_models(settings, args.models, args.out, deadline, args.smoke)
    if TARGET not in ready:
        log("no target: no study")
        return
    shrink = {k: v for k, v in (("documents", args.documents), ("ks", args.ks),
                                ("document_tokens", args.document_tokens)) if v}
    raw = run_study(settings, args.models, args.out, [d for d in DRAFTERS if d in ready],
                    SMOKE_LENGTHS if args.smoke else args.lengths, shrink, deadline, args.smoke)
    if raw:
        write_stats(settings, raw, args.out)


if __name__ == "__main__":
    main()
