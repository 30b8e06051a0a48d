"""Model sources (hf, local, init, and train in `train.py`), each ending in a Hugging Face
directory that later steps load with `from_pretrained`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BloomConfig,
    GPT2Config,
    OPTConfig,
)

from .errors import DecodelabError

MANIFEST = "decodelab.json"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Architecture presets for the `init` source: the published shapes, plus tiny ones that let the
# embedded default run on a 2-core CPU in minutes. Latency depends on shapes, not weight values.
PRESETS: dict[str, tuple[str, dict]] = {
    "gpt2": ("gpt2", dict(n_layer=12, n_embd=768, n_head=12)),
    "gpt2-medium": ("gpt2", dict(n_layer=24, n_embd=1024, n_head=16)),
    "gpt2-large": ("gpt2", dict(n_layer=36, n_embd=1280, n_head=20)),
    "gpt2-xl": ("gpt2", dict(n_layer=48, n_embd=1600, n_head=25)),
    "opt-125m": ("opt", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                             ffn_dim=3072, word_embed_proj_dim=768)),
    "opt-350m": ("opt", dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                             ffn_dim=4096, word_embed_proj_dim=512, do_layer_norm_before=False)),
    "opt-1.3b": ("opt", dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=32,
                             ffn_dim=8192, word_embed_proj_dim=2048)),
    "bloom-560m": ("bloom", dict(n_layer=24, hidden_size=1024, n_head=16)),
    "bloom-1b1": ("bloom", dict(n_layer=24, hidden_size=1536, n_head=16)),
    "bloom-1b7": ("bloom", dict(n_layer=24, hidden_size=2048, n_head=16)),
    "gpt2-tiny": ("gpt2", dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192)),
    "opt-tiny": ("opt", dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                             ffn_dim=1024, word_embed_proj_dim=256, vocab_size=8192)),
    "bloom-tiny": ("bloom", dict(n_layer=4, hidden_size=256, n_head=4, vocab_size=8192)),
}

CONFIG_CLASSES = {"gpt2": GPT2Config, "opt": OPTConfig, "bloom": BloomConfig}
# Vocabulary sizes of the published tokenizers, used when a preset does not override them.
VOCAB = {"gpt2": 50257, "opt": 50272, "bloom": 250880}


def preset_config(preset: str):
    if preset not in PRESETS:
        raise DecodelabError(f"unknown init preset {preset!r}; known: {', '.join(PRESETS)}")
    family, shape = PRESETS[preset]
    shape = {"vocab_size": VOCAB[family], **shape}
    if family == "gpt2" and shape["vocab_size"] <= 50256:
        # GPT-2's special id 50256 must stay inside a small vocabulary.
        shape |= {"bos_token_id": shape["vocab_size"] - 1, "eos_token_id": shape["vocab_size"] - 1}
    return CONFIG_CLASSES[family](**shape)


def max_positions(config) -> int | None:
    """Rows of a learned position table; None for position schemes without a limit (ALiBi)."""
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return None


def family_of(config) -> str:
    return config.model_type


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def write_manifest(out: Path, **info) -> None:
    (out / MANIFEST).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def read_manifest(model_dir: str | Path) -> dict:
    path = Path(model_dir) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def prepare_init(out: Path, preset: str, seed: int) -> None:
    config = preset_config(preset)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out, safe_serialization=True)
    write_manifest(out, source="init", preset=preset, seed=seed,
                   family=family_of(config), parameters=count_parameters(model))


def prepare_local(out: Path, path: str) -> None:
    src = Path(path).expanduser()
    if not (src / "config.json").exists():
        raise DecodelabError(f"local model path {str(src)!r} has no config.json "
                             "(expected a directory in Hugging Face format)")
    link_tree(src, out, skip={MANIFEST})
    config = AutoConfig.from_pretrained(out)
    write_manifest(out, source="local", path=str(src.resolve()), family=family_of(config))


def prepare_hf(out: Path, repo: str, revision: str) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

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
    if not list(snapshot.glob("*.safetensors")):
        raise DecodelabError(f"hf model {repo}@{revision} has no .safetensors weights; "
                             "decodelab loads safetensors only (no pickled checkpoints)")
    link_tree(snapshot, out)
    config = AutoConfig.from_pretrained(out)
    write_manifest(out, source="hf", repo=repo, revision=revision, family=family_of(config))


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


def prepare(spec: dict, out: str | Path, teacher_dir: str | Path | None = None) -> None:
    """Materialize one model from its config entry into `out`, atomically. `teacher_dir` is the
    prepared directory of a `train` spec's teacher (a draft distilled from its target)."""
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    source = spec["source"]
    try:
        if source == "init":
            prepare_init(tmp, spec["preset"], int(spec.get("seed", 0)))
        elif source == "local":
            prepare_local(tmp, spec["path"])
        elif source == "hf":
            prepare_hf(tmp, spec["repo"], spec["revision"])
        elif source == "train":
            from .train import prepare_train

            prepare_train(tmp, spec, Path(teacher_dir) if teacher_dir is not None else None)
        else:
            raise DecodelabError(f"model source {source!r} is not supported here")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def load(model_dir: str | Path, device: str, dtype: str = "float32",
         attn_implementation: str | None = None):
    """Load for inference; `attn_implementation=None` takes transformers' default per family."""
    if dtype not in DTYPES:
        raise DecodelabError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPES[dtype], attn_implementation=attn_implementation,
        use_safetensors=True, trust_remote_code=False,
    )
    return model.to(device).eval()
