"""Backends: what exists, how to synchronize them, how to time and probe memory, and who we are."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psutil
import torch

BACKENDS = ("cpu", "cuda", "mps")


def backend_available(backend: str) -> bool:
    if backend == "cpu":
        return True
    if backend == "cuda":
        return torch.cuda.is_available()
    if backend == "mps":
        return torch.backends.mps.is_available()
    raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


def available_backends() -> list[str]:
    return [b for b in BACKENDS if backend_available(b)]


def why_unavailable(backend: str) -> str:
    if backend == "cuda":
        return "torch.cuda.is_available() is False (no NVIDIA GPU or a CPU-only torch build)"
    if backend == "mps":
        if not torch.backends.mps.is_built():
            return "this torch build has no MPS support (MPS needs macOS on Apple silicon)"
        return "torch.backends.mps.is_available() is False (needs macOS 12.3+ on Apple silicon)"
    return ""


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


def device_name(backend: str) -> str:
    if backend == "cuda":
        return torch.cuda.get_device_name(0)
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
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("DECODELAB_GIT_COMMIT", "unknown")
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
