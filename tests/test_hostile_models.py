"""Hostile and careless models (issue #13, items 5-7): code shipped with a model never runs and
nothing prompts; unloadable weights are refused when the model is prepared; NaN/inf logits stop
every measuring verb with the model's role and directory; `prepare` deletes only its own dirs."""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN
from hf_offline import COMMIT, build_hub_cache
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM

import decodelab
from decodelab import cli
from decodelab.backends import models, sources
from decodelab.config.settings import Pair, Sampling, SpeculativeJob, SweepJob, Verification
from decodelab.core.errors import DecodelabError
from decodelab.engines.speculative import generate
from decodelab.studies.speculative import run as study
from decodelab.studies.sweep import run as sweep
from decodelab.studies.verification import run as verify

NAN = "non-finite logits (NaN/inf)"
SWEEP = {"budgets": [4], "prompt_lengths": [6], "dtype": "float32", "inner_repeats": 1,
         "warmup": 1, "seed": 11}
STUDY = {"ks": [2], "modes": ["greedy"], "temperature": 1.0, "top_k": 0, "top_p": 1.0,
         "prompts": 1, "prompt_len": 8, "budget": 8, "hf_assisted": False, "seed": 3}
PAIR = {"target_device": "cpu", "draft_device": "cpu", "dtype": "float32"}


def study_job(**edit) -> SpeculativeJob:
    return SpeculativeJob.from_spec(STUDY | edit)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "gpt2-tiny"
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, out)
    return out


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(models.MANIFEST))
    return dst


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def pickle_that_touches(marker: Path) -> bytes:
    class Touch:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(Touch())


CUSTOM_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("custom code ran")
from transformers import PretrainedConfig


class EvilConfig(PretrainedConfig):
    model_type = "evilgpt"
"""
AUTO_MAP = {"AutoConfig": "configuration_x.EvilConfig",
            "AutoModelForCausalLM": "configuration_x.EvilConfig"}


def with_custom_code(model_dir: Path, marker: Path) -> Path:
    """An unknown model_type, an auto_map and the configuration_x.py it names: transformers
    asks "Do you wish to run the custom code? [y/N]" for it unless told not to."""
    edit_json(model_dir / "config.json", model_type="evilgpt", auto_map=AUTO_MAP)
    (model_dir / "configuration_x.py").write_text(CUSTOM_CODE.format(marker=str(marker)))
    return model_dir


# 5. code shipped with a model never runs, whatever stdin says


DRIVER = """
import json, sys
from decodelab.cli import main
for argv in json.loads(sys.argv[1]):
    print(f"@@status {main(argv)}", file=sys.stderr, flush=True)
