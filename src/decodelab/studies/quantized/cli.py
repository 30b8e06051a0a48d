"""The quantized backend's `decodelab` verbs: its measuring jobs (`verify-cost`, `llama-peer`), its
statistics and figure. Torch is imported inside the verbs, as the CLI's own do."""

from __future__ import annotations

from decodelab.backends.jobs import add_timing, open_job
from decodelab.core.verbs import add_figures_verb, read_verdicts, typed


def quantized_stats(args):
    from decodelab.analysis import stats
    from decodelab.config.settings import Confidence
    from decodelab.core import tables
    from decodelab.studies.quantized import tables as qs

    ci = typed(Confidence, args.spec)
    verify = stats.read_raw_runs(args.verify_cost, "parallelism")
    runs = stats.read_raw_runs(args.runs, "speculative")
    peer = stats.read_raw_runs(args.peer, "llama_peer")
    speedup = tables.read(args.stats, "speculative_speedup")
    acceptance = tables.read(args.stats, "speculative_acceptance")
    tables.write_group(args.out, "quantized", {
        "verify_cost": qs.verify_cost_table(verify, ci,
                                            read_verdicts(args.verdicts, "parallelism")),
        "speculative": qs.speculative_table(runs, speedup),
        "peer": qs.peer_table(peer, speedup, acceptance, ci)})



def verify_cost(args):
    from decodelab.config.settings import ParallelismJob
    from decodelab.core.io import write_raw
    from decodelab.studies.quantized import run as quantized
    from decodelab.studies.speculative.run import parallelism_rows

    spec = open_job(args, args.device, settings=ParallelismJob)
    df = quantized.verify_cost_job(args.gguf, args.model, args.device, spec, args.repeat,
                                   args.threads)
    write_raw(df, args.out, *parallelism_rows(spec.ks, spec.inner))


def llama_peer(args):
    from decodelab.backends import llamapeer
    from decodelab.config.settings import SpeculativeJob
    from decodelab.core.io import write_raw

    spec = open_job(args, args.device, settings=SpeculativeJob)
    df = llamapeer.peer_job(args.pair, args.target_gguf, args.draft_gguf, args.target_dir, spec,
                            args.repeat, args.threads, args.device)
    write_raw(df, args.out, *llamapeer.expected_rows(spec))


def add_verbs(verbs) -> None:
    p = verbs.add_parser("quantized-stats", help="verify cost per type; quantized pairs' rows")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--stats", required=True, help="the stats directory (speculative_speedup)")
    p.add_argument("--out", required=True)
    p.add_argument("--verify-cost", nargs="*", default=[])
    p.add_argument("--verdicts", required=True, help="stats/verdicts_parallelism.csv")
    p.add_argument("--runs", nargs="*", default=[], help="the quantized pairs' raw runs")
    p.add_argument("--peer", nargs="*", default=[], help="llama-peer's raw runs")
    p.set_defaults(func=quantized_stats)

    add_figures_verb(verbs, "quantized-figures", "the quantized backend's figure",
                     "decodelab.studies.quantized.figures:quantized_figures")

    p = verbs.add_parser("verify-cost", help="time K+1-token against 1-token passes in llama.cpp")
    p.add_argument("--gguf", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--device", required=True, choices=["cpu", "cuda"])
    p.add_argument("--spec", required=True, help="config speculative.parallelism, as JSON")
    add_timing(p)
    p.set_defaults(func=verify_cost)
    p = verbs.add_parser("llama-peer", help="llama.cpp's own speculative decoding, GGUF pair")
    p.add_argument("--pair", required=True, help="the configuration's name")
    p.add_argument("--target-gguf", required=True)
    p.add_argument("--draft-gguf", required=True)
    p.add_argument("--target-dir", required=True, help="the target's model (its tokenizer)")
    p.add_argument("--device", required=True, choices=["cpu", "cuda"])
    p.add_argument("--spec", required=True, help="the speculative study's settings, as JSON")
    add_timing(p)
    p.set_defaults(func=llama_peer)
