"""Model sources (hf, local, init, and train in `train.py`), each ending in a Hugging Face
directory that later steps load with `from_pretrained`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BloomConfig,
    GPT2Config,
    OPTConfig,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .errors import DecodelabError
from .names import check_name

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
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    model.save_pretrained(out, safe_serialization=True)
    write_manifest(out, source="init", preset=preset, seed=seed,
                   family=family_of(config), parameters=count_parameters(model))


def prepare_local(out: Path, path: str, label: str) -> None:
    src = Path(path).expanduser()
    config = check_model_dir(src, f"{label} (local path {str(src)!r})")
    link_tree(src, out, skip={MANIFEST})
    write_manifest(out, source="local", path=str(src.resolve()), family=family_of(config))


def prepare_hf(out: Path, repo: str, revision: str, label: str) -> None:
    import httpx2
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
    except (httpx2.TransportError, OSError) as err:  # the hub went away mid-download, a full disk
        raise DecodelabError(
            f"hf model {repo}@{revision}: the download failed ({first_line(err)}); no model "
            "directory was written: run again once the hub can be reached") from None
    config = check_model_dir(snapshot, f"{label} (hf {repo}@{revision})")
    # A repo's own decodelab.json stays out: writing ours over a hard link would edit the cache.
    link_tree(snapshot, out, skip={MANIFEST})
    write_manifest(out, source="hf", repo=repo, revision=revision, family=family_of(config))


# What a model directory must be before anything loads it. JSON and safetensors headers only:
# no weights are read, nothing is unpickled, no code runs, and nothing ever prompts.

NO_CODE = ("decodelab never runs code shipped with a model (trust_remote_code=False); use a "
           "model whose architecture transformers implements")
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX = "model.safetensors.index.json"


def read_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path.name} is not readable JSON ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return value


def layout_problem(model_dir: Path) -> str | None:
    if not model_dir.is_dir():
        return "is not a directory"
    if not (model_dir / "config.json").is_file():
        return "has no config.json (expected a directory in Hugging Face format)"
    return None


def code_problem(model_dir: Path) -> str | None:
    """Why transformers would want to run code from `model_dir` (and ask for it on stdin)."""
    for name in ("config.json", "tokenizer_config.json"):
        path = model_dir / name
        if path.is_file() and "auto_map" in (raw := read_json_object(path)):
            return f"{name} has 'auto_map' (custom code: {raw['auto_map']}); {NO_CODE}"
    model_type = read_json_object(model_dir / "config.json").get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return (f"config.json has model_type {model_type!r}, which transformers "
                f"{transformers.__version__} does not implement; {NO_CODE}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"model_type {model_type!r} has no causal language model class in transformers"
    shipped = sorted(p.name for p in model_dir.glob("*.py"))
    if shipped:
        return f"it ships Python code ({', '.join(shipped)}); {NO_CODE}"
    return None


def size_note(path: Path) -> str:
    """The file size a damaged safetensors header declares (8 + header + the end of its last
    tensor) against the real one, where the header parses and the two differ."""
    try:
        real = path.stat().st_size
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if 8 + n > real:
                return ""
            header = json.loads(f.read(n))
        ends = [t["data_offsets"][1] for key, t in header.items() if key != "__metadata__"]
        declared = 8 + n + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return ""
    return "" if declared == real else f"; its header declares {declared} bytes, the file {real}"


def weights_problem(model_dir: Path) -> str | None:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLES)
        found = f" (found {', '.join(pickled)}, never unpickled)" if pickled else ""
        return (f"has no .safetensors weights{found}; decodelab loads safetensors only "
                "(no pickled checkpoints)")
    for path in files:
        try:
            # safe_open checks the header against the file: every tensor's byte size, the
            # offsets back to back, the data ending exactly at the end of the file.
            with safe_open(path, "pt") as f:
                f.keys()
        except (OSError, SafetensorError) as err:
            return f"{path.name} is not a complete safetensors file ({err}{size_note(path)})"
    if (model_dir / INDEX).is_file():
        shards = read_json_object(model_dir / INDEX).get("weight_map")
        if not isinstance(shards, dict):
            return f"{INDEX} has no 'weight_map' object"
        missing = sorted({s for s in map(str, shards.values()) if not (model_dir / s).is_file()})
        if missing:
            return f"{INDEX} names absent weight files: {', '.join(missing)}"
    return None


def check_model_dir(model_dir: str | Path, label: str):
    """The transformers config of a Hugging Face directory that `load` can load without running
    its code; else a DecodelabError `label: why` (custom code, no or damaged safetensors, a
    config.json transformers cannot read). Every source and every load goes through here."""
    model_dir = Path(model_dir)
    try:
        why = layout_problem(model_dir) or code_problem(model_dir) or weights_problem(model_dir)
    except ValueError as err:
        why = str(err)
    if why:
        raise DecodelabError(f"{label}: {why}")
    try:
        return AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DecodelabError(f"{label}: transformers {transformers.__version__} cannot read its "
                             f"config.json ({first_line(err)})") from None


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{err.__class__.__name__}: {lines[0] if lines else ''}"


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
    out = Path(out)
    tmp = partial_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    source, label = spec["source"], f"model {name!r}"
    try:
        if source == "init":
            prepare_init(tmp, spec["preset"], int(spec.get("seed", 0)))
        elif source == "local":
            prepare_local(tmp, spec["path"], label)
        elif source == "hf":
            prepare_hf(tmp, spec["repo"], spec["revision"], label)
        elif source == "train":
            from .train import prepare_train

            prepare_train(tmp, spec, Path(teacher_dir) if teacher_dir is not None else None,
                          label)
        else:
            raise DecodelabError(f"model source {source!r} is not supported here")
        if positions_needed:
            refuse_short_model(tmp, name, positions_needed)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def load(model_dir: str | Path, device: str, dtype: str = "float32",
         attn_implementation: str | None = None, role: str = "model"):
    """Load for inference; `attn_implementation=None` takes transformers' default per family.
    `role` (model, target, draft, teacher) names the model in errors. A model whose logits on a
    short probe input are not finite is refused here, before anything is timed."""
    if dtype not in DTYPES:
        raise DecodelabError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    label = f"{role} {str(model_dir)!r}"
    check_model_dir(model_dir, label)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=DTYPES[dtype], attn_implementation=attn_implementation,
            use_safetensors=True, trust_remote_code=False, output_loading_info=True,
        )
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        raise DecodelabError(f"{label} cannot be loaded ({first_line(err)}); prepare it again "
                             "(snakemake --forcerun prepare_model)") from None
    if missing := sorted(info["missing_keys"]):
        # transformers would fill these with random values and only print a report
        raise DecodelabError(f"{label}: its weights lack {len(missing)} tensor(s) its config.json "
                             f"needs ({', '.join(missing[:3])}{', ...' * (len(missing) > 3)})")
    model = model.to(device).eval()
    require_finite(probe_logits(model), model, role, "on a probe input")
    return model


PROBE_TOKENS = 8


@torch.inference_mode()
def probe_logits(model) -> torch.Tensor:
    ids = torch.arange(PROBE_TOKENS, device=model.device)[None] % model.config.vocab_size
    return model(input_ids=ids, use_cache=False).logits


def require_finite(logits: torch.Tensor, model, role: str, where: str) -> None:
    """Stop on NaN/inf logits. One reduction and one host sync: callers run it outside every
    timed region, once per run or per sequence."""
    if not bool(torch.isfinite(logits).all()):
        dtype = str(model.dtype).removeprefix("torch.")
        raise DecodelabError(f"{role} {model.name_or_path!r}: non-finite logits (NaN/inf) "
                             f"{where}; its weights hold NaN/inf or overflow in {dtype}. "
                             "Nothing was recorded")


# --- a model's learned positions against the config's longest sequence ------------------------
# The DAG checks every model whose positions it can read (init presets, train shapes, a local
# config.json); `prepare-model --positions-needed` checks again once the model is built, before
# it is put in place: the first moment an `hf` model's config is known.


def position_overrun(name: str, positions: int | None, needed: int, why: str) -> str | None:
    """The refusal of a model whose position table cannot hold `needed` tokens, else None."""
    if positions is None or needed <= positions:
        return None
    return (f"model {name!r} has {positions} positions, fewer than the {needed} tokens of {why}; "
            "lower the budgets or prompt lengths, or use a model with more positions")


def declared_positions(config_json: str | Path) -> int | None:
    """The position table a config.json declares, read as plain JSON (no model code runs)."""
    from types import SimpleNamespace

    path = Path(config_json)
    try:
        return max_positions(SimpleNamespace(**json.loads(path.read_text())))
    except (OSError, ValueError, TypeError) as err:
        raise DecodelabError(f"{path}: not a readable Hugging Face config.json ({err})") from None


def refuse_short_model(model_dir: str | Path, name: str, needed: int) -> None:
    """Refuse a model (its directory, not yet in place) too short for `needed` tokens."""
    why = "the config's longest sequence (sweep budget + prompt, speculative prompt + budget + K)"
    problem = position_overrun(name, declared_positions(Path(model_dir) / "config.json"),
                               needed, why)
    if problem:
        raise DecodelabError(problem)