"""


def run_verbs(argvs: list[list[str]], stdin: str, hf_home: Path) -> tuple[list, str]:
    """`decodelab` verbs in one fresh interpreter, offline on the hub cache under `hf_home`,
    stdin given (an empty one is closed): the exit status and stderr of each verb, and all it
    printed."""
    src = str(Path(decodelab.__file__).parents[1])
    env = os.environ | {"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"),
                        "HF_HUB_OFFLINE": "1",
                        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], input=stdin,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    parts = proc.stderr.split("@@status ")
    verbs = [(int(part.split("\n", 1)[0]), err) for part, err in zip(parts[1:], parts,
                                                                       strict=False)]
    return verbs, proc.stdout + proc.stderr


@pytest.fixture(scope="module", params=["", "y\ny\n"], ids=["stdin-closed", "stdin-says-yes"])
def custom_code_verbs(request, tiny_dir, tmp_path_factory) -> tuple[Path, dict, str]:
    """Three verbs on models that ship code, in one fresh interpreter (a fresh one per stdin,
    closed or saying yes): prepare-model on a local path, sweep on a prepared directory, and
    prepare-model on an hf snapshot in the offline cache. Returns (root, verb -> (exit status,
    stderr), all printed)."""
    root = tmp_path_factory.mktemp("custom-code")
    marker = root / "MARKER"
    hostile = with_custom_code(copy_model(tiny_dir, root / "hostile"), marker)
    prepared = with_custom_code(copy_model(tiny_dir, root / "models" / "evil"), marker)
    snapshot = copy_model(tiny_dir, root / "snapshot")
    edit_json(snapshot / "config.json", auto_map=AUTO_MAP)
    build_hub_cache(root / "hf-home" / "hub", "org/evil", COMMIT,
                    {p.name: p for p in snapshot.iterdir()})
    argvs = {
        "prepare": ["prepare-model", "--spec",
                    json.dumps({"source": "local", "path": str(hostile)}),
                    "--out", str(root / "results" / "models" / "evil")],
        "sweep": ["sweep", "--model-dir", str(prepared), "--model", "evil", "--backend", "cpu",
                  "--experiment", "sweep", "--repeat", "0", "--spec", json.dumps(SWEEP),
                  "--out", str(root / "rep0.parquet")],
        "hf": ["prepare-model", "--spec",
               json.dumps({"source": "hf", "repo": "org/evil", "revision": COMMIT}),
               "--out", str(root / "hf" / "m")],
    }
    verbs, said_all = run_verbs(list(argvs.values()), request.param, root / "hf-home")
    assert len(verbs) == len(argvs), said_all
    return root, dict(zip(argvs, verbs, strict=True)), said_all


def test_custom_code_never_runs_in_prepare_model_or_sweep(custom_code_verbs):
    root, verbs, said_all = custom_code_verbs
    hostile, out = root / "hostile", root / "results" / "models" / "evil"
    assert not (root / "MARKER").exists(), "the model's configuration_x.py ran"
    assert "Traceback" not in said_all and "[y/N]" not in said_all, said_all
    (prepare, said), (measure, said_sweep) = verbs["prepare"], verbs["sweep"]
    assert prepare == 2 and measure == 2
    assert f"model 'evil' (local path {str(hostile)!r}): config.json has 'auto_map'" in said
    assert "trust_remote_code=False" in said
    assert "model 'evil': config.json has 'auto_map'" in said_sweep
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no model, no partial dir
    assert not (root / "rep0.parquet").exists()


REFUSED = {  # case -> (how to spoil a good model directory, what the error says)
    "auto_map beside a known model_type": (
        lambda d: edit_json(d / "config.json", auto_map=AUTO_MAP),
        "config.json has 'auto_map' (custom code: "),
    "unknown model_type": (
        lambda d: edit_json(d / "config.json", model_type="evilgpt"),
        "config.json has model_type 'evilgpt', which transformers"),
    "no causal-LM class": (
        lambda d: edit_json(d / "config.json", model_type="t5"),
        "model_type 't5' has no causal language model class"),
    "a shipped .py file": (
        lambda d: (d / "modeling_gpt2.py").write_text("raise SystemExit('ran')\n"),
        "it ships Python code (modeling_gpt2.py); decodelab never runs code shipped"),
    "tokenizer auto_map": (
        lambda d: (d / "tokenizer_config.json").write_text(
            json.dumps({"auto_map": {"AutoTokenizer": ["tok.EvilTokenizer", None]}})),
        "tokenizer_config.json has 'auto_map'"),
    "config.json not JSON": (
        lambda d: (d / "config.json").write_text("{model_type: gpt2"),
        "config.json is not readable JSON"),
    "config.json a list": (
        lambda d: (d / "config.json").write_text("[1, 2]"),
        "config.json is not a JSON object"),
    # 6. weights that cannot be loaded
    "only pytorch_model.bin": (
        lambda d: ((d / "model.safetensors").unlink(),
                   (d / "pytorch_model.bin").write_bytes(pickle_that_touches(d / "UNPICKLED"))),
        "has no .safetensors weights (found pytorch_model.bin, never unpickled); decodelab "
        "loads safetensors only"),
    "truncated safetensors": (
        lambda d: truncate(d / "model.safetensors", 8),
        "model.safetensors is not a complete safetensors file (Error while deserializing "
        "header: incomplete metadata, file not fully covered; its header declares"),
    "padded safetensors": (
        lambda d: (d / "model.safetensors").write_bytes(
            (d / "model.safetensors").read_bytes() + bytes(64)),
        "model.safetensors is not a complete safetensors file"),
    "header lies about a shape": (
        lambda d: lie_about_a_shape(d / "model.safetensors"),
        "model.safetensors is not a complete safetensors file (Error while deserializing "
        "header: invalid shape, data type, or offset for tensor"),
    "not safetensors at all": (
        lambda d: (d / "model.safetensors").write_bytes(b"<html>rate limited</html>"),
        "model.safetensors is not a complete safetensors file"),
    "index names an absent shard": (
        lambda d: (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "lm_head.weight": "model-00002-of-00002.safetensors"}})),
        "model.safetensors.index.json names absent weight files: "
        "model-00002-of-00002.safetensors"),
}


def truncate(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:-n])


def lie_about_a_shape(path: Path) -> None:
    """Double one tensor's first dimension in the header; the file keeps its size."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"][0] *= 2
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    path.write_bytes(data[:8] + text + data[8 + n:])


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_model_that_cannot_be_loaded_safely_is_refused_when_prepared(tmp_path, tiny_dir,
                                                                        case):
    spoil, says = REFUSED[case]
    src = copy_model(tiny_dir, tmp_path / "src")
    spoil(src)
    out = tmp_path / "models" / "m"
    with pytest.raises(DecodelabError) as err:
        sources.prepare({"source": "local", "path": str(src)}, out)
    assert str(err.value).startswith(f"model 'm' (local path {str(src)!r}): ")
    assert says in str(err.value)
    assert not out.parent.exists() or not any(out.parent.iterdir())
    # a directory spoiled after preparation: every measuring verb loads through `load`
    with pytest.raises(DecodelabError) as err:
        models.load(src, "cpu", role="target")
    assert str(err.value).startswith(f"target {str(src)!r}: ") and says in str(err.value)
    assert not (src / "UNPICKLED").exists()


