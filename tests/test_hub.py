"""The `hf` source through the real `huggingface_hub` client, against a local Hub
(tests/hub_server.py, HF_ENDPOINT): pinned revisions, safetensors only, no remote code and no
prompt, errors that name the repo and revision, interrupted downloads, the offline cache. And the
hub-backed paper profile: its offline twin mirrors it, and the paper says when pairs use `init`
stand-ins."""

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dag import ROOT, copy_workflow, planned_jobs, snakemake
from hub_server import HubServer

from decodelab.backends import models, sources
from decodelab.core import shapes
from decodelab.studies.speculative import paper as speculative

REPO = "decodelab-test/gpt2-tiny"
PINNED = hashlib.sha1(b"pinned").hexdigest()
OTHER = hashlib.sha1(b"other").hexdigest()  # the `main` branch: never to be fetched


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory) -> dict[str, bytes]:
    """An `init` GPT-2 as decodelab prepares it: config, weights and its own decodelab.json."""
    out = tmp_path_factory.mktemp("init") / "gpt2"
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, out)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def other_revision(files: dict[str, bytes]) -> dict[str, bytes]:
    """Same shapes, different weights: the last byte of the tensor data changed."""
    weights = bytearray(files["model.safetensors"])
    weights[-1] ^= 0xFF
    return files | {"model.safetensors": bytes(weights)}


def add_gpt2(hub: HubServer, files: dict[str, bytes]) -> None:
    hub.add(REPO, PINNED, files)
    hub.add(REPO, OTHER, other_revision(files), branch="main")


@pytest.fixture(scope="module")
def hub(gpt2_files):
    server = HubServer()
    add_gpt2(server, gpt2_files)
    with server:
        yield server


def hub_env(hub: HubServer, hf_home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", **extra}


# Runs `decodelab` verbs one after another in one Python process, so that torch and transformers
# are imported once for several cases; each case's exit status, stdout and stderr come back apart.
DRIVER = """
import json, sys, traceback
from decodelab.cli import main
for argv in json.loads(sys.argv[1]):
    for stream in (sys.stdout, sys.stderr):
        print("@@case", file=stream, flush=True)
    try:
        status = main(argv)
    except BaseException:
        traceback.print_exc()
        status = 1
    print(f"@@status {status}", file=sys.stderr, flush=True)
"""


def prepare_models(cases: list[tuple[dict, Path]], env: dict, stdin: str | None = None):
    """`decodelab prepare-model --spec S --out O` (the prepare_model rule's command) per case,
    with stdin closed or given: a `subprocess.CompletedProcess` per case."""
    argvs = [["prepare-model", "--spec", json.dumps(spec), "--out", str(out)]
             for spec, out in cases]
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], env=env,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    outs = proc.stdout.split("@@case\n")[1:]
    errs = proc.stderr.split("@@case\n")[1:]
    assert len(outs) == len(errs) == len(cases), proc.stdout + proc.stderr
    return [subprocess.CompletedProcess(argv, int(err.rsplit("@@status ", 1)[1]), out, err)
            for argv, out, err in zip(argvs, outs, errs, strict=True)]


def prepare_model(spec: dict, out: Path, env: dict, stdin: str | None = None):
    return prepare_models([(spec, out)], env, stdin)[0]


def hf_spec(repo: str = REPO, revision: str = PINNED) -> dict:
    return {"source": "hf", "repo": repo, "revision": revision}


def assert_refused(proc, out: Path, *names: str) -> str:
    """One clear error naming `names`, no traceback, no prompt, nothing left in results."""
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert "Traceback" not in said and "[y/N]" not in said, said
    assert all(name in proc.stderr for name in names), proc.stderr
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no model, no .partial
    return proc.stderr


def fetched(hub: HubServer, start: int = 0) -> set[str]:
    return {r.path.rsplit("/", 1)[1] for r in hub.requests[start:]
            if r.method == "GET" and "/resolve/" in r.path}


