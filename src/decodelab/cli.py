"""`decodelab <verb>`: one verb per pipeline stage; every Snakemake rule calls one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import DecodelabError


def prepare_model(args):
    from . import models

    models.prepare(json.loads(args.spec), args.out)


def sweep(args):
    import torch

    from . import sweep as sw
    from .devices import backend_available, why_unavailable
    from .io import write_table

    if not backend_available(args.backend):
        raise DecodelabError(f"backend {args.backend!r} is not available on this host: "
                             f"{why_unavailable(args.backend)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = json.loads(args.spec)
    df = sw.run(args.model_dir, args.model, args.backend, spec, args.repeat, args.experiment)
    write_table(df, args.out)


def collect(args):
    from . import stats
    from .io import write_table

    runs = stats.read_runs(args.runs, args.host)
    write_table(runs, args.out)
    write_table(stats.environment_table(runs), args.environment)


def skipped(args):
    import pandas as pd

    from .devices import why_unavailable
    from .io import write_table

    rows = [{"host": args.host, "backend": b, "reason": why_unavailable(b)} for b in args.backends]
    write_table(pd.DataFrame(rows, columns=["host", "backend", "reason"]), args.out)


def statistics(args):
    from . import stats
    from .io import read_table, write_table

    spec = json.loads(args.spec)
    runs = read_table(args.runs)
    ci = (spec["confidence"], spec["bootstrap_resamples"], spec["seed"])
    write_table(stats.latency_table(runs, *ci), args.latency)
    write_table(stats.kv_speedup_table(runs, *ci), args.kv)


def regimes(args):
    import pandas as pd

    from . import regimes as rg
    from .io import read_table, write_table
    from .stats import per_process

    spec = json.loads(args.spec)
    runs = per_process(read_table(args.runs))
    by = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]
    tables = [rg.detect_spikes(runs, value=m, by=by, window=spec["window"],
                               threshold=spec["threshold"], consistency=spec["consistency"],
                               alpha=spec["alpha"])
              for m in ("total_s", "prefill_s", "decode_s")]
    write_table(pd.concat(tables, ignore_index=True), args.out)


def figures(args):
    from . import figures as fg
    from .io import read_table

    stats_dir, out = Path(args.stats), Path(args.out)
    fg.latency_figure(read_table(stats_dir / "latency.csv"),
                      read_table(stats_dir / "regimes.csv"), out / "latency")
    fg.kv_figure(read_table(stats_dir / "kv_speedup.csv"), out / "kv_speedup")


def settings(args):
    from .io import write_json

    write_json(json.loads(args.spec), args.out)


def paper(args):
    from . import paper as pp

    settings = json.loads(Path(args.settings).read_text())
    pp.build(Path(args.sources), Path(args.stats), Path(args.figures), settings,
             Path(args.build_dir), Path(args.out))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decodelab", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    p = verbs.add_parser("prepare-model", help="materialize a model (hf/local/init) as a HF dir")
    p.add_argument("--spec", required=True, help="the model's config entry, as JSON")
    p.add_argument("--out", required=True)
    p.set_defaults(func=prepare_model)

    p = verbs.add_parser("sweep", help="time one process's shuffled grid on one backend")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--experiment", required=True, choices=["sweep", "ablation"])
    p.add_argument("--repeat", type=int, required=True)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--spec", required=True, help="the sweep settings, as JSON")
    p.add_argument("--out", required=True)
    p.set_defaults(func=sweep)

    p = verbs.add_parser("collect", help="merge raw runs into one tidy table")
    p.add_argument("--host", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--environment", required=True)
    p.add_argument("runs", nargs="+")
    p.set_defaults(func=collect)

    p = verbs.add_parser("skipped", help="record backends requested but absent on this host")
    p.add_argument("--host", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("backends", nargs="*")
    p.set_defaults(func=skipped)

    p = verbs.add_parser("stats", help="medians with bootstrap CIs; KV-cache speedups")
    p.add_argument("--runs", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--latency", required=True)
    p.add_argument("--kv", required=True)
    p.set_defaults(func=statistics)

    p = verbs.add_parser("regimes", help="flag latency spikes against the local trend")
    p.add_argument("--runs", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=regimes)

    p = verbs.add_parser("figures", help="draw the figures from the stats tables")
    p.add_argument("--stats", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=figures)

    p = verbs.add_parser("settings", help="record the settings the paper states")
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=settings)

    p = verbs.add_parser("paper", help="generate macros and tables, then build the PDF")
    p.add_argument("--sources", required=True)
    p.add_argument("--stats", required=True)
    p.add_argument("--figures", required=True)
    p.add_argument("--settings", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=paper)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except DecodelabError as err:
        print(f"decodelab {args.verb}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
