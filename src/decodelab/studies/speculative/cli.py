"""The speculative-decoding study's `decodelab` verbs: its measuring jobs (`speculative`,
`parallelism`, `bench`), its statistics and figures. Torch is imported inside the verbs, as the
CLI's own do."""

from __future__ import annotations

from decodelab.backends.jobs import add_gguf, add_machine, add_timing, open_job, recorded_pair
from decodelab.core.verbs import add_figures_verb, read_verdicts, typed


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


def parallelism(args):
    from decodelab.config.settings import ParallelismJob
    from decodelab.core.io import write_raw
    from decodelab.studies.speculative import run as study

    spec = open_job(args, args.backend, settings=ParallelismJob)
    df = study.parallelism_job(args.model_dir, args.model, args.backend, spec, args.repeat)
    write_raw(df, args.out, *study.parallelism_rows(spec.ks, spec.inner))


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


def add_verbs(verbs) -> None:
    p = verbs.add_parser("spec-stats", help="acceptance, speedup, theory, HF peer, parallelism")
    p.add_argument("--spec", required=True)
    p.add_argument("--verdicts", required=True, help="stats/verdicts_speculative.csv")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--parallelism", nargs="*", default=[])
    p.set_defaults(func=speculative_stats)

    add_figures_verb(verbs, "spec-figures", "the speculative-decoding figures",
                     "decodelab.studies.speculative.figures:speculative_figures")

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
