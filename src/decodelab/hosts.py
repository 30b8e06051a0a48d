"""Results from several hosts: the on-disk contract, `decodelab import`, and the merge.

A host's results live in `results/<host>/`:

    stats/environment.csv   fingerprints, one row per backend that ran      (required)
    stats/latency.csv, kv_speedup.csv, regimes.csv, skipped.csv             (required)
    stats/speculative_*.csv, verification_*.csv, models.csv, benchmarks.csv (optional)
    figures/*.pdf|png, runs.parquet, settings.json                          (optional)

the required tables and their columns as `decodelab.tables` declares them (`required`).

A committed reference run (`results/reference/<name>/`) has the same `stats/` layout plus a
README. `import_host` copies another host's directory (or a tarball of it) into
`results/<host>/` atomically, after checking the layout, that it holds only regular files
within size bounds, and that every table reads; `merge` puts every host's tables into one
directory for the paper, a `host` column on every row.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from . import tables
from .errors import DecodelabError
from .io import write_table
from .names import check_name

COPIED = ("stats", "figures", "verification", "runs.parquet", "settings.json")  # what is imported
RESERVED = ("reference", "combined", "paper", "models", "bench", "gguf")  # results/<x> not a host
MANIFEST = "IMPORTED.json"
# Tables whose rows are host-independent (the same models, closed forms, Monte Carlo): one
# copy, the local host's, rather than one per host.
LOCAL_ONLY = ("models", "reference_comparison")
QUALIFIED = ("backend", "pair")  # names that two hosts may share: qualified as name@host


# -----------------------------------------------------------------------------
# import: refuse what could escape results/<host>/ or overwrite what an import did not write

@dataclass(frozen=True)
class Bounds:
    """What one import may hold; a tarball's members count as declared, before unpacking."""
    max_bytes: int = 512 * 2**20
    max_file_bytes: int = 64 * 2**20
    max_files: int = 10_000


def check_host_name(host: str) -> str:
    check_name(host, "host name")
    if host.lower() in RESERVED:  # lower: a case-insensitive disk maps Reference to reference
        raise DecodelabError(
            f"host name {host!r} is not a usable name: {', '.join(RESERVED)} are results/ "
            "folders of their own, not hosts")
    return host


def check_replaceable(dest: Path, replace: bool) -> None:
    """An import may replace only a host that an import wrote, and only when asked to."""
    if not os.path.lexists(dest):
        return
    if dest.is_symlink() or not (dest / MANIFEST).is_file():
        raise DecodelabError(
            f"{dest} is not an imported host (it has no {MANIFEST}: this machine's own "
            "results, or not decodelab's); decodelab import never replaces it: import under "
            "another --host")
    if not replace:
        raise DecodelabError(f"{dest} exists; pass --replace to overwrite it")


def missing_files(root: Path) -> list[str]:
    """Required files of the contract that `root` lacks, as paths relative to it."""
    root = Path(root)
    return [f"stats/{name}.csv" for name in tables.required()
            if not (root / "stats" / f"{name}.csv").is_file()]


def check_layout(root: Path, what: str) -> Path:
    missing = missing_files(root)
    if missing:
        raise DecodelabError(
            f"{what} {root} is not a host's results directory: missing {', '.join(missing)} "
            f"(a host's results/<host>/ holds stats/{{{','.join(tables.required())}}}.csv)")
    return Path(root)


def find_root(tree: Path) -> Path:
    """The directory with stats/ inside an unpacked tarball: the top, or its only child."""
    if (tree / "stats").is_dir():
        return tree
    children = [p for p in tree.iterdir() if p.is_dir()]
    if len(children) == 1 and (children[0] / "stats").is_dir():
        return children[0]
    return tree


def stat_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return kind
    return "special file"


def member_kind(member: tarfile.TarInfo) -> str:
    for test, kind in ((member.isreg, "file"), (member.isdir, "directory"),
                       (member.issym, "symbolic link"), (member.islnk, "hard link"),
                       (member.isfifo, "fifo"), (member.ischr, "character device"),
                       (member.isblk, "block device")):
        if test():
            return kind
    return "special file"


def tree_entries(root: Path) -> Iterator[tuple[str, str, int]]:
    """(path relative to root, kind, size) of what an import copies, links never followed."""
    todo = [name for name in COPIED if os.path.lexists(root / name)]
    while todo:
        rel = todo.pop()
        st = (root / rel).lstat()
        yield rel, stat_kind(st.st_mode), st.st_size
        if stat.S_ISDIR(st.st_mode):
            todo += [f"{rel}/{name}" for name in sorted(os.listdir(root / rel), reverse=True)]


def tar_entries(tar: tarfile.TarFile) -> Iterator[tuple[str, str, int]]:
    for member in tar:  # one header at a time: a refusal stops before the rest is read
        yield member.name, member_kind(member), member.size


