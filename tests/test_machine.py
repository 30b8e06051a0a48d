"""decodelab.backends.machine: the machine's state recorded around each row and job, against a
planted
load (and the same without it); config 'machine' and its pre-flight check."""

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from dag import HOST, copy_workflow, planned_jobs, snakemake
from load import planted_load
from snakemake.utils import validate

from decodelab import cli
from decodelab.backends import machine
from decodelab.config.settings import Machine, Settings, SweepJob
from decodelab.core.errors import DecodelabError
from decodelab.core.io import read_raw, write_raw
from decodelab.studies.sweep import run as sweep

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def validated(**changes) -> dict:
    config = yaml.safe_load((ROOT / "config.yaml").read_text()) | changes
    validate(config, str(SCHEMA))
    return config


ROW_COLUMNS = {"background_cpu_share", "steal_share"}
JOB_COLUMNS = {"load_start", "load_end", "job_background_cpu_share", "job_steal_share",
               "cpu_mhz", "governor", "governor_performance"}


def snap(wall, busy, steal, own):
    return machine.Snapshot(wall_s=wall, busy_s=busy, steal_s=steal, own_s=own)


def test_shares_are_other_processes_busy_time_over_wall_times_cores(monkeypatch):
    monkeypatch.setattr(machine, "cores", lambda: 4)
    start = snap(10.0, 100.0, 5.0, 1.0)
    # 2 s on 4 cores: 8 s of capacity; 5 s busy, 1 s of it this process's; 0.4 s stolen
    assert machine.shares(start, snap(12.0, 105.0, 5.4, 2.0)) == pytest.approx((0.5, 0.05))
    assert machine.shares(start, snap(12.0, 101.0, 5.0, 3.0)) == (0.0, 0.0)  # clipped
    assert machine.shares(start, snap(12.0, 150.0, 15.0, 1.0)) == (1.0, 1.0)
    background, steal = machine.shares(start, snap(12.0, 105.0, math.nan, 2.0))
    assert background == pytest.approx(0.5) and math.isnan(steal)  # no steal reported (macOS)
    assert all(math.isnan(s) for s in machine.shares(start, start))


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def row_shares(rows: int = 5) -> tuple[list[float], dict]:
    """A tiny measurement loop: each row spins 0.15 s, watched as the sweep watches a row."""
    job = machine.Job()
    shares = []
    for _ in range(rows):
        with machine.watched() as row:
            spin(0.15)
        assert set(row) == ROW_COLUMNS
        shares.append(row["background_cpu_share"])
    return shares, job.columns()


