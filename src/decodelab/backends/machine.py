"""The machine's state around a measurement: how much of the CPU other work took (and a
hypervisor stole) while each row and each job was timed, the load average, the CPU frequency and
governor; and the pre-flight check of config 'machine'. Torch-free: psutil reads /proc/stat on
Linux and the kernel's counters on macOS; what a platform does not report is NaN."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from glob import glob
from pathlib import Path

import psutil

from decodelab.config.settings import Machine
from decodelab.core.errors import DecodelabError

IDLE_STATES = ("idle", "iowait", "steal", "guest", "guest_nice")  # guest time is in user already
# /proc/stat counts in 10 ms ticks: measured on 2 cores, a share over 0.1 s scatters by about
# +-0.05, over 0.05 s by +-0.15, over 0.01 s by +-0.4.
MIN_ROW_S = 0.1
GOVERNORS = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
NAN = float("nan")


@dataclass(frozen=True)
class Snapshot:
    """Seconds since some origin: wall clock, busy CPU time of the whole machine (all cores
    summed, every state but IDLE_STATES), stolen time, and this process's CPU time (all its
    threads)."""

    wall_s: float
    busy_s: float
    steal_s: float
    own_s: float


def snapshot() -> Snapshot:
    times = psutil.cpu_times()
    busy = sum(v for k, v in times._asdict().items() if k not in IDLE_STATES)
    return Snapshot(time.perf_counter(), busy, getattr(times, "steal", NAN), time.process_time())


def cores() -> int:
    return psutil.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (os.getloadavg exists on Linux and macOS), NaN elsewhere."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return NAN


def clip(share: float) -> float:
    return share if math.isnan(share) else min(max(share, 0.0), 1.0)


def shares(start: Snapshot, end: Snapshot) -> tuple[float, float]:
    """(background, steal) between two snapshots, as shares of the machine's CPU capacity (wall
    x cores): the busy CPU time other processes used, and the time the hypervisor stole."""
    capacity = (end.wall_s - start.wall_s) * cores()
    if capacity <= 0:
        return NAN, NAN
    background = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return clip(background / capacity), clip((end.steal_s - start.steal_s) / capacity)


# The starts of this job's recent rows (and the job's): a row too short for the kernel's ticks
# is judged with those just before it, which ran in the same process under the same conditions.
_recent: deque[Snapshot] = deque()


@contextmanager
def watched() -> Iterator[dict]:
    """`with watched() as row: ...` then `row` holds the background and steal shares over that
    span, widened for a span shorter than MIN_ROW_S to the MIN_ROW_S before its end (back to the
    job's start at most): one row's columns."""
    row = {}
    _recent.append(snapshot())
    yield row
    end = snapshot()
    background, steal = shares(window_start(end), end)
    row.update(background_cpu_share=background, steal_share=steal)


def window_start(end: Snapshot) -> Snapshot:
    """The latest recent start at least MIN_ROW_S before `end`, else the oldest; older ones are
    dropped (rows end later and later)."""
    while len(_recent) > 1 and end.wall_s - _recent[1].wall_s >= MIN_ROW_S:
        _recent.popleft()
    return _recent[0]


def cpu_mhz() -> float:
    """The median current frequency of the cores, NaN where unreadable (a VM without cpufreq
    still shows /proc/cpuinfo's nominal MHz)."""
    try:
        freqs = [f.current for f in psutil.cpu_freq(percpu=True) or [] if f.current > 0]
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        freqs = []
    return float(statistics.median(freqs)) if freqs else NAN


def governor() -> str:
    """The cores' cpufreq governor ('performance', 'powersave', ...; several joined by ','), or
    'unknown' where the kernel shows none (macOS, most VMs)."""
    found = set()
    for path in glob(GOVERNORS):
        try:
            found.add(Path(path).read_text().strip())
        except OSError:
            continue
    return ",".join(sorted(found - {""})) or "unknown"


def job_columns(start: Snapshot, load_start: float) -> dict:
    """The process's columns, the same on each of its rows: the load average when it started
    and now, the background and steal shares over its measuring part, the frequency and the
    governor."""
    background, steal = shares(start, snapshot())
    name = governor()
    return {"load_start": load_start, "load_end": load_average(),
            "job_background_cpu_share": background, "job_steal_share": steal,
            "cpu_mhz": cpu_mhz(), "governor": name, "governor_performance": name == "performance"}


class Job:
    """`job = Job()` before measuring, `job.columns()` after."""

    def __init__(self):
        self.load_start = load_average()
        self.start = snapshot()
        _recent.clear()
        _recent.append(self.start)

    def columns(self) -> dict:
        return job_columns(self.start, self.load_start)


# --- pre-flight (config 'machine') ---------------------------------------------------------------

POLL_S = 5.0
SAMPLE_S = 0.25
ADVICE = """\
  For stable timings (as pyperf advises): close other work on this machine (browsers, builds,
  other benchmarks); use the `performance` CPU governor (`cpupower frequency-set -g performance`;
  on Linux, `python -m pyperf system tune` sets it and more, `... system reset` undoes it); run
  the DAG with one measuring job at a time and fewer cores than the machine has (`snakemake
  --cores N`, N below the core count); config 'machine.preflight: wait' waits for a quiet
  machine, 'refuse' stops instead."""


def sampled_background(seconds: float = SAMPLE_S) -> float:
    start = snapshot()
    time.sleep(seconds)
    return shares(start, snapshot())[0]


def busy(max_load: float) -> str:
    """'' on a quiet machine, else what was measured. Busy means both: a 1-minute load beyond
    this job above `max_load` per core, and other processes using more than that share of the
    CPU over a short sample now (the load average lags a minute, so the tail of the DAG's
    previous job alone does not count). A quiet load average costs no sample."""
    load = load_average()
    beyond = max(load - 1, 0.0) / cores()  # this job counts 1 as it checks
    if not beyond > max_load:  # NaN (no load average): nothing to go on
        return ""
    background = sampled_background()
    if not background > max_load:
        return ""
    return (f"1-minute load average {load:.2f} on {cores()} cores ({beyond:.2f} per core beyond "
            f"this job, max_load {max_load:g}), and other processes took {background:.0%} of the "
            f"CPU over {SAMPLE_S:g} s")


def preflight(machine: Machine, check: Callable[[float], str] = busy,
              sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> None:
    """Before a job measures: nothing on a quiet machine; on a busy one, by `machine.preflight`,
    warn, wait up to `wait_s` for it to quiet down (then warn and measure), or refuse."""
    if machine.preflight == "off":
        return
    reason = check(machine.max_load)
    if reason and machine.preflight == "wait":
        reason = wait_for_quiet(machine, reason, check, sleep, clock)
    if not reason:
        return
    print(f"decodelab: warning: the machine is busy: {reason}.\n{ADVICE}", file=sys.stderr)
    if machine.preflight == "refuse":
        raise DecodelabError(f"config 'machine.preflight' is 'refuse' and the machine is busy: "
                             f"{reason}; measure on a quiet machine, or set machine.preflight "
                             "to warn or wait")


def wait_for_quiet(machine: Machine, reason: str, check: Callable[[float], str],
                   sleep: Callable[[float], None], clock: Callable[[], float]) -> str:
    """Poll until the machine is quiet or `wait_s` has passed: '' or why it is still busy."""
    start = clock()
    while reason and clock() - start < machine.wait_s:
        sleep(min(POLL_S, machine.wait_s - (clock() - start)))
        reason = check(machine.max_load)
    waited = f"{clock() - start:.0f} s (config 'machine.wait_s': {machine.wait_s:g})"
    if not reason:
        print(f"decodelab: the machine is quiet after waiting {waited}", file=sys.stderr)
        return ""
    return f"{reason}; still so after waiting {waited}, measuring anyway"
