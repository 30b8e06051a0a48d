"""The graph engine: a model's forward passes over a transformers `StaticCache`, each input shape
captured once in a CUDA graph and replayed after that, as gpt-fast decodes.

`Engine` shows the loops the same small part of a causal LM that `llamacpp.Engine` does: a forward
pass on token ids, a KV cache with `get_seq_length` and `crop`, `config`, `device`. So the
speculative loop (the draft's one-token steps, the target's K+1-token verification), the
autoregressive baseline and `decode.decode` run on it unchanged; `decode.new_cache` asks the
engine for its cache. `fused` records a loop of passes and the device work between them as one
graph: a proposal's K draft passes and draws (`speculative.run_draws`) cost the host one replay.

Every pass's graph of an engine shares one memory pool (`capture.Recorder`), so a pass's outputs
are valid only until the engine's next pass: a graph captured earlier may replay over a later
one's outputs. The loops use what a pass returns before the next, or copy it. Graphs of the
device work between passes (`between`: the pipelined loop's verdict) have a pool of their own.

The cache's write position lives on the device (one tensor that every layer's `update` reads and
the last advances in place, `decodelab.engines.cuda.static_cache`), so one captured graph serves
every position. The causal mask is built inside the graph from the same position and hides every
slot at or past it, so a rollback only moves the position back: the stale keys beyond it are
never read and are overwritten by the next write. The loops' length stays on the host
(`Slots.length`), so neither they nor a rollback wait for the device.

Without capture (`capture=False`, any device) the engine runs the same static-cache passes
eagerly: what the CPU tests compare with the eager engine, token for token.

`pipelined` is the graph engine whose speculative loop (`decodelab.engines.pipelined`) the host
runs one iteration ahead of the device: each verdict, rollback and next input stays on the
device, so the device never waits for the host's turn between iterations.

`compiled` is the graph engine over `torch.compile`'s kernels (Inductor, one compilation per
input shape, then captured like the rest): a graph still pays each small kernel's launch and tail
on the GPU, and fusing a layer's elementwise work into few kernels is how gpt-fast nears the
bandwidth floor. `autotuned` compiles with Inductor's autotuning too (`COMPILE_OPTIONS`): minutes
per shape, once. `fused` is gpt-fast's recipe with decodelab's kernels
(`decodelab.engines.cuda.fused`): the model's one-row products on a GEMV kernel in the Linear
layout, its attention in one kernel per layer, and the rest compiled under coordinate-descent
tuning (in place: the model given is changed).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from decodelab.core.errors import DecodelabError
from decodelab.engines.cuda import fused, static_cache
from decodelab.engines.cuda.capture import Recorder
from decodelab.engines.decode import cache_kwarg
from decodelab.engines.pipelined import decide, room
from decodelab.engines.pipelined import generate as pipelined_loop

ENGINES = ("eager", "graph", "pipelined", "compiled", "autotuned", "fused")
# Inductor's options per compiled engine. `autotuned` benchmarks Triton templates against cuBLAS
# for each matmul (max_autotune) and tunes each kernel's launch configuration (coordinate descent,
# which gpt-fast turns on; it sets no max_autotune). Inductor's own CUDA graphs stay off: the
# engine captures them.
COMPILE_OPTIONS = {"compiled": {}, "autotuned": {"max_autotune": True,
                                                 "coordinate_descent_tuning": True},
                   "fused": fused.COMPILE}


# A compiled engine compiles `passes` once per input shape, and every engine's compilations are
# of that one code object: a speculative run's target alone has ten shapes (its prefill, one
# token, K + 1 for K = 1..8), past dynamo's default limit of 8 per code object, beyond which it
# runs the rest uncompiled with a log line. The limits are raised, and reaching one is an error.
RECOMPILES = 128


def allow_recompiles() -> None:
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILES)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILES)
    config.fail_on_recompile_limit_hit = True


class Slots:
    """The engine's static cache as the loops see a cache: its length, and `crop(-n)`."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        keep = length if length >= 0 else self.length + length
        self.engine.move_back(self.length - keep)
        self.length = keep


