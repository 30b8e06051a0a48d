"""The batched-speculation study's `decodelab` verbs: its measuring job (`batched`), its
statistics and figures. Torch is imported inside the verbs, as the CLI's own do."""

from __future__ import annotations

from decodelab.backends.jobs import add_timing, open_job
from decodelab.core.verbs import add_figures_verb, typed


def batched_stats(args):
    from decodelab.analysis import stats
    from decodelab.config.settings import Confidence
    from decodelab.core import tables
    from decodelab.studies.batched import tables as batchstats

    runs = stats.read_raw_runs(args.runs, "batched")
    costs = stats.read_raw_runs(args.costs, "batched")
    tables.write_group(args.out, "batched", batchstats.tables(
        runs, costs, typed(Confidence, args.spec)))



def batched_throughput(args):
    from decodelab.config.settings import BatchedJob
    from decodelab.core.io import write_raw
    from decodelab.studies.batched import run as batchstudy

    spec = open_job(args, args.backend, settings=BatchedJob)
    runs, costs = batchstudy.run(args.target_dir, args.draft_dir, args.backend, spec,
                                 args.repeat)
    write_raw(costs, args.costs, len(costs), "forward timings of the cost model")
    write_raw(runs, args.out, *batchstudy.expected_rows(spec))


def add_verbs(verbs) -> None:
    p = verbs.add_parser("batched-stats", help="batched throughput, verification overhead and "
                                               "scheduler-simulator tables")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("--runs", nargs="*", default=[])
    p.add_argument("--costs", nargs="*", default=[], help="the runs' forward timings")
    p.set_defaults(func=batched_stats)

    add_figures_verb(verbs, "batched-figures", "the batched-speculation figures",
                     "decodelab.studies.batched.figures:batched_figures")

    p = verbs.add_parser("batched", help="tokens/s of batched AR, synchronized and "
                                         "non-synchronized speculation, per batch size")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--draft-dir", required=True)
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--spec", required=True, help="config batched (its job_spec), as JSON")
    p.add_argument("--costs", required=True, help="parquet of the cost model's forward timings")
    add_timing(p)
    p.set_defaults(func=batched_throughput)
