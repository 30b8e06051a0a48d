"""`decodelab import` against hostile and careless input (issue 13, items 2-4; issue 60): names
outside the rule, links and special files (also swapped in after a check), bombs (also inside
the bounds: tar headers, parquet pages, wide tables), unreadable or untypesettable tables, a
full or read-only disk, and replacing what an import did not write. Every refusal leaves
results/ exactly as it was, hashed before and after."""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures import host_dir

from decodelab import cli
from decodelab.core import hosts
from decodelab.core.errors import DecodelabError
from decodelab.core.io import write_table

SMALL = {"max_bytes": 2**20, "max_file_bytes": 2**20, "max_files": 100}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Built once: results/ with a committed reference, this machine's own host `vm`, an
    imported `mac`; and box/, another host's results/<host>/ to import."""
    root = tmp_path_factory.mktemp("template")
    results = root / "results"
    host_dir(results / "reference" / "default-cpu")
    (results / "reference" / "README.md").write_text("committed\n")
    host_dir(results / "vm")
    hosts.import_host(host_dir(root / "mac-src"), "mac", results)
    host_dir(root / "box")
    return root


@pytest.fixture
def results(template, tmp_path) -> Path:
    return Path(shutil.copytree(template / "results", tmp_path / "results"))


@pytest.fixture
def src(template, tmp_path) -> Path:
    return Path(shutil.copytree(template / "box", tmp_path / "box"))


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under root: a file's hash, a link's target, or 'dir'."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                seen[rel] = "link " + os.readlink(path)
            elif path.is_dir():
                seen[rel] = "dir"
            else:
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def refused(results: Path, match: str, source: Path, host: str = "box", **kwargs) -> None:
    """The import raises an error matching `match` and changes nothing under results/."""
    before = snapshot(results)
    with pytest.raises(DecodelabError, match=match):
        hosts.import_host(source, host, results, **kwargs)
    assert snapshot(results) == before


def tarball(src: Path, out: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]] = ()
            ) -> Path:
    """src packed as box/..., plus `extra` members (bytes for files, None for the rest)."""
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname="box")
        for info, data in extra:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


# -----------------------------------------------------------------------------
# item 2: host names, and what --replace may replace

@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("name", ["..", ".", ".hidden", "x" * 65, "Reference", "PAPER"])
def test_host_names_outside_the_rule_are_refused(results, src, name, replace):
    refused(results, rf"host name '{re.escape(name[:64])}(\.\.\.)?' is not a usable name", src,
            name, replace=replace)


def test_cli_names_the_rule_without_a_traceback(results, src, capsys):
    before = snapshot(results)
    rc = cli.main(["import", "--from", str(src), "--host", "..", "--results", str(results),
                   "--replace"])
    err = capsys.readouterr().err
    assert rc == 2 and snapshot(results) == before
    assert err.startswith("decodelab import: error: host name '..' is not a usable name: ")
    assert "[A-Za-z0-9_][A-Za-z0-9._-]{0,63}" in err and "Traceback" not in err


@pytest.mark.parametrize("replace", [False, True])
def test_replace_replaces_only_an_imported_host(results, src, replace):
    (src / "stats" / "extra.csv").write_text("a\n1\n")
    dest = hosts.import_host(src, "mac", results, replace=True)  # imported before: replaced
    assert (dest / "stats" / "extra.csv").is_file()
    refused(results, r"results/vm is not an imported host \(it has no IMPORTED\.json", src, "vm",
            replace=replace)


# -----------------------------------------------------------------------------
# item 3: links and special files, in a directory and in a tarball

def plant_link(src: Path, outside: Path, where: str) -> None:
    """src/<where> becomes a link to something outside src (a file, a folder, its own stats)."""
    outside.mkdir()
    (outside / "secret.csv").write_text("secret\n42\n")
    if where in ("stats", "stats/latency.csv"):
        (src / where).rename(outside / "moved")
        target = outside / "moved"
    else:
        target = outside / "secret.csv" if where.endswith(".csv") else outside
    (src / where).symlink_to(target)


@pytest.mark.parametrize("where", ["stats/leak.csv", "figures/x", "stats/latency.csv", "stats"])
def test_directory_import_refuses_a_link(results, src, tmp_path, where):
    plant_link(src, tmp_path / "outside", where)
    refused(results, rf"import source .*: {where} is a symbolic link", src)


