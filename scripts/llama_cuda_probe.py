"""Where llama.cpp's CUDA build fails beside PyTorch, and which process environment mends it.
Each step runs alone in a fresh process, so a crash names its step.

The failure it probes (torch with its own CUDA wheels beside a llama-cpp-python built with the
machine's CUDA toolkit): llama.cpp alone on CUDA loads, evaluates, rolls back and holds two
models, but a process that also imports torch can die (SIGABRT inside `import torch` when
llama_cpp came first, SIGSEGV in `decodelab speculative`, which imports torch first), as two
different sets of CUDA libraries meet. The variants below load one set of CUDA libraries before
either does.

Usage: python3 scripts/llama_cuda_probe.py TARGET.gguf DRAFT.gguf ENV_FILE
Prints one line per step and variant; writes to ENV_FILE the `export` line of the first variant
under which every step passes (':' when the process needs nothing, an empty file when no variant
mends it).
"""

import ctypes.util
import glob
import os
import re
import shlex
import subprocess
import sys
import sysconfig

PRELUDE = """
import faulthandler, sys
faulthandler.enable()
target, draft = sys.argv[1], sys.argv[2]
def engine(path, **kw):
    import llama_cpp
    return llama_cpp.Llama(path, n_ctx=0, logits_all=True, verbose=False, n_gpu_layers=-1, **kw)
def step(llm, ids):
    start = llm.n_tokens
    llm.eval(ids)
    return llm.scores[start:llm.n_tokens].copy()
"""

BESIDE_TORCH = {
    "torch imported first": "import torch; step(engine(target), [1])",
    "torch's CUDA first": "import torch; torch.zeros(1, device='cuda'); step(engine(target), [1])",
    "llama.cpp first, then torch's CUDA": (
        "t = engine(target); step(t, [1]); import torch; torch.zeros(1, device='cuda');"
        " torch.cuda.Event(enable_timing=True).record(); step(t, [2])"),
    "decodelab's engine": (
        "import torch; from decodelab.backends.llamacpp import Engine;"
        " e = Engine(target, device='cuda');"
        " c = e.new_cache(); e(torch.tensor([[1, 2, 3]]), past_key_values=c); c.crop(-1);"
        " e(torch.tensor([[4]]), past_key_values=c); torch.zeros(1, device='cuda')"),
}
CUDA_LIBS = ("libcudart.so.1[0-9]", "libcublasLt.so.1[0-9]", "libcublas.so.1[0-9]")


def found(roots: list[str]) -> str:
    """The CUDA runtime and cuBLAS libraries under `roots`, first match of each, ':'-joined."""
    libs = []
    for name in CUDA_LIBS:
        hits = sorted(p for root in roots for p in glob.glob(f"{root}/**/{name}", recursive=True))
        libs += hits[:1]
    return ":".join(libs) if len(libs) == len(CUDA_LIBS) else ""


def variants() -> dict[str, dict[str, str]]:
    site = sysconfig.get_paths()["purelib"]
    toolkit = sorted(glob.glob("/usr/local/cuda*/lib64")
                     + glob.glob("/usr/local/cuda*/targets/*/lib"))
    out = {"as is": {}}
    cxx = ctypes.util.find_library("stdc++")
    if cxx:  # the system C++ runtime first in the global scope: its symbols win every lookup
        out["the C++ runtime preloaded"] = {"LD_PRELOAD": cxx}
    torch_libs, toolkit_libs = found([f"{site}/nvidia"]), found(toolkit)
    if torch_libs:
        out["torch's CUDA libraries preloaded"] = {"LD_PRELOAD": torch_libs}
    if toolkit_libs:
        out["the toolkit's CUDA libraries preloaded"] = {"LD_PRELOAD": toolkit_libs}
    return out


def passes(name: str, code: str, env: dict[str, str], args: list[str]) -> bool:
    try:
        done = subprocess.run([sys.executable, "-c", PRELUDE + code + "\nprint('ok')", *args],
                              capture_output=True, text=True, timeout=90, env=os.environ | env)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        rc, text = "timeout", ""
    tail = " | ".join(text.strip().splitlines()[-4:])
    print(f"  {name}: rc {rc}: {tail}", flush=True)
    return rc == 0


def exported_cxx_runtime() -> None:
    """How many libstdc++ symbols each llama.cpp library exports: a copy of the C++ runtime's
    code in a library's dynamic symbol table can win lookups made by torch or libllama."""
    import llama_cpp

    for lib in sorted(glob.glob(f"{os.path.dirname(llama_cpp.__file__)}/lib/lib*.so*")):
        nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
        std = [ln for ln in nm.stdout.splitlines() if re.search(r" _ZN?S[tdaoi]|_ZNKS", ln)]
        print(f"{os.path.basename(lib)}: {len(std)} exported std:: symbols", flush=True)


def main(target: str, draft: str, env_file: str) -> None:
    exported_cxx_runtime()
    chosen = None
    for label, env in variants().items():
        print(f"beside torch, {label} {env}:", flush=True)
        if all([passes(name, code, env, [target, draft]) for name, code in BESIDE_TORCH.items()]):
            chosen = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            print(f"  -> every step passes: {label}", flush=True)
            break
    with open(env_file, "w") as out:  # ':' when nothing needs mending, empty when nothing mends
        out.write("" if chosen is None else f"export {chosen}\n" if chosen else ":\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