class Engine:
    """`model` over one static cache of `max_len` tokens (default: its positions; without
    `paired`, transformers' own StaticCache), replaying a CUDA graph per (input length, logits
    kept) once `capture` has recorded it."""

    def __init__(self, model, capture: bool = True, max_len: int | None = None,
                 compile: dict | None = None, pipelined: bool = False,
                 fuse_verdict: bool = False, paired: bool = True):
        if capture and model.device.type != "cuda":
            raise DecodelabError(f"CUDA graphs need a CUDA device; {model.name_or_path!r} is on "
                                 f"{model.device.type}")
        self.model = model
        self.capture = capture
        self.max_len = max_len or model.config.get_text_config().max_position_embeddings
        self.cache = static_cache.new(model.config, self.max_len, paired)
        self.recorder = Recorder(capture)
        self.between = Recorder(capture)  # device work between passes, in a pool of its own
        self.slots: Slots | None = None
        self.config = model.config
        self.device = model.device
        self.dtype = model.dtype
        self.name_or_path = model.name_or_path
        self.cache_kwarg = cache_kwarg(model)  # outside the compiled code: it inspects
        self.compiled = compile is not None
        self.speculative_loop = pipelined_loop if pipelined else None
        # `fuse_verdict`: the pipelined loop's verdict compiled (Inductor), some thirty small
        # kernels of the sampled rule fused into a few, each a launch the loop no longer pays
        # (scripts/gpu_pair.py --parts verdict times both). The config's `pipelined` engine has it.
        fuse = pipelined and fuse_verdict
        if self.compiled or fuse:  # one compilation per shape; the verdict's per K and rule
            allow_recompiles()
        self.decide = torch.compile(decide, fullgraph=True, dynamic=False) if fuse else decide
        self.run = (torch.compile(self.passes, dynamic=False, options=compile) if self.compiled
                    else self.passes)
        self.buffers: dict = {}  # a loop's own, which its graphs read in place (`pipelined`)

    def parameters(self):
        return self.model.parameters()

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    @property
    def generation_config(self):
        return self.model.generation_config

    def generate(self, *args, assistant_model=None, **kwargs):
        """Hugging Face's own generation (its loop, eager) on the wrapped models."""
        if isinstance(assistant_model, Engine):
            assistant_model = assistant_model.model
        return self.model.generate(*args, assistant_model=assistant_model, **kwargs)

    def counters(self) -> list[torch.Tensor]:
        return static_cache.positions(self.cache)

    def move_back(self, n: int) -> None:
        static_cache.move_back(self.cache, n)

    def new_cache(self) -> Slots:
        """The one static cache, emptied: its buffers' addresses are in the captured graphs.
        Its position is zeroed on the device rather than moved back by the host's length, which
        a loop that failed midway (the pipelined one keeps its length on the device) left stale."""
        if self.cache.is_initialized:
            torch._foreach_zero_(self.counters())
        self.slots = Slots(self)
        return self.slots

    def passes(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=keep,
                          **{self.cache_kwarg: self.cache}).logits

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """The float logits ([V]) of the last of `ids` ([T]): a raw pass for code that `fused`
        records, which keeps the cache's length itself."""
        return self.run(ids[None], 1)[0, -1].float()

    def fused(self, key, fn, inputs: tuple, advance: int, cache: Slots):
        """fn(*inputs) after what `cache` holds, where fn writes `advance` tokens to the cache
        (through `run` or `step`) and may do device work of its own between passes: one graph
        per `key` (which must name every shape and constant fn depends on), so that a loop of
        passes and draws costs the host one replay. Its outputs are the graph's buffers, valid
        until the engine's next pass: the graphs share one memory pool, so a graph captured
        earlier may replay over a later one's outputs."""
        if cache is not self.slots:
            raise DecodelabError("a graph engine serves one sequence at a time: use the cache "
                                 "of its latest new_cache()")
        self.check_room(cache.length + advance)
        out = self.replay(key, fn, inputs, advance)
        cache.length += advance
        return out

    def check_room(self, tokens: int) -> None:
        if tokens > self.max_len:
            raise DecodelabError(f"{self.name_or_path!r}: {tokens} tokens do not fit its static "
                                 f"cache of {self.max_len}")

    def replay(self, key, fn, inputs: tuple, advance: int, held: bool = False):
        """`fused` without the cache's length, for a loop that keeps it on the device
        (`decodelab.engines.pipelined`) and has checked the room beforehand; `held` as
        `Recorder.replay`'s. The warm-ups before capture have their writes undone; compiled code
        recompiles once the cache has been initialized by a first pass, and every compilation
        must be done before capture (it syncs, which capture forbids)."""
        return self.recorder.replay(key, fn, inputs, warm_ups=1 + 2 * self.compiled,
                                    undo=lambda: self.move_back(advance), held=held)

    def forward(self, input_ids: torch.Tensor, use_cache: bool = True,
                past_key_values: Slots | None = None, logits_to_keep: int = 0):
        """Logits ([1, T, V]) of the last `logits_to_keep` positions of `input_ids` ([1, T]; 0:
        all) after what `past_key_values` holds: a graph's buffer, valid until the engine's next
        pass (`fused`)."""
        if past_key_values is None:
            return self.model(input_ids=input_ids, use_cache=False, logits_to_keep=logits_to_keep)
        n = input_ids.shape[1]
        logits = self.fused(*self.pass_of(n, logits_to_keep), (input_ids,), n, past_key_values)
        return SimpleNamespace(logits=logits)

    def pass_of(self, n: int, keep: int):
        """(key, fn) of a forward pass over [1, n] ids keeping `keep` logits: one graph each."""
        return (n, keep), lambda ids: self.run(ids, keep)

    __call__ = forward


def require_cuda(model, name: str, key: str) -> None:
    if model.device.type != "cuda":
        raise DecodelabError(f"config '{key}': engine {name!r} needs a CUDA device "
                             f"(this model is on {model.device.type}); use 'eager'")


def engine(model, name: str, key: str, max_len: int | None = None, k: int = 0):
    """`model` as config `key` (one of ENGINES) runs it: itself, or a graph
    engine whose cache holds `max_len` tokens (default: the model's positions). A pipelined
    engine's holds K + 1 more, for its loop's overshooting last proposal at draft length `k`;
    the others' no more than they need, as each pass attends over every slot."""
    if name == "eager":
        return model
    if name not in ENGINES:
        raise DecodelabError(f"config '{key}': engine {name!r} is not one of "
                             f"{', '.join(ENGINES)}")
    require_cuda(model, name, key)
    pipelined = name == "pipelined"
    if name == "fused":
        fused.prepare(model)
    if pipelined and max_len is not None:
        max_len = room(max_len, k)
    return Engine(model, max_len=max_len, compile=COMPILE_OPTIONS.get(name), pipelined=pipelined,
                  fuse_verdict=pipelined)