def test_directory_import_refuses_a_fifo(results, src):
    os.mkfifo(src / "figures" / "pipe")
    refused(results, r"figures/pipe is a fifo; an import takes regular files and directories",
            src)


@pytest.mark.parametrize("extra, match", [
    (member("box/stats/leak.csv", tarfile.SYMTYPE, "latency.csv"),
     r"box/stats/leak\.csv is a symbolic link"),
    (member("box/figures/up", tarfile.SYMTYPE, "../../.."), r"box/figures/up is a symbolic link"),
    (member("box/stats/copy.csv", tarfile.LNKTYPE, "box/stats/latency.csv"),
     r"box/stats/copy\.csv is a hard link"),
    (member("box/figures/pipe", tarfile.FIFOTYPE), r"box/figures/pipe is a fifo"),
    (member("box/../escape.csv"), r"box/\.\./escape\.csv points outside the tree"),
])
def test_tarball_import_refuses_links_special_files_and_escapes(results, src, tmp_path, extra,
                                                                match):
    data = b"a\n1\n" if extra.isreg() else None
    refused(results, match, tarball(src, tmp_path / "box.tgz", [(extra, data)]))


# -----------------------------------------------------------------------------
# item 4: bounds, checked before anything is unpacked

def test_a_tar_bomb_is_refused_from_its_headers(results, src, tmp_path, monkeypatch):
    bomb = tarball(src, tmp_path / "bomb.tgz", [(member("box/figures/zeros.png"), bytes(4 << 20))])
    assert bomb.stat().st_size < 2**16  # 4 MiB of zeros in a few KB
    unpacked = []
    monkeypatch.setattr(tarfile.TarFile, "extractall", lambda *a, **k: unpacked.append(a))
    refused(results, r"tarball .*bomb\.tgz: box/figures/zeros\.png holds 4194304 bytes, more "
            r"than the 1048576 a file may \(--max-file-bytes\)", bomb, bounds=hosts.Bounds(**SMALL))
    assert not unpacked, "the tarball was unpacked before its sizes were checked"


@pytest.mark.parametrize("form", ["directory", "tarball"])
@pytest.mark.parametrize("bound, match", [
    ({"max_bytes": 3 << 19}, r"holds more than 1572864 bytes \(--max-bytes\)"),
    ({"max_files": 19, "max_bytes": 4 << 20},
     r"holds more than 19 files and directories \(--max-files\)"),
])
def test_total_size_and_file_count_are_bounded(results, src, tmp_path, form, bound, match):
    for i in range(3):
        (src / "figures" / f"f{i}.png").write_bytes(os.urandom(1 << 19))  # 3 x 512 KiB
    source = src if form == "directory" else tarball(src, tmp_path / "box.tgz")
    refused(results, match, source, bounds=hosts.Bounds(**(SMALL | bound)))


def test_cli_takes_the_bounds_as_options(results, src, tmp_path, capsys):
    bomb = tarball(src, tmp_path / "bomb.tgz", [(member("box/stats/zeros.csv"), bytes(2 << 20))])
    before = snapshot(results)
    rc = cli.main(["import", "--from", str(bomb), "--host", "box", "--results", str(results),
                   "--max-file-bytes", "1M"])
    assert rc == 2 and snapshot(results) == before
    assert "zeros.csv holds 2097152 bytes, more than the 1048576" in capsys.readouterr().err


# -----------------------------------------------------------------------------
# item 4: every table parses at import, as the merge and the paper will read it

LATENCY_WITHOUT_MEDIAN = b"experiment,backend,model,family,dtype,prompt_len,use_cache,budget\n"


@pytest.mark.parametrize("form", ["directory", "tarball"])
@pytest.mark.parametrize("name, data, match", [
    ("stats/latency.csv", b"", r"stats/latency\.csv is empty; it needs a header with experiment"),
    ("stats/skipped.csv", b"\n\n", r"stats/skipped\.csv is empty; it needs a header with backend"),
    ("stats/environment.csv", b"\x89PNG\r\n\x1a\n\xff\xfe",
     r"stats/environment\.csv is not UTF-8 text \(byte 0x89 at offset 0\)"),
    ("stats/regimes.csv", bytes(4096), r"stats/regimes\.csv holds NUL bytes: binary"),
    ("stats/latency.csv", LATENCY_WITHOUT_MEDIAN,
     r"stats/latency\.csv lacks the column\(s\) metric, median, ci_low, ci_high, n that the"),
    ("stats/kv_speedup.csv", b"backend,model\ncpu,a\ncpu,a,b,c\n",
     r"stats/kv_speedup\.csv does not parse as CSV: .*Expected 2 fields"),
    ("stats/speculative_hf.csv", b"pair,k\n\xc3(\n", r"stats/speculative_hf\.csv is not UTF-8"),
    ("runs.parquet", b"PAR1 not a parquet PAR1", r"runs\.parquet is not a readable parquet"),
])
def test_unreadable_tables_are_refused(results, src, tmp_path, form, name, data, match):
    (src / name).write_bytes(data)
    source = src if form == "directory" else tarball(src, tmp_path / "box.tgz")
    refused(results, rf"import source .*: {match}", source)


