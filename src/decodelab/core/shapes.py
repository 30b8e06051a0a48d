"""Model shapes as plain data, no torch or transformers: the `init` presets and the learned
position tables, which the DAG checks against the config's longest sequence before any job.

The DAG checks every model whose positions it can read (init presets, train shapes, a local
config.json); `prepare-model --positions-needed` checks again once the model is built, before it
is put in place: the first moment an `hf` model's config is known.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from decodelab.core.errors import DecodelabError

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
    "llama-tiny": ("llama", dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=768, vocab_size=8192)),
}
# Vocabulary sizes of the published tokenizers, used when a preset does not override them.
VOCAB = {"gpt2": 50257, "opt": 50272, "bloom": 250880, "llama": 32000}
# The position tables of transformers' config classes, which no preset overrides (BLOOM's ALiBi
# and Llama's RoPE have none); tests/test_models.py checks them against transformers.
POSITIONS = {"gpt2": 1024, "opt": 2048, "bloom": None, "llama": None}
# Families whose positions are computed (RoPE): their max_position_embeddings is no table.
ROTARY = {"llama"}


def check_preset(preset: str) -> str:
    if preset not in PRESETS:
        raise DecodelabError(f"unknown init preset {preset!r}; known: {', '.join(PRESETS)}")
    return preset


def preset_positions(preset: str) -> int | None:
    """Rows of an `init` preset's learned position table; None without one."""
    return POSITIONS[PRESETS[check_preset(preset)][0]]


def declared_layers(spec: dict) -> int | None:
    """Layers of a model spec that says them (`train`'s n_layer, an `init` preset's); None
    otherwise (a hub or local model says them only once fetched)."""
    if spec.get("source") == "init" and spec.get("preset") in PRESETS:
        shape = PRESETS[spec["preset"]][1]
        return shape.get("n_layer", shape.get("num_hidden_layers"))
    return spec.get("n_layer") if spec.get("source") == "train" else None


def max_positions(config) -> int | None:
    """Rows of a learned position table; None for position schemes without a limit (ALiBi,
    RoPE)."""
    if getattr(config, "model_type", None) in ROTARY:
        return None
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return None


def declared_positions(config_json: str | Path) -> int | None:
    """The position table a config.json declares, read as plain JSON (no model code runs)."""
    path = Path(config_json)
    try:
        return max_positions(SimpleNamespace(**json.loads(path.read_text())))
    except (OSError, ValueError, TypeError) as err:
        raise DecodelabError(f"{path}: not a readable Hugging Face config.json ({err})") from None


def position_overrun(name: str, positions: int | None, needed: int, why: str) -> str | None:
    """The refusal of a model whose position table cannot hold `needed` tokens, else None."""
    if positions is None or needed <= positions:
        return None
    return (f"model {name!r} has {positions} positions, fewer than the {needed} tokens of {why}; "
            "lower the budgets or prompt lengths, or use a model with more positions")