def median(values):
    return sorted(values)[len(values) // 2]


def took_the_cpu(quiet: float, loaded: float) -> bool:
    """The planted load left this process at most 3/4 of the CPU the others had left it. On a
    quiet machine the share goes from about 0 to about 0.8; on one others already share it
    rises less (from R/(R+1) to (R+8)/(R+9) with R other busy processes on 2 cores and
    load.py's eight), and this holds up to R = 22."""
    return 1 - loaded < 0.75 * (1 - quiet)


def test_a_planted_load_shows_in_each_row_and_in_the_job():
    """Planted against quiet in the same test: the machine may be shared."""
    quiet, quiet_job = row_shares()
    with planted_load():
        loaded, loaded_job = row_shares()
    assert all(0 <= s <= 1 for s in quiet + loaded)
    assert took_the_cpu(median(quiet), median(loaded)), (quiet, loaded)
    assert took_the_cpu(quiet_job["job_background_cpu_share"],
                        loaded_job["job_background_cpu_share"]), (quiet_job, loaded_job)
    assert set(loaded_job) == JOB_COLUMNS


def test_the_margin_rejects_no_load_and_accepts_a_planted_one():
    assert not took_the_cpu(0.05, 0.08) and not took_the_cpu(0.75, 0.78)  # noise, not a load
    assert took_the_cpu(0.02, 0.8) and took_the_cpu(0.75, 0.9)


def test_a_row_too_short_for_the_kernels_ticks_is_judged_with_the_rows_before_it(monkeypatch):
    clock = iter([0.0, 1.0, 1.05, 1.1, 1.12, 1.13, 1.3, 1.31, 1.35])
    monkeypatch.setattr(machine, "snapshot", lambda: snap(next(clock), 0.0, 0.0, 0.0))
    machine.Job()  # starts at 0.0
    starts = []
    for _ in range(4):
        with machine.watched():
            pass
        starts.append(machine._recent[0].wall_s)
    # a row [1.0, 1.05] reaches back to the job's start; [1.1, 1.12] to 1.0, the latest start
    # 0.1 s before its end; [1.13, 1.3] is long enough alone; [1.31, 1.35] to 1.13
    assert starts == [0.0, 1.0, 1.13, 1.13]


def test_job_columns_read_the_platform(monkeypatch, tmp_path):
    for cpu, name in [("cpu0", "performance"), ("cpu1", "performance")]:
        (tmp_path / cpu).mkdir()
        (tmp_path / cpu / "scaling_governor").write_text(f"{name}\n")
    monkeypatch.setattr(machine, "GOVERNORS", str(tmp_path / "cpu*" / "scaling_governor"))
    columns = machine.Job().columns()
    assert columns["governor"] == "performance" and columns["governor_performance"] is True
    (tmp_path / "cpu1" / "scaling_governor").write_text("powersave\n")
    assert machine.governor() == "performance,powersave"
    monkeypatch.setattr(machine, "GOVERNORS", str(tmp_path / "none*"))
    assert machine.governor() == "unknown"
    assert machine.Job().columns()["governor_performance"] is False


def test_an_unreadable_platform_gives_nan_not_an_error(monkeypatch):
    def unreadable(*args, **kwargs):
        raise OSError("not here")

    monkeypatch.setattr(machine.os, "getloadavg", unreadable)
    monkeypatch.setattr(machine.psutil, "cpu_freq", unreadable)
    columns = machine.Job().columns()
    assert math.isnan(columns["load_start"]) and math.isnan(columns["cpu_mhz"])
    assert machine.busy(0.5) == ""  # no load average: nothing to go on, no sample taken


# --- the pre-flight check ------------------------------------------------------------------------

def test_busy_needs_both_the_load_average_and_a_busy_sample(monkeypatch):
    monkeypatch.setattr(machine, "cores", lambda: 2)
    samples = []
    monkeypatch.setattr(machine, "sampled_background", lambda: samples.append(1) or 0.9)
    monkeypatch.setattr(machine, "load_average", lambda: 1.8)  # 0.4 per core beyond this job
    assert machine.busy(0.5) == "" and not samples  # a quiet load average costs no sample
    monkeypatch.setattr(machine, "load_average", lambda: 4.0)
    reason = machine.busy(0.5)
    assert "1-minute load average 4.00 on 2 cores (1.50 per core" in reason and "90%" in reason
    monkeypatch.setattr(machine, "sampled_background", lambda: 0.2)  # the previous job's tail
    assert machine.busy(0.5) == ""


class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.t += seconds


def busy_for(polls: int):
    """A check that finds the machine busy on its first `polls` calls, quiet after."""
    calls = []

    def check(max_load):
        calls.append(max_load)
        return "load 3.00" if len(calls) <= polls else ""

    return check, calls


def run_preflight(mode, polls, capsys, **settings):
    clock = FakeClock()
    check, calls = busy_for(polls)
    machine.preflight(Machine(mode, **settings), check, clock.sleep, clock)
    return calls, clock, capsys.readouterr().err


def test_preflight_is_silent_on_a_quiet_machine_and_off_checks_nothing(capsys):
    for mode in ("warn", "wait", "refuse"):
        calls, clock, err = run_preflight(mode, 0, capsys)
        assert err == "" and clock.sleeps == [] and len(calls) == 1
    calls, _, err = run_preflight("off", 99, capsys)
    assert calls == [] and err == ""


def test_preflight_warns_with_the_advice(capsys):
    calls, clock, err = run_preflight("warn", 99, capsys, max_load=0.3)
    assert calls == [0.3] and clock.sleeps == []
    assert "warning: the machine is busy: load 3.00" in err
    for advice in ("close other work", "cpupower frequency-set -g performance",
                   "python -m pyperf system tune", "one measuring job at a time", "--cores"):
        assert advice in err.replace("\n  ", " "), advice


def test_preflight_waits_for_a_quiet_machine(capsys):
    calls, clock, err = run_preflight("wait", 2, capsys, wait_s=60)
    assert len(calls) == 3 and clock.t == 2 * machine.POLL_S
    assert "quiet after waiting 10 s" in err and "warning" not in err


def test_preflight_waits_at_most_wait_s_then_warns_and_measures(capsys):
    calls, clock, err = run_preflight("wait", 99, capsys, wait_s=12)
    assert clock.t == 12 and clock.sleeps == [5.0, 5.0, 2.0]
    assert "still so after waiting 12 s (config 'machine.wait_s': 12), measuring anyway" in err
    assert "cpupower" in err


def test_preflight_refuses_naming_the_key_and_the_load(capsys):
    with pytest.raises(DecodelabError, match=r"config 'machine.preflight' is 'refuse' and the "
                                             r"machine is busy: load 3.00"):
        run_preflight("refuse", 99, capsys)
    assert "cpupower" in capsys.readouterr().err


# --- config 'machine' ---------------------------------------------------------------------------

def test_machine_settings_default_to_warn_and_round_trip():
    assert Settings.from_config(validated()).machine == Machine("warn", 0.5, 120)
    config = validated()
    del config["machine"]
    validate(config, str(SCHEMA))  # the schema's defaults, as Snakemake fills them
    assert Settings.from_config(config).machine == Machine()
    spec = {"preflight": "wait", "max_load": 0.2, "wait_s": 30}
    assert Machine.from_spec(spec).job_spec() == spec


def test_a_bare_yaml_off_is_off():
    config = validated(machine=yaml.safe_load("{preflight: off}"))
    assert Settings.from_config(config).machine.preflight == "off"


@pytest.mark.parametrize("section, key", [
    ({"preflight": "sometimes"}, "machine.preflight"),
    ({"max_load": -0.1}, "machine.max_load"),
    ({"wait_s": "long"}, "machine.wait_s"),
    ({"wait_s": True}, "machine.wait_s"),
    ({"quiet": True}, "machine"),
])
def test_bad_machine_settings_are_refused_naming_the_key(section, key):
    with pytest.raises(DecodelabError, match=rf"config '{key}'"):
        Machine.from_spec(section)
    config = yaml.safe_load((ROOT / "config.yaml").read_text()) | {"machine": section}
    with pytest.raises(Exception, match="machine|sometimes|-0.1|long|True|quiet"):
        validate(config, str(SCHEMA))


# --- a tiny sweep under a planted load -----------------------------------------------------------

SWEEP = {"budgets": [4, 8], "prompt_lengths": [6], "dtype": "float32", "inner_repeats": 3,
         "warmup": 1, "seed": 11}


def tiny_sweep(model_dir, tmp_path, name):
    job = SweepJob.from_spec(SWEEP)
    df = sweep.run(str(model_dir), "gpt2-tiny", "cpu", job, repeat=0, experiment="sweep",
                   progress=False)
    path = write_raw(df, tmp_path / f"{name}.parquet", *sweep.expected_rows(job, "sweep"))
    return read_raw(path, "sweep")


def test_a_tiny_sweep_under_a_planted_load_records_it_in_its_raw_rows(model_dir, tmp_path):
    quiet = tiny_sweep(model_dir, tmp_path, "quiet")
    with planted_load():
        loaded = tiny_sweep(model_dir, tmp_path, "loaded")
    for df in (quiet, loaded):
        assert ROW_COLUMNS | JOB_COLUMNS <= set(df.columns)
        assert df[[*JOB_COLUMNS]].nunique(dropna=False).max() == 1  # one value per process
        assert df["background_cpu_share"].between(0, 1).all()
    assert took_the_cpu(quiet["job_background_cpu_share"].iloc[0],
                        loaded["job_background_cpu_share"].iloc[0])
    assert took_the_cpu(quiet["background_cpu_share"].median(),
                        loaded["background_cpu_share"].median())


def sweep_verb(model_dir, out, machine_spec: dict) -> list[str]:
    return ["sweep", "--model-dir", str(model_dir), "--model", "gpt2-tiny", "--backend", "cpu",
            "--experiment", "sweep", "--repeat", "0", "--threads", "1", "--spec",
            json.dumps(SWEEP), "--machine", json.dumps(machine_spec), "--out", str(out)]


def test_a_measuring_verb_checks_the_machine_before_it_measures(model_dir, tmp_path,
                                                                monkeypatch, capsys):
    monkeypatch.setattr(machine, "load_average", lambda: 9.0)
    monkeypatch.setattr(machine, "sampled_background", lambda: 0.8)
    out = tmp_path / "rep0.parquet"
    assert cli.main(sweep_verb(model_dir, out, {"preflight": "refuse"})) == 2
    err = capsys.readouterr().err
    assert "error: config 'machine.preflight' is 'refuse' and the machine is busy" in err
    assert "cpupower" in err and not out.exists()
    assert cli.main(sweep_verb(model_dir, out, {"preflight": "sometimes"})) == 2
    assert "config 'machine.preflight': 'sometimes' is not one of" in capsys.readouterr().err
    assert cli.main(sweep_verb(model_dir, out, {"preflight": "warn"})) == 0
    assert "warning: the machine is busy" in capsys.readouterr().err and out.exists()


# --- the pre-flight setting reruns nothing that was measured -------------------------------------

TINY = {"models": ["gpt2-tiny"], "budgets": [4], "prompt_lengths": [6], "repeats": 1,
        "inner_repeats": 1, "warmup": 1}
TARGET = f"results/{HOST}/cpu/sweep/gpt2-tiny/rep0.parquet"


def tiny_config(root: Path, machine_section: dict, **sweep_changes) -> Path:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config |= {"host": HOST, "machine": machine_section,
               "sweep": config["sweep"] | TINY | sweep_changes}
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def planned_after(root: Path, config: Path) -> dict[str, int]:
    out = snakemake(root, TARGET, "-n", "--rerun-triggers", "params", "--configfile",
                    str(config)).stdout
    return {} if "Nothing to be done" in out else planned_jobs(out)


@pytest.mark.slow  # a real sweep job and three dry runs: 40 s
def test_changing_the_preflight_reruns_no_measuring_job(tmp_path):
    root = copy_workflow(tmp_path)
    snakemake(root, TARGET, "--cores", "1", "--configfile",
              str(tiny_config(root, {"preflight": "off"})))  # a real job: its params recorded
    refuse = tiny_config(root, {"preflight": "refuse", "max_load": 0.1, "wait_s": 5})
    assert "sweep" not in planned_after(root, refuse)
    warmup = tiny_config(root, {"preflight": "off"}, warmup=2)  # the control: a measured setting
    assert "sweep" in planned_after(root, warmup)
