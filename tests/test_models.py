"""Model sources (init, local, hf), presets and loading.

The `hf` tests go through the real `huggingface_hub.snapshot_download`, offline, against a hub
cache built in a temporary directory in the layout huggingface_hub writes. They run in a
subprocess so that `HF_HUB_OFFLINE`/`HF_HUB_CACHE`, which huggingface_hub reads at import time,
are set exactly as a user would set them.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_offline import COMMIT, build_hub_cache, prepare_hf_offline
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from decodelab.backends import models, sources
from decodelab.core import shapes
from decodelab.core.errors import DecodelabError

TINY = {"gpt2-tiny": "gpt2", "opt-tiny": "opt", "bloom-tiny": "bloom", "llama-tiny": "llama"}

# Published parameter counts (tied input/output embeddings counted once).
PUBLISHED = {
    "gpt2": 124e6,
    "gpt2-medium": 355e6,
    "gpt2-large": 774e6,
    "gpt2-xl": 1.56e9,
    "opt-125m": 125e6,
    "opt-350m": 331e6,
    "opt-1.3b": 1.3e9,
    "bloom-560m": 559e6,
    "bloom-1b1": 1.07e9,
    "bloom-1b7": 1.72e9,
}

OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def init_spec(preset="gpt2-tiny", seed=1):
    return {"source": "init", "preset": preset, "seed": seed}


def weights(model_dir):
    return load_file(Path(model_dir) / "model.safetensors")


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A gpt2-tiny model made by the init source, shared read-only by the module."""
    out = tmp_path_factory.mktemp("tiny") / "gpt2-tiny"
    sources.prepare(init_spec(), out)
    return out


# init source


@pytest.mark.parametrize("preset", list(TINY))
def test_init_writes_a_loadable_hf_dir(tmp_path, preset):
    out = tmp_path / "m"
    sources.prepare(init_spec(preset), out)
    assert (out / "config.json").is_file()
    assert (out / "model.safetensors").is_file()
    assert not sources.partial_dir(tmp_path / "m").exists()
    model = models.load(out, "cpu")
    assert model.config.model_type == TINY[preset]
    assert not model.training
    assert models.count_parameters(model) == models.read_manifest(out)["parameters"]


@pytest.mark.parametrize("preset", list(TINY))
def test_init_is_deterministic_per_seed(tmp_path, preset):
    sources.prepare(init_spec(preset, seed=1), tmp_path / "a")
    sources.prepare(init_spec(preset, seed=1), tmp_path / "b")
    sources.prepare(init_spec(preset, seed=2), tmp_path / "c")
    assert same_weights(weights(tmp_path / "a"), weights(tmp_path / "b"))
    assert not same_weights(weights(tmp_path / "a"), weights(tmp_path / "c"))


def test_init_manifest(tiny_dir):
    manifest = models.read_manifest(tiny_dir)
    assert manifest["source"] == "init"
    assert manifest["preset"] == "gpt2-tiny"
    assert manifest["seed"] == 1
    assert manifest["family"] == "gpt2"
    assert manifest["parameters"] == 5_518_848


def test_prepare_replaces_an_existing_dir(tmp_path):
    out = tmp_path / "m"
    sources.prepare(init_spec(seed=1), out)
    (out / "stale.txt").write_text("left over")
    sources.prepare(init_spec(seed=2), out)
    assert not (out / "stale.txt").exists()
    assert models.read_manifest(out)["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_read_manifest_of_a_dir_without_one_is_empty(tmp_path):
    assert models.read_manifest(tmp_path) == {}


def test_load_rejects_unknown_dtype(tiny_dir):
    with pytest.raises(DecodelabError, match="float64"):
        models.load(tiny_dir, "cpu", dtype="float64")


def test_load_honours_dtype(tiny_dir):
    model = models.load(tiny_dir, "cpu", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


# presets


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_real_size_presets_have_published_parameter_counts(preset):
    config = sources.preset_config(preset)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert next(model.parameters()).is_meta
    assert models.count_parameters(model) == pytest.approx(PUBLISHED[preset], rel=0.02)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("gpt2", 1024), ("gpt2-xl", 1024), ("gpt2-tiny", 1024),
        ("opt-125m", 2048), ("opt-1.3b", 2048), ("opt-tiny", 2048),
        ("bloom-560m", None), ("bloom-1b7", None), ("bloom-tiny", None),
        ("llama-tiny", None),
    ],
)
def test_max_positions(preset, expected):
    assert shapes.max_positions(sources.preset_config(preset)) == expected


@pytest.mark.parametrize("preset", list(shapes.PRESETS))
def test_plain_preset_positions_equal_what_transformers_configures(preset):
    assert shapes.preset_positions(preset) == shapes.max_positions(sources.preset_config(preset))


