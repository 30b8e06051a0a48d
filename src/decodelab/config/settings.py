"""Typed settings: the validated config (schema checked, defaults filled: the Snakefile) as frozen
dataclasses, built once by `Settings.from_config`, and the checks the schema cannot express.

Each measuring rule passes its job's settings as one JSON argument built here (`job_spec`); the
raw files are stamped and hashed with it, so its keys and values follow the config's exactly.
The checks raise DecodelabError naming the config key; the .smk files turn it into WorkflowError.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

from decodelab.core import tables
from decodelab.core.errors import DecodelabError
from decodelab.core.hosts import MANIFEST, RESERVED
from decodelab.core.kv_layout import min_budget
from decodelab.core.names import NAME_RULE, check_name, is_valid_name
from decodelab.core.shapes import (
    PRESETS,
    declared_layers,
    declared_positions,
    position_overrun,
    preset_positions,
)
from decodelab.core.sizes import DEFAULT_LIMITS, config_fields, size_problem, spec_fields


def frozen(value):
    """YAML lists as tuples, so that a frozen dataclass holds nothing mutable (JSON writes both
    as lists)."""
    return tuple(frozen(v) for v in value) if isinstance(value, list) else value


def check_keys(cls, section: Mapping) -> None:
    """An unknown key, or a missing one that `cls` has no default for, is a DecodelabError
    naming it (the caller says where the section came from)."""
    known = {f.name: f for f in fields(cls)}
    unknown = [key for key in section if key not in known]
    if unknown:
        raise DecodelabError(f"unknown key {unknown[0]!r} (known: {', '.join(known)})")
    missing = [name for name, f in known.items() if name not in section
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise DecodelabError(f"missing key {missing[0]!r}")


def build(cls, section: Mapping):
    """A dataclass from a config section whose keys are its fields."""
    check_keys(cls, section)
    return cls(**{key: frozen(value) for key, value in section.items()})


class Spec:
    """A typed section or job spec: built from its validated dict, written back as that dict."""

    @classmethod
    def from_spec(cls, spec: Mapping):
        return build(cls, spec)

    def job_spec(self) -> dict:
        return asdict(self)


def without_unset(spec, *optional: str) -> dict:
    """`spec` as a dict, without the optional keys left unset: raw files written before those
    keys existed keep their hash."""
    return {k: v for k, v in asdict(spec).items() if v is not None or k not in optional}


def build_nested(cls, spec: Mapping, key: str):
    """`build` of the section `key` of `spec`, its errors naming the section."""
    try:
        return build(cls, spec[key])
    except DecodelabError as err:
        raise DecodelabError(f"{key}: {err}") from None


@dataclass(frozen=True)
class Confidence(Spec):
    """The percentile-bootstrap interval of every statistics table (config 'stats')."""

    confidence: float = 0.95
    bootstrap_resamples: int = 2000
    seed: int = 0


@dataclass(frozen=True)
class Stability(Spec):
    """Config 'stats.stability': when a configuration's timings are too noisy for a claim
    (`decodelab.analysis.stability`). pyperf warns at a standard deviation of 10% of the mean; the
    default's millisecond decodes on 2 cores spread more than that on a quiet machine (module
    docstring of `decodelab.analysis.stability`), so the spread limits are wider and the background
    share does most of the work."""

    cv_between: float = 0.25       # of the per-process medians, judged by its lower bound:
    # one-sided, from 2-3 processes (decodelab.analysis.stability)
    cv_between_confidence: float = 0.9
    cv_within: float = 0.35        # of the inner repeats inside one process, pooled over the
    cv_within_confidence: float = 0.9  # processes, judged by its lower bound too
    max_over_median: float = 2.0   # the largest raw value over the median
    background: float = 0.15       # CPU share taken by other work (or stolen by a hypervisor)
    noisy_share: float = 0.2       # a job is noisy above this share of unstable configurations


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: temperature 0 is greedy (argmax); top_k 0 and top_p 1 keep
    every token."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_spec(cls, spec: Mapping) -> Sampling:
        return cls(spec["temperature"], spec["top_k"], spec["top_p"])

    def in_mode(self, mode: str) -> Sampling:
        """The speculative study's modes: `greedy` takes the argmax, `sampled` these settings."""
        return GREEDY if mode == "greedy" else self


GREEDY = Sampling()


@dataclass(frozen=True)
class SweepJob:
    """One sweep process's settings (`decodelab sweep --spec`). Its raw file is hashed with
    `job_spec()`: `sdp_backends` and `engine` appear only when set, so older raw files keep
    their hash."""

    budgets: tuple[int, ...]
    prompt_lengths: tuple[int, ...]
    dtype: str | tuple[str, ...]  # one, or several measured one after another in the process
    inner_repeats: int
    warmup: int
    seed: int
    sdp_backends: tuple[str, ...] | None = None
    engine: str | None = None

    @property
    def dtypes(self) -> tuple[str, ...]:
        return (self.dtype,) if isinstance(self.dtype, str) else self.dtype

    @classmethod
    def from_spec(cls, spec: Mapping) -> SweepJob:
        return build(cls, spec)

    def job_spec(self) -> dict:
        return without_unset(self, "sdp_backends", "engine")


@dataclass(frozen=True)
class Sweep:
    """Config 'sweep': the decode-latency sweep and the KV-cache ablation."""

    models: tuple[str, ...]
    budgets: tuple[int, ...]
    prompt_lengths: tuple[int, ...]
    dtype: str | tuple[str, ...]
    repeats: int
    inner_repeats: int
    warmup: int
    seed: int  # the config's top-level seed
    backends: tuple[str, ...] | None = None
    ablation_models: tuple[str, ...] | None = None
    sdp_backends: tuple[str, ...] | None = None
    engine: str | None = None  # eager, or a static-cache CUDA-graph engine (graphs.ENGINES)

    @classmethod
    def from_config(cls, section: Mapping, seed: int) -> Sweep:
        return build(cls, {**section, "seed": seed})

    @property
    def ablation(self) -> tuple[str, ...]:
        return self.ablation_models or self.models

    def section(self) -> dict:
        """The config section as given."""
        return {k: v for k, v in asdict(self).items() if k != "seed" and v is not None}

    def job(self) -> SweepJob:
        """One sweep process's settings."""
        return SweepJob(**{f.name: getattr(self, f.name) for f in fields(SweepJob)})

    def job_spec(self) -> dict:
        return self.job().job_spec()


