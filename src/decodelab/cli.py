"""`decodelab <verb>`: one verb per pipeline stage; every Snakemake rule calls one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from decodelab import studies
from decodelab.config.settings import PREFLIGHT_ENV
from decodelab.core.errors import DecodelabError


def typed(settings: type, text: str, arg: str = "--spec"):
    """A JSON argument as the typed settings of config.py that the rule wrote it from; bad JSON
    or a missing or unknown key is an error naming the argument and the key."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise DecodelabError(f"{arg}: not JSON ({err})") from None
    if not isinstance(spec, dict):
        raise DecodelabError(f"{arg}: expected a JSON object of {settings.__name__}'s keys, "
                             f"got {type(spec).__name__}")
    try:
        return settings.from_spec(spec)
    except DecodelabError as err:
        raise DecodelabError(f"{arg} ({settings.__name__}): {err}") from None


def open_job(args, *backends: str, settings: type | None = None):
    """The opening of every measuring verb: fail early on a missing backend (on a host of
    several GPUs, take one of them), check that the machine is quiet (a verb that times
    something has --machine), set torch's CPU threads (0: torch's default), and return the
    job's settings (--spec) typed as `settings` (config.py); without one (a model's config
    entry, whose keys depend on its source) the JSON as given."""
    # a bad spec fails before torch loads
    if settings is not None:
        spec = typed(settings, args.spec)
    else:
        spec = json.loads(args.spec) if args.spec else None
    import torch

    from decodelab.backends.devices import backend_problem, claim_gpu
    from decodelab.backends.machine import preflight
    from decodelab.config.settings import Machine

    for backend in backends:
        if problem := backend_problem(backend):
            raise DecodelabError(f"backend {backend!r} is not available on this host: {problem}")
    if "cuda" in backends:
        claim_gpu()
    if "machine" in args:
        preflight(typed(Machine, args.machine))
    if args.threads:
        torch.set_num_threads(args.threads)
    return spec


def prepare_model(args):
    from decodelab.backends import sources

    sources.prepare(open_job(args), args.out, teacher_dir=args.teacher_dir,
                    positions_needed=args.positions_needed)


def sweep(args):
    from decodelab.config.settings import SweepJob
    from decodelab.core.io import write_raw
    from decodelab.studies.sweep import run as sw

    spec = open_job(args, args.backend, settings=SweepJob)
    df = sw.run(args.model_dir, args.model, args.backend, spec, args.repeat, args.experiment)
    write_raw(df, args.out, *sw.expected_rows(spec, args.experiment))


def collect(args):
    from decodelab.analysis import stats
    from decodelab.core.io import write_table

    runs = stats.read_runs(args.runs, args.host)
    write_table(runs, args.out)
    write_table(stats.environment_table(runs), args.environment)


def skipped(args):
    import pandas as pd

    from decodelab.core.io import write_table
    from decodelab.core.probe import why_unavailable

    rows = [{"host": args.host, "backend": b, "reason": why_unavailable(b)} for b in args.backends]
    rows += [{"host": args.host, **row} for row in json.loads(args.also)]
    write_table(pd.DataFrame(rows, columns=["host", "backend", "reason"]), args.out)


def read_verdicts(path: str, study: str):
    """A verdicts_<study>.csv table (the `verdicts` verb's), typed."""
    import pandas as pd

    from decodelab.core import tables

    try:
        return tables.typed(pd.read_csv(path), tables.table(f"verdicts_{study}"))
    except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError) as err:
        raise DecodelabError(f"{path}: not a readable verdicts table ({err}); rerun the "
                             "verdicts rule") from err


def verdicts(args):
    from decodelab.analysis import stability, stats
    from decodelab.config.settings import Stability
    from decodelab.core.io import write_table

    runs = stats.read_raw_runs(args.runs, args.study)
    limits = typed(Stability, args.spec)
    write_table(stability.verdicts(runs, stats.STUDIES[args.study], limits), args.out)


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


