"""Results from several hosts: the on-disk contract, `decodelab import`, and the merge.

A host's results live in `results/<host>/`:

    stats/environment.csv   fingerprints, one row per backend that ran      (required)
    stats/latency.csv, kv_speedup.csv, regimes.csv, skipped.csv             (required)
    stats/speculative_*.csv, verification_*.csv, models.csv, benchmarks.csv (optional)
    figures/*.pdf|png, runs.parquet, settings.json                          (optional)

the required tables and their columns as `decodelab.core.tables` declares them (`required`).

A committed reference run (`results/reference/<name>/`) has the same `stats/` layout plus a
README. `import_host` copies another host's directory (or a tarball of it) into
`results/<host>/` atomically. A tarball's headers are checked before anything is unpacked
(and tarfile reads no extended header past a small bound); a directory's files are each opened
once without following a link and copied from that descriptor, the bounds counted as they are
copied. Then the staged copy, and only it, is checked: the layout, every table readable within
a shape bound, every cell typesettable by the paper, every declared number a finite number,
runs.parquet decodable within a bound. `merge` reads every host's tables under the same bounds
and writes one directory for the paper, a `host` column on every row, all tables or none.
A full or read-only disk ends either in one error line and nothing written.
"""

from __future__ import annotations

import errno
import io
import json
import lzma
import os
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from decodelab.core import tables
from decodelab.core.errors import DecodelabError
from decodelab.core.io import write_table
from decodelab.core.names import check_name
from decodelab.core.text import check_cells

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
    """What one import may hold; a tarball's members count as declared, before unpacking.
    max_files counts every entry, directories too."""
    max_bytes: int = 512 * 2**20
    max_file_bytes: int = 64 * 2**20
    max_files: int = 10_000


WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # of the disk written, never a source's
MAX_DEPTH = 32  # folders deep: a walk holds one descriptor per level
MAX_TAR_HEADER = 64 * 2**10  # tarfile reads a long name or pax record whole, as big as declared
MAX_COLUMNS = 1000  # a table's columns, and its cells (rows x columns), before pandas parses it
MAX_CELLS = 2**21
PARQUET_EXPANSION = 8  # runs.parquet may decode to this many times --max-file-bytes
CHUNK = 2**20


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
    """Required files of the contract that `root` lacks, as paths relative to it, by name."""
    root = Path(root)
    return [f"stats/{name}.csv" for name in sorted(tables.required())
            if not (root / "stats" / f"{name}.csv").is_file()]


def check_layout(root: Path, what: str, shown: Path | None = None) -> Path:
    """`root` holds the required tables; `shown` names it in the error (a staged copy's
    source)."""
    missing = missing_files(root)
    if missing:
        raise DecodelabError(
            f"{what} {shown or root} is not a host's results directory: missing "
            f"{', '.join(missing)} (a host's results/<host>/ holds "
            f"stats/{{{','.join(tables.required())}}}.csv)")
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


class Tally:
    """An import's entries and bytes against its bounds: each entry as a tarball header
    declares it or as the walk finds it, each file's bytes as declared or as copied."""

    def __init__(self, what: str, bounds: Bounds):
        self.what, self.bounds, self.entries, self.bytes = what, bounds, 0, 0

    def entry(self, rel: str, kind: str) -> None:
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if rel.startswith("/") or ".." in parts:
            raise DecodelabError(f"{self.what}: {rel} points outside the tree")
        if not parts and kind != "directory":
            raise DecodelabError(f"{self.what}: a {kind} with an empty name; pack the host's "
                                 "folder again (e.g. tar czf host.tgz -C results <host>)")
        if len(parts) > MAX_DEPTH:
            raise DecodelabError(f"{self.what}: {rel} is nested deeper than {MAX_DEPTH} "
                                 "folders; a host's results are not")
        if kind not in ("file", "directory"):
            raise self.refusal(rel, kind)
        self.entries += 1
        if self.entries > self.bounds.max_files:
            raise DecodelabError(f"{self.what} holds more than {self.bounds.max_files} "
                                 "files and directories (--max-files)")

    def refusal(self, rel: str, kind: str) -> DecodelabError:
        return DecodelabError(f"{self.what}: {rel} is a {kind}; an import takes regular files "
                              "and directories only (copy what it points to into the tree)")

    def room(self) -> int:
        """The most bytes the next file may hold."""
        return min(self.bounds.max_file_bytes, self.bounds.max_bytes - self.bytes)

    def add(self, rel: str, size: int) -> None:
        if size > self.bounds.max_file_bytes:
            raise DecodelabError(f"{self.what}: {rel} holds {size} bytes, more than the "
                                 f"{self.bounds.max_file_bytes} a file may (--max-file-bytes)")
        self.bytes += size
        if self.bytes > self.bounds.max_bytes:
            raise DecodelabError(f"{self.what} holds more than {self.bounds.max_bytes} bytes "
                                 f"(--max-bytes): {self.bytes} up to {rel}")