@pytest.fixture(scope="module")
def pinned_run(hub, tmp_path_factory):
    """The default workflow's prepare_model stage on an `hf` model at the pinned commit."""
    workdir = copy_workflow(tmp_path_factory.mktemp("workflow"))
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["models"]["hub-gpt2"] = hf_spec()
    (workdir / "hub.yaml").write_text(yaml.safe_dump(config))
    hf_home = workdir / "hf-home"
    start = len(hub.requests)
    env = {k: v for k, v in hub_env(hub, hf_home).items() if k.startswith("HF_")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        snakemake(workdir, "results/models/hub-gpt2", "--cores", "1", "--configfile", "hub.yaml")
    return workdir, hf_home, hub.requests[start:]


def test_prepare_model_stage_fetches_the_pinned_commit_only(pinned_run, gpt2_files):
    workdir, hf_home, requests = pinned_run
    out = workdir / "results/models/hub-gpt2"
    assert (out / "model.safetensors").read_bytes() == gpt2_files["model.safetensors"]
    assert models.read_manifest(out).items() >= {"source": "hf", "repo": REPO,
                                                 "revision": PINNED}.items()
    hub_requests = [r for r in requests if "/agent-harnesses" not in r.path]
    assert hub_requests and all(r.commit == PINNED for r in hub_requests), hub_requests
    assert not any(OTHER in r.path or "/main" in r.path for r in requests)
    got = {r.path.rsplit("/", 1)[1] for r in hub_requests if r.method == "GET"}
    assert got == {PINNED, *gpt2_files}  # the tree listing and every file
    # The repo's own decodelab.json is replaced in results/, never written through into the cache.
    blob = next((hf_home / "hub").glob(f"models--*/snapshots/{PINNED}/{models.MANIFEST}"))
    assert blob.read_bytes() == gpt2_files[models.MANIFEST]


def test_offline_cache_is_used_without_a_single_request(pinned_run, hub, gpt2_files, tmp_path):
    _, hf_home, _ = pinned_run
    start = len(hub.requests)
    out = tmp_path / "results/models/hub-gpt2"
    proc = prepare_model(hf_spec(), out, hub_env(hub, hf_home, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors").read_bytes() == gpt2_files["model.safetensors"]
    assert hub.requests[start:] == []


def pickle_that_touches(marker: Path) -> bytes:
    class Touch:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(Touch())


PICKLED = ("decodelab-test/pickle-only", hashlib.sha1(b"pickle-only").hexdigest())
REMOTE = ("decodelab-test/remote-code", hashlib.sha1(b"remote-code").hexdigest())
ABSENT_REVISION = hashlib.sha1(b"never committed").hexdigest()


@pytest.fixture(scope="module")
def markers(hub, gpt2_files, tmp_path_factory) -> dict[str, Path]:
    """Two repositories whose files leave a marker if they are ever unpickled or executed: one
    with only pytorch_model.bin, one whose config.json takes its class from code on the hub."""
    root = tmp_path_factory.mktemp("markers")
    marks = {"pickle": root / "unpickled", "code": root / "remote-code-ran"}
    hub.add(*PICKLED, {"config.json": gpt2_files["config.json"],
                       "pytorch_model.bin": pickle_that_touches(marks["pickle"])})
    repo, commit = REMOTE
    config = json.loads(gpt2_files["config.json"]) | {
        "model_type": "decodelab-remote",
        "auto_map": {"AutoConfig": f"{repo}--configuration_x.XConfig",
                     "AutoModelForCausalLM": f"{repo}--modeling_x.XModel"},
    }
    code = (f"import pathlib\npathlib.Path({str(marks['code'])!r}).touch()\n"
            "from transformers import PretrainedConfig\n\n\n"
            "class XConfig(PretrainedConfig):\n    model_type = 'decodelab-remote'\n")
    hub.add(repo, commit, {"config.json": json.dumps(config).encode(),
                           "model.safetensors": gpt2_files["model.safetensors"],
                           "configuration_x.py": code.encode(), "modeling_x.py": code.encode()},
            branch="main")
    return marks


REFUSED = {  # case -> (repo, revision), all run in one process with stdin closed
    "pickle-only": PICKLED,
    "absent-repo": ("decodelab-test/absent", PINNED),
    "absent-revision": (REPO, ABSENT_REVISION),
    "remote-code": REMOTE,
}


@pytest.fixture(scope="module")
def refused(hub, markers, tmp_path_factory):
    """case -> (process, out dir); with the hub's requests made meanwhile."""
    root = tmp_path_factory.mktemp("refused")
    outs = {case: root / case / "results/models/m" for case in REFUSED}
    start = len(hub.requests)
    procs = prepare_models([(hf_spec(*REFUSED[case]), outs[case]) for case in REFUSED],
                           hub_env(hub, root / "hf"))
    return {case: (proc, outs[case]) for case, proc in zip(REFUSED, procs, strict=True)}, \
        fetched(hub, start)


def test_pickle_only_repository_is_refused_and_never_unpickled(refused, markers, tmp_path):
    control = tmp_path / "control"
    pickle.loads(pickle_that_touches(control))
    assert control.exists()  # the payload is armed: unpickling it leaves the marker
    cases, files = refused
    message = assert_refused(*cases["pickle-only"], "@".join(PICKLED))
    assert "safetensors" in message
    assert not markers["pickle"].exists()
    assert "pytorch_model.bin" not in files


@pytest.mark.parametrize("repo, revision, code", [
    ("decodelab-test/absent", PINNED, "RepositoryNotFoundError"),
    (REPO, ABSENT_REVISION, "RevisionNotFoundError"),
], ids=["absent-repo", "absent-revision"])
def test_missing_repo_or_revision_is_named(refused, request, repo, revision, code):
    case = request.node.callspec.id
    assert code in assert_refused(*refused[0][case], f"{repo}@{revision}")


def test_remote_code_repository_is_refused_with_stdin_closed(refused, markers):
    cases, files = refused
    assert_refused(*cases["remote-code"], "@".join(REMOTE))
    assert not markers["code"].exists()
    assert not any(name.endswith(".py") for name in files)


def test_remote_code_repository_is_refused_when_stdin_says_yes(hub, markers, tmp_path):
    start = len(hub.requests)
    out = tmp_path / "results/models/remote"
    proc = prepare_model(hf_spec(*REMOTE), out, hub_env(hub, tmp_path / "hf"), stdin="y\n")
    assert_refused(proc, out, "@".join(REMOTE))
    assert not markers["code"].exists()
    assert not any(name.endswith(".py") for name in fetched(hub, start))


@pytest.mark.slow  # two downloads and loads of the GPT-2 files: 50 s
def test_interrupted_download_leaves_nothing_a_rerun_takes_for_finished(gpt2_files, tmp_path):
    weights = gpt2_files["model.safetensors"]
    hub = HubServer()
    add_gpt2(hub, gpt2_files)
    hub.break_file("model.safetensors", at=len(weights) // 2)
    out, hf_home = tmp_path / "results/models/hub-gpt2", tmp_path / "hf"
    with hub:
        proc = prepare_model(hf_spec(), out, hub_env(hub, hf_home))
    assert_refused(proc, out, f"{REPO}@{PINNED}")
    assert "model.safetensors" in fetched(hub)

    del hub.broken["model.safetensors"]
    start = len(hub.requests)
    with hub:  # the hub is back, on a new port
        proc = prepare_model(hf_spec(), out, hub_env(hub, hf_home))
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors").read_bytes() == weights
    assert "model.safetensors" in fetched(hub, start)


def test_paper_offline_is_the_paper_profile_with_init_stand_ins():
    online = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    offline = yaml.safe_load((ROOT / "config/paper-offline.yaml").read_text())
    assert {k: v for k, v in online.items() if k != "models"} == \
        {k: v for k, v in offline.items() if k != "models"}
    assert list(online["models"]) == list(offline["models"])
    for name, spec in online["models"].items():
        if spec["source"] == "hf":  # the preset of the repo's architecture, e.g. gpt2-xl
            assert offline["models"][name] == {"source": "init", "preset":
                                               spec["repo"].split("/")[1], "seed": 1}, name
            assert offline["models"][name]["preset"] in shapes.PRESETS
        else:
            assert offline["models"][name] == spec, name
    pairs = online["speculative"]["pairs"].values()
    assert {p["target"] for p in pairs} >= {"gpt2-xl", "opt-1.3b", "target"}


@pytest.mark.slow  # two dry runs of the 112-job paper DAG: 100 s on 2 loaded cores
def test_paper_offline_smoke_plans_the_full_dags_jobs_with_smaller_amounts(tmp_path):
    full = snakemake(copy_workflow(tmp_path), "-n", "--cores", "1", "--configfile",
                     "config/paper-offline.yaml")
    smoke = subprocess.run([ROOT / "scripts/paper_offline_smoke.sh", tmp_path / "smoke", "-n"],
                           capture_output=True, text=True, timeout=300)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    full_jobs, smoke_jobs = planned_jobs(full.stdout), planned_jobs(smoke.stdout)
    models = yaml.safe_load((ROOT / "config/paper-offline.yaml").read_text())["models"]
    assert full_jobs["prepare_model"] == smoke_jobs["prepare_model"] == len(models)
    assert set(full_jobs) == set(smoke_jobs)  # the same rules; fewer repeats, so fewer jobs
    assert smoke_jobs["sweep"] < full_jobs["sweep"]
    # Every model, experiment and pair of the profile, each in fewer processes.
    profile = yaml.safe_load((ROOT / "config/paper-offline.yaml").read_text())
    shrunk = yaml.safe_load((tmp_path / "smoke/smoke.yaml").read_text())
    for rule, section in [("sweep", "sweep"), ("speculative", "speculative"),
                          ("parallelism", "speculative")]:
        per_process = full_jobs[rule] / profile[section]["repeats"]
        assert smoke_jobs[rule] == per_process * shrunk[section]["repeats"], rule


def test_the_paper_names_init_stand_ins_in_speculative_pairs():
    settings = {"speculative": {"pairs": {
        "cpu-cpu": {"target": "target", "draft": "draft"},
        "gpt2-xl.cpu-cpu": {"target": "gpt2-xl", "draft": "gpt2"},
    }}}
    prepared = pd.DataFrame({"model": ["target", "draft", "gpt2-xl", "gpt2"],
                             "source": ["train", "train", "init", "init"]})
    assert speculative.init_pair_models(prepared, settings) == ["gpt2", "gpt2-xl"]
    macros, flags = speculative.speculative_macros(None, prepared, settings, pd.DataFrame())
    assert flags["SpecInitPair"] and macros["SpecInitModels"] == (
        r"\texttt{gpt2} and \texttt{gpt2-xl}")
    assert not flags["SpecInitRows"]  # nothing ran: no result row to qualify
    real = prepared.assign(source=["train", "train", "hf", "hf"])
    _, flags = speculative.speculative_macros(None, real, settings, pd.DataFrame())
    assert not flags["SpecInitPair"]


def test_the_paper_names_the_result_rows_of_init_pairs():
    cpu = {"draft_device": "cpu", "target_device": "cpu"}
    settings = {"speculative": {"pairs": {
        "cpu-cpu": {"target": "target", "draft": "draft", **cpu},
        "gpt2-xl.cpu-cpu": {"target": "gpt2-xl", "draft": "gpt2", **cpu},
        "opt-1.3b.cpu-cpu": {"target": "opt-1.3b", "draft": "opt-125m", **cpu},
        "gpt2-xl.cuda-cuda": {"target": "gpt2-xl", "draft": "gpt2", "draft_device": "cuda",
                              "target_device": "cuda"},
    }}}
    prepared = pd.DataFrame({"model": ["target", "draft", "gpt2-xl", "gpt2", "opt-1.3b",
                                       "opt-125m"],
                             "source": ["train", "train", "init", "init", "hf", "hf"]})
    ran = speculative.no_rows() | {"speedup": pd.DataFrame(
        {"pair": ["cpu-cpu", "gpt2-xl.cpu-cpu", "opt-1.3b.cpu-cpu"]})}
    env = pd.DataFrame({"backend": ["cpu"]})
    # the skipped CUDA pair has no row to qualify; the real and trained pairs are not named
    assert speculative.init_pairs(ran, prepared, settings, env) == ["gpt2-xl.cpu-cpu"]
    real = prepared.assign(source="hf")
    assert speculative.init_pairs(ran, real, settings, env) == []
