"""A Hugging Face hub cache on disk in the layout huggingface_hub writes, and `sources.prepare`
run offline on it in a fresh interpreter, for the `hf` source tests."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import decodelab

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def build_hub_cache(cache: Path, repo: str, commit: str, files: dict[str, Path]) -> Path:
    """Lay `files` out as huggingface_hub does: content-addressed blobs, a snapshot of relative
    symlinks per commit, and refs/main naming the commit. Returns the snapshot dir."""
    org, name = repo.split("/")
    root = cache / f"models--{org}--{name}"
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for filename, src in files.items():
        data = src.read_bytes()
        is_lfs = filename.endswith((".safetensors", ".bin"))
        etag = hashlib.sha256(data).hexdigest() if is_lfs else git_blob_sha1(data)
        (root / "blobs" / etag).write_bytes(data)
        (snapshot / filename).symlink_to(Path("..", "..", "blobs", etag))
    (root / "refs" / "main").write_text(commit)  # no trailing newline, as the hub writes it
    return snapshot


RUNNER = r"""
import json, sys, traceback
import huggingface_hub.constants as hc
from decodelab.backends import sources
from decodelab.core.errors import DecodelabError

cache, jobs = sys.argv[1], json.loads(sys.argv[2])
assert hc.HF_HUB_OFFLINE is True, "HF_HUB_OFFLINE not picked up"
assert hc.HF_HUB_CACHE == cache, (hc.HF_HUB_CACHE, cache)
results = []
for spec, out in jobs:
    try:
        sources.prepare(spec, out)
        results.append({"ok": True})
    except DecodelabError as err:
        results.append({
            "ok": False,
            "message": str(err),
            "chained": err.__cause__ is not None or not err.__suppress_context__,
            "traceback_lines": len(traceback.format_exception(err)),
        })
print(json.dumps(results))
"""


def prepare_hf_offline(tmp_path: Path, cache: Path, jobs: list[tuple[dict, Path]]) -> list[dict]:
    """Run `sources.prepare` for each (spec, out) in a fresh interpreter, offline, on `cache`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.pop("TRANSFORMERS_CACHE", None)
    env |= {
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(decodelab.__file__).parents[1]), env.get("PYTHONPATH", "")]
        ),
    }
    payload = json.dumps([[spec, str(out)] for spec, out in jobs])
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(cache), payload],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
