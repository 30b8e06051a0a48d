"""`decodelab import` against hostile and careless input (issue 13, items 2-4): names outside
the rule, links and special files, bombs, unreadable tables, and replacing what an import did
not write. Every refusal leaves results/ exactly as it was, hashed before and after."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from fixtures import host_dir

from decodelab import cli, hosts
from decodelab.errors import DecodelabError

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
    refused(results, rf"host name '{re.escape(name)}' is not a usable name", src, name,
            replace=replace)


def test_cli_names_the_rule_without_a_traceback(results, src, capsys):
    before = snapshot(results)
    rc = cli.main(["import", "--from", str(src), "--host", "..", "--results", str(results),
                   "--replace"])
    err = capsys.readouterr().err
    assert rc == 2 and snapshot(results) == before
    assert err.startswith("decodelab import: error: host name '..' is not a usable name: ")
    assert "pattern ^[A-Za-z0-9_]" in err and "Traceback" not in err


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
    ({"max_files": 19, "max_bytes": 4 << 20}, r"holds more than 19 files \(--max-files\)"),
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