@dataclass(frozen=True)
class Pair:
    """One draft/target configuration of config 'speculative.pairs'."""

    target: str
    draft: str
    target_device: str
    draft_device: str
    dtype: str = "float32"
    # A role in llama.cpp runs that model's GGUF of this quantization type
    # (decodelab.studies.quantized.run).
    target_backend: str = "pytorch"
    draft_backend: str = "pytorch"
    target_quant: str | None = None
    draft_quant: str | None = None
    engine: str = "eager"  # or graph, pipelined, compiled, autotuned, fused: CUDA graphs (graphs)

    @property
    def devices(self) -> set[str]:
        return {self.target_device, self.draft_device}

    def quant(self, role: str) -> str | None:
        """The GGUF type `role` runs in llama.cpp, None for a PyTorch role."""
        return getattr(self, f"{role}_quant") if self.backend(role) == "llamacpp" else None

    def backend(self, role: str) -> str:
        return getattr(self, f"{role}_backend")

    @classmethod
    def from_spec(cls, spec: Mapping) -> Pair:
        return build(cls, spec)

    def job_spec(self) -> dict:
        """The configuration; the backend keys only where set, so that PyTorch pairs keep the
        hash of the raw files written before them."""
        spec = asdict(self)
        for role in ("target", "draft"):
            if self.backend(role) == "pytorch" and getattr(self, f"{role}_quant") is None:
                del spec[f"{role}_backend"], spec[f"{role}_quant"]
        if self.engine == "eager":
            del spec["engine"]
        return spec


@dataclass(frozen=True)
class Parallelism:
    """Config 'speculative.parallelism': the target's forward time on K+1 tokens against 1."""

    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    context: int = 128
    inner: int = 5


@dataclass(frozen=True)
class ParallelismJob(Spec):
    """One parallelism process's settings (`decodelab parallelism --spec`, and `verify-cost`'s,
    whose dtype is the GGUF type)."""

    ks: tuple[int, ...]
    context: int
    inner: int
    dtype: str
    seed: int
    sdp_backends: tuple[str, ...] | None = None

    def job_spec(self) -> dict:
        return without_unset(self, "sdp_backends")


@dataclass(frozen=True)
class SpeculativeJob(Spec):
    """One speculative process's settings (`decodelab speculative --spec`, and `llama-peer`'s):
    the study's grid, its sampled mode and the seed."""

    ks: tuple[int, ...]
    modes: tuple[str, ...]
    temperature: float
    top_k: int
    top_p: float
    prompts: int
    prompt_len: int
    budget: int
    hf_assisted: bool
    seed: int
    sdp_backends: tuple[str, ...] | None = None

    def job_spec(self) -> dict:
        return without_unset(self, "sdp_backends")

    @property
    def sampling(self) -> Sampling:
        """The `sampled` mode's settings."""
        return Sampling(self.temperature, self.top_k, self.top_p)


# Passes per parallelism row: one pass of a small target lasts less than the scheduler's 10 ms
# tick, so a single preemption doubled a row; the mean of a few does not.
PASSES = 4


def parallelism_span(inner: int) -> int:
    """How far past its context a parallelism process's passes start (warm-up rows included):
    each pass from a context length new to passes of its size
    (decodelab.studies.speculative.run.parallelism)."""
    return (inner + 1) * PASSES


@dataclass(frozen=True)
class Speculative:
    """Config 'speculative': the study's grid, its configurations and its sampled mode."""

    pairs: Mapping[str, Pair]
    ks: tuple[int, ...]
    modes: tuple[str, ...]
    sampling: Sampling  # the `sampled` mode's
    prompts: int
    prompt_len: int
    budget: int
    repeats: int
    hf_assisted: bool
    parallelism: Parallelism
    seed: int  # the config's top-level seed
    sdp_backends: tuple[str, ...] | None = None  # of the speculative and parallelism processes

    @classmethod
    def from_config(cls, section: Mapping, seed: int) -> Speculative:
        rest = {k: v for k, v in section.items()
                if k not in ("pairs", "parallelism", "temperature", "top_k", "top_p")}
        return cls(pairs={name: Pair.from_spec(p) for name, p in section["pairs"].items()},
                   sampling=Sampling.from_spec(section),
                   parallelism=build(Parallelism, section["parallelism"]),
                   seed=seed, **{k: frozen(v) for k, v in rest.items()})

    def grid(self) -> dict:
        return {"ks": self.ks, "modes": self.modes, **asdict(self.sampling),
                "prompts": self.prompts, "prompt_len": self.prompt_len, "budget": self.budget,
                "hf_assisted": self.hf_assisted}

    def job(self) -> SpeculativeJob:
        """One speculative process's settings."""
        return SpeculativeJob(**self.grid(), seed=self.seed, sdp_backends=self.sdp_backends)

    def job_spec(self) -> dict:
        return self.job().job_spec()

    def parallelism_job(self, dtype: str) -> ParallelismJob:
        """One parallelism process's settings, in its target's dtype."""
        return ParallelismJob(**asdict(self.parallelism), dtype=dtype, seed=self.seed,
                              sdp_backends=self.sdp_backends)

    def parallelism_spec(self, dtype: str) -> dict:
        return self.parallelism_job(dtype).job_spec()

    def section(self) -> dict:
        """The config section as given."""
        return {**self.grid(), "pairs": {n: p.job_spec() for n, p in self.pairs.items()},
                "repeats": self.repeats, "parallelism": asdict(self.parallelism),
                **({"sdp_backends": self.sdp_backends} if self.sdp_backends else {})}


@dataclass(frozen=True)
class Quantized:
    """Config 'quantized': the models converted to GGUF for llama.cpp
    (decodelab.studies.quantized.run),
    each type's verify cost (time on K+1 tokens over 1, with 'speculative.parallelism') on each
    device; the speculative pairs may name more models and types."""

    models: tuple[str, ...] = ()
    types: tuple[str, ...] = ("F16", "Q8_0", "Q4_0")
    devices: tuple[str, ...] = ("cpu",)
    # pairs of 'speculative.pairs' that llama.cpp's own speculative example also runs
    # (decodelab.backends.llamapeer): both roles in llama.cpp, on one device
    peer: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: Mapping) -> Quantized:
        return build(cls, spec)


