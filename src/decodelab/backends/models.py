"""A model directory in Hugging Face format: what it must be before anything loads it, its
manifest, and loading it for inference. `sources.py` builds one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from decodelab.core.errors import DecodelabError
from decodelab.core.sizes import LAYERS, config_fields, job_limits, size_problem, whole

MANIFEST = "decodelab.json"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def family_of(config) -> str:
    return config.model_type


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def write_manifest(out: Path, **info) -> None:
    (out / MANIFEST).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def read_manifest(model_dir: str | Path) -> dict:
    path = Path(model_dir) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


# What a model directory must be before anything loads it. JSON and safetensors headers only:
# no weights are read, nothing is unpickled, no code runs, and nothing ever prompts.

NO_CODE = ("decodelab never runs code shipped with a model (trust_remote_code=False); use a "
           "model whose architecture transformers implements")
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX = "model.safetensors.index.json"


def read_json_object(path: Path) -> dict:
    try:
        return config_fields(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path.name} is not readable JSON ({first_line(err)})") from None


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


def shape_problem(model_dir: Path) -> str | None:
    """A model larger than config 'limits', from its config.json alone: transformers would
    allocate all of it before reading a single weight."""
    return size_problem(read_json_object(model_dir / "config.json"), job_limits(), "config.json")


# A block's tensors: transformer.h.3.attn..., model.layers.3..., model.decoder.layers.3...
BLOCK = re.compile(r"(?:^|\.)(?:h|layers|blocks)\.(\d+)\.")


def layers_problem(model_dir: Path, tensors: set[str]) -> str | None:
    """config.json's layer count against the blocks its weights hold: a config that claims more
    would have transformers allocate the missing ones (and fill them with random values)."""
    blocks = {int(m[1]) for name in tensors if (m := BLOCK.search(name))}
    fields = read_json_object(model_dir / "config.json")
    declared = whole(fields, LAYERS, "config.json")
    if not blocks or declared is None or declared == len(blocks) == max(blocks) + 1:
        return None
    key = next(k for k in LAYERS if fields.get(k) is not None)
    return (f"config.json declares {declared} layers ({key}) but its weights hold "
            f"{len(blocks)} blocks (indices {min(blocks)}..{max(blocks)})")


def weights_problem(model_dir: Path) -> str | None:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLES)
        found = f" (found {', '.join(pickled)}, never unpickled)" if pickled else ""
        return (f"has no .safetensors weights{found}; decodelab loads safetensors only "
                "(no pickled checkpoints)")
    tensors = set()
    for path in files:
        try:
            # safe_open checks the header against the file: every tensor's byte size, the
            # offsets back to back, the data ending exactly at the end of the file.
            with safe_open(path, "pt") as f:
                tensors.update(f.keys())
        except (OSError, SafetensorError) as err:
            return f"{path.name} is not a complete safetensors file ({err}{size_note(path)})"
    if (model_dir / INDEX).is_file():
        shards = read_json_object(model_dir / INDEX).get("weight_map")
        if not isinstance(shards, dict):
            return f"{INDEX} has no 'weight_map' object"
        missing = sorted({s for s in map(str, shards.values()) if not (model_dir / s).is_file()})
        if missing:
            return f"{INDEX} names absent weight files: {', '.join(missing)}"
    return layers_problem(model_dir, tensors)


def check_model_dir(model_dir: str | Path, label: str):
    """The transformers config of a Hugging Face directory that `load` can load without running
    its code; else a DecodelabError `label: why` (custom code, no or damaged safetensors, a
    config.json transformers cannot read). Every source and every load goes through here."""
    model_dir = Path(model_dir)
    try:
        why = (layout_problem(model_dir) or code_problem(model_dir) or shape_problem(model_dir)
               or weights_problem(model_dir))
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
