"""Which backends this host has, told without importing torch, so that the DAG is planned in
a fraction of a second.

The installed torch's build (`torch/version.py`, read as text) says whether it can drive CUDA or
ROCm; the platform and the device nodes say whether there is a GPU. That is a prediction: every
measuring job checks again with torch (`devices.backend_problem`) and stops, naming the backend,
where the two disagree. A host the probe cannot see into (a GPU it misses) sets
`assume_available`.
"""

from __future__ import annotations

import ast
import functools
import glob
import importlib.util
import os
import platform
import sys
from pathlib import Path

BACKENDS = ("cpu", "cuda", "mps")
# NVIDIA GPUs on Linux, a GPU passed through to WSL 2, AMD GPUs (ROCm builds of torch).
GPU_NODES = {"cuda": ("/dev/nvidia[0-9]*", "/dev/dxg"), "hip": ("/dev/kfd",)}
MPS_MACOS = (12, 3)


@functools.cache
def torch_build() -> dict[str, str | None] | None:
    """`__version__`, `cuda` and `hip` of the installed torch's `torch.version`; None without
    torch. Found by its import spec and parsed: no torch code runs."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    build = {"__version__": None, "cuda": None, "hip": None}
    source = Path(spec.origin).with_name("version.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in build:
                    build[target.id] = ast.literal_eval(node.value)
    return build


def gpu_node(kind: str) -> str | None:
    """The first device node of a `kind` (cuda, hip) GPU on this host, or None."""
    return next((node for pattern in GPU_NODES[kind] for node in sorted(glob.glob(pattern))), None)


def hidden_by_env() -> bool:
    """CUDA_VISIBLE_DEVICES set to nothing, or to a list starting with a negative index."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.split(",")[0].strip() in ("", "-1")


def macos_version() -> tuple[int, ...]:
    return tuple(int(part) for part in platform.mac_ver()[0].split(".")[:2] if part.isdigit())


def toolkit(build: dict[str, str | None]) -> tuple[str, str]:
    """(device-node kind, name) of the GPU toolkit a torch build drives."""
    return ("hip", f"ROCm {build['hip']}") if build["hip"] else ("cuda", f"CUDA {build['cuda']}")


def why_not_cuda() -> str:
    build = torch_build()
    if build is None:
        return "torch is not installed"
    # The texts for a CPU-only torch without a GPU (cuda) and off macOS (mps) are the ones
    # torch's own checks gave before: the paper prints them in its table of skipped backends.
    prefix = "torch.cuda.is_available() is False"
    if not (build["cuda"] or build["hip"]):
        node = None if sys.platform == "darwin" else gpu_node("cuda")
        if node is None:
            return f"{prefix} (no NVIDIA GPU or a CPU-only torch build)"
        return (f"{prefix} (torch {build['__version__']} is a CPU-only build, on a host with an "
                f"NVIDIA GPU at {node}: install a CUDA build of torch)")
    if hidden_by_env():
        return (f"{prefix} (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides "
                "every GPU)")
    kind, name = toolkit(build)
    if gpu_node(kind):
        return ""
    return (f"{prefix} (no GPU: none of {', '.join(GPU_NODES[kind])} exists; torch "
            f"{build['__version__']} is built for {name})")


def why_not_mps() -> str:
    if torch_build() is None:
        return "torch is not installed"
    if sys.platform != "darwin":
        return "this torch build has no MPS support (MPS needs macOS on Apple silicon)"
    if platform.machine() != "arm64":
        return (f"torch.backends.mps.is_available() is False (needs macOS 12.3+ on Apple "
                f"silicon; this Python runs on {platform.machine()})")
    if macos_version() < MPS_MACOS:
        return (f"torch.backends.mps.is_available() is False (needs macOS 12.3+ on Apple "
                f"silicon; this Mac runs macOS {platform.mac_ver()[0]})")
    return ""


def why_unavailable(backend: str) -> str:
    """Why `backend` cannot run here, as far as the probe can tell; '' where it can."""
    if backend == "cpu":
        return ""
    if backend == "cuda":
        return why_not_cuda()
    if backend == "mps":
        return why_not_mps()
    raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


def backend_available(backend: str) -> bool:
    return not why_unavailable(backend)