def test_the_pickle_payload_is_armed(tmp_path):
    """Negative control for "never unpickled": unpickling the file does leave the marker."""
    pickle.loads(pickle_that_touches(tmp_path / "UNPICKLED"))
    assert (tmp_path / "UNPICKLED").exists()


def test_an_hf_snapshot_goes_through_the_same_checks(custom_code_verbs):
    root, verbs, _ = custom_code_verbs
    status, said = verbs["hf"]
    assert status == 2
    assert f"model 'm' (hf org/evil@{COMMIT}): config.json has 'auto_map'" in said, said
    out = root / "hf" / "m"
    assert not out.exists() and not sources.partial_dir(out).exists()
    assert not (root / "MARKER").exists()


@pytest.mark.parametrize("change, says", [
    ({"n_embd": 128}, "cannot be loaded (RuntimeError: "),
    # refused before transformers builds the two extra blocks (issue 60)
    ({"n_layer": 6}, "config.json declares 6 layers (n_layer) but its weights hold 4 blocks"),
], ids=["shapes differ", "tensors missing"])
def test_load_names_the_directory_of_weights_that_do_not_fit_the_config(tmp_path, tiny_dir,
                                                                       change, says):
    src = copy_model(tiny_dir, tmp_path / "m")
    edit_json(src / "config.json", **change)
    with pytest.raises(DecodelabError) as err:
        models.load(src, "cpu")
    assert str(err.value).startswith(f"model {str(src)!r}") and says in str(err.value)


# 7. NaN/inf logits stop every measuring verb


def poisoned(src: Path, dst: Path, weight: str, rows: slice = slice(None)) -> str:
    """A copy of `src` (tokenizer and manifest included) with weight[rows] set to NaN."""
    model = AutoModelForCausalLM.from_pretrained(src, use_safetensors=True)
    with torch.no_grad():
        model.get_parameter(weight)[rows] = float("nan")
    model.save_pretrained(dst, safe_serialization=True)
    for item in src.iterdir():
        if not (dst / item.name).exists():
            shutil.copy2(item, dst / item.name)
    return str(dst)


