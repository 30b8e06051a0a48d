"""Model sources (init, local, hf, train in `train.py`, package in `packaged.py`): each builds
a Hugging Face directory from its config entry, which later steps load with `models.load`."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, BloomConfig, GPT2Config, LlamaConfig, OPTConfig

from decodelab.backends.models import (
    MANIFEST,
    check_model_dir,
    count_parameters,
    family_of,
    first_line,
    write_manifest,
)
from decodelab.core.errors import DecodelabError
from decodelab.core.names import check_name
from decodelab.core.shapes import PRESETS, VOCAB, check_preset, declared_positions, position_overrun
from decodelab.core.sizes import job_limits, size_problem, spec_fields

CONFIG_CLASSES = {"gpt2": GPT2Config, "opt": OPTConfig, "bloom": BloomConfig,
                  "llama": LlamaConfig}


def preset_config(preset: str):
    family, shape = PRESETS[check_preset(preset)]
    shape = {"vocab_size": VOCAB[family], **shape}
    if family == "gpt2" and shape["vocab_size"] <= 50256:
        # GPT-2's special id 50256 must stay inside a small vocabulary.
        shape |= {"bos_token_id": shape["vocab_size"] - 1, "eos_token_id": shape["vocab_size"] - 1}
    return CONFIG_CLASSES[family](**shape)


def prepare_init(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    preset, seed = spec["preset"], int(spec.get("seed", 0))
    config = preset_config(preset)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    model.save_pretrained(out, safe_serialization=True)
    write_manifest(out, source="init", preset=preset, seed=seed,
                   family=family_of(config), parameters=count_parameters(model))


def prepare_local(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    src = Path(spec["path"]).expanduser()
    config = check_model_dir(src, f"{label} (local path {str(src)!r})")
    link_tree(src, out, skip={MANIFEST})
    write_manifest(out, source="local", path=str(src.resolve()), family=family_of(config))


def prepare_hf(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = spec["repo"], spec["revision"]
    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*"]
    try:
        snapshot = Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        raise DecodelabError(
            f"hf model {repo}@{revision} is not in the local Hugging Face cache and the hub "
            f"cannot be reached (offline: {err.__class__.__name__}). Fetch it on a machine "
            "with network access, or use `source: local` with a downloaded directory, or "
            "`source: init` with an architecture preset for latency-only runs."
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise DecodelabError(f"hf model {repo}@{revision}: {err.__class__.__name__}") from None
    except (httpx2.TransportError, OSError) as err:  # the hub went away mid-download, a full disk
        raise DecodelabError(
            f"hf model {repo}@{revision}: the download failed ({first_line(err)}); no model "
            "directory was written: run again once the hub can be reached") from None
    config = check_model_dir(snapshot, f"{label} (hf {repo}@{revision})")
    # A repo's own decodelab.json stays out: writing ours over a hard link would edit the cache.
    link_tree(snapshot, out, skip={MANIFEST})
    write_manifest(out, source="hf", repo=repo, revision=revision, family=family_of(config))


def prepare_train(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    # Imported here: training pulls in the Llama and distillation code (1.5 s of imports) that
    # no other source, and no refusal of a hostile model, needs.
    from decodelab.backends.train import prepare_train as train

    train(out, spec, label, teacher_dir)


def prepare_package(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    # Imported here: the GGUF reader and its dequantization are needed by this source alone.
    from decodelab.backends.packaged import prepare_package as package

    package(out, spec, label, teacher_dir)


# Each source fills `out` (an empty directory) from its spec; `label` names the model in errors.
SOURCES = {"init": prepare_init, "local": prepare_local, "hf": prepare_hf, "train": prepare_train,
           "package": prepare_package}


def link_tree(src: Path, out: Path, skip: set[str] = frozenset()) -> None:
    """Hard-link (or copy) the files of `src` into `out`, resolving the hub cache's symlinks."""
    out.mkdir(parents=True, exist_ok=True)
    for item in sorted(src.iterdir()):
        if item.name in skip or item.is_dir():
            continue
        target = out / item.name
        real = item.resolve()
        try:
            os.link(real, target)
        except OSError:
            shutil.copy2(real, target)


def partial_dir(out: Path) -> Path:
    """Where `prepare` builds `out`: hidden, so no model's name (never starting with '.') is it."""
    return out.with_name(f".{out.name}.partial")


def prepare(spec: dict, out: str | Path, teacher_dir: str | Path | None = None,
            positions_needed: int = 0) -> None:
    """Materialize one model from its config entry into `out`, atomically. `teacher_dir` is the
    prepared directory of a `train` spec's teacher (a draft distilled from its target); a model
    whose position table is shorter than `positions_needed` is refused before it is in place."""
    # The name as given: Path() would turn "results/models/." into "results/models".
    name = check_name(os.path.basename(os.fspath(out).rstrip("/")), "model")
    source = spec.get("source")
    if source not in SOURCES:
        raise DecodelabError(f"model source {source!r} is not supported here")
    fields = spec_fields(spec)
    if fields and (problem := size_problem(fields, job_limits(), f"model {name!r}")):
        raise DecodelabError(problem)
    out = Path(out)
    tmp = partial_dir(out)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        SOURCES[source](tmp, spec, f"model {name!r}",
                        Path(teacher_dir) if teacher_dir is not None else None)
        if positions_needed:
            refuse_short_model(tmp, name, positions_needed)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError | SafetensorError):
            raise DecodelabError(unwritable(name, out, err)) from None
        raise


def unwritable(name: str, out: Path, err: OSError | SafetensorError) -> str:
    """The one line of a model directory that could not be written (a full disk, a read-only
    results/): where, and what to do. safetensors' writer reports the OS error in its text."""
    code = getattr(err, "errno", None)
    if code is None and (m := re.search(r"os error (\d+)", str(err))):
        code = int(m[1])
    why = os.strerror(code) if code else first_line(err)
    where = getattr(err, "filename", None) or out.parent
    if code in (errno.ENOSPC, errno.EDQUOT):
        todo = "free space on its file system"
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR):
        todo = f"make {out.parent} a writable directory"
    else:
        todo = f"check {where}"
    return (f"model {name!r}: {why}: {where}; nothing was left in {out.parent}: {todo} and run "
            "again")


def refuse_short_model(model_dir: str | Path, name: str, needed: int) -> None:
    """Refuse a model (its directory, not yet in place) too short for `needed` tokens."""
    why = "the config's longest sequence (sweep budget + prompt, speculative prompt + budget + K)"
    problem = position_overrun(name, declared_positions(Path(model_dir) / "config.json"),
                               needed, why)
    if problem:
        raise DecodelabError(problem)