@dataclass(frozen=True)
class LongVerification:
    """Config 'long.verification': the verification levels
    (decodelab.studies.verification.run.run_long) on one
    long-context pair: the target, verifying on its full cache, and `drafter` drafting K tokens
    through `policy`'s view of `kv_budget` tokens, on `documents` held-out documents cut to
    `length` tokens. The sample sizes are its own (the levels' other settings: 'verification')."""

    length: int
    policy: str = "retrieval"
    kv_budget: int = 32
    drafter: str = "self"
    k: int = 4
    documents: int = 4
    tokens: int = 4096  # level 3: tokens per sample at full size
    power_tokens: int = 1024  # level 3: tokens per sample and seed of the power run
    seeds: int = 5  # power run seeds (levels 2 and 3)

    @classmethod
    def from_spec(cls, spec: Mapping) -> LongVerification:
        return build(cls, spec)


@dataclass(frozen=True)
class Long:
    """Config 'long': the long-context study (decodelab.studies.long.run), context length x KV
    budget x policy x drafter x mode x K over held-out documents, one process per repeat."""

    target: str
    lengths: tuple[int, ...]
    kv_budgets: tuple[int, ...]
    seed: int  # the config's top-level seed
    drafters: tuple[str, ...] = ("self",)
    device: str = "cpu"
    dtype: str = "float32"
    policies: tuple[str, ...] = ("full", "sink_window", "retrieval", "random_chunks")
    ks: tuple[int, ...] = (4,)
    modes: tuple[str, ...] = ("greedy", "sampled")
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    documents: int = 4
    budget: int = 32  # new tokens per run
    repeats: int = 2
    verification: LongVerification | None = None  # config 'long.verification'; None: not run

    @classmethod
    def from_config(cls, section: Mapping, seed: int) -> Long:
        check = section.get("verification")
        long = build(cls, {**{k: v for k, v in section.items() if k != "verification"},
                           "seed": seed})
        return replace(long, verification=LongVerification.from_spec(check)) if check else long

    @property
    def longest(self) -> int:
        """The longest sequence a run builds: context, new tokens and one proposal."""
        return max(self.lengths) + self.budget + max(self.ks)

    def job(self) -> LongJob:
        """One long-context process's settings: all but the target's name and the repeats."""
        return LongJob(**{f.name: getattr(self, f.name) for f in fields(LongJob)
                          if f.name != "document_tokens"})

    def job_spec(self) -> dict:
        """The study's raw files hash this: the verification is not in it."""
        return self.job().job_spec()

    def verification_spec(self) -> dict:
        """The long-context verification job's settings (`LongVerificationJob`)."""
        return {"check": asdict(self.verification), "device": self.device, "dtype": self.dtype,
                "seed": self.seed}


@dataclass(frozen=True)
class LongJob:
    """One long-context process's settings (`decodelab long --spec`). `document_tokens`
    (scripts/long_cuda.py): draw documents of at least this many tokens instead of the longest
    length, so that calls of one length each draw the same documents; in the raw file's hash
    only when set."""

    lengths: tuple[int, ...]
    kv_budgets: tuple[int, ...]
    seed: int
    drafters: tuple[str, ...]
    device: str
    dtype: str
    policies: tuple[str, ...]
    ks: tuple[int, ...]
    modes: tuple[str, ...]
    temperature: float
    top_k: int
    top_p: float
    documents: int
    budget: int
    document_tokens: int | None = None

    @property
    def sampling(self) -> Sampling:
        """The `sampled` mode's settings."""
        return Sampling(self.temperature, self.top_k, self.top_p)

    @classmethod
    def from_spec(cls, spec: Mapping) -> LongJob:
        return build(cls, spec)

    def job_spec(self) -> dict:
        return {k: v for k, v in asdict(self).items()
                if v is not None or k != "document_tokens"}


@dataclass(frozen=True)
class LongVerificationJob:
    """One long-context verification job: config 'long.verification' on 'long.device' in
    'long.dtype', seeded by the config's seed."""

    check: LongVerification
    device: str
    dtype: str
    seed: int

    @classmethod
    def from_spec(cls, spec: Mapping) -> LongVerificationJob:
        return cls(LongVerification.from_spec(spec["check"]), spec["device"], spec["dtype"],
                   spec["seed"])


@dataclass(frozen=True)
class Batched:
    """Config 'batched': batched speculation without a shared schedule
    (decodelab.studies.batched.run):
    batch size x context x mode over held-out prompts, `rounds` prompt sets in each of
    `repeats` processes."""

    target: str
    draft: str  # the separate draft of synchronized speculation
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    seed: int  # the config's top-level seed
    device: str = "cpu"
    dtype: str = "float32"
    budget: int = 16  # new tokens per request
    k: int = 3  # the synchronized K; the scheduler's K* lies in 1..2K
    policy: str = "sink_window"  # the self-speculative draft's sparse view
    kv_budget: int = 32
    refresh_layer: int | None = None  # the refreshed mode's refresh layer; None: no such mode
    rounds: int = 2
    repeats: int = 2

    @classmethod
    def from_config(cls, section: Mapping, seed: int) -> Batched:
        return build(cls, {**section, "seed": seed})

    @property
    def longest(self) -> int:
        """The longest sequence a row builds: context, new tokens and the widest proposal."""
        return max(self.contexts) + self.budget + 2 * self.k + 1

    def job(self) -> BatchedJob:
        """One batched process's settings: all but the models' names and the repeats."""
        return BatchedJob(**{f.name: getattr(self, f.name) for f in fields(BatchedJob)})

    def job_spec(self) -> dict:
        return self.job().job_spec()


@dataclass(frozen=True)
class BatchedJob(Spec):
    """One batched process's settings (`decodelab batched --spec`)."""

    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    seed: int
    device: str
    dtype: str
    budget: int
    k: int
    policy: str
    kv_budget: int
    refresh_layer: int | None
    rounds: int


@dataclass(frozen=True)
class ExactLevel:
    random_pairs: int
    vocab_sizes: tuple[int, ...]
    concentrations: tuple[float, ...]
    real_positions: int
    block_vocab: int
    block_ks: tuple[int, ...]


@dataclass(frozen=True)
class MonteCarloLevel:
    draws: int
    vocab: int
    block_draws: int


@dataclass(frozen=True)
class RealLevel:
    tokens: int
    budget: int
    top: int
    prompts: int
    power_tokens: int
    greedy_prompts: int


