"""A study is one folder: a toy study added as `studies/toy/` alone, in a copy of the package,
is planned by the DAG, run by its own `decodelab` verb, tabled (declared, read typed, merged)
and typeset in the paper, with no shared file touched."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dag import ROOT, copy_workflow, write_config
from test_tables import planned

from decodelab import studies

HOST = "testhost"
TOY = {
    "__init__.py": '"""A toy study: counts, one row per K."""\n',
    "declared.py": '''from decodelab.core.tables import Table

ORDER = 70
SECTIONS = ("paper",)
FIGURES = ()
TABLES = (Table("toy_counts", "toy", "toy_stats", "Toy", numeric=("k", "count"), text=("what",),
                optional=True),)
''',
    "cli.py": '''import pandas as pd

from decodelab.core.io import write_table


def toy_stats(args):
    write_table(pd.DataFrame({"what": ["toy"] * 3, "k": [1, 2, 3], "count": [5, 7, 11]}),
                args.out)


def add_verbs(verbs):
    p = verbs.add_parser("toy-stats", help="the toy study's table")
    p.add_argument("--out", required=True)
    p.set_defaults(func=toy_stats)
''',
    "paper.py": '''from decodelab.core import tables
from decodelab.report.section import Section


def parts(stats_dir, settings):
    counts = tables.read(stats_dir, "toy_counts")
    total = int(counts["count"].sum()) if len(counts) else 0
    return Section({"ToyTotal": str(total)}, {})
''',
    "rules.smk": '''rule toy_stats:
    output:
        f"results/{HOST}/stats/toy_counts.csv",
    shell:
        "decodelab toy-stats --out {output}"
''',
    "section.tex": "\\section{Toy}\nThe toy study counted \\ToyTotal{} things.\n",
}


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory) -> Path:
    """A copy of the package with the toy study's folder, and nothing else changed."""
    root = tmp_path_factory.mktemp("toy")
    package = shutil.copytree(ROOT / "src/decodelab", root / "src/decodelab",
                              ignore=shutil.ignore_patterns("__pycache__"))
    folder = package / "studies" / "toy"
    folder.mkdir()
    for name, text in TOY.items():
        (folder / name).write_text(text)
    return root / "src"


def python(src: Path, code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{src}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_registry_finds_every_study_folder_in_the_papers_order():
    assert studies.names() == ("sweep", "speculative", "quantized", "long", "batched",
                               "verification")
    assert studies.figures()[:2] == ["latency", "kv_speedup"]
    assert {t.group for t in studies.tables()} >= {"speculative", "long", "batched"}


def test_the_toy_folder_is_registered_with_its_table_verb_and_section(toy_package):
    found = json.loads(python(toy_package, """
import json
from decodelab import studies
from decodelab.cli import build_parser
from decodelab.core import tables
from decodelab.paper.build import all_sections
print(json.dumps({"names": studies.names(), "table": tables.table("toy_counts").rule,
                  "verb": "toy-stats" in build_parser()._subparsers._group_actions[0].choices,
                  "section": [m.__name__ for m in all_sections()][-1],
                  "rules": [str(p.name) for p in studies.files("rules.smk")]}))
"""))
    assert found == {"names": [*studies.names(), "toy"], "table": "toy_stats", "verb": True,
                     "section": "decodelab.studies.toy.paper", "rules": ["rules.smk"]}


def test_the_dag_plans_the_toy_study_and_merges_its_table(toy_package, tmp_path, monkeypatch):
    workdir = copy_workflow(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(toy_package))
    jobs = planned(workdir, write_config(workdir, host=HOST))
    writers = {rule for rule, _, outputs in jobs for f in outputs
               if f == f"results/{HOST}/stats/toy_counts.csv"}
    readers = {rule for rule, inputs, _ in jobs
               if {f"results/{HOST}/stats/toy_counts.csv",
                   "results/combined/stats/toy_counts.csv"} & set(inputs)}
    assert writers == {"toy_stats"} and {"merge_hosts", "paper"} <= readers


@pytest.mark.latex
def test_the_toy_study_runs_tables_and_typesets(toy_package, tmp_path):
    """Its verb writes its table, the registry reads it typed, and the paper's build puts its
    section and its number in the PDF."""
    stats = shutil.copytree(ROOT / "results/reference/default-cpu/stats", tmp_path / "stats")
    text = python(toy_package, """
import subprocess, sys
from pathlib import Path
from decodelab.cli import main
from decodelab.core import tables
from decodelab.paper.build import build
from fixtures import PAPER, settings_dict
stats, tmp = Path(sys.argv[1]), Path(sys.argv[2])
main(["toy-stats", "--out", str(stats / "toy_counts.csv")])
counts = tables.read(stats, "toy_counts")
assert counts["count"].dtype.kind == "i" and counts["what"].tolist() == ["toy"] * 3
from decodelab.studies.sweep.figures import regime_depth_figures
for verb in ("figures", "spec-figures", "quantized-figures", "long-figures", "batched-figures",
             "verify-figures"):
    main([verb, "--stats", str(stats), "--out", str(tmp / "figures")])
regime_depth_figures(stats, tmp / "figures")
pdf = build(PAPER, stats, tmp / "figures", settings_dict(("cpu",)), tmp / "build",
            tmp / "paper.pdf")
print(subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout)
""", str(stats), str(tmp_path))
    assert "The toy study counted 23 things." in " ".join(text.split())