def selection(args):
    from decodelab.analysis import stats
    from decodelab.analysis.selection import selection_table, spec_cells
    from decodelab.config.settings import Confidence, SpikeRule
    from decodelab.core.io import read_table, write_table

    spec_runs = stats.read_raw_runs(args.speculative, "speculative")
    cells = spec_cells(spec_runs) if len(spec_runs) else spec_runs
    write_table(selection_table(read_table(args.runs), cells,
                                typed(SpikeRule, args.regimes, "--regimes"),
                                typed(Confidence, args.spec)), args.out)


def regime_depth(args):
    from decodelab.config.settings import Regimes
    from decodelab.core import tables
    from decodelab.studies.sweep.depth import depth_tables

    frames = depth_tables(Path(args.runs), Path(args.regimes), typed(Regimes, args.spec))
    tables.write_group(args.out, "regime_depth", frames)


def figures(args):
    from decodelab.studies.sweep.figures import draw_all as draw

    draw(Path(args.stats), Path(args.out))


def speculative(args):
    from decodelab.config.settings import SpeculativeJob
    from decodelab.core.io import write_raw
    from decodelab.studies.quantized import run as quantized
    from decodelab.studies.speculative import run as study

    pair = recorded_pair(args)
    spec = open_job(args, pair["target_device"], pair["draft_device"], settings=SpeculativeJob)
    df = study.run(args.target_dir, args.draft_dir, args.pair, pair, spec, args.repeat)
    df = quantized.with_target_divergence(df, pair, args.target_dir, spec)
    write_raw(df, args.out, *study.expected_rows(spec, pair))


def recorded_pair(args) -> dict:
    """--pair-spec, checked as a typed Pair, as the raw file records it (columns pair_*): its
    keys as given, in their order, with the GGUF files of its llama.cpp roles."""
    from decodelab.config.settings import Pair

    typed(Pair, args.pair_spec, "--pair-spec")
    return json.loads(args.pair_spec) | {
        f"{role}_gguf": path for role, path in
        (("target", args.target_gguf), ("draft", args.draft_gguf)) if path}


def convert_gguf(args):
    from decodelab.backends.gguf_convert import convert

    convert(args.model_dir, args.type, args.out_dir)


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


def long_context(args):
    from decodelab.config.settings import LongJob
    from decodelab.core.io import write_raw
    from decodelab.studies.long import run as longstudy

    spec = open_job(args, args.backend, settings=LongJob)
    drafters = dict(d.split("=", 1) for d in args.drafter_dir)
    df = longstudy.run(args.target_dir, args.target, drafters, args.backend, spec, args.repeat)
    write_raw(df, args.out, *longstudy.expected_rows(spec))


def batched_throughput(args):
    from decodelab.config.settings import BatchedJob
    from decodelab.core.io import write_raw
    from decodelab.studies.batched import run as batchstudy

    spec = open_job(args, args.backend, settings=BatchedJob)
    runs, costs = batchstudy.run(args.target_dir, args.draft_dir, args.backend, spec,
                                 args.repeat)
    write_raw(costs, args.costs, len(costs), "forward timings of the cost model")
    write_raw(runs, args.out, *batchstudy.expected_rows(spec))


def batched_stats(args):
    from decodelab.analysis import stats
    from decodelab.config.settings import Confidence
    from decodelab.core import tables
    from decodelab.studies.batched import tables as batchstats

    runs = stats.read_raw_runs(args.runs, "batched")
    costs = stats.read_raw_runs(args.costs, "batched")
    tables.write_group(args.out, "batched", batchstats.tables(
        runs, costs, typed(Confidence, args.spec)))


def long_stats(args):
    from decodelab.analysis import stats
    from decodelab.config.settings import Confidence
    from decodelab.core import tables
    from decodelab.studies.long import tables as longstats

    runs = stats.read_raw_runs(args.runs, "long")
    tables.write_group(args.out, "long", longstats.tables(runs, typed(Confidence, args.spec)))