def check_entries(entries: Iterable[tuple[str, str, int]], what: str, bounds: Bounds
                  ) -> list[str]:
    """The regular files among `entries`; an error at the first link, special file, path
    out of the tree, or file over the bounds."""
    files, total = [], 0
    for rel, kind, size in entries:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise DecodelabError(f"{what}: {rel} points outside the tree")
        if kind not in ("file", "directory"):
            raise DecodelabError(
                f"{what}: {rel} is a {kind}; an import takes regular files and directories "
                "only (copy what it points to into the tree)")
        if kind == "directory":
            continue
        files.append(rel)
        total += size
        if size > bounds.max_file_bytes:
            raise DecodelabError(f"{what}: {rel} holds {size} bytes, more than the "
                                 f"{bounds.max_file_bytes} a file may (--max-file-bytes)")
        if total > bounds.max_bytes:
            raise DecodelabError(f"{what} holds more than {bounds.max_bytes} bytes "
                                 f"(--max-bytes): {total} up to {rel}")
        if len(files) > bounds.max_files:
            raise DecodelabError(
                f"{what} holds more than {bounds.max_files} files (--max-files)")
    return files


def unpack(tarball: Path, into: Path, bounds: Bounds) -> Path:
    """Check every member's header, then unpack: nothing reaches the disk before the bounds
    hold and no link is ever made."""
    try:
        with tarfile.open(tarball) as tar:
            check_entries(tar_entries(tar), f"tarball {tarball}", bounds)
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DecodelabError(f"cannot unpack {tarball}: {err}") from err
    return find_root(into)


def copy_files(src: Path, files: list[str], dest: Path) -> None:
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel, follow_symlinks=False)


def read_csv_text(path: Path, what: str) -> pd.DataFrame | None:
    """The table at `path`, None when the file is empty; an error naming the file when it is
    not UTF-8 text or does not parse."""
    data = path.read_bytes()
    if b"\0" in data:
        raise DecodelabError(f"{what} holds NUL bytes: binary, not CSV text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DecodelabError(f"{what} is not UTF-8 text (byte {data[err.start]:#04x} at "
                             f"offset {err.start})") from err
    if not text.strip():
        return None
    try:
        return pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, ValueError) as err:
        raise DecodelabError(f"{what} does not parse as CSV: "
                             f"{str(err).strip().splitlines()[-1]}") from err


def check_table(path: Path, what: str, columns: tuple[str, ...] | None) -> None:
    df = read_csv_text(path, what)
    if columns is None:
        return  # an optional table may be empty, as the merge reads it
    if df is None:
        raise DecodelabError(f"{what} is empty; it needs a header with {', '.join(columns)}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DecodelabError(f"{what} lacks the column(s) {', '.join(missing)} that the merge "
                             f"and the paper read (it needs {', '.join(columns)})")


def check_parquet(path: Path, what: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for _ in pq.ParquetFile(path).iter_batches():  # every page decoded, a batch at a time
            pass
    except (OSError, ValueError, pa.ArrowException) as err:
        raise DecodelabError(f"{what} is not a readable parquet file: {err}") from err


def check_contents(root: Path, what: str) -> None:
    """Every table parses as the merge and the paper will read it."""
    required = tables.required()
    for path in sorted((root / "stats").rglob("*.csv")):
        columns = required.get(path.stem) if path.parent == root / "stats" else None
        check_table(path, f"{what}: {path.relative_to(root)}", columns)
    if (root / "runs.parquet").exists():
        check_parquet(root / "runs.parquet", f"{what}: runs.parquet")


def swap_into_place(staged: Path, dest: Path, old: Path) -> None:
    if dest.exists():
        os.replace(dest, old)
    try:
        os.replace(staged, dest)
    except OSError as err:
        if old.exists():
            os.replace(old, dest)
        raise DecodelabError(f"cannot move the import into {dest}: {err}") from err


def import_host(source: Path, host: str, results: Path = Path("results"),
                replace: bool = False, bounds: Bounds = Bounds()) -> Path:
    """Copy another host's results (a directory or a tarball) into results/<host>/ atomically.

    The copy is checked (no links or special files, within `bounds`, every table readable),
    assembled beside the destination and renamed into place, so a failed import leaves
    nothing behind and an interrupted one never leaves half a host.
    """
    check_host_name(host)
    source, results = Path(source), Path(results)
    if not source.exists():
        raise DecodelabError(f"nothing to import: {source} does not exist")
    dest = results / host
    check_replaceable(dest, replace)
    what = f"import source {source}"
    results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=results, prefix=f".import-{host}-") as tmp:
        tmp = Path(tmp)
        root = unpack(source, tmp / "unpacked", bounds) if source.is_file() else source
        files = check_entries(tree_entries(check_layout(root, "import source")), what, bounds)
        staged = tmp / "staged"
        staged.mkdir()
        copy_files(root, files, staged)
        check_contents(staged, what)
        manifest = {"host": host, "imported_from": str(source.resolve()),
                    "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "files": sorted(files)}
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        swap_into_place(staged, dest, tmp / "old")
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
    for host, frames in by_host.items():
        for name, df in frames.items():
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
    names = sorted({n for frames in by_host.values() for n in frames})
    merged = {}
    for name in names:
        parts = []
        for host, frames in by_host.items():
            if name not in frames:
                continue
            df = host_rows(name, frames[name], host, local)
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
