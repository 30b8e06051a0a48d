"""Results from several hosts: the on-disk contract, `decodelab import`, and the merge.

A host's results live in `results/<host>/`:

    stats/environment.csv   fingerprints, one row per backend that ran      (required)
    stats/latency.csv, kv_speedup.csv, regimes.csv, skipped.csv             (required)
    stats/speculative_*.csv, verification_*.csv, models.csv, benchmarks.csv (optional)
    figures/*.pdf|png, runs.parquet, settings.json                          (optional)

A committed reference run (`results/reference/<name>/`) has the same `stats/` layout plus a
README. `import_host` copies another host's directory (or a tarball of it) into
`results/<host>/` atomically, after checking the layout; `merge` puts every host's tables into
one directory for the paper, a `host` column on every row.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from .errors import DecodelabError
from .io import write_table

REQUIRED = ("environment", "latency", "kv_speedup", "regimes", "skipped")
OPTIONAL_PREFIXES = ("speculative_", "verification_")
OPTIONAL = ("models", "benchmarks")
RESERVED = ("reference", "combined", "paper", "models", "bench")  # results/<x> not a host
MANIFEST = "IMPORTED.json"
# Tables whose rows are host-independent (the same models, closed forms, Monte Carlo): one
# copy, the local host's, rather than one per host.
LOCAL_ONLY = ("models", "reference_comparison")
QUALIFIED = ("backend", "pair")  # names that two hosts may share: qualified as name@host


def check_host_name(host: str) -> str:
    if not host or host in RESERVED or not all(c.isalnum() or c in "._-" for c in host):
        raise DecodelabError(
            f"host name {host!r} is not usable: letters, digits, '.', '_' and '-' only, and not "
            f"one of {', '.join(RESERVED)} (those are results/ folders of their own)")
    return host


def missing_files(root: Path) -> list[str]:
    """Required files of the contract that `root` lacks, as paths relative to it."""
    root = Path(root)
    return [f"stats/{name}.csv" for name in REQUIRED
            if not (root / "stats" / f"{name}.csv").is_file()]


def check_layout(root: Path, what: str) -> Path:
    missing = missing_files(root)
    if missing:
        raise DecodelabError(
            f"{what} {root} is not a host's results directory: missing {', '.join(missing)} "
            f"(a host's results/<host>/ holds stats/{{{','.join(REQUIRED)}}}.csv)")
    return Path(root)


def find_root(tree: Path) -> Path:
    """The directory with stats/ inside an unpacked tarball: the top, or its only child."""
    if (tree / "stats").is_dir():
        return tree
    children = [p for p in tree.iterdir() if p.is_dir()]
    if len(children) == 1 and (children[0] / "stats").is_dir():
        return children[0]
    return tree


def unpack(tarball: Path, into: Path) -> Path:
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as err:
        raise DecodelabError(f"cannot unpack {tarball}: {err}") from err
    return find_root(into)


def copy_tree(src: Path, dest: Path) -> None:
    """stats/, figures/, runs.parquet and settings.json: what the paper and the report read."""
    for name in ("stats", "figures", "verification"):
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name)
    for name in ("runs.parquet", "settings.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)


def import_host(source: Path, host: str, results: Path = Path("results"),
                replace: bool = False) -> Path:
    """Copy another host's results (a directory or a tarball) into results/<host>/ atomically.

    The copy is assembled beside the destination and renamed into place, so a failed import
    leaves nothing behind and an interrupted one never leaves half a host.
    """
    check_host_name(host)
    source, results = Path(source), Path(results)
    if not source.exists():
        raise DecodelabError(f"nothing to import: {source} does not exist")
    dest = results / host
    if dest.exists() and not replace:
        raise DecodelabError(f"{dest} exists; pass --replace to overwrite it")
    results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=results, prefix=f".import-{host}-") as tmp:
        tmp = Path(tmp)
        root = unpack(source, tmp / "unpacked") if source.is_file() else source
        check_layout(root, "import source")
        staged = tmp / "staged"
        staged.mkdir()
        copy_tree(root, staged)
        manifest = {"host": host, "imported_from": str(source.resolve()),
                    "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "files": sorted(p.relative_to(staged).as_posix()
                                    for p in staged.rglob("*") if p.is_file())}
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        old = tmp / "old"
        if dest.exists():
            os.replace(dest, old)
        os.replace(staged, dest)
    return dest


# -----------------------------------------------------------------------------
# merge: one table per name over all hosts

def read_host_tables(root: Path) -> dict[str, pd.DataFrame]:
    tables = {}
    for path in sorted((Path(root) / "stats").glob("*.csv")):
        try:
            tables[path.stem] = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            tables[path.stem] = pd.DataFrame()
    return tables


def shared_names(by_host: dict[str, dict[str, pd.DataFrame]], column: str) -> set[str]:
    """Values of `column` that more than one host ran (skipped backends and the reference
    comparison's rows, which are other machines', do not count)."""
    seen: dict[str, set[str]] = {}
    for host, tables in by_host.items():
        for name, df in tables.items():
            if name == "skipped" or name in LOCAL_ONLY:  # not what ran on that host
                continue
            if column in df and len(df):
                for value in df[column].dropna().astype(str):
                    if value:
                        seen.setdefault(value, set()).add(host)
    return {v for v, hosts in seen.items() if len(hosts) > 1}


def qualify(df: pd.DataFrame, host: str, shared: dict[str, set[str]]) -> pd.DataFrame:
    df = df.copy()
    for column, names in shared.items():
        if column in df and len(df):
            values = df[column].astype("string")
            hit = values.isin(names)
            df[column] = values.where(~hit, values + f"@{host}").astype(object)
    return df


def host_rows(name: str, df: pd.DataFrame, host: str, local: str) -> pd.DataFrame:
    """The rows of one host's table that the merged table keeps."""
    if name in LOCAL_ONLY and host != local:
        return df.iloc[0:0]
    if name.startswith("verification_") and host != local and "pair" in df:
        return df[df["pair"].fillna("").astype(str) != ""]  # levels 1-2 are not per host
    return df