def parallelism(args):
    from decodelab.config.settings import ParallelismJob
    from decodelab.core.io import write_raw
    from decodelab.studies.speculative import run as study

    spec = open_job(args, args.backend, settings=ParallelismJob)
    df = study.parallelism_job(args.model_dir, args.model, args.backend, spec, args.repeat)
    write_raw(df, args.out, *study.parallelism_rows(spec.ks, spec.inner))


def speculative_stats(args):
    from decodelab.analysis import stats
    from decodelab.config.settings import Confidence
    from decodelab.core import tables
    from decodelab.studies.speculative import tables as speculative_tables

    ci = typed(Confidence, args.spec)
    runs = stats.read_raw_runs(args.runs, "speculative")
    par = stats.read_raw_runs(args.parallelism, "parallelism")
    st = speculative_tables
    proc = st.spec_per_process(runs)
    acceptance = st.acceptance_table(proc, ci)
    speedup = st.speedup_table(proc, ci, read_verdicts(args.verdicts, "speculative")).merge(
        st.prompt_table(runs, ci), on=st.SPEC_KEYS, how="left")
    tables.write_group(args.out, "speculative", {
        "acceptance": acceptance, "speedup": speedup,
        "theory": speculative_tables.theory_table(proc, speedup, acceptance),
        "hf": speculative_tables.hf_table(proc, runs, ci),
        "parallelism": speculative_tables.parallelism_table(par, ci),
        "floor": speculative_tables.floor_table(runs)})


def stability_tables(args):
    from decodelab.analysis import stability, stats
    from decodelab.config.settings import Stability
    from decodelab.core import tables
    from decodelab.core.io import read_table

    runs = {"sweep": read_table(args.runs),
            "speculative": stats.read_raw_runs(args.speculative, "speculative"),
            "parallelism": stats.read_raw_runs(args.parallelism, "parallelism")}
    studies = [(runs[name], stats.STUDIES[name], read_verdicts(path, name))
               for name, path in zip(runs, args.verdicts, strict=True)]
    frames = stability.stability_tables(studies, typed(Stability, args.spec))
    tables.write_group(args.out, "stability", frames)


def remeasure(args):
    from decodelab.analysis.stability import files_to_remeasure

    files = files_to_remeasure(args.stability)
    if files:
        print("\n".join(files))


def verify(args):
    from decodelab.backends.devices import set_sdp_backends
    from decodelab.config.settings import Pair, Verification
    from decodelab.core.io import write_report
    from decodelab.studies.verification import run as vf

    pair = typed(Pair, args.pair_spec) if args.level == "real" else None
    spec = open_job(args, *(pair.devices if pair else ()), settings=Verification)
    if args.level == "exact":
        out = vf.run_exact(spec, args.target_dir, args.draft_dir, spec.seed)
    elif args.level == "monte-carlo":
        out = vf.run_monte_carlo(spec)
    else:
        gguf = {role: path for role, path in (("target", args.target_gguf),
                                              ("draft", args.draft_gguf)) if path}
        set_sdp_backends(json.loads(args.sdp_backends) if args.sdp_backends else None,
                         "speculative.sdp_backends")
        out = vf.run_real(spec, args.pair, pair, args.target_dir, args.draft_dir, spec.seed,
                          gguf)
    write_report(out, args.out)


def verify_long(args):
    from decodelab.config.settings import LongVerificationJob, Verification
    from decodelab.core.io import write_report
    from decodelab.studies.verification import run as vf

    job = typed(LongVerificationJob, args.long_spec)
    spec = open_job(args, job.device, settings=Verification)
    write_report(vf.run_long(spec, job, args.target_dir, args.draft_dir), args.out)


def verify_rule(report: str) -> str:
    """The rule that writes a report: verification/{exact,monte_carlo,real_<pair>,
    long_<backend>}.json."""
    stem = Path(report).stem
    for prefix in ("real", "long"):
        if stem.startswith(f"{prefix}_"):
            return f"verify_{prefix}"
    return f"verify_{stem}"


REPORT_KEYS = {"levels": "results"}  # a verification table -> its rows' key in the reports


