"""Backends: synchronization, timers, memory probes and the environment fingerprint.

CUDA and MPS are exercised without the hardware by replacing the torch entry points that
`decodelab.backends.devices` must call with recording fakes.
"""

import fnmatch
import json
import math
import platform
import subprocess
import sys
import time

import pytest
import torch

from decodelab.backends import devices
from decodelab.core import probe
from decodelab.core.errors import DecodelabError

FINGERPRINT_KEYS = {
    "hostname", "backend", "device_name", "device_index", "cpu_model", "cpu_count", "ram_bytes",
    "os", "python", "torch", "transformers", "git_commit", "config_hash", "timestamp",
    "sdp_backends",
}


@pytest.fixture
def sync_calls(monkeypatch):
    """Record every call to torch.cuda.synchronize and torch.mps.synchronize."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(("cuda", dev)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps", None)))
    return calls


# synchronize


def test_synchronize_cuda_calls_torch_cuda_synchronize(sync_calls):
    devices.synchronize("cuda")
    assert [kind for kind, _ in sync_calls] == ["cuda"]
    assert torch.device(sync_calls[0][1]).type == "cuda"


def test_synchronize_cuda_passes_the_device_index(sync_calls):
    devices.synchronize(torch.device("cuda", 1))
    [(kind, device)] = sync_calls
    assert kind == "cuda"
    assert torch.device(device) == torch.device("cuda", 1)


def test_synchronize_mps_calls_torch_mps_synchronize(sync_calls):
    devices.synchronize(torch.device("mps"))
    assert sync_calls == [("mps", None)]


def test_synchronize_cpu_is_a_noop(sync_calls):
    devices.synchronize("cpu")
    devices.synchronize(torch.device("cpu"))
    assert sync_calls == []


# now / timed


@pytest.fixture
def events(monkeypatch):
    """One ordered log of device synchronizations and clock reads."""
    log = []
    real_clock = time.perf_counter

    def clock():
        log.append("clock")
        return real_clock()

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(devices.time, "perf_counter", clock)
    return log


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_now_synchronizes_before_reading_the_clock(events, device):
    devices.now(device)
    assert events == ["sync", "clock"]


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_timed_synchronizes_before_both_timestamps(events, device):
    with devices.timed(device) as t:
        events.append("body")
    assert events == ["sync", "clock", "body", "sync", "clock"]
    assert t.seconds >= 0


def test_timed_is_nan_until_the_block_ends():
    with devices.timed("cpu") as t:
        assert math.isnan(t.seconds)
    assert not math.isnan(t.seconds)


def test_timed_measures_at_least_the_sleep():
    with devices.timed("cpu") as t:
        time.sleep(0.05)
    assert t.seconds >= 0.05


def test_now_difference_measures_at_least_the_sleep():
    start = devices.now("cpu")
    time.sleep(0.05)
    assert devices.now("cpu") - start >= 0.05


# memory_snapshot


def test_memory_snapshot_cpu_has_rss_and_nan_accelerator_fields():
    snap = devices.memory_snapshot("cpu")
    assert snap["rss_bytes"] > 0
    assert math.isnan(snap["mem_cuda_peak_bytes"])
    assert math.isnan(snap["mem_mps_current_bytes"])
    assert math.isnan(snap["mem_mps_driver_bytes"])


def test_memory_snapshot_mps_reads_current_and_driver_memory(monkeypatch):
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 1234)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 5678)
    snap = devices.memory_snapshot("mps")
    assert snap["mem_mps_current_bytes"] == 1234.0
    assert snap["mem_mps_driver_bytes"] == 5678.0
    assert math.isnan(snap["mem_cuda_peak_bytes"])
    assert snap["rss_bytes"] > 0


def test_memory_snapshot_cuda_reads_the_allocator_peak(monkeypatch):
    seen = []

    def max_memory_allocated(device=None):
        seen.append(device)
        return 4096

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", max_memory_allocated)
    snap = devices.memory_snapshot("cuda")
    assert snap["mem_cuda_peak_bytes"] == 4096.0
    assert len(seen) == 1
    assert math.isnan(snap["mem_mps_current_bytes"])
    assert math.isnan(snap["mem_mps_driver_bytes"])
    assert snap["rss_bytes"] > 0


def test_memory_snapshot_values_are_floats():
    assert all(isinstance(v, float) for v in devices.memory_snapshot("cpu").values())


def test_reset_peak_memory_only_touches_cuda(monkeypatch):
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(1))
    devices.reset_peak_memory("cpu")
    devices.reset_peak_memory("mps")
    assert resets == []
    devices.reset_peak_memory("cuda")
    assert resets == [1]


# availability: the torch-free probe the DAG plans on, and torch's word in the jobs

CPU_BUILD = {"__version__": "2.13.0+cpu", "cuda": None, "hip": None}
CUDA_BUILD = {"__version__": "2.13.0", "cuda": "12.4", "hip": None}
ROCM_BUILD = {"__version__": "2.13.0+rocm6.2", "cuda": None, "hip": "6.2.41133"}


@pytest.fixture
def host(monkeypatch):
    """Pretend to be another host: host(build, nodes, os, machine, macos) fakes the installed
    torch build, the GPU device nodes present, sys.platform and the Mac's CPU and version."""
    def pretend(build=CPU_BUILD, nodes=(), os="linux", machine="x86_64", macos=""):
        monkeypatch.setattr(probe, "torch_build", lambda: build)
        monkeypatch.setattr(probe.glob, "glob",
                            lambda pattern: [n for n in nodes if fnmatch.fnmatch(n, pattern)])
        monkeypatch.setattr(sys, "platform", os)
        monkeypatch.setattr(platform, "machine", lambda: machine)
        monkeypatch.setattr(platform, "mac_ver", lambda: (macos, ("", "", ""), machine))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return pretend


