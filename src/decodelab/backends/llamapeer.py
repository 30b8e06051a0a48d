"""llama.cpp's own speculative decoding on the quantized study's GGUF pair: the peer.

`llama-speculative` (llama.cpp's speculative example: one draft sequence, K tokens drafted per
target batch, llama.cpp's own acceptance rule) and `llama-completion` (llama.cpp's own
autoregressive decoding of the target alone) are built from the llama.cpp source that
llama-cpp-python vendors (scripts/llama_peer_build.sh, run by `make quantized-peer`). Each run
is one process per prompt x mode (x K); this module writes their command lines, reads what they
print and makes rows: the speedup is llama.cpp's speculative decode rate over its own
autoregressive rate, same prompt, target, threads, device and sampling.

The programs read text, not token ids: each held-out prompt is decoded with the target's
tokenizer and llama.cpp tokenizes it again (`prompt_tokens` is what it read). A model without a
tokenizer (an `init` one, a vocabulary-less GGUF) cannot be given a prompt and is refused.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
from dataclasses import replace
from pathlib import Path

import pandas as pd

from decodelab.backends import machine
from decodelab.backends.devices import fingerprint
from decodelab.backends.gguf_convert import llama_cpp_version
from decodelab.config.settings import Sampling, SpeculativeJob
from decodelab.core.errors import DecodelabError

SPECULATIVE, AUTOREGRESSIVE = "llama-speculative", "llama-completion"
BUILD = "make quantized-peer (scripts/llama_peer_build.sh)"
NUMBER = r"([-\d.]+|nan|-?inf)"
SPECULATIVE_OUTPUT = {
    "prompt_tokens": r"encoded\s+(\d+) tokens in",
    "tokens": r"decoded\s+(\d+) tokens in",
    "seconds": r"decoded\s+\d+ tokens in\s+" + NUMBER + " seconds",
    "drafted": r"n_drafted\s*=\s*(\d+)",
    "accepted": r"n_accept\s*=\s*(\d+)",
}
AUTOREGRESSIVE_OUTPUT = {
    "prompt_tokens": r"prompt eval time =\s+[-\d.]+ ms /\s+(\d+) tokens",
    "prompt_ms": r"prompt eval time =\s+" + NUMBER + " ms",
    "evals": r"(?<!prompt) eval time =\s+[-\d.]+ ms /\s+(\d+) runs",
    "eval_ms": r"(?<!prompt) eval time =\s+" + NUMBER + " ms",
    "total_ms": r"total time =\s+" + NUMBER + " ms",
}


def programs_dir() -> Path:
    """Where the build keeps the two programs ($DECODELAB_LLAMA_PEER overrides it)."""
    if "DECODELAB_LLAMA_PEER" in os.environ:
        return Path(os.environ["DECODELAB_LLAMA_PEER"])
    return Path.home() / ".cache" / "decodelab" / f"llama.cpp-peer-{llama_cpp_version()}"


def program(name: str) -> Path:
    path = programs_dir() / name
    if not os.access(path, os.X_OK):
        raise DecodelabError(f"llama.cpp's {name} is not built ({path} is missing): run {BUILD}, "
                             "or set DECODELAB_LLAMA_PEER to the directory that holds it")
    return path


def parsed(text: str, patterns: dict[str, str], name: str) -> dict[str, float]:
    """The numbers `patterns` find in a program's output; one missing is an error that shows
    the output's end."""
    out = {}
    for key, pattern in patterns.items():
        found = re.search(pattern, text)
        if found is None:
            tail = "\n".join(text.strip().splitlines()[-8:])
            raise DecodelabError(f"llama.cpp's {name} printed no {key} ({pattern!r}); its "
                                 f"output ended:\n{tail}")
        out[key] = float(found.group(1))
    return out


def sampling_args(mode: str, sampling: Sampling) -> list[str]:
    """llama.cpp's sampler as the project's: greedy, or temperature / top-k / top-p alone
    (llama.cpp's min-p of 0.05 and top-k of 40 off, no penalties)."""
    if mode == "greedy":
        return ["--temp", "0"]
    return ["--temp", str(sampling.temperature), "--top-k", str(sampling.top_k),
            "--top-p", str(sampling.top_p), "--min-p", "0"]


def gpu_layers(device: str) -> str:
    return "99" if device == "cuda" else "0"


def common_args(target: Path, prompt: str, budget: int, threads: int, device: str, seed: int
                ) -> list[str]:
    """Both programs': the target, the prompt, `budget` tokens never cut short by an
    end-of-text, one thread count for one-token and batched passes, the model's context."""
    return ["-m", str(target), "-p", prompt, "-n", str(budget), "-t", str(threads),
            "-tb", str(threads), "-c", "0", "-s", str(seed), "-ngl", gpu_layers(device),
            "--ignore-eos"]


def run(command: list[str], name: str) -> tuple[str, dict]:
    """A program's output (stdout and stderr) and the machine's state while it ran: the
    background share counts its CPU time as the job's own."""
    start, children = machine.snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # errors="replace": a token's text can be part of a UTF-8 character
    done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                          stdin=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    end = machine.snapshot()
    child_s = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    background, steal = machine.shares(start, replace(end, own_s=end.own_s + child_s))
    text = done.stdout + done.stderr
    if done.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-8:])
        raise DecodelabError(f"llama.cpp's {name} failed (exit {done.returncode}): "
                             f"{' '.join(command[:3])} ...; its output ended:\n{tail}")
    return text, {"background_cpu_share": background, "steal_share": steal}