def test_position_helpers_import_without_torch_or_transformers():
    code = ("import sys; from decodelab.core import shapes; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tiny_gpt2_keeps_special_ids_inside_the_vocabulary():
    config = sources.preset_config("gpt2-tiny")
    assert config.eos_token_id < config.vocab_size
    assert config.bos_token_id < config.vocab_size


def test_unknown_preset_names_it(tmp_path):
    with pytest.raises(DecodelabError, match="gpt5-huge"):
        sources.preset_config("gpt5-huge")
    with pytest.raises(DecodelabError, match="gpt5-huge"):
        shapes.preset_positions("gpt5-huge")
    with pytest.raises(DecodelabError, match="gpt5-huge"):
        sources.prepare(init_spec("gpt5-huge"), tmp_path / "m")


def test_failed_prepare_leaves_no_partial_dir(tmp_path):
    with pytest.raises(DecodelabError):
        sources.prepare(init_spec("gpt5-huge"), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_unknown_source_is_refused(tmp_path):
    with pytest.raises(DecodelabError, match="train"):
        sources.prepare({"source": "train"}, tmp_path / "m")


# local source


def test_local_without_config_names_the_path(tmp_path):
    src = tmp_path / "not-a-model"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"")
    with pytest.raises(DecodelabError, match="not-a-model") as err:
        sources.prepare({"source": "local", "path": str(src)}, tmp_path / "m")
    assert "config.json" in str(err.value)
    assert not (tmp_path / "m").exists()
    assert not sources.partial_dir(tmp_path / "m").exists()


def test_local_materialises_a_loadable_copy(tmp_path, tiny_dir):
    out = tmp_path / "m"
    sources.prepare({"source": "local", "path": str(tiny_dir)}, out)
    assert same_weights(weights(out), weights(tiny_dir))
    manifest = models.read_manifest(out)
    assert manifest["source"] == "local"
    assert manifest["path"] == str(tiny_dir.resolve())
    assert manifest["family"] == "gpt2"
    assert models.load(out, "cpu").config.model_type == "gpt2"
    # the source dir keeps its own manifest
    assert models.read_manifest(tiny_dir)["source"] == "init"


# hf source, offline, through the real huggingface_hub


OFFLINE_JOBS = {  # case -> (repo, revision), all prepared in one offline interpreter
    "by_commit": ("org/tiny-gpt2", COMMIT),
    "by_branch": ("org/tiny-gpt2", "main"),
    "missing_revision": ("org/tiny-gpt2", OTHER_COMMIT),
    "missing_repo": ("org/absent", "main"),
    "pickled": ("org/pickled", COMMIT),
}


@pytest.fixture(scope="module")
def hf_offline(tmp_path_factory, tiny_dir):
    """A hub cache holding `org/tiny-gpt2` at COMMIT (the init-source model) and `org/pickled`
    (its weights as pytorch_model.bin only), and every OFFLINE_JOBS case prepared from it, offline,
    in one fresh interpreter: case -> (result, out dir)."""
    root = tmp_path_factory.mktemp("hf-offline")
    cache = root / "hub"
    files = {
        p.name: p for p in tiny_dir.iterdir() if p.is_file() and p.name != models.MANIFEST
    }
    assert {"config.json", "model.safetensors"} <= set(files)
    build_hub_cache(cache, "org/tiny-gpt2", COMMIT, files)
    state = {k: v.clone() for k, v in weights(tiny_dir).items()}
    torch.save(state, root / "pytorch_model.bin")
    build_hub_cache(cache, "org/pickled", COMMIT, {
        "config.json": tiny_dir / "config.json",
        "pytorch_model.bin": root / "pytorch_model.bin",
    })
    outs = {case: root / "out" / case for case in OFFLINE_JOBS}
    results = prepare_hf_offline(root, cache.resolve(), [
        ({"source": "hf", "repo": repo, "revision": revision}, outs[case])
        for case, (repo, revision) in OFFLINE_JOBS.items()])
    return {case: (result, outs[case]) for case, result in zip(OFFLINE_JOBS, results, strict=True)}


def test_hf_offline_from_cache_by_commit_and_by_branch(hf_offline, tiny_dir):
    (by_commit_result, by_commit), (by_branch_result, by_branch) = (
        hf_offline["by_commit"], hf_offline["by_branch"])
    assert [by_commit_result, by_branch_result] == [{"ok": True}, {"ok": True}]
    for out in (by_commit, by_branch):
        assert not (out / "model.safetensors").is_symlink()
        assert same_weights(weights(out), weights(tiny_dir))
        manifest = models.read_manifest(out)
        assert manifest["source"] == "hf"
        assert manifest["repo"] == "org/tiny-gpt2"
        assert manifest["family"] == "gpt2"
    assert models.read_manifest(by_commit)["revision"] == COMMIT
    loaded = models.load(by_commit, "cpu").state_dict()
    original = models.load(tiny_dir, "cpu").state_dict()
    assert same_weights(loaded, original)


def test_hf_offline_missing_revision_or_repo_points_to_init_and_local(hf_offline):
    for case, missing in [("missing_revision", "tiny-gpt2@" + OTHER_COMMIT),
                          ("missing_repo", "absent@main")]:
        result, out = hf_offline[case]
        assert result["ok"] is False
        message = result["message"]
        assert missing in message
        assert "source: init" in message
        assert "source: local" in message
        assert not result["chained"], "the hub's exception should not be chained"
        assert result["traceback_lines"] < 10
        assert not out.exists()
        assert not sources.partial_dir(out).exists()


def test_hf_snapshot_without_safetensors_is_refused(hf_offline):
    result, out = hf_offline["pickled"]
    assert result["ok"] is False
    assert "safetensors" in result["message"]
    assert not out.exists()
    assert not sources.partial_dir(out).exists()
