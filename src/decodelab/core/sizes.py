"""A model's size from its shape alone, before anything is allocated: an `init` preset, a `train`
spec or a config.json's fields give layers, width, vocabulary and positions, and so about how
many parameters building it would allocate. Above config 'limits.max_params' it is refused, and
above 'limits.max_layers': every block costs about 40 kB of Python objects however narrow (a
100,000-layer GPT-2 of width 8 holds 77M parameters and takes 4 GB).

No torch here: the DAG checks every model it can (init, train, local) while it is built, and
`models.check_model_dir` checks a config.json again before any model is built from it. Jobs
read the limit from the environment Snakemake hands them (`export_limit`), as the machine's
pre-flight settings (decodelab.config.settings.export_preflight): a limit changes nothing measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from decodelab.core.shapes import PRESETS, VOCAB

LIMITS_ENV = "DECODELAB_LIMITS"
DEFAULT_LIMITS = {"max_params": 4_000_000_000, "max_layers": 512}

LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
WIDTH = ("hidden_size", "n_embd", "d_model")
FFN = ("intermediate_size", "ffn_dim", "n_inner")
POSITIONS = ("n_positions", "max_position_embeddings")
VOCABULARY = ("vocab_size",)
NO_TABLE = {"llama", "bloom"}  # rotary positions and ALiBi: no learned position table


def whole(fields: Mapping, keys: tuple[str, ...], where: str) -> int | None:
    """The first of `keys` that `fields` sets, a whole number >= 0; else None."""
    for key in keys:
        value = fields.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}: {key!r} is not a whole number >= 0")
        return value
    return None


def estimated_params(fields: Mapping, where: str) -> int:
    """Embeddings, a learned position table, an untied output head and the blocks (attention
    4 d^2, an MLP of two matrices, three when gated) of a Hugging Face config's fields; norms
    and biases left out. Llama alone unties its head by default."""
    layers = whole(fields, LAYERS, where) or 0
    width = whole(fields, WIDTH, where) or 0
    vocab = whole(fields, VOCABULARY, where) or 0
    ffn = whole(fields, FFN, where) or 4 * width
    family = fields.get("model_type")
    positions = 0 if family in NO_TABLE else whole(fields, POSITIONS, where) or 0
    mlp = (3 if family == "llama" else 2) * width * ffn
    head = 0 if fields.get("tie_word_embeddings", family != "llama") else vocab * width
    return (vocab + positions) * width + head + layers * (4 * width * width + mlp)


def spec_fields(spec: Mapping) -> dict | None:
    """The config fields of an `init` or `train` model spec; None for sources whose shape is
    known only from their config.json (local, hf)."""
    if spec.get("source") == "init" and spec.get("preset") in PRESETS:
        family, shape = PRESETS[spec["preset"]]
        return {"model_type": family, "vocab_size": VOCAB[family], **shape}
    if spec.get("source") == "train":
        arch = spec.get("arch", "gpt2")
        width = spec.get("n_embd")
        ffn = 8 * width // 3 if arch == "llama" and isinstance(width, int) else None
        return {"model_type": arch, "n_layer": spec.get("n_layer"), "n_embd": width,
                "vocab_size": spec.get("vocab_size"), "n_positions": spec.get("n_positions"),
                "intermediate_size": ffn, "tie_word_embeddings": True}
    return None


MAX_CONFIG_BYTES = 1 << 20


def config_fields(config_json: Path) -> dict:
    """A config.json as a dict, read only when it is of a config's size (ValueError else)."""
    if config_json.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{config_json.name} is larger than 1 MiB; a config.json is a few kB")
    fields = json.loads(config_json.read_text(encoding="utf-8"))
    if not isinstance(fields, dict):
        raise ValueError(f"{config_json.name} is not a JSON object")
    return fields


def size_problem(fields: Mapping, limits: Mapping[str, int], what: str) -> str | None:
    """The refusal of a model of `fields` above `limits`, naming the key that raises it; None
    when it fits."""
    try:
        params = estimated_params(fields, what)
        layers = whole(fields, LAYERS, what) or 0
    except ValueError as err:
        return str(err)
    if layers > limits["max_layers"]:
        return (f"{what}: {layers} layers, more than config 'limits.max_layers' "
                f"({limits['max_layers']}); raise it to build a model this deep")
    if params > limits["max_params"]:
        return (f"{what}: about {params:.3g} parameters ({layers} layers of width "
                f"{whole(fields, WIDTH, what)}, vocabulary {whole(fields, VOCABULARY, what)}), "
                f"more than config 'limits.max_params' ({limits['max_params']:.3g}); raise it to "
                "build a model this large")
    return None


def job_limits() -> dict[str, int]:
    """The limits a job was given (`export_limits`), else the defaults."""
    try:
        given = json.loads(os.environ.get(LIMITS_ENV, "{}"))
    except ValueError:
        given = {}
    return {key: int(given.get(key, default)) for key, default in DEFAULT_LIMITS.items()}


def export_limits(limits: Mapping[str, int]) -> None:
    os.environ[LIMITS_ENV] = json.dumps(dict(limits), sort_keys=True)
