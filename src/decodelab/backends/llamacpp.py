"""A GGUF model in llama.cpp (llama-cpp-python) as the quantized backend.

`Engine` shows the small part of a Hugging Face causal LM that the project's loops use: a
forward pass on token ids that returns the logits of every position, a KV cache with
`get_seq_length` and `crop`, `config.vocab_size` and `device`. So the speculative loop
(`speculative.generate`), the model-alone decoding (`decode.decode`) and the verification
parallelism measurement (`decodelab.studies.speculative.run.parallelism`) run on it unchanged,
with the project's own rejection rule, and a llama.cpp model can be the draft, the target or
both. `decode.new_cache` asks the engine for its cache instead of making a `DynamicCache`.

The engine's context holds one sequence: its cache is the context's KV memory, rolled back by
removing sequence positions (`llama_memory_seq_rm`), and `new_cache` empties it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch

from decodelab.backends import models
from decodelab.backends.gguf_convert import llama_cpp_version
from decodelab.core.errors import DecodelabError


def llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise DecodelabError("llama-cpp-python is not installed; run `make quantized-tools`"
                             ) from None
    return llama_cpp


class Cache:
    """The engine's KV memory as the loops see a cache: its length, and `crop(-n)` to drop the
    last n positions."""

    def __init__(self, llm):
        self.llm = llm

    def get_seq_length(self) -> int:
        return self.llm.n_tokens

    def crop(self, length: int) -> None:
        keep = length if length >= 0 else self.llm.n_tokens + length
        self.llm._ctx.kv_cache_seq_rm(-1, keep, -1)
        self.llm.n_tokens = keep


class Engine:
    """`device` is where llama.cpp computes (cuda: every layer offloaded, which needs a CUDA
    build); the logits always come back to the CPU, which is the engine's torch device."""

    def __init__(self, path: str | Path, n_ctx: int = 0, threads: int | None = None,
                 device: str = "cpu"):
        path = Path(path)
        if not path.is_file():
            raise DecodelabError(f"GGUF file {path} does not exist")
        lib = llama_cpp()
        if device == "cuda" and not lib.llama_supports_gpu_offload():
            raise DecodelabError(f"llama-cpp-python here is a CPU build and cannot run {path} on "
                                 "cuda; build it with CMAKE_ARGS=-DGGML_CUDA=on "
                                 "(scripts/quantized_cuda.sh)")
        threads = threads or os.cpu_count()
        try:  # one thread count for both: llama.cpp takes n_threads_batch for passes of > 1 token
            self.llm = lib.Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False,
                                 n_threads=threads, n_threads_batch=threads,
                                 n_gpu_layers=-1 if device == "cuda" else 0)
        except (ValueError, RuntimeError) as err:
            raise DecodelabError(f"llama.cpp could not load GGUF file {path} ({err})") from None
        self.name_or_path = str(path)
        self.dtype = path.stem  # F16, Q8_0, Q4_0: what require_finite names
        self.compute_device = device
        self.config = SimpleNamespace(vocab_size=self.llm.n_vocab())
        self.device = torch.device("cpu")

    def parameters(self):
        yield torch.empty(0)  # `speculative.device_of` reads the device of the first one

    def weight_bytes(self) -> float:
        """Bytes of the model's tensors as llama.cpp holds them (quantized blocks, scales
        included): what a one-token step reads, the bandwidth floor's numerator."""
        return float(llama_cpp().llama_model_size(self.llm.model))

    def get_output_embeddings(self):
        return SimpleNamespace(out_features=self.config.vocab_size)

    def new_cache(self) -> Cache:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()
        return Cache(self.llm)

    def forward(self, input_ids: torch.Tensor, use_cache: bool = True,
                past_key_values: Cache | None = None, logits_to_keep: int = 0):
        """Logits ([1, T, V], float32) of every position of `input_ids` ([1, T]) after what
        `past_key_values` holds; the last `logits_to_keep` only when it is > 0."""
        if past_key_values is None:
            past_key_values = self.new_cache()
        start = self.llm.n_tokens
        self.llm.eval(input_ids[0].tolist())
        logits = torch.from_numpy(self.llm.scores[start:self.llm.n_tokens].copy())
        return SimpleNamespace(logits=logits[-logits_to_keep:][None])

    __call__ = forward


def build_info() -> dict[str, str]:
    """What the fingerprint records of the llama.cpp build: its version, what llama.cpp says
    it was built with (CPU features; CUDA and its architectures), and the CMake flags where the
    build script states them ($DECODELAB_LLAMA_CMAKE_ARGS)."""
    lib = llama_cpp()
    return {"llama_cpp_python": llama_cpp_version(),
            "llama_cpp_system": lib.llama_print_system_info().decode().strip(),
            "llama_cpp_gpu_offload": bool(lib.llama_supports_gpu_offload()),
            "llama_cpp_cmake_args": os.environ.get("DECODELAB_LLAMA_CMAKE_ARGS", "")}


def backend_label(qtype: str, device: str = "cpu") -> str:
    """The `backend` of verify-cost rows, beside the PyTorch backends in the parallelism table."""
    return f"llama.cpp-{qtype}-{device}"


def load_role(model_dir: str | Path, pair: dict, role: str):
    """A speculative configuration's `role` model: its GGUF (`<role>_gguf`) in llama.cpp where
    `<role>_backend` is llamacpp, else the Hugging Face model in PyTorch."""
    device = pair[f"{role}_device"]
    if pair.get(f"{role}_backend") == "llamacpp":
        if not pair.get(f"{role}_gguf"):
            raise DecodelabError(f"the pair runs its {role} in llama.cpp ({role}_backend: "
                                 f"llamacpp) but no GGUF file was given: pass --{role}-gguf")
        return Engine(pair[f"{role}_gguf"], device=device)
    return models.load(model_dir, device, pair["dtype"], role=role)


def quantized_roles(pair: dict) -> list[str]:
    return [role for role in ("target", "draft") if pair.get(f"{role}_backend") == "llamacpp"]