def test_empty_optional_tables_and_a_real_parquet_import_and_merge(results, src, tmp_path):
    (src / "stats" / "benchmarks.csv").write_text("\n")  # what write_table makes of no rows
    runs = pd.DataFrame({"backend": ["cpu"] * 3, "total_s": [0.1, 0.2, 0.3]})
    runs.to_parquet(src / "runs.parquet")
    dest = hosts.import_host(src, "box", results)
    merged = hosts.merge({"vm": results / "vm", "box": dest}, "vm", tmp_path / "out",
                         ["latency", "benchmarks"])
    assert pd.read_csv(merged[0])["host"].isin(["vm", "box"]).all()
    (src / "runs.parquet").write_bytes((src / "runs.parquet").read_bytes()[:-40])  # truncated
    refused(results, r"runs\.parquet is not a readable parquet file", src, "box2")



# -----------------------------------------------------------------------------
# issue 60, class 1: every imported cell typesets, every declared number is one

def set_cell(path: Path, row: int, column: str, value: str) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.loc[row - 1, column] = value
    df.to_csv(path, index=False)


@pytest.mark.parametrize("table, column, value, match", [
    ("environment", "device_name", "cpu\adevice", r"control character U\+0007"),
    ("environment", "backend", "cpu\u4e2d", r"character U\+4E2D \(\u4e2d\) that the paper's fonts"),
    ("skipped", "reason", "tab\there", r"control character U\+0009"),
    ("skipped", "reason", "two\nlines", r"control character U\+000A"),
    ("speculative_floor", "role", "target\u202e", r"control character U\+202E"),
    ("latency", "metric", "decode_s\u0127", r"character U\+0127"),
])
def test_untypesettable_cells_are_refused_naming_row_and_column(results, src, table, column,
                                                                 value, match):
    path = src / "stats" / f"{table}.csv"
    if table == "skipped":
        path.write_text("host,backend,reason\nbox,cuda,none\n")
    set_cell(path, 1, column, value)
    refused(results, rf"import source .*: stats/{table}\.csv row 1, column {column}: {match}",
            src)


def test_an_untypesettable_column_name_is_refused(results, src, tmp_path):
    (src / "stats" / "benchmarks.csv").write_text("rule,s\x1b[31m\nstats,1\n")
    refused(results, r"stats/benchmarks\.csv header, column 2: control character U\+001B",
            tarball(src, tmp_path / "box.tgz"))


@pytest.mark.parametrize("value", ["many", "inf", "2 cores"])
def test_a_declared_number_that_is_not_one_is_refused(results, src, value):
    set_cell(src / "stats" / "environment.csv", 1, "cpu_count", value)
    refused(results, rf"stats/environment\.csv row 1, column cpu_count: '{value}' is not a "
            "finite number", src)


def test_accented_latin_letters_and_empty_numbers_import(results, src):
    set_cell(src / "stats" / "environment.csv", 1, "device_name", "Łódź Müller café")
    set_cell(src / "stats" / "environment.csv", 1, "cpu_count", "")
    dest = hosts.import_host(src, "box", results)
    env = pd.read_csv(dest / "stats" / "environment.csv")
    assert env.loc[0, "device_name"] == "Łódź Müller café"


REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


def test_every_committed_reference_table_passes_the_import_checks():
    roots = sorted({p.parent for p in REFERENCE.rglob("stats") if p.is_dir()})
    assert len(roots) > 3
    for root in roots:
        hosts.check_contents(root, str(root), hosts.Bounds())


# -----------------------------------------------------------------------------
# class 2: what is copied is what was checked (no window between check and copy)

