"""The opening of every measuring verb and the arguments they share: fail early on a missing
backend, check that the machine is quiet, set torch's threads, type the job's settings."""

from __future__ import annotations

import argparse
import json
import os

from decodelab.config.settings import PREFLIGHT_ENV
from decodelab.core.errors import DecodelabError
from decodelab.core.verbs import typed


def open_job(args, *backends: str, settings: type | None = None):
    """The opening of every measuring verb: fail early on a missing backend (on a host of
    several GPUs, take one of them), check that the machine is quiet (a verb that times
    something has --machine), set torch's CPU threads (0: torch's default), and return the
    job's settings (--spec) typed as `settings` (config.py); without one (a model's config
    entry, whose keys depend on its source) the JSON as given."""
    # a bad spec fails before torch loads
    if settings is not None:
        spec = typed(settings, args.spec)
    else:
        spec = json.loads(args.spec) if args.spec else None
    import torch

    from decodelab.backends.devices import backend_problem, claim_gpu
    from decodelab.backends.machine import preflight
    from decodelab.config.settings import Machine

    for backend in backends:
        if problem := backend_problem(backend):
            raise DecodelabError(f"backend {backend!r} is not available on this host: {problem}")
    if "cuda" in backends:
        claim_gpu()
    if "machine" in args:
        preflight(typed(Machine, args.machine))
    if args.threads:
        torch.set_num_threads(args.threads)
    return spec


def recorded_pair(args) -> dict:
    """--pair-spec, checked as a typed Pair, as the raw file records it (columns pair_*): its
    keys as given, in their order, with the GGUF files of its llama.cpp roles."""
    from decodelab.config.settings import Pair

    typed(Pair, args.pair_spec, "--pair-spec")
    return json.loads(args.pair_spec) | {
        f"{role}_gguf": path for role, path in
        (("target", args.target_gguf), ("draft", args.draft_gguf)) if path}


def add_timing(p: argparse.ArgumentParser) -> None:
    """What every timed process takes: its pre-flight, its repeat, its threads, its output."""
    add_machine(p)
    p.add_argument("--repeat", type=int, required=True)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--out", required=True)


def add_machine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--machine", default=os.environ.get(PREFLIGHT_ENV, "{}"),
                   help=f"config 'machine' (the pre-flight check), as JSON; default: "
                        f"${PREFLIGHT_ENV} (which the workflow sets from its config), else warn")


def add_gguf(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target-gguf", help="the target's GGUF, where it runs in llama.cpp")
    p.add_argument("--draft-gguf", help="the draft's GGUF, where it runs in llama.cpp")
