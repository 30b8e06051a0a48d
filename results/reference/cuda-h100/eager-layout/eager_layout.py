"""One process of the eager-layout test (plain torch and transformers, no decodelab): gpt2 with
random weights in float16 decodes greedily in transformers' eager loop, synchronized after every
step as the latency sweep times it, with cuDNN attention left out as in the stable-timing sweeps.
Prints one JSON line: per repeat the median wall and main-thread CPU time of a step, and what
might set them (the CPU the process ran on, its clock, the hash seed, address randomization).

python eager_layout.py [--tokens N] [--repeats R] [--device cuda]"""

import argparse
import json
import os
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import GPT2Config, GPT2LMHeadModel

BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def decode(model, prompt, tokens):
    """Per step: (wall s, main-thread CPU s), prefill excluded."""
    out = model(prompt, use_cache=True)
    cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync(prompt.device)
    steps = []
    for _ in range(tokens):
        wall, cpu = time.perf_counter(), time.thread_time()
        out = model(token, past_key_values=cache, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync(prompt.device)
        steps.append((time.perf_counter() - wall, time.thread_time() - cpu))
    return steps


def cpu_clock_mhz(cpu):
    """The kernel's current clock for `cpu` (NaN where /proc/cpuinfo does not say)."""
    with open("/proc/cpuinfo") as f:
        blocks = f.read().split("\n\n")
    for block in blocks:
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if fields.get("processor") == str(cpu):
            return float(fields.get("cpu MHz", "nan"))
    return float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).to(device, torch.float16 if device.type == "cuda"
                                                 else torch.float32).eval()
    prompt = torch.randint(0, 50257, (1, 32), device=device)
    with sdpa_kernel(BACKENDS):
        for _ in range(2):
            decode(model, prompt, 16)
        repeats = [decode(model, prompt, args.tokens) for _ in range(args.repeats)]
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU it last ran on
    with open("/proc/sys/kernel/randomize_va_space") as f:
        aslr = f.read().strip()
    with open("/proc/self/personality") as f:
        personality = f.read().strip()  # 0040000: ADDR_NO_RANDOMIZE (setarch -R)
    print(json.dumps({
        "step_ms": [1e3 * statistics.median(w for w, _ in r) for r in repeats],
        "cpu_ms": [1e3 * statistics.median(c for _, c in r) for r in repeats],
        "cpu": cpu, "cpu_mhz": cpu_clock_mhz(cpu), "hash_seed": os.environ.get("PYTHONHASHSEED"),
        "aslr": aslr, "personality": personality, "model_at": hex(id(model)),
        "affinity": len(os.sched_getaffinity(0)), "device": torch.cuda.get_device_name()
        if device.type == "cuda" else "cpu"}))


if __name__ == "__main__":
    main()
