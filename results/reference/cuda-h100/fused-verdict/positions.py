"""The pipelined engine against the synced graph engine on a trained pair, K = 1..8 in both
modes: after every run, the caches' positions on the device against the host's, and where the
tokens first differ. Usage: python3 positions.py FUSE(0|1) DTYPE [KS, e.g. 1,5,8]; reads the
pair from .gpu/pair/{target,draft}; runs uncaptured off a GPU."""

import random
import sys

import torch

from decodelab.backends import models
from decodelab.config.settings import GREEDY, Sampling
from decodelab.engines.cuda import graphs
from decodelab.engines.pipelined import room
from decodelab.engines.speculative import generate

fuse, dtype = sys.argv[1] == "1", sys.argv[2]
ks = [int(k) for k in sys.argv[3].split(",")] if len(sys.argv) > 3 else range(1, 9)
device = "cuda" if torch.cuda.is_available() else "cpu"
capture = device == "cuda"
target, draft = (models.load(f".gpu/pair/{r}", device, dtype, role=r) for r in ("target", "draft"))
ours_pair = [graphs.Engine(m, capture=capture, pipelined=True, fuse_verdict=fuse,
                           max_len=room(160, 8)) for m in (target, draft)]
synced_pair = [graphs.Engine(m, capture=capture, max_len=room(160, 8)) for m in (target, draft)]
rng = random.Random(0)
prompts = [[rng.randrange(4096) for _ in range(32)] for _ in range(3)]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator(device).manual_seed(seed)


for mode, s in (("greedy", GREEDY), ("sampled", Sampling(temperature=1.0))):
    for k in ks:
        for i, p in enumerate(prompts):
            want = generate(*synced_pair, p, 128, k, s, seeded(1), seeded(2))
            ours = generate(*ours_pair, p, 128, k, s, seeded(1), seeded(2))
            host = len(p) + sum(n + 1 for n in ours.accepted) - 1
            on_device = tuple(e.counters()[0].item() for e in ours_pair)
            pairs = enumerate(zip(ours.tokens, want.tokens, strict=True))
            diff = next((j for j, (a, b) in pairs if a != b), None)
            print(mode, k, i, "host", host, "device", on_device, "first difference", diff,
                  "accepted", sorted(set(ours.accepted)), flush=True)
print("OK")
