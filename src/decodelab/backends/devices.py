"""Backends under torch: whether one really runs here, how to synchronize them, how to time and
probe memory, and who we are. The DAG's torch-free guess of what exists is `probe.py`."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psutil
import torch

from decodelab.core import probe
from decodelab.core.errors import DecodelabError


def backend_problem(backend: str) -> str:
    """Why torch cannot run `backend` here, or ''. The DAG planned on the torch-free probe's
    guess; this is the check that counts, and it says so where the probe guessed wrong."""
    if backend == "cuda" and not torch.cuda.is_available():
        return probe.why_unavailable("cuda") or cuda_miss()
    if backend == "mps" and not torch.backends.mps.is_available():
        return probe.why_unavailable("mps") or mps_miss()
    if backend in ("cuda", "mps"):
        return ""
    return probe.why_unavailable(backend)  # cpu: '', an unknown name: ValueError


def cuda_miss() -> str:
    build = probe.torch_build()
    kind, toolkit = probe.toolkit(build)
    return (f"torch.cuda.is_available() is False, though torch {build['__version__']} is built "
            f"for {toolkit} and this host has {probe.gpu_node(kind)} (a driver older than "
            f"{toolkit}? a GPU this process may not open?)")


def mps_miss() -> str:
    return (f"torch.backends.mps.is_available() is False on macOS {platform.mac_ver()[0]} "
            f"(torch.backends.mps.is_built() is {torch.backends.mps.is_built()})")


def available_backends() -> list[str]:
    return [b for b in probe.BACKENDS if not backend_problem(b)]


_claimed: dict[str, object] = {}


def claim_gpu(lock_dir: str | Path | None = None, count: int | None = None,
              poll_s: float = 1.0) -> int:
    """On a host with several CUDA devices, take the first one no other decodelab process holds
    (an exclusive lock held until this process exits) and make it the current device, so that
    `snakemake --resources gpu=N` runs N GPU jobs at once, one per device. Waits while all are
    taken. Returns the device index."""
    if "index" in _claimed:
        return _claimed["index"]
    count = torch.cuda.device_count() if count is None else count
    lock_dir = Path(lock_dir or os.environ.get("DECODELAB_LOCK_DIR", tempfile.gettempdir()))
    index = 0
    while count > 1:
        index = try_locks(lock_dir, count)
        if index is not None:
            break
        time.sleep(poll_s)
    if count > 1:
        torch.cuda.set_device(index)
    _claimed["index"] = index
    return index


def try_locks(lock_dir: Path, count: int) -> int | None:
    for index in range(count):
        handle = open(lock_dir / f"decodelab-cuda{index}.lock", "w")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _claimed["handle"] = handle
        return index
    return None


def synchronize(device: torch.device | str) -> None:
    """Block until all queued work on `device` is done; a timestamp taken before this is a lie."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def now(device: torch.device | str) -> float:
    """A timestamp taken after the device has drained its queue."""
    synchronize(device)
    return time.perf_counter()


@contextmanager
def timed(device: torch.device | str):
    """`with timed(dev) as t: ...` then `t.seconds`; synchronized on both ends."""

    class Elapsed:
        seconds = float("nan")

    elapsed = Elapsed()
    start = now(device)
    yield elapsed
    elapsed.seconds = now(device) - start


def reset_peak_memory(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_snapshot(device: torch.device | str) -> dict[str, float]:
    """Allocator peaks (CUDA), current and driver-allocated bytes (MPS), process RSS."""
    kind = torch.device(device).type
    snap = {
        "mem_cuda_peak_bytes": float("nan"),
        "mem_mps_current_bytes": float("nan"),
        "mem_mps_driver_bytes": float("nan"),
        "rss_bytes": float(psutil.Process().memory_info().rss),
    }
    if kind == "cuda":
        snap["mem_cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(device))
    elif kind == "mps":
        snap["mem_mps_current_bytes"] = float(torch.mps.current_allocated_memory())
        snap["mem_mps_driver_bytes"] = float(torch.mps.driver_allocated_memory())
    return snap


def sm_clock_probe(device: torch.device | str) -> Callable[[], float] | None:
    """A reader of the CUDA device's SM clock in MHz (NVML, through nvidia-ml-py), or None off
    CUDA or without NVML. NVML averages the clock over 1/6 s to 1 s."""
    if torch.device(device).type != "cuda":
        return None
    try:
        torch.cuda.clock_rate()
    except Exception:  # no nvidia-ml-py, no driver: the rows carry NaN
        return None
    return lambda: float(torch.cuda.clock_rate())


SDP_BACKENDS = ("flash", "mem_efficient", "math", "cudnn")


def set_sdp_backends(allowed: Iterable[str] | None, key: str = "sweep.sdp_backends") -> None:
    """Allow only these backends of torch's scaled_dot_product_attention (None: torch's
    defaults). The flags are global to the process: CPU attention honours flash and math, CUDA
    all four. results/reference/cuda-h200/README.md shows why one may leave cuDNN out."""
    if allowed is None:
        return
    allowed = list(allowed)
    unknown = sorted(set(allowed) - set(SDP_BACKENDS))
    if unknown or not allowed:
        raise DecodelabError(f"config '{key}' must be a non-empty list of "
                             f"{', '.join(SDP_BACKENDS)}; got {allowed}")
    for name in SDP_BACKENDS:
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(name in allowed)


def sdp_backends() -> str:
    """The attention backends torch may pick, as recorded with every row."""
    return ",".join(n for n in SDP_BACKENDS if getattr(torch.backends.cuda, f"{n}_sdp_enabled")())


def device_name(backend: str) -> str:
    if backend == "cuda":
        return torch.cuda.get_device_name()
    if backend == "mps":
        return f"Apple MPS ({platform.machine()}, macOS {platform.mac_ver()[0]})"
    return cpu_model()


@functools.cache
def cpu_model() -> str:
    if sys.platform == "darwin":
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                             capture_output=True, text=True, check=False)
        if out.stdout.strip():
            return out.stdout.strip()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.cache
def git_commit() -> str:
    """The checkout's commit; DECODELAB_GIT_COMMIT wins where the tree was copied without its
    own .git (a container, a device machine)."""
    if os.environ.get("DECODELAB_GIT_COMMIT"):
        return os.environ["DECODELAB_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def config_hash(spec: dict) -> str:
    """Short hash of the canonical JSON of the settings a job ran with."""
    blob = json.dumps(spec, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def fingerprint(backend: str, spec: dict) -> dict[str, str | int]:
    import transformers

    return {
        "hostname": socket.gethostname(),
        "backend": backend,
        "device_name": device_name(backend),
        "device_index": torch.cuda.current_device() if backend == "cuda" else 0,
        "sdp_backends": sdp_backends(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "ram_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "git_commit": git_commit(),
        "config_hash": config_hash(spec),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
