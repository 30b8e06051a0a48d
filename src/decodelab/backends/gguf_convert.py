"""A Hugging Face model directory to GGUF with llama.cpp's own converter (its `conversion`
package, kept from the llama-cpp-python source distribution by `make quantized-tools`), then to
the quantized types with llama.cpp's quantize (`llama_model_quantize`).

The converter refuses a BPE tokenizer whose pre-tokenizer it does not recognise, and the `init`
source writes no tokenizer at all. The engine only needs token ids in and logits out, so a
byte-level tokenizer (the `train` source's) is declared as GPT-2's pre-tokenizer, and a model
without one is written in llama.cpp's vocabulary-less mode.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from decodelab.config.settings import QUANT_TYPES
from decodelab.core.errors import DecodelabError

TOOLS = "make quantized-tools"


def llama_cpp_version() -> str:
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        raise DecodelabError(f"llama-cpp-python is not installed; run `{TOOLS}`") from None


def converter_dir() -> Path:
    """Where `make quantized-tools` keeps the sdist's convert_hf_to_gguf.py and conversion/."""
    if "DECODELAB_LLAMA_CONVERTER" in os.environ:
        return Path(os.environ["DECODELAB_LLAMA_CONVERTER"])
    return Path.home() / ".cache" / "decodelab" / f"llama.cpp-converter-{llama_cpp_version()}"


def conversion():
    """llama.cpp's `conversion` package and the `gguf` it was written against (the sdist's
    gguf-py: PyPI's gguf of the same version number lacks what the converter uses), imported
    from `converter_dir()`."""
    where = converter_dir()
    for part in ("conversion", "gguf-py/gguf"):
        if not (where / part / "__init__.py").is_file():
            raise DecodelabError(f"llama.cpp's converter is not in {where} (no {part}/); run "
                                 f"`{TOOLS}` or set DECODELAB_LLAMA_CONVERTER")
    for path in (str(where / "gguf-py"), str(where)):
        if path not in sys.path:
            sys.path.insert(0, path)
    return importlib.import_module("conversion")


def byte_level(model_dir: Path) -> bool:
    """Whether tokenizer.json pre-tokenizes as GPT-2 does (byte-level, no prefix space)."""
    pre = json.loads((model_dir / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
    return pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space", False)


def no_vocab(writer, vocab_size: int) -> None:
    """llama.cpp's vocabulary-less mode: `vocab_size` dummy tokens, ids in and logits out."""
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(vocab_size)


def with_own_vocab(cls):
    """`cls` (a converter class) with the vocabulary handling above."""

    class OwnVocab(cls):
        model_arch = cls.model_arch  # the converter checks that each subclass declares it

        def set_vocab(self):
            if (self.dir_model / "tokenizer.json").is_file():
                super().set_vocab()
            else:
                no_vocab(self.gguf_writer, self.hparams["vocab_size"])

        def get_vocab_base_pre(self, tokenizer) -> str:
            if byte_level(self.dir_model):
                return "gpt-2"
            return super().get_vocab_base_pre(tokenizer)

    return OwnVocab


def converter_class(model_dir: Path):
    """The converter class for `model_dir`, and the hyperparameters to give it."""
    conv = conversion()
    hparams = conv.ModelBase.load_hparams(model_dir, False)
    if "n_positions" in hparams:  # the GPT-2 converter reads n_ctx, which transformers 5 drops
        hparams.setdefault("n_ctx", hparams["n_positions"])
    arch = conv.get_model_architecture(hparams, conv.ModelType.TEXT)
    try:
        return with_own_vocab(conv.get_model_class(arch)), hparams
    except NotImplementedError:
        raise DecodelabError(f"{model_dir}: llama.cpp's converter does not support architecture "
                             f"{arch!r}") from None


def convert_f16(model_dir: Path, out: Path) -> Path:
    """`model_dir` to an F16 GGUF at `out`, written under a temporary name first."""
    import torch

    cls, hparams = converter_class(model_dir)
    import gguf  # the converter's, on the path from here on
    partial = out.with_name(f".{out.name}.partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.inference_mode():
            cls(model_dir, gguf.LlamaFileType.MOSTLY_F16, partial, hparams=hparams,
                model_name=model_dir.name).write()
    except NotImplementedError as err:  # a tokenizer or tensor the converter does not know
        partial.unlink(missing_ok=True)
        raise DecodelabError(f"{model_dir}: llama.cpp's converter refused it ({err})") from None
    partial.replace(out)
    return out


def quantize(f16: Path, out: Path, qtype: str) -> Path:
    """llama.cpp's quantize of an F16 GGUF to `qtype` (Q8_0, Q4_0)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    partial = out.with_name(f".{out.name}.partial")
    if llama_cpp.llama_model_quantize(str(f16).encode(), str(partial).encode(), params) != 0:
        partial.unlink(missing_ok=True)
        raise DecodelabError(f"llama.cpp could not quantize {f16} to {qtype}")
    partial.replace(out)
    return out


def gguf_path(out_dir: str | Path, qtype: str) -> Path:
    """<out_dir>/<type>.gguf; the DAG's out_dir is results/gguf/<model>/ (beside, not inside,
    prepare_model's directory output)."""
    return Path(out_dir) / f"{qtype}.gguf"


def convert(model_dir: str | Path, qtype: str, out_dir: str | Path) -> Path:
    """The `qtype` GGUF of `model_dir` in `out_dir` (its F16 first, made when missing)."""
    if qtype not in QUANT_TYPES:
        raise DecodelabError(f"quantization type {qtype!r} is not one of {list(QUANT_TYPES)}")
    f16 = gguf_path(out_dir, "F16")
    if not f16.is_file():
        convert_f16(Path(model_dir), f16)
    return f16 if qtype == "F16" else quantize(f16, gguf_path(out_dir, qtype), qtype)