@dataclass(frozen=True)
class Verification:
    """Config 'verification': the three levels of the distribution-equivalence check."""

    pairs: tuple[str, ...]
    k: int
    alpha: float
    seeds: int
    exact: ExactLevel
    monte_carlo: MonteCarloLevel
    real: RealLevel
    seed: int  # the config's top-level seed

    @classmethod
    def from_config(cls, section: Mapping, seed: int) -> Verification:
        return cls(pairs=frozen(section["pairs"]), k=section["k"], alpha=section["alpha"],
                   seeds=section["seeds"], exact=build_nested(ExactLevel, section, "exact"),
                   monte_carlo=build_nested(MonteCarloLevel, section, "monte_carlo"),
                   real=build_nested(RealLevel, section, "real"), seed=seed)

    @classmethod
    def from_spec(cls, spec: Mapping) -> Verification:
        """A verification job's settings (`job_spec`): every level, no pairs."""
        check_keys(cls, {**spec, "pairs": ()})
        return cls.from_config({**spec, "pairs": ()}, spec["seed"])

    def job_spec(self) -> dict:
        """Every verification job's settings: all but the pairs."""
        return {k: v for k, v in asdict(self).items() if k != "pairs"}

    def section(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "seed"}


@dataclass(frozen=True)
class Changepoints:
    model: str
    penalty: float
    min_size: int
    noise_floor: float


@dataclass(frozen=True)
class Onsets:
    factor: float
    baseline: int
    run: int


@dataclass(frozen=True)
class SpikeRule(Spec):
    """The spike rule's settings (`decodelab regimes --spec`, `selection --regimes`)."""

    window: int
    threshold: float
    consistency: float
    alpha: float


REGIME_RULE_KEYS = tuple(f.name for f in fields(SpikeRule))