# llama.cpp's log is written by a thread of its own, and a run sometimes exits (status 0) with
# its last lines, the summary, unwritten: seen with 0.3.36's programs on a busy machine, the
# same command printing them the next time. Such a run is repeated; its numbers are never guessed.
ATTEMPTS = 6


def run_parsed(command: list[str], name: str, patterns: dict[str, str]) -> tuple[dict, dict]:
    """A program's numbers and its machine state, from the first of ATTEMPTS runs that printed
    them all; the last run's missing number is the error."""
    for attempt in range(1, ATTEMPTS):
        text, state = run(command, name)
        try:
            return {**parsed(text, patterns, name), "attempts": attempt}, state
        except DecodelabError:
            continue
    text, state = run(command, name)
    return {**parsed(text, patterns, name), "attempts": ATTEMPTS}, state


def speculative_row(target: Path, draft: Path, prompt: str, k: int, mode: str, spec: SpeculativeJob,
                    threads: int, device: str, seed: int) -> dict:
    """One llama-speculative run: tokens, decode seconds and rate, drafted and accepted."""
    drafting = ["-md", str(draft), "--spec-draft-n-max", str(k), "-td", str(threads),
                "-tbd", str(threads), "-ngld", gpu_layers(device)]
    row, state = run_parsed([str(program(SPECULATIVE)), *common_args(
        target, prompt, spec.budget, threads, device, seed), *sampling_args(mode, spec.sampling),
        *drafting], SPECULATIVE, SPECULATIVE_OUTPUT)
    row["acceptance"] = row["accepted"] / row["drafted"] if row["drafted"] else float("nan")
    return {"method": "speculative", "k": k, **row, **state}


def autoregressive_row(target: Path, prompt: str, mode: str, spec: SpeculativeJob, threads: int,
                       device: str, seed: int) -> dict:
    """One llama-completion run: `budget` tokens; its decode time is everything after the
    prompt pass (as llama-speculative's), so sampling and printing count on both sides."""
    args = common_args(target, prompt, spec.budget, threads, device, seed)
    row, state = run_parsed([str(program(AUTOREGRESSIVE)), *args,
                             *sampling_args(mode, spec.sampling), "-no-cnv",
                             "--no-display-prompt"], AUTOREGRESSIVE, AUTOREGRESSIVE_OUTPUT)
    seconds = (row.pop("total_ms") - row.pop("prompt_ms")) / 1e3
    return {"method": "autoregressive", "k": 0, "tokens": float(spec.budget),
            "seconds": seconds, **row, **state}


def prompt_texts(target_dir: str | Path, spec: SpeculativeJob) -> list[str]:
    """The speculative study's held-out prompts (same seed) as text for llama.cpp."""
    from transformers import AutoTokenizer

    from decodelab.backends.train import heldout_prompts

    if not (Path(target_dir) / "tokenizer.json").is_file():
        raise DecodelabError(f"{target_dir} has no tokenizer: llama.cpp's programs read a text "
                             "prompt, which its vocabulary-less GGUF cannot take (give the peer "
                             "a `train` or `hf` pair)")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    ids = heldout_prompts(target_dir, spec.prompts, spec.prompt_len, spec.seed)
    return [tokenizer.decode(p) for p in ids]


def expected_rows(spec: SpeculativeJob) -> tuple[int, str]:
    per_prompt = len(spec.modes) * (len(spec.ks) + 1)
    return spec.prompts * per_prompt, (f"{spec.prompts} prompts x {len(spec.modes)} "
                                          f"modes x ({len(spec.ks)} K + autoregressive)")


def peer_job(pair: str, target: str | Path, draft: str | Path, target_dir: str | Path,
             spec: SpeculativeJob, repeat: int, threads: int, device: str) -> pd.DataFrame:
    """One process's rows: per prompt and mode llama.cpp's autoregressive run, then its
    speculative run at each K; seeds differ by repeat, as the speculative study's do."""
    target, draft = Path(target), Path(draft)
    for path in (target, draft):
        if not path.is_file():
            raise DecodelabError(f"GGUF file {path} does not exist")
    threads = threads or os.cpu_count() or 1
    job = machine.Job()
    rows = []
    for i, prompt in enumerate(prompt_texts(target_dir, spec)):
        for mode in spec.modes:
            seed = spec.seed + 1000 * repeat + i
            rows.append({"prompt": i, "mode": mode, **autoregressive_row(
                target, prompt, mode, spec, threads, device, seed)})
            rows += [{"prompt": i, "mode": mode, **speculative_row(
                target, draft, prompt, k, mode, spec, threads, device, seed)} for k in spec.ks]
    df = pd.DataFrame(rows)
    df["tokens_per_s"] = df["tokens"] / df["seconds"]
    return df.assign(pair=pair, repeat=repeat, threads=threads, llama_device=device,
                     target_gguf=str(target), draft_gguf=str(draft),
                     llama_cpp_python=llama_cpp_version(), **job.columns(),
                     **fingerprint(device, spec.job_spec()))