def test_torch_build_is_read_without_importing_torch():
    code = ("import json, sys; from decodelab.core.probe import torch_build; "
            "print(json.dumps([torch_build(), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    build, imported = json.loads(out.stdout)
    assert not imported
    assert build == {"__version__": str(torch.__version__), "cuda": torch.version.cuda,
                     "hip": torch.version.hip}


def test_the_probe_agrees_with_torch_on_this_host():
    assert {b: probe.backend_available(b) for b in probe.BACKENDS} == \
        {b: b in devices.available_backends() for b in probe.BACKENDS}


def test_cpu_is_always_available(host):
    host(build=None)
    assert probe.backend_available("cpu") is True
    assert probe.why_unavailable("cuda") == probe.why_unavailable("mps") == "torch is not installed"


def test_an_unknown_backend_raises_naming_it():
    with pytest.raises(ValueError, match="tpu"):
        probe.backend_available("tpu")
    with pytest.raises(ValueError, match="tpu"):
        devices.backend_problem("tpu")


def test_a_cpu_only_linux_host_gets_the_reasons_the_paper_prints(host):
    host()
    assert probe.why_unavailable("cuda") == (
        "torch.cuda.is_available() is False (no NVIDIA GPU or a CPU-only torch build)")
    assert probe.why_unavailable("mps") == (
        "this torch build has no MPS support (MPS needs macOS on Apple silicon)")


def test_a_cpu_only_torch_on_a_gpu_host_is_told_to_install_a_cuda_build(host):
    host(nodes=["/dev/nvidiactl", "/dev/nvidia0"])
    why = probe.why_unavailable("cuda")
    assert "2.13.0+cpu is a CPU-only build" in why and "/dev/nvidia0" in why
    assert "install a CUDA build of torch" in why


@pytest.mark.parametrize(("build", "node"), [(CUDA_BUILD, "/dev/nvidia0"), (CUDA_BUILD, "/dev/dxg"),
                                             (ROCM_BUILD, "/dev/kfd")])
def test_a_gpu_build_with_a_gpu_is_available(host, build, node):
    host(build=build, nodes=[node])
    assert probe.backend_available("cuda")


def test_a_gpu_build_without_a_gpu_names_the_nodes_and_the_build(host):
    host(build=CUDA_BUILD, nodes=["/dev/kfd"])
    why = probe.why_unavailable("cuda")
    assert "no GPU" in why and "/dev/nvidia[0-9]*" in why and "built for CUDA 12.4" in why


@pytest.mark.parametrize("value", ["", "-1", "-1,0"])
def test_cuda_visible_devices_can_hide_every_gpu(host, monkeypatch, value):
    host(build=CUDA_BUILD, nodes=["/dev/nvidia0"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU" in probe.why_unavailable("cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert probe.backend_available("cuda")


def test_a_mac_has_mps_on_apple_silicon_with_macos_12_3(host):
    host(os="darwin", machine="arm64", macos="14.2.1")
    assert probe.backend_available("mps")
    assert "no NVIDIA GPU" in probe.why_unavailable("cuda")
    host(os="darwin", machine="arm64", macos="12.1")
    assert "this Mac runs macOS 12.1" in probe.why_unavailable("mps")
    host(os="darwin", machine="x86_64", macos="13.0")
    assert "this Python runs on x86_64" in probe.why_unavailable("mps")


def test_a_job_stops_where_torch_contradicts_the_probe(host, monkeypatch):
    host(build=CUDA_BUILD, nodes=["/dev/nvidia0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    why = devices.backend_problem("cuda")
    assert why.startswith("torch.cuda.is_available() is False, though torch 2.13.0 is built for "
                          "CUDA 12.4 and this host has /dev/nvidia0")
    host(os="darwin", machine="arm64", macos="14.2")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert "macOS 14.2" in devices.backend_problem("mps")


def test_a_job_reports_the_probe_reason_where_both_agree(host, monkeypatch):
    host()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.backend_problem("cuda") == probe.why_unavailable("cuda")


def test_available_backends_follows_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert devices.available_backends() == ["cpu", "cuda"]


# fingerprint and config hash


def test_fingerprint_has_all_provenance_keys():
    spec = {"model": "gpt2-tiny", "budget": 8}
    fp = devices.fingerprint("cpu", spec)
    assert FINGERPRINT_KEYS <= set(fp)
    assert fp["backend"] == "cpu"
    assert fp["torch"] == torch.__version__
    assert fp["config_hash"] == devices.config_hash(spec)
    assert all(fp[k] not in (None, "") for k in FINGERPRINT_KEYS)


@pytest.fixture
def torch_sdp_flags():
    """Restore torch's attention-backend flags, which are global to the process."""
    saved = {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in devices.SDP_BACKENDS}
    yield
    for name, on in saved.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


def test_sdp_backends_allows_only_the_listed_attention_backends(torch_sdp_flags):
    devices.set_sdp_backends(None)  # leaves torch's defaults
    assert "math" in devices.sdp_backends()
    devices.set_sdp_backends(["flash", "mem_efficient", "math"])
    assert devices.sdp_backends() == "flash,mem_efficient,math"
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    devices.set_sdp_backends(["math"])
    assert devices.sdp_backends() == "math"
    assert devices.fingerprint("cpu", {})["sdp_backends"] == "math"
    with pytest.raises(DecodelabError, match=r"sweep\.sdp_backends.*'cudnnn'"):
        devices.set_sdp_backends(["cudnnn"])
    with pytest.raises(DecodelabError, match="non-empty"):
        devices.set_sdp_backends([])


def test_fingerprint_is_json_serializable():
    import json

    json.dumps(devices.fingerprint("cpu", {"a": 1}))


def test_config_hash_is_stable_for_equal_specs():
    a = {"model": "gpt2", "budgets": [1, 2, 4], "nested": {"x": 1, "y": 2}}
    b = {"nested": {"y": 2, "x": 1}, "budgets": [1, 2, 4], "model": "gpt2"}
    assert devices.config_hash(a) == devices.config_hash(b)
    fingerprints = [devices.fingerprint("cpu", spec) for spec in (a, b)]
    assert fingerprints[0]["config_hash"] == fingerprints[1]["config_hash"]


@pytest.mark.parametrize(
    "other",
    [
        {"model": "gpt2", "budgets": [1, 2, 8]},
        {"model": "opt-125m", "budgets": [1, 2, 4]},
        {"model": "gpt2", "budgets": [1, 2, 4], "seed": 0},
    ],
)
def test_config_hash_differs_for_different_specs(other):
    base = {"model": "gpt2", "budgets": [1, 2, 4]}
    assert devices.config_hash(base) != devices.config_hash(other)


# claim_gpu: one device per process on a host of several


@pytest.fixture
def fresh_claim(monkeypatch):
    monkeypatch.setattr(devices, "_claimed", {})
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_claim_gpu_takes_a_free_device_and_skips_a_held_one(tmp_path, fresh_claim):
    held = open(tmp_path / "decodelab-cuda0.lock", "w")
    import fcntl
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another job holds device 0
    assert devices.claim_gpu(tmp_path, count=3) == 1
    assert devices.claim_gpu(tmp_path, count=3) == 1  # once per process
    assert fresh_claim == [1]
    held.close()


def test_claim_gpu_waits_until_a_device_is_released(tmp_path, fresh_claim, monkeypatch):
    import fcntl
    held = [open(tmp_path / f"decodelab-cuda{i}.lock", "w") for i in range(2)]
    for h in held:
        fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)
    polls = []

    def release_after_two_polls(_):
        polls.append(1)
        if len(polls) == 2:
            held[1].close()

    monkeypatch.setattr(devices.time, "sleep", release_after_two_polls)
    assert devices.claim_gpu(tmp_path, count=2) == 1
    assert len(polls) == 2 and fresh_claim == [1]
    held[0].close()


def test_claim_gpu_on_one_device_takes_no_lock(tmp_path, fresh_claim):
    assert devices.claim_gpu(tmp_path, count=1) == 0
    assert list(tmp_path.iterdir()) == [] and fresh_claim == []


def test_sm_clock_probe_is_none_off_cuda():
    assert devices.sm_clock_probe("cpu") is None


def test_git_commit_prefers_the_environment(monkeypatch):
    devices.git_commit.cache_clear()
    monkeypatch.setenv("DECODELAB_GIT_COMMIT", "abc123")
    try:
        assert devices.git_commit() == "abc123"
    finally:
        devices.git_commit.cache_clear()