def verification_stats(args):
    import pandas as pd

    from decodelab.core import tables
    from decodelab.core.io import read_report

    reports = [read_report(p, verify_rule(p)) for p in args.reports]
    frames = {}
    for key in (t.key for t in tables.group("verification")):
        rows = [r for report in reports for r in report.get(REPORT_KEYS.get(key, key), [])]
        frames[key] = pd.DataFrame(rows).drop(columns=["detail"], errors="ignore")
    tables.write_group(args.out, "verification", frames)


def verification_figures(args):
    from decodelab.studies.verification.figures import verification_figures as draw

    draw(Path(args.stats), Path(args.out))


def bench(args):
    """Ours against HF assisted generation and plain decoding, side by side in one process: the
    study's settings from --config, greedy, on one of its configurations."""
    from decodelab.config.settings import bench_settings
    from decodelab.core.io import write_table
    from decodelab.studies.speculative import run as study
    from decodelab.studies.speculative import tables as speculative_tables

    pair, spec = bench_settings(args.config, args.pair, ks=args.ks, prompts=args.prompts,
                                budget=args.budget)
    open_job(args, pair.target_device, pair.draft_device)
    runs = study.run(args.target_dir, args.draft_dir, "bench", pair.job_spec(), spec.job(),
                     repeat=0)
    table = speculative_tables.method_ratios(speculative_tables.spec_per_process(runs))
    write_table(table.reset_index(), args.out)
    print(table.round(3).to_string())


def model_table(args):
    import pandas as pd

    from decodelab.backends.models import read_manifest
    from decodelab.core.io import write_table

    rows = [{"model": Path(d).name, **read_manifest(d)} for d in args.model_dirs]
    write_table(pd.DataFrame(rows), args.out)


def spec_figures(args):
    from decodelab.studies.speculative.figures import speculative_figures as draw

    draw(Path(args.stats), Path(args.out))


def quantized_figures(args):
    from decodelab.studies.quantized.figures import quantized_figures as draw

    draw(Path(args.stats), Path(args.out))


def long_figures(args):
    from decodelab.studies.long.figures import long_figures as draw

    draw(Path(args.stats), Path(args.out))


def batched_figures(args):
    from decodelab.studies.batched.figures import batched_figures as draw

    draw(Path(args.stats), Path(args.out))


def settings(args):
    from decodelab.core.io import write_json

    write_json(json.loads(args.spec), args.out)


def paper(args):
    from decodelab.paper.build import build

    settings = json.loads(Path(args.settings).read_text())
    build(Path(args.sources), Path(args.stats), Path(args.figures), settings,
          Path(args.build_dir), Path(args.out))


def positive_count(text: str) -> int:
    """A positive count, of bytes or files: 1000, 64K, 512M, 2G (binary multiples)."""
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    try:
        n = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count (e.g. 1000, 64K, 512M)")
    return n


def import_results(args):
    from decodelab.core import hosts

    limits = {"max_bytes": args.max_bytes, "max_file_bytes": args.max_file_bytes,
              "max_files": args.max_files}
    bounds = hosts.Bounds(**{k: v for k, v in limits.items() if v is not None})
    dest = hosts.import_host(Path(args.source), args.host, Path(args.results), args.replace,
                             bounds)
    print(f"imported {args.source} as host {args.host!r} into {dest}; add it to 'hosts' in the "
          "config so that the paper merges it")


def merge_hosts(args):
    from decodelab.core import hosts

    roots = dict(pair.split("=", 1) for pair in args.hosts)
    hosts.merge({h: Path(r) for h, r in roots.items()}, args.local, Path(args.out), args.tables)


def compare_reference(args):
    from decodelab.core.io import write_table
    from decodelab.report import reference

    refs = reference.reference_dirs(Path(args.references))
    table = reference.compare(Path(args.stats), refs)
    write_table(table, args.out)
    if not refs:
        print(f"decodelab compare-reference: no reference run under {args.references}",
              file=sys.stderr)


def benchmark_summary(args):
    from decodelab.core.io import write_table
    from decodelab.report import benchmarks

    write_table(benchmarks.summarise(args.files), args.out)