# -- a tarball: every header checked before anything is unpacked

class TarHeaderBomb(Exception):
    pass


def refuse_sparse(self, *args):
    raise TarHeaderBomb(f"{self.name} is a sparse file: an import takes regular files only")


class BoundedTarInfo(tarfile.TarInfo):
    """A header whose extension tarfile reads into memory whole (a GNU long name, a pax
    record) only when it declares at most MAX_TAR_HEADER bytes; no sparse maps, whose length
    is the member's to declare. tarfile's own hook for custom _proc_* methods."""

    def _proc_member(self, tarfile_):
        if self.type == tarfile.GNUTYPE_SPARSE:
            refuse_sparse(self)
        if self.type in EXTENDED_HEADERS and self.size > MAX_TAR_HEADER:
            raise TarHeaderBomb(
                f"an extended header ({EXTENDED_HEADERS[self.type]}) declares {self.size} "
                f"bytes, more than the {MAX_TAR_HEADER} a header may; pack the host's folder "
                "again with plain tar")
        return super()._proc_member(tarfile_)

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = refuse_sparse


EXTENDED_HEADERS = {tarfile.GNUTYPE_LONGNAME: "GNU long name",
                    tarfile.GNUTYPE_LONGLINK: "GNU long link", tarfile.XHDTYPE: "pax",
                    tarfile.XGLTYPE: "pax global", tarfile.SOLARIS_XHDTYPE: "Solaris pax"}


def check_members(tar: tarfile.TarFile, tally: Tally) -> None:
    for member in tar:  # one header at a time: a refusal stops before the rest is read
        kind = member_kind(member)
        tally.entry(member.name, kind)
        if kind == "file":
            tally.add(member.name, member.size)


def unpack(tarball: Path, into: Path, bounds: Bounds) -> Path:
    """Check every member's header, then unpack: nothing reaches the disk before the bounds
    hold and no link is ever made. An error writing `into` is left to the caller."""
    what = f"tarball {tarball}"
    try:
        with open(tarball, "rb") as raw, tarfile.open(fileobj=raw,
                                                      tarinfo=BoundedTarInfo) as tar:
            check_members(tar, Tally(what, bounds))
            tar.extractall(into, filter="data")
    except TarHeaderBomb as err:
        raise DecodelabError(f"{what}: {err}") from None
    except RecursionError:
        raise DecodelabError(f"{what}: extended headers nested too deep to read") from None
    except OSError as err:
        if writing(err, into):
            raise
        raise DecodelabError(f"cannot unpack {tarball}: {err}") from err
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as err:
        raise DecodelabError(f"cannot unpack {tarball}: {err}") from err
    return find_root(into)


# -- a directory: each file opened once, links never followed, copied within the bounds

def writing(err: OSError, dest: Path) -> bool:
    """Whether `err` came from writing under `dest` rather than from reading the source."""
    return err.errno in WRITE_ERRORS or (
        err.filename is not None and Path(os.fsdecode(err.filename)).is_relative_to(dest))


class Changed(Exception):
    """An entry that is no longer what the walk listed: (path, kind now, kind then)."""


def kind_now(name: str, dir_fd: int) -> str:
    try:
        return stat_kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return "missing entry"


