"""Config files as plain data, checked before any loader builds them.

Snakemake reads a `--configfile` while it parses its command line, before the Snakefile runs,
with YTE (`yte.process_yaml`): a file with a top-level `__use_yte__: true` has its Python
expressions evaluated right there, and the loaded aliases are shared objects that every later
walk (the schema check, an error message) expands. `file_problem` reads the file as a stream of
YAML events instead: it bounds its size, its nesting and the values its aliases expand to, and
refuses YTE and any tag but YAML's plain ones, without building anything.

Two places run it: the Snakefile, over its own `configfile:` and every `--configfile` (before
the config is validated), and `preflight`, run by the workflow profiles (profiles/*/config.yaml)
while Snakemake reads them, which is before it reads the `--configfile`s. `preflight` also makes
Snakemake's source cache, which Snakemake creates before the Snakefile runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import yaml

MAX_BYTES = 1 << 20
MAX_NODES = 100_000  # scalars, lists and mappings, every alias counted as what it expands to
MAX_DEPTH = 64
YTE = "__use_yte__"
PLAIN_TAGS = {None, "!"} | {f"tag:yaml.org,2002:{t}"
                            for t in ("str", "int", "float", "bool", "null", "seq", "map")}
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def file_problem(path: str | Path) -> str | None:
    """Why the config file at `path` is refused before any loader reads it, else None."""
    where = f"config file {os.fspath(path)}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as err:
        return f"{where} cannot be read ({err.strerror})"
    if len(data) > MAX_BYTES:
        return f"{where} is larger than {MAX_BYTES} bytes (1 MiB); a config is a few kilobytes"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"{where} is not UTF-8 text (byte {err.start})"
    return text_problem(text, where)


def text_problem(text: str, where: str) -> str | None:
    """One pass over the YAML events of `text`: its size once aliases are expanded, its depth,
    its tags, and no YTE."""
    nodes, open_nodes, sizes = 0, [], {}
    try:
        for event in yaml.parse(text, Loader=LOADER):
            line = f"{where}, line {event.start_mark.line + 1}"
            if isinstance(event, yaml.AliasEvent):
                nodes += sizes.get(event.anchor, 1)
            elif isinstance(event, yaml.NodeEvent):
                nodes += 1
                if event.tag not in PLAIN_TAGS:
                    return f"{line}: tag {event.tag[:60]!r} is not allowed; a config is plain data"
                if isinstance(event, yaml.ScalarEvent):
                    if event.value == YTE:
                        return (f"{line}: '{YTE}' (YTE templates, which Snakemake evaluates as "
                                "Python) is not allowed in a config")
                    if event.anchor is not None:
                        sizes[event.anchor] = 1
                else:
                    open_nodes.append((event.anchor, nodes - 1))
                    if len(open_nodes) > MAX_DEPTH:
                        return f"{line}: nested deeper than {MAX_DEPTH} levels"
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, start = open_nodes.pop()
                if anchor is not None:
                    sizes[anchor] = nodes - start
            if nodes > MAX_NODES:
                return (f"{line}: holds more than {MAX_NODES} values once its aliases are "
                        "expanded (an alias bomb?); a config holds a few hundred")
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "not YAML"
        return f"{where}{at}: not valid YAML ({str(problem)[:80]})"
    return None


# --- before Snakemake reads the command line's config files ----------------------------------

def configfiles_in(argv: list[str]) -> list[str]:
    """The files of `--configfile`/`--configfiles` in a snakemake command line, any
    abbreviation argparse takes (`--configf`) included."""
    files, taking = [], False
    for arg in argv:
        option, eq, value = arg.partition("=")
        if arg.startswith("-"):
            taking = len(option) > len("--config") and "--configfiles".startswith(option)
            if taking and eq:
                files.append(value)
        elif taking:
            files.append(arg)
    return files


def source_cache_problem() -> str | None:
    """Snakemake makes its source cache under the user's cache directory before the Snakefile
    runs; a read-only or missing HOME ends there in a traceback."""
    from platformdirs import user_cache_dir

    cache = Path(user_cache_dir("snakemake", "snakemake")) / "snakemake" / "source-cache"
    try:
        runtime = cache / "snakemake-runtime-cache"
        runtime.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(dir=runtime))
    except OSError as err:
        return (f"Snakemake's source cache {cache} cannot be written "
                f"({err.strerror}); set XDG_CACHE_HOME (or HOME) to a writable directory")
    return None


def preflight(argv: list[str] | None = None) -> None:
    """Stop a snakemake command line, in one line, whose config files `file_problem` refuses or
    whose source cache cannot be made. The workflow profiles run it."""
    argv = sys.argv[1:] if argv is None else argv
    for path in configfiles_in(argv):
        if problem := file_problem(path):
            sys.exit(f"decodelab: {problem}")
    if problem := source_cache_problem():
        sys.exit(f"decodelab: {problem}")