NAN_WEIGHTS = ("transformer.ln_f.weight", slice(None))
# Positions from 8 on: the load-time probe (8 tokens) passes, a prompt plus budget does not.
LATE_NAN = ("transformer.wpe.weight", slice(8, None))  # models.PROBE_TOKENS
PARALLELISM_CONTEXT = 16  # from here on: after the untimed context, in the timed passes
LATER_NAN = ("transformer.wpe.weight", slice(PARALLELISM_CONTEXT, None))


@pytest.fixture(scope="module")
def nan_models(tiny_pair, tiny_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("nan")
    target, draft = map(Path, tiny_pair)
    return {
        "target": poisoned(target, root / "nan-target", *NAN_WEIGHTS),
        "draft": poisoned(draft, root / "nan-draft", *NAN_WEIGHTS),
        "late-target": poisoned(target, root / "late-target", *LATE_NAN),
        "late-draft": poisoned(draft, root / "late-draft", *LATE_NAN),
        "later-target": poisoned(target, root / "later-target", *LATER_NAN),
        "init": poisoned(tiny_dir, root / "nan-init", *NAN_WEIGHTS),
        "late-init": poisoned(tiny_dir, root / "late-init", *LATE_NAN),
    }


def assert_nan_error(err, role: str, model_dir: str, where: str) -> None:
    assert str(err.value).startswith(f"{role} {model_dir!r}: {NAN} {where}"), str(err.value)


@pytest.mark.parametrize("which, where", [
    ("init", "on a probe input"),
    ("late-init", "in the prefill or the last decode step"),
], ids=["nan-weights", "nan-late-positions"])
def test_sweep_stops_on_a_nan_model(nan_models, which, where):
    with pytest.raises(DecodelabError) as err:
        sweep.run(nan_models[which], "nan", "cpu", SweepJob.from_spec(SWEEP), 0, "sweep",
                  progress=False)
    assert_nan_error(err, "model", nan_models[which], where)


@pytest.mark.parametrize("roles, mode, blamed", [
    (("target", "draft"), "greedy", "target"),
    (("target", "draft"), "sampled", "target"),
    ((None, "draft"), "sampled", "draft"),
], ids=["both-nan-greedy", "both-nan-sampled", "nan-draft-sampled"])
def test_speculative_study_and_bench_stop_on_nan_models(tiny_pair, nan_models, roles, mode,
                                                        blamed):
    dirs = [nan_models[r] if r else d for r, d in zip(roles, tiny_pair, strict=True)]
    with pytest.raises(DecodelabError) as err:
        study.run(*dirs, "cpu-cpu", PAIR, study_job(modes=[mode]), 0, progress=False)
    assert_nan_error(err, blamed, nan_models[blamed], "on a probe input")


@pytest.mark.parametrize("role", ["target", "draft"])
def test_speculative_decoding_checks_both_models_once_per_sequence(tiny_pair, nan_models, role):
    dirs = {"target": tiny_pair[0], "draft": tiny_pair[1], role: nan_models[f"late-{role}"]}
    target, draft = (models.load(dirs[r], "cpu") for r in ("target", "draft"))
    with pytest.raises(DecodelabError) as err:
        generate(target, draft, list(range(10, 18)), 12, 2, Sampling())
    assert_nan_error(err, role, dirs[role], "in a speculative block")


def test_bench_stops_on_nan_models(nan_models, tmp_path, capsys):
    out = tmp_path / "bench.csv"
    status = cli.main(["bench", "--target-dir", nan_models["target"], "--draft-dir",
                       nan_models["draft"], "--ks", "1", "--prompts", "1", "--budget", "4",
                       "--out", str(out)])
    assert status == 2 and not out.exists()
    assert f"target {nan_models['target']!r}: {NAN}" in capsys.readouterr().err


@pytest.mark.parametrize("which, where", [
    ("late-target", "on the context"),
    ("later-target", "in the last timed pass"),
])
def test_parallelism_stops_on_a_model_nan_at_late_positions(nan_models, tmp_path, capsys, which,
                                                            where):
    out = tmp_path / "rep0.parquet"
    spec = {"ks": [1], "context": PARALLELISM_CONTEXT, "inner": 1, "seed": 0, "dtype": "float32"}
    status = cli.main(["parallelism", "--model-dir", nan_models[which], "--model", "t",
                       "--backend", "cpu", "--spec", json.dumps(spec), "--repeat", "0",
                       "--out", str(out)])
    assert status == 2 and not out.exists()
    assert f"target {nan_models[which]!r}: {NAN} {where}" in capsys.readouterr().err


def test_verify_real_stops_on_a_nan_target(tiny_pair, nan_models):
    spec = Verification.from_spec({
        "k": 2, "alpha": 0.01, "seeds": 1, "seed": 0,
        "exact": {"random_pairs": 1, "vocab_sizes": [2], "concentrations": [1.0],
                  "real_positions": 1, "block_vocab": 2, "block_ks": [1]},
        "monte_carlo": {"draws": 1, "vocab": 2, "block_draws": 1},
        "real": {"tokens": 64, "budget": 16, "top": 20, "prompts": 2, "power_tokens": 32,
                 "greedy_prompts": 2}})
    pair = Pair("target", "draft", target_device="cpu", draft_device="cpu")
    with pytest.raises(DecodelabError) as err:
        verify.run_real(spec, "cpu-cpu", pair, nan_models["target"], tiny_pair[1], 0)
    assert_nan_error(err, "target", nan_models["target"], "on a probe input")


def test_training_stops_at_the_step_whose_loss_is_nan(tmp_path):
    out = tmp_path / "m"
    with pytest.raises(DecodelabError, match=r"^model 'm': training loss is (nan|inf) "
                       r"\(non-finite, NaN/inf\) at step \d+ of 10; nothing was saved"):
        sources.prepare(TINY_TRAIN | {"lr": 1e30}, out)
    assert list(tmp_path.iterdir()) == []


def test_distilling_from_a_nan_teacher_stops_before_training(nan_models, tmp_path):
    draft = TINY_TRAIN | {"n_embd": 16, "steps": 5, "teacher": "target", "distill": 1.0}
    with pytest.raises(DecodelabError) as err:
        sources.prepare(draft, tmp_path / "draft", teacher_dir=nan_models["target"])
    assert_nan_error(err, "teacher", nan_models["target"], "on a probe input")
    assert list(tmp_path.iterdir()) == []


def test_finite_models_pass_every_check(tiny_pair, tiny_dir):
    """Negative control: the same verbs on healthy models measure and raise nothing."""
    df = study.run(*tiny_pair, "cpu-cpu", PAIR, study_job(modes=["greedy", "sampled"]), 0,
                   progress=False)
    assert len(df) > 0
    assert len(sweep.run(str(tiny_dir), "gpt2-tiny", "cpu", SweepJob.from_spec(SWEEP), 0, "sweep",
                         progress=False))


# prepare() deletes only the directory it was asked for


def test_preparing_x_leaves_a_model_named_x_partial_alone(tmp_path):
    keep = tmp_path / "x.partial"  # a legal model name
    keep.mkdir()
    (keep / "config.json").write_text("{}")
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, tmp_path / "x")
    assert (keep / "config.json").read_text() == "{}"
    assert (tmp_path / "x" / "model.safetensors").is_file()