def open_no_follow(name: str, dir_fd: int, rel: str, was: str) -> int:
    """A descriptor on `name`, the `was` that the walk listed, or Changed: a link is never
    followed (O_NOFOLLOW), a fifo never waited on (O_NONBLOCK)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags | (os.O_DIRECTORY if was == "directory" else 0),
                     dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):  # a link, file, socket now
            raise Changed(rel, kind_now(name, dir_fd), was) from err
        raise
    kind = stat_kind(os.fstat(fd).st_mode)
    if kind != was:
        os.close(fd)
        raise Changed(rel, kind, was)
    return fd


def tree_entries(dir_fd: int, names: Iterable[str], prefix: str = ""
                 ) -> Iterator[tuple[str, str, int, str]]:
    """(path relative to the source, kind, its folder's descriptor, name) of what an import
    copies, by lstat. A folder is opened, without following a link, after it is yielded:
    one swapped for a link since is refused, not walked."""
    for name in names:
        rel = prefix + name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # an optional part of the layout
        kind = stat_kind(st.st_mode)
        yield rel, kind, dir_fd, name
        if kind == "directory":
            fd = open_no_follow(name, dir_fd, rel, kind)
            try:
                yield from tree_entries(fd, sorted(os.listdir(fd)), rel + "/")
            finally:
                os.close(fd)


def copy_from(fd: int, target: Path, limit: int) -> int:
    """Copy up to `limit` bytes from `fd` into a new file `target`; the bytes copied."""
    copied, out = 0, os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        while copied < limit and (chunk := os.read(fd, min(CHUNK, limit - copied))):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
            copied += len(chunk)
    finally:
        os.close(out)
    return copied


def copy_file(dir_fd: int, name: str, rel: str, target: Path, tally: Tally) -> None:
    """Copy one file through the descriptor it is checked on: what lands is what passed."""
    fd = open_no_follow(name, dir_fd, rel, "file")
    try:
        limit = tally.room() + 1  # a byte past the bound tells a file over it
        size = os.fstat(fd).st_size
        if size < limit:
            size = copy_from(fd, target, limit)
            if size == limit:  # it grew past the bound since: say by how much
                size = max(size, os.fstat(fd).st_size)
        tally.add(rel, size)
    finally:
        os.close(fd)


def copy_tree(root: Path, dest: Path, what: str, bounds: Bounds) -> list[str]:
    """Copy what an import takes from `root` into a new `dest`, every entry counted against
    the bounds; the files copied, relative to dest."""
    tally, files, rel = Tally(what, bounds), [], "."
    dest.mkdir()
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise DecodelabError(f"{what}: cannot read it ({err.strerror})") from err
    try:
        for rel, kind, dir_fd, name in tree_entries(root_fd, COPIED):
            tally.entry(rel, kind)
            if kind == "directory":
                (dest / rel).mkdir()
            else:
                copy_file(dir_fd, name, rel, dest / rel, tally)
                files.append(rel)
    except Changed as change:
        rel, kind, was = change.args
        raise DecodelabError(f"{what}: {rel} is a {kind} now, not the {was} it was when "
                             "listed; import from a folder that nothing is changing") from None
    except OSError as err:
        if writing(err, dest):
            raise
        raise DecodelabError(f"{what}: cannot read {rel} ({err.strerror}); fix its "
                             "permissions and import again") from err
    finally:
        os.close(root_fd)
    return files


# -- every table reads, and holds what the paper can typeset

def read_bounded(path: Path, what: str, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise DecodelabError(f"{what} holds more than {limit} bytes (--max-file-bytes)")
    return data


def check_shape(text: str, what: str) -> None:
    """Refuse a table pandas would spend seconds and GiBs on: more than MAX_COLUMNS columns,
    or MAX_CELLS cells (it pads every row to the header). Counted from above: a quoted comma
    or newline counts as a column or a row."""
    end = text.find("\n")  # the header's line, counted in place rather than copied
    end = len(text) if end < 0 else end
    if text.count('"', 0, end) % 2:
        raise DecodelabError(f"{what}: its header runs past its first line (a newline in a "
                             "quoted column name); a table's column names are one line")
    columns = text.count(",", 0, end) + 1
    rows = text.count("\n") - text.endswith("\n")  # below the header
    if columns > MAX_COLUMNS:
        raise DecodelabError(f"{what} has {columns} columns, more than the {MAX_COLUMNS} a "
                             "table may")
    if rows * columns > MAX_CELLS:
        raise DecodelabError(f"{what} has {rows} rows x {columns} columns, more than the "
                             f"{MAX_CELLS} cells a table may")


def read_csv_text(path: Path, what: str, limit: int = Bounds.max_file_bytes, **kwargs
                  ) -> pd.DataFrame | None:
    """The table at `path`, None when the file is empty; an error naming the file when it is
    over `limit` bytes or its shape's bounds, not UTF-8 text, or does not parse."""
    data = read_bounded(path, what, limit)
    if b"\0" in data:
        raise DecodelabError(f"{what} holds NUL bytes: binary, not CSV text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DecodelabError(f"{what} is not UTF-8 text (byte {data[err.start]:#04x} at "
                             f"offset {err.start})") from err
    if not text.strip():
        return None
    check_shape(text, what)
    try:
        return pd.read_csv(io.StringIO(text), **kwargs)
    except (pd.errors.ParserError, ValueError) as err:
        raise DecodelabError(f"{what} does not parse as CSV: "
                             f"{str(err).strip().splitlines()[-1]}") from err


def non_number(df: pd.DataFrame, columns: Iterable[str]) -> tuple[int, str, str] | None:
    """(row, column, value) of the first cell of `columns` that is neither empty nor a finite
    number."""
    first = None
    for column in [c for c in columns if c in df.columns]:
        cells = df[column]
        numbers = pd.to_numeric(cells.where(cells != ""), errors="coerce").astype(float)
        bad = ((cells != "") & ~np.isfinite(numbers)).to_numpy().nonzero()[0]
        if len(bad) and (first is None or bad[0] < first[0]):
            first = bad[0], column
    if first is None:
        return None
    row, column = first
    return row + 1, column, df[column].iloc[row]


def check_table(path: Path, what: str, table: tables.Table | None, limit: int) -> None:
    """The table reads, every cell typesets, its declared numbers are numbers and the host
    contract's columns are there."""
    df = read_csv_text(path, what, limit, dtype=str, keep_default_na=False)
    columns = table.required if table else None
    if df is None:
        if columns is None:
            return  # an optional table may be empty, as the merge reads it
        raise DecodelabError(f"{what} is empty; it needs a header with {', '.join(columns)}")
    if not isinstance(df.index, pd.RangeIndex):  # rows one field longer: pandas' index
        df = df.reset_index()
    check_cells(df, what, ": replace it on the host and export again")
    if table and (bad := non_number(df, table.numeric)):
        row, column, value = bad
        raise DecodelabError(f"{what} row {row}, column {column}: {value[:40]!r} is not a "
                             "finite number, which the paper reads there (write one, or "
                             "leave the cell empty)")
    missing = [c for c in columns or () if c not in df.columns]
    if missing:
        raise DecodelabError(f"{what} lacks the column(s) {', '.join(missing)} that the merge "
                             f"and the paper read (it needs {', '.join(columns)})")


def decoded_bytes(batch) -> int:
    """What `batch` takes with its dictionary-encoded strings spelled out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for column in batch.columns:
        if pa.types.is_dictionary(column.type):
            lengths = pc.take(pc.binary_length(column.dictionary), column.indices)
            total += (pc.sum(lengths).as_py() or 0) + 8 * len(column)
        else:
            total += column.nbytes
    return total


def check_parquet(path: Path, what: str, bounds: Bounds) -> None:
    """Every page decodes, to at most PARQUET_EXPANSION x --max-file-bytes: first as the
    footer declares it (8 bytes a value, or the pages' uncompressed size), before any page is
    read; then as decoded, a batch at a time, strings kept dictionary-encoded meanwhile."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    limit = PARQUET_EXPANSION * bounds.max_file_bytes
    refusal = (f"more than the {limit} bytes an import decodes ({PARQUET_EXPANSION} x "
               "--max-file-bytes)")
    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups)
                  for c in range(meta.num_columns)]
        values = sum(c.num_values for c in chunks)
        stored = sum(c.total_uncompressed_size for c in chunks)
        if max(8 * values, stored) > limit:
            raise DecodelabError(f"{what} declares {values} values ({meta.num_rows} rows x "
                                 f"{meta.num_columns} columns), {stored} bytes uncompressed: "
                                 f"{refusal}")
        strings = [f.name for f in parquet.schema_arrow if pa.types.is_string(f.type)
                   or pa.types.is_binary(f.type) or pa.types.is_large_string(f.type)]
        decoded = 0
        for batch in pq.ParquetFile(path, read_dictionary=strings).iter_batches(4096):
            decoded += decoded_bytes(batch)
            if decoded > limit:
                raise DecodelabError(f"{what} decodes to {refusal}")
    except (OSError, ValueError, pa.ArrowException) as err:
        raise DecodelabError(f"{what} is not a readable parquet file: {err}") from err


def check_contents(root: Path, what: str, bounds: Bounds) -> None:
    """Every table parses as the merge and the paper will read it, and holds only what the
    paper can typeset; runs.parquet decodes within the bounds."""
    declared = {t.name: t for t in tables.all_tables()}
    for path in sorted((root / "stats").rglob("*.csv")):
        table = declared.get(path.stem) if path.parent == root / "stats" else None
        check_table(path, f"{what}: {path.relative_to(root)}", table, bounds.max_file_bytes)
    if (root / "runs.parquet").exists():
        check_parquet(root / "runs.parquet", f"{what}: runs.parquet", bounds)


def swap_into_place(staged: Path, dest: Path, old: Path) -> None:
    if dest.exists():
        os.replace(dest, old)
    try:
        os.replace(staged, dest)
    except OSError as err:
        if old.exists():
            os.replace(old, dest)
        raise DecodelabError(f"cannot move the import into {dest}: {err}") from err


def write_failure(err: OSError, where: Path, verb: str) -> DecodelabError:
    path = f" ({err.filename})" if err.filename else ""
    return DecodelabError(f"cannot write into {where}: {err.strerror or err}{path}; free space "
                          f"on its disk or make it writable, then {verb} again (nothing was "
                          "written)")


def import_host(source: Path, host: str, results: Path = Path("results"),
                replace: bool = False, bounds: Bounds = Bounds()) -> Path:
    """Copy another host's results (a directory or a tarball) into results/<host>/ atomically.

    The copy is checked (no links or special files, within `bounds`, every table readable
    and typesettable) as staged beside the destination, then renamed into place, so a failed
    import leaves nothing behind and an interrupted one never leaves half a host.
    """
    check_host_name(host)
    source, results = Path(source), Path(results)
    if not source.exists():
        raise DecodelabError(f"nothing to import: {source} does not exist")
    dest = results / host
    check_replaceable(dest, replace)
    what = f"import source {source}"
    try:
        results.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=results, prefix=f".import-{host}-") as tmp:
            tmp = Path(tmp)
            root = unpack(source, tmp / "unpacked", bounds) if source.is_file() else source
            staged = tmp / "staged"
            files = copy_tree(root, staged, what, bounds)
            check_layout(staged, "import source", shown=source)
            check_contents(staged, what, bounds)
            manifest = {"host": host, "imported_from": str(source.resolve()),
                        "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
                        "files": sorted(files)}
            (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            swap_into_place(staged, dest, tmp / "old")
    except OSError as err:
        raise write_failure(err, results, "import") from err
    return dest


# -----------------------------------------------------------------------------
# merge: one table per name over all hosts

def read_host_tables(root: Path) -> dict[str, pd.DataFrame]:
    """Every stats table of a host, each read within the bounds an import holds it to."""
    frames = {}
    for path in sorted((Path(root) / "stats").glob("*.csv")):
        df = read_csv_text(path, str(path))
        frames[path.stem] = pd.DataFrame() if df is None else df
    return frames


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


def hosts_table(roots: dict[str, Path], local: str,
                environments: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for host, root in roots.items():
        env = environments[host]
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


def write_tables(frames: dict[Path, pd.DataFrame], out_dir: Path) -> list[Path]:
    """Write every table or none: each beside its place first, then all renamed in."""
    staged = {}
    try:
        for path, df in frames.items():
            staged[path] = write_table(df, path.with_name(f".{path.name}.merging"))
        for path, tmp in staged.items():
            os.replace(tmp, path)
    except OSError as err:
        raise write_failure(err, out_dir, "merge") from err
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    return list(frames)


def merge(roots: dict[str, Path], local: str, out_dir: Path, names: list[str]) -> list[Path]:
    """Write out_dir/<name>.csv for every name in `names` (header-only when no host has it)
    and out_dir/hosts.csv, all or none; `roots` maps host -> results/<host>, the local host
    among them."""
    if local not in roots:
        raise DecodelabError(f"the local host {local!r} is not among the hosts to merge")
    for host, root in roots.items():
        check_layout(Path(root), f"host {host!r}:")
    by_host = {h: read_host_tables(r) for h, r in roots.items()}
    merged = merge_tables(by_host, local)
    out_dir = Path(out_dir)
    frames = {out_dir / f"{name}.csv": merged.get(name, pd.DataFrame())
              for name in names if name != "hosts"}
    environments = {h: tabs["environment"] for h, tabs in by_host.items()}
    frames[out_dir / "hosts.csv"] = hosts_table(roots, local, environments)
    return write_tables(frames, out_dir)
