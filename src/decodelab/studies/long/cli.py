"""The long-context study's `decodelab` verbs: its measuring job (`long`), its statistics and
figures. Torch is imported inside the verbs, as the CLI's own do."""

from __future__ import annotations

from decodelab.backends.jobs import add_timing, open_job
from decodelab.core.verbs import add_figures_verb, typed


def long_stats(args):
    from decodelab.analysis import stats
    from decodelab.config.settings import Confidence
    from decodelab.core import tables
    from decodelab.studies.long import tables as longstats

    runs = stats.read_raw_runs(args.runs, "long")
    tables.write_group(args.out, "long", longstats.tables(runs, typed(Confidence, args.spec)))



def long_context(args):
    from decodelab.config.settings import LongJob
    from decodelab.core.io import write_raw
    from decodelab.studies.long import run as longstudy

    spec = open_job(args, args.backend, settings=LongJob)
    drafters = dict(d.split("=", 1) for d in args.drafter_dir)
    df = longstudy.run(args.target_dir, args.target, drafters, args.backend, spec, args.repeat)
    write_raw(df, args.out, *longstudy.expected_rows(spec))


def add_verbs(verbs) -> None:
    p = verbs.add_parser("long-stats", help="long-context acceptance, speedup, memory tables")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("--runs", nargs="*", default=[])
    p.set_defaults(func=long_stats)

    add_figures_verb(verbs, "long-figures", "the long-context figures",
                     "decodelab.studies.long.figures:long_figures")

    p = verbs.add_parser("long", help="one process of the long-context study (sparse-KV drafts)")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--target", required=True, help="the target's model name")
    p.add_argument("--drafter-dir", action="append", default=[], metavar="NAME=DIR",
                   help="a separate drafter's model directory (repeatable)")
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--spec", required=True, help="config long, as JSON")
    add_timing(p)
    p.set_defaults(func=long_context)