def merge_tables(by_host: dict[str, dict[str, pd.DataFrame]], local: str
                 ) -> dict[str, pd.DataFrame]:
    """Every table name over all hosts; a backend or pair that several hosts share keeps its
    name on the local host and becomes name@host on the others."""
    shared = {c: shared_names(by_host, c) for c in QUALIFIED}
    names = sorted({n for tables in by_host.values() for n in tables})
    merged = {}
    for name in names:
        parts = []
        for host, tables in by_host.items():
            if name not in tables:
                continue
            df = host_rows(name, tables[name], host, local)
            if host != local:
                df = qualify(df, host, shared)
            if len(df.columns):
                parts.append(df.drop(columns=["host"], errors="ignore").assign(host=host))
        merged[name] = (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame())
    return merged


def hosts_table(roots: dict[str, Path], local: str) -> pd.DataFrame:
    rows = []
    for host, root in roots.items():
        env = pd.read_csv(Path(root) / "stats" / "environment.csv")
        manifest = Path(root) / MANIFEST
        meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
        rows.append({"host": host, "role": "local" if host == local else "imported",
                     "backends": " ".join(env["backend"].astype(str)),
                     "devices": "; ".join(env["device_name"].astype(str)),
                     "cpu_model": "; ".join(env["cpu_model"].astype(str).unique()),
                     "imported_from": meta.get("imported_from", ""),
                     "imported_at": meta.get("imported_at", "")})
    return pd.DataFrame(rows, columns=["host", "role", "backends", "devices", "cpu_model",
                                       "imported_from", "imported_at"])


def merge(roots: dict[str, Path], local: str, out_dir: Path, names: list[str]) -> list[Path]:
    """Write out_dir/<name>.csv for every name in `names` (header-only when no host has it)
    and out_dir/hosts.csv; `roots` maps host -> results/<host>, the local host among them."""
    if local not in roots:
        raise DecodelabError(f"the local host {local!r} is not among the hosts to merge")
    for host, root in roots.items():
        check_layout(Path(root), f"host {host!r}:")
    merged = merge_tables({h: read_host_tables(r) for h, r in roots.items()}, local)
    out_dir = Path(out_dir)
    written = [write_table(merged.get(name, pd.DataFrame()), out_dir / f"{name}.csv")
               for name in names if name != "hosts"]
    written.append(write_table(hosts_table(roots, local), out_dir / "hosts.csv"))
    return written
