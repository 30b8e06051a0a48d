"""The studies, one folder each, found by the registry below: a folder here is a study.

A study's folder holds
    declared.py  what the rest of the artifact reads of it, torch-free and cheap to import:
                 TABLES (its statistics tables, `decodelab.core.tables.Table`), ORDER (its place
                 in the paper), SECTIONS (its paper modules, each with `parts(stats_dir,
                 settings) -> Section`) and FIGURES (the figure stems the paper reads)
    run.py       its measuring jobs; tables.py, figures.py, paper.py: the rest of its pipeline
    cli.py       optional: `add_verbs(verbs)` adds its `decodelab` verbs
    rules.smk    optional: its Snakemake rules, which the Snakefile includes
    section.tex  optional: its part of the paper, which the paper's build puts in
so that a new study is a new folder and touches no shared file.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent


@cache
def names() -> tuple[str, ...]:
    """Every study's folder name, in the paper's order (ORDER, then name)."""
    found = [m.name for m in pkgutil.iter_modules([str(HERE)]) if m.ispkg]
    return tuple(sorted(found, key=lambda name: (declared(name).ORDER, name)))


def declared(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}.declared")


def tables() -> tuple:
    return tuple(t for name in names() for t in declared(name).TABLES)


def figures() -> list[str]:
    return [stem for name in names() for stem in declared(name).FIGURES]


def sections() -> list[ModuleType]:
    """The paper modules of every study, in the paper's order."""
    return [importlib.import_module(f"{__name__}.{name}.{module}")
            for name in names() for module in declared(name).SECTIONS]


def optional_modules(module: str) -> list[ModuleType]:
    """Each study's `module` (cli, ...) where it has one."""
    return [importlib.import_module(f"{__name__}.{name}.{module}") for name in names()
            if (HERE / name / f"{module}.py").exists()]


def files(filename: str) -> list[Path]:
    """Each study's `filename` (rules.smk, section.tex) where it has one."""
    return [HERE / name / filename for name in names() if (HERE / name / filename).exists()]