def swap_after_listing(monkeypatch, rel: str, swap) -> None:
    """`swap()` runs once, right after the walk has looked at `rel` and before the import
    copies it."""
    walk, done = hosts.tree_entries, []

    def swapping(*args, **kwargs):
        for entry in walk(*args, **kwargs):
            if entry[0] == rel and not done:
                done.append(swap())
            yield entry
    monkeypatch.setattr(hosts, "tree_entries", swapping)


def test_a_file_swapped_for_a_link_after_its_check_is_refused(results, src, tmp_path,
                                                              monkeypatch):
    (tmp_path / "secret.csv").write_text("secret\n42\n")
    (src / "stats" / "leak.csv").write_text("a\n1\n")
    leak = src / "stats" / "leak.csv"
    swap_after_listing(monkeypatch, "stats/leak.csv",
                       lambda: (leak.unlink(), leak.symlink_to(tmp_path / "secret.csv")))
    refused(results, r"import source .*: stats/leak\.csv is a symbolic link now, not the file "
            "it was", src)


def test_a_folder_swapped_for_a_link_after_its_check_is_refused(results, src, tmp_path,
                                                                monkeypatch):
    outside = tmp_path / "outside"
    shutil.copytree(src / "stats", outside)
    (outside / "secret.csv").write_text("secret\n42\n")

    def swap():
        (src / "stats").rename(tmp_path / "moved")
        (src / "stats").symlink_to(outside)
    swap_after_listing(monkeypatch, "stats", swap)
    refused(results, r"import source .*: stats is a symbolic link now, not the directory it", src)


def test_a_file_grown_past_the_bound_after_its_check_is_refused(results, src, monkeypatch):
    png = src / "figures" / "grows.png"
    png.write_bytes(b"small")
    swap_after_listing(monkeypatch, "figures/grows.png",
                       lambda: png.write_bytes(bytes(2 << 20)))
    refused(results, r"figures/grows\.png holds 2097152 bytes, more than the 1048576 a file "
            r"may \(--max-file-bytes\)", src, bounds=hosts.Bounds(**SMALL))


# -----------------------------------------------------------------------------
# class 3: bombs inside the bounds

