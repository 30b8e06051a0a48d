"""Backends: synchronization, timers, memory probes and the environment fingerprint.

CUDA and MPS are exercised without the hardware by replacing the torch entry points that
`decodelab.devices` must call with recording fakes.
"""

import math
import time

import pytest
import torch

from decodelab import devices
from decodelab.errors import DecodelabError

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


# availability


def test_available_backends_contains_cpu():
    backends = devices.available_backends()
    assert "cpu" in backends
    assert set(backends) <= set(devices.BACKENDS)


def test_backend_available_cpu():
    assert devices.backend_available("cpu") is True


def test_backend_available_unknown_raises_naming_it():
    with pytest.raises(ValueError, match="tpu"):
        devices.backend_available("tpu")


def test_available_backends_follows_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert devices.available_backends() == ["cpu", "cuda"]


@pytest.mark.parametrize("backend", ["cuda", "mps"])
def test_why_unavailable_explains_accelerators(backend):
    assert devices.why_unavailable(backend)


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
