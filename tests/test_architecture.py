"""The shape of the package: no import cycles, torch only where things are measured, and a DAG
that builds without torch or transformers."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
HEAVY = {"torch", "transformers"}

# The layers are the package's folders, lowest first: a module imports from its own layer or a
# lower one (a study may use another study). Only the measuring layers, a study's `run` and the
# verification study's `equivalence` (and the CLI, with each study's verbs in its folder's
# `cli`, which call them from inside their verbs) may reach torch.
LAYERS = ("core", "config", "analysis", "measure", "report", "studies", "compose")
FOLDERS = {"core": "core", "config": "config", "analysis": "analysis", "backends": "measure",
           "engines": "measure", "report": "report", "studies": "studies", "paper": "compose",
           "cli": "compose"}
TORCH_FREE = ("core", "config", "analysis", "report", "studies")
MEASURING_STUDY_MODULES = ("run", "equivalence")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "decodelab").rglob("*.py"))}


def imported_names(path: Path, name: str) -> set[str]:
    """Every module `path` imports, at any depth (an import inside a function counts): absolute
    names, relative ones resolved, `from pkg import mod` as pkg.mod."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    """decodelab module -> the decodelab modules and the top-level outside packages it imports."""
    known = modules()
    graph = {}
    for name, path in known.items():
        edges = set()
        for target in imported_names(path, name):
            if target.split(".")[0] != "decodelab":
                edges.add(target.split(".")[0])
            elif target in known:
                edges.add(target)
            elif target.rpartition(".")[0] in known:  # `from decodelab.x import a_function`
                edges.add(target.rpartition(".")[0])
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in graph:
                continue
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reaches(graph: dict[str, set[str]], start: str, targets: set[str]) -> list[str] | None:
    """An import chain from `start` to one of `targets`, or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for succ in sorted(graph.get(path[-1], ())):
            if succ in targets:
                return [*path, succ]
            if succ in graph and succ not in seen:
                seen.add(succ)
                paths.append([*path, succ])
    return None


def layer_of(module: str) -> str | None:
    """The layer of a module by its folder; None for the package itself and unknown folders."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] == "studies" and parts[-1] == "cli":  # a study's verbs: the CLI's, in its folder
        return "compose"
    if parts[1] == "studies" and parts[-1] in MEASURING_STUDY_MODULES:
        return "measure"
    return FOLDERS.get(parts[1])


def test_the_graph_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "decodelab.core.errors" in graph["decodelab.core.names"]
    assert {"torch", "decodelab.backends.devices"} <= graph["decodelab.backends.train"]
    assert "decodelab.core.io" in graph["decodelab.cli"]  # imported inside a verb
    assert reaches(graph, "decodelab.studies.sweep.run", HEAVY)


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_module_lies_in_a_layer_folder():
    strays = [m for m in modules() if m != "decodelab" and layer_of(m) is None]
    assert not strays, f"put each module in one of the folders {sorted(FOLDERS)}: {strays}"


def test_no_module_imports_from_a_higher_layer():
    graph, rank = import_graph(), {layer: i for i, layer in enumerate(LAYERS)}
    packages = {m for m, path in modules().items() if path.name == "__init__.py"}
    upward = [(m, t) for m, targets in graph.items() for t in targets - packages
              if layer_of(m) and layer_of(t) and rank[layer_of(t)] > rank[layer_of(m)]]
    assert not upward, f"imports from a higher layer: {upward}"


def test_the_layer_rule_sees_an_upward_import():
    assert layer_of("decodelab.core.tables") == "core"
    assert layer_of("decodelab.studies.sweep.run") == "measure"
    assert layer_of("decodelab.studies.sweep.tables") == "studies"
    assert layer_of("decodelab.studies.sweep.cli") == "compose"
    assert LAYERS.index(layer_of("decodelab.report.tex")) > LAYERS.index("analysis")


@pytest.mark.parametrize("layer", TORCH_FREE)
def test_layer_never_reaches_torch_or_transformers(layer):
    graph = import_graph()
    chains = {m: reaches(graph, m, HEAVY) for m in graph if layer_of(m) == layer}
    assert not {m: c for m, c in chains.items() if c}, f"{layer} modules import torch: {chains}"


# The DAG: what the Snakefile and its .smk files import, run in a fresh interpreter.

IMPORT = re.compile(r"^[ \t]*(from[ \t]+decodelab[\w.]*[ \t]+import[ \t]+(?:\([^)]*\)|.*)"
                    r"|import[ \t]+decodelab.*)$", re.M)


def workflow_imports() -> list[str]:
    """The `decodelab` import statements of the Snakefile and every .smk file, as written."""
    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow").rglob("*.smk"))]
    return sorted({m for f in files for m in IMPORT.findall(f.read_text(encoding="utf-8"))})


def test_the_dag_imports_neither_torch_nor_transformers():
    imports = workflow_imports()
    assert any("decodelab.core.probe" in line for line in imports)
    code = "\n".join(["import json, sys", *imports, "print(json.dumps(sorted(sys.modules)))"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert not loaded & HEAVY, f"building the DAG imports {sorted(loaded & HEAVY)}"
