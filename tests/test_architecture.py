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

# Every module of src/decodelab in one layer; a package (decodelab.paper) covers its submodules.
# Only `measure` (and the CLI, which calls it from inside its verbs) may reach torch.
LAYERS = {
    "base": {"errors", "names", "io", "text"},
    "plan": {"config", "configcheck", "probe", "shapes", "kv_layout", "sizes", "yamlsafe"},
    "measure": {"devices", "models", "sources", "train", "decode", "sampling", "speculative",
                "sweep", "study", "equivalence", "verify", "machine", "gguf_convert", "llamacpp",
                "llamapeer", "graphs", "quantized", "sparse_kv", "longctx", "batched", "refresh",
                "batchstudy", "longstudy", "budgetdraft", "floor", "pipelined", "capture",
                "attention", "matvec", "fused", "static_cache"},
    "analyze": {"stats", "theory", "regimes", "regime_depth", "changepoints", "phases",
                "variance", "memory", "onsets", "collapse", "stability", "selection",
                "quantized_stats", "scheduler", "batchsim", "longstats", "batchstats"},
    "report": {"tables", "figures", "paper", "reference", "hosts", "benchmarks"},
    "cli": {"cli"},
}
TORCH_FREE = ("base", "plan", "analyze", "report")


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


def layer_of(module: str) -> list[str]:
    short = module.removeprefix("decodelab.")
    return [layer for layer, members in LAYERS.items()
            if any(short == m or short.startswith(f"{m}.") for m in members)]


def test_the_graph_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "decodelab.errors" in graph["decodelab.names"]
    assert {"torch", "decodelab.devices"} <= graph["decodelab.train"]
    assert "decodelab.io" in graph["decodelab.cli"]  # imported inside a verb
    assert reaches(graph, "decodelab.sweep", HEAVY)


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_module_has_one_layer():
    misplaced = {m: layer_of(m) for m in modules() if m != "decodelab" and len(layer_of(m)) != 1}
    assert not misplaced, f"give each module one layer in LAYERS: {misplaced}"


@pytest.mark.parametrize("layer", TORCH_FREE)
def test_layer_never_reaches_torch_or_transformers(layer):
    graph = import_graph()
    chains = {m: reaches(graph, m, HEAVY) for m in graph if layer_of(m) == [layer]}
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
    assert any("decodelab.probe" in line for line in imports)
    code = "\n".join(["import json, sys", *imports, "print(json.dumps(sorted(sys.modules)))"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert not loaded & HEAVY, f"building the DAG imports {sorted(loaded & HEAVY)}"
