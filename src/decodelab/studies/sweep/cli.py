"""The latency study's `decodelab` verbs: its measuring job (`sweep`), its statistics,
regimes, regimes in depth and figures. Torch is imported inside the verbs, as the CLI's own do."""

from __future__ import annotations

from pathlib import Path

from decodelab.backends.jobs import add_timing, open_job
from decodelab.core.verbs import add_figures_verb, read_verdicts, typed


def statistics(args):
    from decodelab.config.settings import Confidence
    from decodelab.core.io import read_table, write_table
    from decodelab.studies.sweep import tables as sweep_tables

    runs, ci = read_table(args.runs), typed(Confidence, args.spec)
    verdict = read_verdicts(args.verdicts, "sweep")
    write_table(sweep_tables.latency_table(runs, ci, verdict), args.latency)
    write_table(sweep_tables.kv_speedup_table(runs, ci, verdict), args.kv)


def regimes(args):
    from decodelab.analysis import regimes as rg
    from decodelab.analysis import stats
    from decodelab.config.settings import SpikeRule
    from decodelab.core.io import read_table, write_table

    rule = typed(SpikeRule, args.spec)
    runs = read_table(args.runs)
    verdict = read_verdicts(args.verdicts, "sweep")
    write_table(rg.spike_table(stats.per_process(runs), rule, verdict), args.out)


def regime_depth(args):
    from decodelab.config.settings import Regimes
    from decodelab.core import tables
    from decodelab.studies.sweep.depth import depth_tables

    frames = depth_tables(Path(args.runs), Path(args.regimes), typed(Regimes, args.spec))
    tables.write_group(args.out, "regime_depth", frames)



def sweep(args):
    from decodelab.config.settings import SweepJob
    from decodelab.core.io import write_raw
    from decodelab.studies.sweep import run as sw

    spec = open_job(args, args.backend, settings=SweepJob)
    df = sw.run(args.model_dir, args.model, args.backend, spec, args.repeat, args.experiment)
    write_raw(df, args.out, *sw.expected_rows(spec, args.experiment))


def add_verbs(verbs) -> None:
    p = verbs.add_parser("stats", help="medians with bootstrap CIs; KV-cache speedups")
    p.add_argument("--runs", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--verdicts", required=True, help="stats/verdicts_sweep.csv")
    p.add_argument("--latency", required=True)
    p.add_argument("--kv", required=True)
    p.set_defaults(func=statistics)

    p = verbs.add_parser("regimes", help="flag latency spikes against the local trend")
    p.add_argument("--runs", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--verdicts", required=True, help="stats/verdicts_sweep.csv")
    p.add_argument("--out", required=True)
    p.set_defaults(func=regimes)

    p = verbs.add_parser("regime-depth", help="spikes by family, prefill vs decode, variance "
                         "between processes, memory correlation, change points")
    p.add_argument("--runs", required=True)
    p.add_argument("--regimes", required=True, help="the regimes rule's table")
    p.add_argument("--spec", required=True, help="the regimes settings, as JSON")
    p.add_argument("--out", required=True, help="the stats directory")
    p.set_defaults(func=regime_depth)

    add_figures_verb(verbs, "figures", "the figures from the stats tables",
                     "decodelab.studies.sweep.figures:draw_all")

    p = verbs.add_parser("sweep", help="time one process's shuffled grid on one backend")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--experiment", required=True, choices=["sweep", "ablation"])
    p.add_argument("--spec", required=True, help="the sweep settings, as JSON")
    add_timing(p)
    p.set_defaults(func=sweep)