def raw_header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def extended_header_bomb(src: Path, out: Path, kind: bytes, size: int) -> Path:
    """src packed as box/..., then an extended header of `kind` declaring `size` bytes of
    zeros before a file's header; gzip'd, a few KB per MiB declared."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(src, arcname="box")
    body = plain.getvalue().rstrip(b"\0")
    body += bytes(-len(body) % 512)
    with gzip.open(out, "wb", compresslevel=1) as gz:
        gz.write(body + raw_header("././@LongLink", kind, size))
        for _ in range((size + 511) // 512 * 512 // (1 << 20)):
            gz.write(bytes(1 << 20))
        gz.write(bytes((size + 511) // 512 * 512 % (1 << 20)))
        gz.write(raw_header("box/figures/x.png", tarfile.REGTYPE, 0) + bytes(1024))
    return out


@pytest.mark.parametrize("kind, label", [(tarfile.GNUTYPE_LONGNAME, "GNU long name"),
                                         (tarfile.XHDTYPE, "pax"),
                                         (tarfile.XGLTYPE, "pax global")])
def test_a_tar_extended_header_bomb_is_refused_before_it_is_read(results, src, tmp_path,
                                                                 kind, label):
    bomb = extended_header_bomb(src, tmp_path / "bomb.tgz", kind, 16 << 20)
    assert bomb.stat().st_size < 2**17
    refused(results, rf"tarball .*bomb\.tgz: an extended header \({label}\) declares 16777216 "
            r"bytes, more than the 65536 a header may", bomb)


@pytest.mark.parametrize("form", ["directory", "tarball"])
def test_directories_count_against_max_files(results, src, tmp_path, form):
    for i in range(40):
        (src / "figures" / f"d{i}").mkdir()
    source = src if form == "directory" else tarball(src, tmp_path / "box.tgz")
    refused(results, r"holds more than 60 files and directories \(--max-files\)", source,
            bounds=hosts.Bounds(**(SMALL | {"max_files": 60})))


def test_a_parquet_declaring_more_values_than_the_bound_is_refused(results, src):
    runs = pa.table({"total_s": pa.array(np.zeros(2_000_000))})  # 16 MB decoded
    pq.write_table(runs, src / "runs.parquet")
    assert (src / "runs.parquet").stat().st_size < 2**16
    refused(results, r"runs\.parquet declares 2000000 values \(2000000 rows x 1 columns\), "
            r"\d+ bytes uncompressed: more than the 8388608 bytes an import decodes", src,
            bounds=hosts.Bounds(**SMALL))


def test_a_parquet_of_one_long_string_repeated_is_refused(results, src):
    strings = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1000, dtype=np.int32)),
                                             pa.array(["x" * (100 << 10)]))
    pq.write_table(pa.table({"backend": strings}), src / "runs.parquet")  # 100 MB decoded
    assert (src / "runs.parquet").stat().st_size < 2**18
    refused(results, r"runs\.parquet decodes to more than the 8388608 bytes an import decodes",
            src, bounds=hosts.Bounds(**SMALL))


@pytest.mark.parametrize("text, match", [
    (",".join(f"c{i}" for i in range(200_000)) + "\n" + "1," * 199_999 + "1\n",
     r"has 200000 columns, more than the 1000 a table may"),
    (",".join(f"c{i}" for i in range(1000)) + "\n" + "1\n" * 5000,
     r"has 5000 rows x 1000 columns, more than the 2097152 cells a table may"),
    ('"a\nb",c\n1,2\n', r"its header runs past its first line"),
])
def test_a_table_too_wide_or_too_ragged_is_refused_before_pandas_reads_it(results, src, tmp_path,
                                                                         text, match):
    (src / "stats" / "wide.csv").write_text(text)
    refused(results, rf"stats/wide\.csv:? {match}", src)
    vm = host_dir(tmp_path / "vm")
    (vm / "stats" / "wide.csv").write_text(text)  # a local host's table: the merge bounds it
    with pytest.raises(DecodelabError, match=rf"vm/stats/wide\.csv:? {match}"):
        hosts.merge({"vm": vm}, "vm", tmp_path / "out", ["latency"])


# -----------------------------------------------------------------------------
# class 4: a full or read-only disk, an empty member name: one line, nothing partial

def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["copy", "manifest"])
def test_a_full_disk_during_import_is_one_line_and_leaves_nothing(results, src, monkeypatch,
                                                                  where):
    if where == "copy":
        write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: no_space() if fd > 2 else
                            write(fd, data))
    else:
        monkeypatch.setattr(Path, "write_text", no_space)
    refused(results, r"cannot write into .*results: No space left on device; free space on "
            r"its disk or make it writable, then import again \(nothing was written\)", src)


def test_a_read_only_results_during_import_is_one_line(results, src, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(results))
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    refused(results, r"cannot write into .*results: Read-only file system \(.*results\); free "
            "space on its disk or make it writable", src)


def test_cli_full_disk_during_import_without_a_traceback(results, src, monkeypatch, capsys):
    monkeypatch.setattr(Path, "write_text", no_space)
    before = snapshot(results)
    rc = cli.main(["import", "--from", str(src), "--host", "box", "--results", str(results)])
    err = capsys.readouterr().err
    assert rc == 2 and snapshot(results) == before
    assert err.startswith("decodelab import: error: cannot write into ") and err.count("\n") == 1
    assert "No space left on device" in err and "Traceback" not in err


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_cli_full_or_read_only_disk_during_merge_leaves_no_table(results, tmp_path,
                                                                  monkeypatch, capsys, error):
    out = tmp_path / "combined"
    out.mkdir()
    (out / "latency.csv").write_text("old\n")
    written = []

    def fails_second(df, path):
        if written:
            raise OSError(error, os.strerror(error), str(path))
        written.append(path)
        return write_table(df, path)
    monkeypatch.setattr(hosts, "write_table", fails_second)
    before = snapshot(out)
    rc = cli.main(["merge-hosts", "--local", "vm", "--out", str(out), "--tables", "latency",
                   "environment", "--hosts", f"vm={results / 'vm'}", f"mac={results / 'mac'}"])
    err = capsys.readouterr().err
    assert rc == 2 and snapshot(out) == before, "a partial merge was left"
    assert err.startswith(f"decodelab merge-hosts: error: cannot write into {out}: ")
    assert err.count("\n") == 1 and "then merge again" in err and "Traceback" not in err


def test_a_tar_member_with_an_empty_name_is_refused(results, src, tmp_path):
    bad = tarball(src, tmp_path / "box.tgz", [(member(""), b"a\n1\n")])
    refused(results, r"tarball .*box\.tgz: a file with an empty name; pack the host's folder "
            "again", bad)