@dataclass(frozen=True)
class Regimes:
    """Config 'regimes': the spike rule, change points and step-up onsets."""

    window: int
    threshold: float
    consistency: float
    alpha: float
    changepoints: Changepoints
    onsets: Onsets

    @classmethod
    def from_config(cls, section: Mapping) -> Regimes:
        rule = {k: section[k] for k in REGIME_RULE_KEYS}
        return cls(**rule, changepoints=build_nested(Changepoints, section, "changepoints"),
                   onsets=build_nested(Onsets, section, "onsets"))

    @classmethod
    def from_spec(cls, spec: Mapping) -> Regimes:
        """`decodelab regime-depth --spec` (`job_spec`)."""
        check_keys(cls, spec)
        return cls.from_config(spec)

    @property
    def rule(self) -> SpikeRule:
        return SpikeRule(**{k: getattr(self, k) for k in REGIME_RULE_KEYS})

    def rule_spec(self) -> dict:
        """The spike rule's settings only: a change-point setting does not rerun the rule."""
        return self.rule.job_spec()

    def job_spec(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    """Config 'limits': the largest model decodelab builds or loads (decodelab.core.sizes)."""

    max_params: int = DEFAULT_LIMITS["max_params"]
    max_layers: int = DEFAULT_LIMITS["max_layers"]


PREFLIGHT = ("off", "warn", "wait", "refuse")


@dataclass(frozen=True)
class Machine:
    """Config 'machine': what a measuring job does when the machine is busy as it starts
    (`decodelab.backends.machine.preflight`). `max_load`: the 1-minute load average beyond the job
    itself, per core."""

    preflight: str = "warn"
    max_load: float = 0.5
    wait_s: float = 120.0

    def __post_init__(self):
        if self.preflight not in PREFLIGHT:
            raise DecodelabError(f"config 'machine.preflight': {self.preflight!r} is not one of "
                                 f"{', '.join(PREFLIGHT)}")
        for key in ("max_load", "wait_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise DecodelabError(f"config 'machine.{key}': {value!r} is not a number >= 0")

    @classmethod
    def from_spec(cls, spec: Mapping) -> Machine:
        unknown = sorted(set(spec) - {f.name for f in fields(cls)})
        if unknown:
            raise DecodelabError(f"config 'machine': unknown key {unknown[0]!r}")
        if spec.get("preflight") is False:  # YAML 1.1 reads a bare `off` as false
            spec = {**spec, "preflight": "off"}
        return build(cls, spec)

    def job_spec(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Settings:
    """The whole validated config."""

    host: str | None
    hosts: tuple[str, ...]
    backends: tuple[str, ...]
    strict: bool
    seed: int
    assume_available: tuple[str, ...]
    cluster: str | None
    gpu_model: str | None
    containers: Mapping[str, str]
    models: Mapping[str, Mapping]  # each source has its own keys; passed on as given
    sweep: Sweep
    speculative: Speculative
    verification: Verification
    regimes: Regimes
    stats: Confidence
    stability: Stability
    machine: Machine
    limits: Limits = Limits()
    quantized: Quantized = Quantized()
    long: Long | None = None  # the stage runs only where config 'long' is given
    batched: Batched | None = None  # likewise config 'batched'

    @classmethod
    def from_config(cls, config: Mapping) -> Settings:
        seed = config["seed"]
        stats = {k: v for k, v in config["stats"].items() if k != "stability"}
        return cls(
            host=config["host"], hosts=frozen(config["hosts"]), backends=frozen(config["backends"]),
            strict=config["strict"], seed=seed, assume_available=frozen(config["assume_available"]),
            cluster=config["cluster"], gpu_model=config["gpu_model"],
            containers=dict(config["containers"]), models=dict(config["models"]),
            sweep=Sweep.from_config(config["sweep"], seed),
            speculative=Speculative.from_config(config["speculative"], seed),
            verification=Verification.from_config(config["verification"], seed),
            regimes=Regimes.from_config(config["regimes"]),
            stats=Confidence.from_spec(stats),
            stability=Stability.from_spec(config["stats"]["stability"]),
            machine=Machine.from_spec(config["machine"]),
            limits=build(Limits, config.get("limits", {})),
            quantized=Quantized.from_spec(config.get("quantized", {})),
            long=Long.from_config(config["long"], seed) if config.get("long") else None,
            batched=Batched.from_config(config["batched"], seed) if config.get("batched")
            else None)

    def paper_settings(self, host: str) -> dict:
        """The settings the paper states. The sweep's keys sit at the top level, where a
        `sweep.backends` takes the place of `backends`."""
        return {
            "host": host,
            "backends": self.backends,
            "shuffle_seed": self.seed,
            **self.sweep.section(),
            "models": {name: self.models[name] for name in self.sweep.models},
            "regimes": self.regimes.job_spec(),
            "stats": {**self.stats.job_spec(), "stability": self.stability.job_spec()},
            "speculative": self.speculative.section(),
            "verification": self.verification.section(),
            **({"long_verification": asdict(self.long.verification)}
               if self.long is not None and self.long.verification is not None else {}),
        }

    def position_needs(self) -> dict[str, tuple[int, str]]:
        """Model -> (tokens, why): the longest sequence any of its jobs builds."""
        needs: dict[str, tuple[int, str]] = {}

        def need(model, tokens, why):
            if tokens > needs.get(model, (0, ""))[0]:
                needs[model] = (tokens, why)

        sweep, spec = self.sweep, self.speculative
        budget, prompt = max(sweep.budgets), max(sweep.prompt_lengths)
        for name in sweep.models:
            need(name, budget + prompt,
                 f"config 'sweep' (budget {budget} + prompt length {prompt})")
        k, par = max(spec.ks), spec.parallelism
        spec_tokens = spec.prompt_len + spec.budget + k
        spec_why = (f"config 'speculative' (prompt_len {spec.prompt_len} + budget "
                    f"{spec.budget} + K {k})")
        par_k = max(par.ks)
        par_tokens = par.context + parallelism_span(par.inner) + par_k + 1
        par_why = (f"config 'speculative.parallelism' (context {par.context} + "
                   f"{parallelism_span(par.inner)} for {par.inner} inner repeats + K {par_k} + 1)")
        for pair in spec.pairs.values():
            need(pair.draft, spec_tokens, spec_why)
            need(pair.target, spec_tokens, spec_why)
            need(pair.target, par_tokens, par_why)  # only targets are timed
        for name in self.quantized.models:
            need(name, par_tokens, par_why)
        if self.long is not None:
            long = self.long
            for name in {long.target, *long.drafters} - {"self"}:
                need(name, long.longest, f"config 'long' (longest length {max(long.lengths)} "
                     f"+ budget {long.budget} + K {max(long.ks)})")
            if (v := long.verification) is not None:
                budget = self.verification.real.budget
                for name in {long.target, v.drafter} - {"self"}:
                    need(name, v.length + budget + v.k,
                         f"config 'long.verification' (length {v.length} + "
                         f"verification.real.budget {budget} + K {v.k})")
        if self.batched is not None:
            b = self.batched
            for name in (b.target, b.draft):
                need(name, b.longest, f"config 'batched' (longest context {max(b.contexts)} + "
                     f"budget {b.budget} + 2 K + 1 = {b.longest})")
        return needs


# --- checks the schema cannot express, in the order the DAG runs them ---------------------------

def this_host(configured: str | None, hostname: str) -> str:
    """Config 'host', else the machine's hostname: its first label, other characters as '-',
    less any leading ones that cannot start a name."""
    if configured is not None:
        return check_name(configured, "config 'host':")
    label = next((part for part in hostname.split(".") if part), "")
    name = re.sub(r"[^A-Za-z0-9_-]", "-", label)[:64]
    while name and not is_valid_name(name):
        name = name[1:]
    if not name:
        raise DecodelabError(f"this machine's hostname {hostname!r} gives no usable host name; "
                             f"set config 'host' ({NAME_RULE})")
    return name


def check_model_names(settings: Settings) -> None:
    sweep, models = settings.sweep, settings.models
    named = [("sweep.models", m) for m in sweep.models]
    named += [(f"models.{n}.teacher", s["teacher"]) for n, s in models.items() if "teacher" in s]
    named += [(f"speculative.pairs.{n}.{role}", getattr(p, role))
              for n, p in settings.speculative.pairs.items() for role in ("target", "draft")]
    for key, name in named:
        if name not in models:
            raise DecodelabError(f"config '{key}': no model named {name!r} in 'models'")
    for name in sweep.ablation_models or ():
        if name not in sweep.models:
            raise DecodelabError(f"config 'sweep.ablation_models': {name!r} is not in sweep.models")


@dataclass(frozen=True)
class DraftObjective:
    """A `train` drafter's sparse-cache objective (budgetdraft.py): `budget_robust` is
    BudgetDraft's (full-cache + sparse_weight x sparse-cache KL to the teacher, a budget drawn
    per step with budget_weights); `no_prefix` the control that never sees the prefix."""
    objective: str
    continuation: int
    budgets: tuple[int, ...] = ()
    budget_weights: tuple[float, ...] = ()
    sparse_weight: float = 0.5
    sparse_policy: str = "retrieval"


DRAFT_OBJECTIVES = ("budget_robust", "no_prefix")
DRAFT_KEYS = tuple(f.name for f in fields(DraftObjective))


def draft_objective(spec: Mapping, where: str = "train model spec") -> DraftObjective | None:
    """The objective of a `train` spec (None: next-token CE / distillation), checked across
    keys; errors name `where` and the key."""
    given = {key: spec[key] for key in DRAFT_KEYS if key in spec}
    if "objective" not in given:
        if given:
            raise DecodelabError(f"{where}: key {next(iter(given))!r} needs an 'objective'")
        return None

    def bad(key: str, why: str) -> DecodelabError:
        return DecodelabError(f"{where}: key {key!r} {why}")

    name = given["objective"]
    if name not in DRAFT_OBJECTIVES:
        raise bad("objective", f"must be one of {', '.join(DRAFT_OBJECTIVES)}, not {name!r}")
    for key, why in (("teacher", "the teacher's full-cache predictions are its targets"),
                     ("arch", "the sparse cache needs rotary positions (arch: llama)")):
        if key not in spec or (key == "arch" and spec[key] != "llama"):
            raise bad("objective", f"{name!r} needs {key!r}: {why}")
    if "distill" in spec:
        raise bad("distill", f"does not apply to objective {name!r} (its loss is all KL)")
    if "continuation" not in given:
        raise bad("continuation", f"is missing (objective {name!r}: the tokens the loss sees "
                  "after the prefix; BudgetDraft's 256)")
    prefix = spec.get("seq_len", 0) - given["continuation"]
    if not 1 <= given["continuation"] or prefix < 1:
        raise bad("continuation", f"must be >= 1 and leave a prefix in seq_len "
                  f"({spec.get('seq_len')}), not {given['continuation']}")
    objective = build(DraftObjective, given)
    if name == "no_prefix":
        extra = sorted(set(given) - {"objective", "continuation"})
        if extra:
            raise bad(extra[0], "does not apply to objective 'no_prefix' (it sees no prefix)")
        return objective
    if not objective.budgets or not all(type(b) is int for b in objective.budgets):
        raise bad("budgets", "must be a list of token counts (objective 'budget_robust': the "
                  f"sparse budgets drawn per step), not {given.get('budgets')!r}")
    if objective.sparse_weight < 0:
        raise bad("sparse_weight", f"must be >= 0, not {objective.sparse_weight}")
    if max(objective.budgets) >= prefix:
        raise bad("budgets", f"must each be below the prefix (seq_len - continuation = "
                  f"{prefix}), where a budget keeps the full cache; got {max(objective.budgets)}")
    weights = objective.budget_weights or (1.0,) * len(objective.budgets)
    numbers = all(type(w) in (int, float) for w in weights)
    if len(weights) != len(objective.budgets) or not numbers or min(weights) <= 0:
        raise bad("budget_weights", f"must give one positive weight per budget "
                  f"({len(objective.budgets)}), not {list(weights)}")
    return replace(objective, budget_weights=weights)


# The families here that llama.cpp's converter has a class for (it has none for OPT), and the
# GGUF types the pipeline makes.
CONVERTIBLE = ("gpt2", "bloom")
QUANT_TYPES = ("F16", "Q8_0", "Q4_0")


def model_family(spec: Mapping) -> str | None:
    """A model's architecture family as far as the DAG can know it: None for `hf` and
    `package` (its conversion job names the architecture if the converter refuses it)."""
    if spec["source"] == "init":
        return PRESETS[spec["preset"]][0]
    if spec["source"] == "train":
        return spec.get("arch", "gpt2")
    if spec["source"] == "local":
        config_json = Path(spec["path"]).expanduser() / "config.json"
        return json.loads(config_json.read_text()).get("model_type")
    return None


def unconvertible(name: str, spec: Mapping) -> str | None:
    """Why llama.cpp's converter cannot take a model, None when it can (or cannot be told)."""
    family = model_family(spec)
    if family is None or family in CONVERTIBLE:
        return None
    return (f"model {name}: llama.cpp's converter has no class for the {family} architecture "
            f"(it converts {', '.join(CONVERTIBLE)} here)")


def quantized_plan(settings: Settings, backends: Iterable[str]) -> dict:
    """What the quantized study runs here: `verify` (model, type, device) for the verify cost,
    `convert` (model, type) for every GGUF that it and the llama.cpp pair roles need, and
    `skipped` (model, reason) for the models of config 'quantized.models' that cannot be
    converted."""
    q = settings.quantized
    skipped = [(m, why) for m in q.models if (why := unconvertible(m, settings.models[m]))]
    models = [m for m in q.models if m not in dict(skipped)]
    verify = [(m, t, d) for m in models for t in q.types for d in q.devices if d in backends]
    roles = {(getattr(p, role), p.quant(role)) for p in settings.speculative.pairs.values()
             for role in ("target", "draft") if p.quant(role)}
    return {"verify": verify, "skipped": skipped,
            "convert": sorted({(m, t) for m, t, _ in verify} | roles)}


def check_peer(name: str, pair: Pair | None) -> None:
    """A pair for llama.cpp's own speculative example: both roles GGUF files on one device."""
    key = "config 'quantized.peer'"
    if pair is None:
        raise DecodelabError(f"{key}: no pair named {name!r} in 'speculative.pairs'")
    if not (pair.quant("target") and pair.quant("draft")):
        raise DecodelabError(f"{key}: pair {name!r} needs target_backend and draft_backend "
                             "llamacpp (llama.cpp's speculative example runs two GGUF files)")
    if pair.target_device != pair.draft_device:
        raise DecodelabError(f"{key}: pair {name!r} runs its target on {pair.target_device} and "
                             f"its draft on {pair.draft_device}; the example runs both on one")


def check_quantized(settings: Settings) -> None:
    """A llama.cpp role names its GGUF type and runs on the CPU or CUDA; a PyTorch one names
    none; config 'quantized' names known models."""
    for name in settings.quantized.models:
        if name not in settings.models:
            raise DecodelabError(f"config 'quantized.models': no model named {name!r} in 'models'")
    for name in settings.quantized.peer:
        check_peer(name, settings.speculative.pairs.get(name))
    for name, pair in settings.speculative.pairs.items():
        for role in ("target", "draft"):
            key = f"speculative.pairs.{name}.{role}"
            quant, device = getattr(pair, f"{role}_quant"), getattr(pair, f"{role}_device")
            if pair.backend(role) == "llamacpp" and quant is None:
                raise DecodelabError(f"config '{key}_quant': {role}_backend llamacpp needs the "
                                     "GGUF type to run (F16, Q8_0 or Q4_0)")
            if pair.backend(role) == "pytorch" and quant is not None:
                raise DecodelabError(f"config '{key}_quant': {quant!r} is set but the {role} "
                                     f"runs in PyTorch; set {role}_backend: llamacpp")
            if quant and (why := unconvertible(getattr(pair, role), settings.models[
                    getattr(pair, role)])):
                raise DecodelabError(f"config '{key}_backend': {why}")
            if pair.backend(role) == "llamacpp" and device == "mps":
                raise DecodelabError(f"config '{key}_device': llama.cpp roles run on cpu or "
                                     "cuda here (Metal is llama.cpp's own build on a Mac)")


def check_long(settings: Settings) -> None:
    """Config 'long' names a rotary-position target (its KV view keeps true positions, which a
    learned position table cannot take past its length) and drafters among the models."""
    long = settings.long
    if long is None:
        return
    for key, name in [("long.target", long.target),
                      *[("long.drafters", d) for d in long.drafters if d != "self"]]:
        if name not in settings.models:
            raise DecodelabError(f"config '{key}': no model named {name!r} in 'models'")
        family = model_family(settings.models[name])
        if family not in (None, "llama"):
            raise DecodelabError(f"config '{key}': model {name!r} is a {family} model; the "
                                 "long-context study needs rotary positions (a train model "
                                 "with arch: llama, or the init preset llama-tiny)")
    longest = max(long.lengths)
    if max(long.kv_budgets) >= longest:
        raise DecodelabError(f"config 'long.kv_budgets': {max(long.kv_budgets)} tokens is no "
                             f"sparse view of the longest context ({longest}, 'long.lengths'); "
                             "make it smaller")
    if long.verification is not None:
        check_long_verification(long)


def check_long_verification(long: Long) -> None:
    """A drafter of the study's, and a budget its policy can keep that is a sparse view of the
    context (a view of the whole context drafts exactly the target)."""
    v = long.verification
    if v.drafter != "self" and v.drafter not in long.drafters:
        raise DecodelabError(f"config 'long.verification.drafter': {v.drafter!r} is not one of "
                             f"'long.drafters' ({', '.join(long.drafters)})")
    if v.policy == "full":
        return
    if v.kv_budget < min_budget(v.policy):
        raise DecodelabError(f"config 'long.verification.kv_budget': policy {v.policy!r} keeps "
                             f"at least {min_budget(v.policy)} tokens, got {v.kv_budget}")
    if v.kv_budget >= v.length:
        raise DecodelabError(f"config 'long.verification.kv_budget': {v.kv_budget} tokens is no "
                             f"sparse view of a {v.length}-token context "
                             "('long.verification.length'); make it smaller")


def check_batched(settings: Settings) -> None:
    """Config 'batched' names its target and draft among the models, and budgets a sparse view
    smaller than its shortest prompt (half the shortest context)."""
    b = settings.batched
    if b is None:
        return
    for key, name in (("batched.target", b.target), ("batched.draft", b.draft)):
        if name not in settings.models:
            raise DecodelabError(f"config '{key}': no model named {name!r} in 'models'")
    if b.policy == "retrieval":
        raise DecodelabError("config 'batched.policy': retrieval selects per layer and head, "
                             "the batch draws one view per row for every layer; for views "
                             "chosen by attention, set 'batched.refresh_layer'")
    least = min_budget(b.policy)
    if b.kv_budget < least:
        raise DecodelabError(f"config 'batched.kv_budget': policy {b.policy!r} keeps at least "
                             f"{least} tokens, got {b.kv_budget}")
    if b.refresh_layer is not None:
        check_refresh_layer(b, declared_layers(settings.models[b.target]))
    if b.kv_budget >= min(b.contexts) // 2:
        raise DecodelabError(f"config 'batched.kv_budget': {b.kv_budget} tokens is no sparse "
                             f"view of the shortest prompt ({min(b.contexts) // 2} tokens, half "
                             f"the shortest of 'batched.contexts'); make it smaller")


def check_refresh_layer(b: Batched, layers: int | None) -> None:
    """A layer the target has (when its spec says how many), and a budget of whole chunks."""
    if layers is not None and b.refresh_layer >= layers:
        raise DecodelabError(f"config 'batched.refresh_layer': layer {b.refresh_layer} of "
                             f"{b.target!r}, a model of {layers} layers (0..{layers - 1})")
    if b.kv_budget < min_budget("retrieval"):
        raise DecodelabError(f"config 'batched.kv_budget': the refresh layer keeps chunks, at "
                             f"least {min_budget('retrieval')} tokens, got {b.kv_budget}")


def check_engines(settings: Settings) -> None:
    """The graph engines capture CUDA graphs: every device they run on must be CUDA."""
    runs = [(f"speculative.pairs.{name}.engine", pair.engine, pair.devices)
            for name, pair in settings.speculative.pairs.items()]
    runs.append(("sweep.engine", settings.sweep.engine,
                 set(settings.sweep.backends or settings.backends)))
    for key, engine, devices in runs:
        if engine not in (None, "eager") and devices != {"cuda"}:
            raise DecodelabError(f"config '{key}': engine {engine!r} needs CUDA devices only "
                                 f"(here: {', '.join(sorted(devices))}); use 'eager'")


def check_verification_pairs(settings: Settings) -> None:
    pairs = settings.speculative.pairs
    for name in settings.verification.pairs:
        if name not in pairs:
            raise DecodelabError(f"config 'verification.pairs': no pair named {name!r} in "
                                 f"'speculative.pairs' (known: {', '.join(pairs)})")


def case_twin(names: Iterable[str]) -> tuple[str, str] | None:
    """Two of `names` equal but for case (one directory on macOS's file system), or None."""
    seen: dict[str, str] = {}
    for name in names:
        if name.casefold() in seen:
            return seen[name.casefold()], name
        seen[name.casefold()] = name
    return None


def check_names_differ_by_more_than_case(settings: Settings) -> None:
    named = {"models": settings.models, "speculative.pairs": settings.speculative.pairs}
    for key, names in named.items():
        twins = case_twin(names)
        if twins:
            raise DecodelabError(
                f"config '{key}': {twins[0]!r} and {twins[1]!r} differ only by case, and name "
                "the same directory on a case-insensitive file system (macOS); rename one")


# Names no host may take: results/<x> entries that are not a host's (`make report` writes
# results/report.html). This host may not take either the entries of logs/ and benchmarks/ that
# rules outside any host write, which logs/<host>/ and benchmarks/<host>/ would meet.
NOT_RESULTS = (*RESERVED, "report.html")
NOT_HOSTS = (*NOT_RESULTS, "prepare_model", "merge_hosts.log", "paper.log")


def check_hosts(host: str, imported: Iterable[str], results: Path = Path("results")) -> None:
    """This host writes only results/<host>/: never a reserved folder, never an imported host."""
    imported = list(imported)
    if host.casefold() in {name.casefold() for name in NOT_HOSTS}:
        raise DecodelabError(f"host name {host!r} is reserved ({', '.join(NOT_HOSTS)} are "
                             "entries of results/, logs/ or benchmarks/ that are not a host's, in "
                             "any case); set config 'host' to another name")
    twins = case_twin([host, *imported])
    if twins:
        raise DecodelabError(f"config 'hosts': {twins[1]!r} names the same results/ directory as "
                             f"{twins[0]!r} (this host or another listed one; case does not tell "
                             "names apart on macOS)")
    if (results / host / MANIFEST).is_file():
        raise DecodelabError(f"host name {host!r}: results/{host}/ holds results imported from "
                             f"another host (results/{host}/{MANIFEST}), which this run must not "
                             "overwrite; set config 'host' to another name")
    for other in imported:
        if other.casefold() in {name.casefold() for name in NOT_RESULTS}:
            raise DecodelabError(f"config 'hosts': {other!r} is a reserved name "
                                 f"({', '.join(NOT_RESULTS)}, in any case), not a host's results")
        missing = [f"results/{other}/stats/{t}.csv" for t in tables.required()
                   if not (results / other / "stats" / f"{t}.csv").is_file()]
        if missing:
            raise DecodelabError(f"config 'hosts' lists {other!r} but {', '.join(missing)} is "
                                 f"missing; import it first: decodelab import --from <dir or "
                                 f"tarball> --host {other}")


def check_cluster_backends(settings: Settings) -> None:
    if settings.cluster == "slurm" and "mps" in settings.backends:
        raise DecodelabError(
            "config 'backends' lists 'mps', but the slurm profile (config 'cluster: slurm') runs "
            "jobs on cluster nodes and no SLURM cluster has Apple MPS: run the MPS rules on the "
            "Mac itself and pass backends='[cpu,cuda]' here (docs/hosts-and-clusters.md)")


def plan_backends(settings: Settings, available: Callable[[str], bool],
                  why_unavailable: Callable[[str], str]) -> tuple[list[str], list[str]]:
    """(planned, skipped): a backend is planned when present here, assumed by config, or on a
    cluster's nodes; a skipped one is an error under `strict`."""
    planned = [b for b in settings.backends
               if available(b) or b in settings.assume_available or settings.cluster == "slurm"]
    skipped = [b for b in settings.backends if b not in planned]
    if skipped and settings.strict:
        raise DecodelabError(f"config 'backends' lists {skipped[0]!r}, which is not available on "
                             f"this host ({why_unavailable(skipped[0])}); remove it or set "
                             "strict: false")
    if not planned:
        raise DecodelabError("none of the backends in config 'backends' is available on this host")
    return planned, skipped


def sweep_backends(settings: Settings, planned: list[str], host: str) -> list[str]:
    """The planned backends the sweep runs on (config 'sweep.backends', default all)."""
    backends = [b for b in settings.sweep.backends or planned if b in planned]
    if not backends:
        raise DecodelabError(f"none of config 'sweep.backends' "
                             f"({', '.join(settings.sweep.backends)}) is available on this host "
                             f"({host})")
    return backends


def known_positions(name: str, spec: Mapping) -> int | None:
    """A model's learned positions as far as the DAG can know them: None for `hf` and `package`
    (their job checks once downloaded) and for position schemes without a table (ALiBi)."""
    if spec["source"] == "init":
        if spec["preset"] not in PRESETS:
            raise DecodelabError(f"config 'models.{name}.preset': unknown preset "
                                 f"{spec['preset']!r}; known: {', '.join(PRESETS)}")
        return preset_positions(spec["preset"])
    if spec["source"] == "train":
        return spec["n_positions"]
    if spec["source"] == "local":
        config_json = Path(spec["path"]).expanduser() / "config.json"
        if not config_json.is_file():
            raise DecodelabError(f"config 'models.{name}.path': {spec['path']!r} has no "
                                 "config.json (expected a directory in Hugging Face format)")
        try:
            return declared_positions(config_json)
        except DecodelabError as err:
            raise DecodelabError(f"config 'models.{name}.path': {err}") from None
    return None


def model_fields(name: str, spec: Mapping) -> dict | None:
    """The config fields the DAG can know of a model: its spec's (init, train), its
    config.json's (local); None for `hf` and `package` (their job checks once downloaded: a
    `package` job reads the GGUF header before it dequantizes anything)."""
    if spec["source"] == "package":
        wheel = spec.get("wheel")
        if wheel and not Path(wheel).expanduser().is_file():
            raise DecodelabError(f"config 'models.{name}.wheel': no file at {wheel!r}; give the "
                                 f"path of {spec['package']} {spec['version']}'s .whl, or drop "
                                 "'wheel' to download it from the package registry")
        return None
    if spec["source"] != "local":
        return spec_fields(spec)
    try:
        return config_fields(Path(spec["path"]).expanduser() / "config.json")
    except (OSError, ValueError) as err:
        why = (str(err).splitlines() or [err.__class__.__name__])[0][:100]
        raise DecodelabError(f"config 'models.{name}.path': its config.json is not readable "
                             f"({why})") from None


def check_model_sizes(settings: Settings) -> None:
    """Every model whose shape the DAG knows fits config 'limits', before any job allocates
    it."""
    for name, spec in settings.models.items():
        fields = model_fields(name, spec)
        problem = fields and size_problem(fields, asdict(settings.limits),
                                          f"config 'models.{name}'")
        if problem:
            raise DecodelabError(problem)


def check_positions(settings: Settings, needs: Mapping[str, tuple[int, str]]) -> None:
    """Fail before any job when a sequence would overrun a learned position table."""
    for name, spec in settings.models.items():
        positions = known_positions(name, spec)
        if name in needs:
            problem = position_overrun(name, positions, *needs[name])
            if problem:
                raise DecodelabError(problem)


def check_changepoints(settings: Settings) -> None:
    cp = settings.regimes.changepoints
    if cp.model == "linear" and cp.min_size < 3:
        raise DecodelabError(
            "config 'regimes.changepoints.min_size': model 'linear' needs segments of at least 3"
            f" budgets (a line through 2 points has no residual), got {cp.min_size}")


def check_local_images(settings: Settings, planned: list[str]) -> None:
    """Under --sdm apptainer, an image given as a file must exist before any job starts."""
    for backend in sorted({"cpu"} | ({"cuda"} & set(planned))):
        image = settings.containers[backend]
        if "://" not in image and not Path(image).exists():
            raise DecodelabError(f"config 'containers.{backend}': image {image!r} does not exist; "
                                 "build it (envs/README.md) or run without --sdm apptainer")


SCHEMA = Path("workflow/schemas/config.schema.yaml")


def load_settings(path: str | Path, schema: str | Path = SCHEMA) -> Settings:
    """A config file's settings outside Snakemake: validated, its defaults filled in as the
    Snakefile's `validate` fills them."""
    import yaml

    from decodelab.config.check import schema_problem, with_defaults
    from decodelab.core.yamlsafe import file_problem

    if problem := file_problem(path):
        raise DecodelabError(problem)
    config = yaml.safe_load(Path(path).read_text())
    problem = schema_problem(config, schema)
    if problem:
        raise DecodelabError(f"{path}: {problem}")
    return Settings.from_config(with_defaults(config, yaml.safe_load(Path(schema).read_text())))


def bench_settings(path: str | Path, pair: str, ks: list[int] | None = None,
                   prompts: int | None = None, budget: int | None = None
                   ) -> tuple[Pair, Speculative]:
    """`decodelab bench`'s configuration and study: config `speculative` of the file at `path`,
    greedy with HF assisted generation beside it, with K, prompts and budget as given."""
    study = load_settings(path).speculative
    if pair not in study.pairs:
        raise DecodelabError(f"{path}: no pair named {pair!r} in 'speculative.pairs' "
                             f"(known: {', '.join(study.pairs)})")
    return study.pairs[pair], replace(study, modes=("greedy",), hf_assisted=True,
                                      ks=tuple(ks or study.ks), prompts=prompts or study.prompts,
                                      budget=budget or study.budget)


PREFLIGHT_ENV = "DECODELAB_MACHINE"


def export_preflight(settings: Settings) -> None:
    """Every timing job's pre-flight settings (decodelab.backends.machine.preflight) in the
    environment the jobs inherit, not a rule param: they change nothing that is measured, so
    changing them reruns no job."""
    os.environ[PREFLIGHT_ENV] = json.dumps(settings.machine.job_spec(), sort_keys=True)