@pytest.mark.parametrize("name", ["..", ".", ".hidden"])
def test_prepare_refuses_an_out_that_is_not_a_model_name(tmp_path, name):
    models_dir = tmp_path / "results" / "models"
    (models_dir / "other").mkdir(parents=True)
    (tmp_path / "results" / "reference").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(DecodelabError, match=f"model '{name}' is not a usable name"):
        sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1},
                       f"{models_dir}/{name}")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


# issue 60: a model's size from its config before anything is allocated; a place that cannot be
# written


def test_a_config_json_claiming_more_layers_than_its_weights_hold_is_refused(tmp_path, tiny_dir,
                                                                             capsys):
    """transformers would build all 300 blocks (and fill 296 with random values) first; past
    'limits.max_layers' (2000) the limit refuses it first."""
    local = copy_model(tiny_dir, tmp_path / "liar")
    edit_json(local / "config.json", n_layer=300)
    with pytest.raises(DecodelabError, match=r"config.json declares 300 layers \(n_layer\) but "
                                             r"its weights hold 4 blocks \(indices 0..3\)"):
        models.check_model_dir(local, "model")
    out = tmp_path / "models" / "liar"
    spec = json.dumps({"source": "local", "path": str(local)})
    assert cli.main(["prepare-model", "--spec", spec, "--out", str(out)]) == 2
    assert "config.json declares 300 layers" in capsys.readouterr().err
    assert not out.exists() and not sources.partial_dir(out).exists()
    edit_json(local / "config.json", n_layer=2000)
    with pytest.raises(DecodelabError, match=r"2000 layers, more than config 'limits.max_layers'"):
        models.check_model_dir(local, "model")


