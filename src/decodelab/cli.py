"""`decodelab <verb>`: one verb per pipeline stage; every Snakemake rule calls one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from decodelab import studies
from decodelab.backends.jobs import open_job
from decodelab.core.errors import DecodelabError
from decodelab.core.verbs import read_verdicts, typed


def prepare_model(args):
    from decodelab.backends import sources

    sources.prepare(open_job(args), args.out, teacher_dir=args.teacher_dir,
                    positions_needed=args.positions_needed)


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


def verdicts(args):
    from decodelab.analysis import stability, stats
    from decodelab.config.settings import Stability
    from decodelab.core.io import write_table

    runs = stats.read_raw_runs(args.runs, args.study)
    limits = typed(Stability, args.spec)
    write_table(stability.verdicts(runs, stats.STUDIES[args.study], limits), args.out)


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


def convert_gguf(args):
    from decodelab.backends.gguf_convert import convert

    convert(args.model_dir, args.type, args.out_dir)


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


def model_table(args):
    import pandas as pd

    from decodelab.backends.models import read_manifest
    from decodelab.core.io import write_table

    rows = [{"model": Path(d).name, **read_manifest(d)} for d in args.model_dirs]
    write_table(pd.DataFrame(rows), args.out)


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

    p = verbs.add_parser("selection", help="each quoted best chosen on odd processes and "
                         "estimated on even ones (no winner's curse)")
    p.add_argument("--runs", required=True)
    p.add_argument("--speculative", nargs="*", default=[], help="the speculative raw runs")
    p.add_argument("--spec", required=True, help="config stats, as JSON")
    p.add_argument("--regimes", required=True, help="the regimes settings, as JSON")
    p.add_argument("--out", required=True)
    p.set_defaults(func=selection)





    p = verbs.add_parser("convert-gguf", help="a model to GGUF with llama.cpp's converter")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--type", required=True, choices=["F16", "Q8_0", "Q4_0"])
    p.add_argument("--out-dir", required=True, help="writes <out-dir>/<type>.gguf")
    p.set_defaults(func=convert_gguf)



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




    p = verbs.add_parser("model-table", help="one row per prepared model, from its manifest")
    p.add_argument("--out", required=True)
    p.add_argument("model_dirs", nargs="+")
    p.set_defaults(func=model_table)

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