def artifact_times(args):
    import pandas as pd

    from decodelab.report import benchmarks

    bench = pd.read_csv(args.benchmarks)
    if "host" not in bench:
        bench["host"] = args.host or "this host"
    for host, rows in bench.groupby("host"):
        print(benchmarks.markdown(rows, str(host)))


def add_timing(p: argparse.ArgumentParser) -> None:
    """What every timed process takes: its pre-flight, its repeat, its threads, its output."""
    add_machine(p)
    p.add_argument("--repeat", type=int, required=True)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--out", required=True)


def add_machine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--machine", default=os.environ.get(PREFLIGHT_ENV, "{}"),
                   help=f"config 'machine' (the pre-flight check), as JSON; default: "
                        f"${PREFLIGHT_ENV} (which the workflow sets from its config), else warn")


def add_gguf(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target-gguf", help="the target's GGUF, where it runs in llama.cpp")
    p.add_argument("--draft-gguf", help="the draft's GGUF, where it runs in llama.cpp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decodelab", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    p = verbs.add_parser("prepare-model", help="materialize a model (hf/local/init) as a HF dir")
    p.add_argument("--spec", required=True, help="the model's config entry, as JSON")
    p.add_argument("--teacher-dir", help="the prepared teacher of a distilled draft")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--positions-needed", type=int, default=0,
                   help="refuse (and remove) the model if its position table is shorter")
    p.add_argument("--out", required=True)
    p.set_defaults(func=prepare_model)

    p = verbs.add_parser("sweep", help="time one process's shuffled grid on one backend")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--experiment", required=True, choices=["sweep", "ablation"])
    p.add_argument("--spec", required=True, help="the sweep settings, as JSON")
    add_timing(p)
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
    p.add_argument("--also", default="[]", help="more rows ({backend, reason}), as JSON: the "
                   "models llama.cpp's converter cannot take")
    p.add_argument("backends", nargs="*")
    p.set_defaults(func=skipped)

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

    p = verbs.add_parser("selection", help="each quoted best chosen on odd processes and "
                         "estimated on even ones (no winner's curse)")
    p.add_argument("--runs", required=True)
    p.add_argument("--speculative", nargs="*", default=[], help="the speculative raw runs")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--regimes", required=True, help="the regimes settings, as JSON")
    p.add_argument("--out", required=True)
    p.set_defaults(func=selection)

    p = verbs.add_parser("regime-depth", help="spikes by family, prefill vs decode, variance "
                         "between processes, memory correlation, change points")
    p.add_argument("--runs", required=True)
    p.add_argument("--regimes", required=True, help="the regimes rule's table")
    p.add_argument("--spec", required=True, help="the regimes settings, as JSON")
    p.add_argument("--out", required=True, help="the stats directory")
    p.set_defaults(func=regime_depth)

    p = verbs.add_parser("figures", help="draw the figures from the stats tables")
    p.add_argument("--stats", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=figures)

    p = verbs.add_parser("speculative", help="one process of the speculative-decoding study")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--draft-dir", required=True)
    p.add_argument("--pair", required=True, help="the configuration's name")
    p.add_argument("--pair-spec", required=True, help="devices and dtype, as JSON")
    add_gguf(p)
    p.add_argument("--spec", required=True, help="the study settings, as JSON")
    add_timing(p)
    p.set_defaults(func=speculative)

    p = verbs.add_parser("parallelism", help="time K+1-token against 1-token target passes")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--spec", required=True)
    add_timing(p)
    p.set_defaults(func=parallelism)

    p = verbs.add_parser("long", help="one process of the long-context study (sparse-KV drafts)")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--target", required=True, help="the target's model name")
    p.add_argument("--drafter-dir", action="append", default=[], metavar="NAME=DIR",
                   help="a separate drafter's model directory (repeatable)")
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--spec", required=True, help="config long, as JSON")
    add_timing(p)
    p.set_defaults(func=long_context)

    p = verbs.add_parser("batched", help="tokens/s of batched AR, synchronized and "
                                         "non-synchronized speculation, per batch size")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--draft-dir", required=True)
    p.add_argument("--backend", required=True, choices=["cpu", "cuda", "mps"])
    p.add_argument("--spec", required=True, help="config batched (its job_spec), as JSON")
    p.add_argument("--costs", required=True, help="parquet of the cost model's forward timings")
    add_timing(p)
    p.set_defaults(func=batched_throughput)

    p = verbs.add_parser("batched-stats", help="batched throughput, verification overhead and "
                                               "scheduler-simulator tables")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("--runs", nargs="*", default=[])
    p.add_argument("--costs", nargs="*", default=[], help="the runs' forward timings")
    p.set_defaults(func=batched_stats)

    p = verbs.add_parser("long-stats", help="long-context acceptance, speedup, memory tables")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("--runs", nargs="*", default=[])
    p.set_defaults(func=long_stats)

    p = verbs.add_parser("convert-gguf", help="a model to GGUF with llama.cpp's converter")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--type", required=True, choices=["F16", "Q8_0", "Q4_0"])
    p.add_argument("--out-dir", required=True, help="writes <out-dir>/<type>.gguf")
    p.set_defaults(func=convert_gguf)

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

    p = verbs.add_parser("quantized-stats", help="verify cost per type; quantized pairs' rows")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--stats", required=True, help="the stats directory (speculative_speedup)")
    p.add_argument("--out", required=True)
    p.add_argument("--verify-cost", nargs="*", default=[])
    p.add_argument("--verdicts", required=True, help="stats/verdicts_parallelism.csv")
    p.add_argument("--runs", nargs="*", default=[], help="the quantized pairs' raw runs")
    p.add_argument("--peer", nargs="*", default=[], help="llama-peer's raw runs")
    p.set_defaults(func=quantized_stats)

    p = verbs.add_parser("spec-stats", help="acceptance, speedup, theory, HF peer, parallelism")
    p.add_argument("--spec", required=True)
    p.add_argument("--verdicts", required=True, help="stats/verdicts_speculative.csv")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--parallelism", nargs="*", default=[])
    p.set_defaults(func=speculative_stats)

    p = verbs.add_parser("stability", help="stable or not, per configuration and per job")
    p.add_argument("--spec", required=True, help="config stats.stability, as JSON")
    p.add_argument("--runs", required=True, help="the collected sweep runs")
    p.add_argument("--speculative", nargs="*", default=[], help="speculative raw files")
    p.add_argument("--parallelism", nargs="*", default=[], help="parallelism raw files")
    p.add_argument("--verdicts", nargs=3, required=True, metavar=("SWEEP", "SPECULATIVE",
                   "PARALLELISM"), help="the verdicts rule's tables of the three studies")
    p.add_argument("--out", required=True, help="the stats directory")
    p.set_defaults(func=stability_tables)

    p = verbs.add_parser("verdicts", help="stable or not, per configuration of one study")
    p.add_argument("--study", required=True, choices=["sweep", "speculative", "parallelism"])
    p.add_argument("--spec", required=True, help="config stats.stability, as JSON")
    p.add_argument("--out", required=True)
    p.add_argument("runs", nargs="*", help="the study's raw files")
    p.set_defaults(func=verdicts)

    p = verbs.add_parser("remeasure", help="print the noisy jobs' raw files (none: nothing)")
    p.add_argument("--stability", nargs="+", required=True, help="stats/stability.csv files")
    p.set_defaults(func=remeasure)

    p = verbs.add_parser("verify", help="one level of the equivalence verification, as JSON")
    p.add_argument("--level", required=True, choices=["exact", "monte-carlo", "real"])
    p.add_argument("--spec", required=True, help="the verification settings, as JSON")
    p.add_argument("--target-dir")
    p.add_argument("--draft-dir")
    p.add_argument("--pair", help="the configuration's name (level real)")
    p.add_argument("--pair-spec", help="devices and dtype, as JSON (level real)")
    p.add_argument("--sdp-backends", help="the attention backends allowed, as a JSON list "
                   "(level real; default: torch's)")
    add_gguf(p)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=verify)

    p = verbs.add_parser("verify-long", help="every verification level on the long-context "
                         "pair (config long.verification), as JSON")
    p.add_argument("--spec", required=True, help="config verification, as JSON")
    p.add_argument("--long-spec", required=True, help="config long.verification's job, as JSON")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--draft-dir", help="the drafter's model directory (none: self)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=verify_long)

    p = verbs.add_parser("verify-stats", help="flatten the verification reports into tables")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("reports", nargs="+")
    p.set_defaults(func=verification_stats)

    p = verbs.add_parser("bench", help="speculative vs HF assisted vs plain decoding, as ratios")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--draft-dir", required=True)
    p.add_argument("--config", default="config.yaml", help="the study's settings (speculative)")
    p.add_argument("--pair", default="cpu-cpu", help="the configuration: devices and dtype")
    p.add_argument("--ks", type=int, nargs="+", help="instead of the config's speculative.ks")
    p.add_argument("--prompts", type=int, help="instead of the config's speculative.prompts")
    p.add_argument("--budget", type=int, help="instead of the config's speculative.budget")
    add_machine(p)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=bench, spec=None)

    p = verbs.add_parser("model-table", help="one row per prepared model, from its manifest")
    p.add_argument("--out", required=True)
    p.add_argument("model_dirs", nargs="+")
    p.set_defaults(func=model_table)

    for name, what, func in (("verify", "the verification figures", verification_figures),
                             ("spec", "the speculative-decoding figures", spec_figures),
                             ("quantized", "the quantized backend's figure", quantized_figures),
                             ("long", "the long-context figures", long_figures),
                             ("batched", "the batched-speculation figures", batched_figures)):
        p = verbs.add_parser(f"{name}-figures", help=f"draw {what}")
        p.add_argument("--stats", required=True)
        p.add_argument("--out", required=True)
        p.set_defaults(func=func)

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

    p = verbs.add_parser("import", help="copy another host's results into results/<host>/")
    p.add_argument("--from", dest="source", required=True,
                   help="that host's results/<host>/ directory, or a tarball of it")
    p.add_argument("--host", required=True, help="the name it gets here")
    p.add_argument("--results", default="results", help="the results directory")
    p.add_argument("--replace", action="store_true",
                   help="overwrite results/<host>/ (only a host imported before)")
    p.add_argument("--max-bytes", type=positive_count,
                   help="bytes all the files may hold, a tarball's as declared (default 512M)")
    p.add_argument("--max-file-bytes", type=positive_count,
                   help="bytes one file may hold (default 64M)")
    p.add_argument("--max-files", type=positive_count, help="files it may hold (default 10000)")
    p.set_defaults(func=import_results)

    p = verbs.add_parser("merge-hosts", help="every host's tables in one directory, per host")
    p.add_argument("--local", required=True, help="this host's name")
    p.add_argument("--out", required=True)
    p.add_argument("--tables", nargs="+", required=True, help="table names to write")
    p.add_argument("--hosts", nargs="+", required=True, help="host=results/<host> pairs")
    p.set_defaults(func=merge_hosts)

    p = verbs.add_parser("compare-reference", help="this run against results/reference/*")
    p.add_argument("--stats", required=True, help="this host's stats directory")
    p.add_argument("--references", default="results/reference")
    p.add_argument("--out", required=True)
    p.set_defaults(func=compare_reference)

    p = verbs.add_parser("benchmarks", help="Snakemake benchmark files summarised per rule")
    p.add_argument("--out", required=True)
    p.add_argument("files", nargs="+")
    p.set_defaults(func=benchmark_summary)

    p = verbs.add_parser("artifact-times", help="the per-rule time table for ARTIFACT.md")
    p.add_argument("--benchmarks", required=True, help="a stats/benchmarks.csv")
    p.add_argument("--host", help="the host's name when the table has no host column")
    p.set_defaults(func=artifact_times)
    for study in studies.optional_modules("cli"):  # a study's own verbs, from its folder
        study.add_verbs(verbs)
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