def test_a_config_json_past_the_limits_is_refused_before_a_model_is_built(tmp_path, tiny_dir,
                                                                          monkeypatch):
    local = copy_model(tiny_dir, tmp_path / "wide")
    edit_json(local / "config.json", n_embd=200_000)
    with pytest.raises(DecodelabError, match=r"config.json: about 1.\d+e\+12 parameters .* more "
                                             r"than config 'limits.max_params' \(4e\+09\)"):
        models.check_model_dir(local, "model")
    edit_json(local / "config.json", n_embd=256)
    monkeypatch.setenv("DECODELAB_LIMITS", json.dumps({"max_params": 10**6, "max_layers": 512}))
    with pytest.raises(DecodelabError, match=r"more than config 'limits.max_params' \(1e\+06\)"):
        models.load(local, "cpu")


def test_prepare_model_refuses_a_train_spec_too_deep_before_training(tmp_path, capsys):
    out = tmp_path / "models" / "deep"
    spec = json.dumps(TINY_TRAIN | {"n_layer": 3000, "n_embd": 8, "n_head": 1})
    assert cli.main(["prepare-model", "--spec", spec, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "decodelab prepare-model: error: model 'deep': 3000 layers, more than config "
        "'limits.max_layers' (512); raise it to build a model this deep\n")
    assert not out.parent.exists()


def test_prepare_model_into_a_place_it_cannot_write_is_one_line_and_leaves_nothing(tmp_path,
                                                                                   capsys):
    results = tmp_path / "results"
    results.write_text("a file where results/ should be\n")
    spec = '{"source": "init", "preset": "gpt2-tiny", "seed": 1}'
    assert cli.main(["prepare-model", "--spec", spec, "--out", str(results / "models/t")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"decodelab prepare-model: error: model 't': Not a directory: {results}")
    assert err.count("\n") == 1 and "make " in err
    assert results.read_text() == "a file where results/ should be\n"


@pytest.mark.parametrize("error", [
    OSError(28, "No space left on device", "model.safetensors"),
    # what safetensors' writer raises on a full tmpfs
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
], ids=["OSError", "SafetensorError"])
def test_prepare_model_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys,
                                                                     monkeypatch, error):
    def fill(out, spec, label, teacher_dir):
        (out / "model.safetensors").write_bytes(b"\0" * 1000)
        raise error

    monkeypatch.setitem(sources.SOURCES, "init", fill)
    out = tmp_path / "models" / "t"
    spec = '{"source": "init", "preset": "gpt2-tiny", "seed": 1}'
    assert cli.main(["prepare-model", "--spec", spec, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decodelab prepare-model: error: model 't': No space left on device: ")
    assert err.count("\n") == 1 and "free space on its file system" in err
    assert list((tmp_path / "models").iterdir()) == []
