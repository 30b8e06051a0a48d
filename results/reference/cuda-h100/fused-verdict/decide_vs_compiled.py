"""The compiled pipelined verdict against the eager one, on this device: K = 1..8, greedy and
sampled, every accepted count n (each twice), first uncompiled-uncaptured, then captured as the
loop captures it (`capture.Recorder`, 2 warm-ups each undone). Prints one line per case; `ok`
when eager, compiled and captured agree on the verdict, the draft's next input, K - n and the
caches' positions (7 counters, as the CPU-trained default pair's 6 + 1 layers).

It ran at commit f1ecded, where `pipelined.decide` took the counters and moved them back itself,
inside the compiled code (output: decide_vs_compiled.txt). Since then decide leaves the counters
to its caller, so to rerun it: `git worktree add /tmp/f1 f1ecded`, then
`PYTHONPATH=/tmp/f1/src python3 decide_vs_compiled.py [COUNTERS]`.
"""

import sys

import torch

from decodelab.config.settings import GREEDY, Sampling
from decodelab.engines.cuda.capture import Recorder
from decodelab.engines.cuda.graphs import allow_recompiles
from decodelab.engines.pipelined import Buffers, decide
from decodelab.engines.sampling import wide

allow_recompiles()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
V, NC = 4096, int(sys.argv[1]) if len(sys.argv) > 1 else 7
fused = torch.compile(decide, fullgraph=True, dynamic=False)
cap = dev.type == "cuda"


def case(k, m, s, seed):
    g = torch.Generator(dev).manual_seed(seed)
    logits = torch.randn(1, k + 1, V, device=dev, generator=g).to(torch.bfloat16)
    best = logits[0].float().argmax(-1)
    ids = torch.randint(0, V, (k + 1,), device=dev, generator=g)
    ids[1:m + 1] = best[:m]
    if m < k:
        ids[m + 1] = (best[m] + 1) % V
    probs = torch.softmax(torch.randn(k, V, device=dev, generator=g), -1)
    ua = torch.rand(k, device=dev, generator=g, dtype=wide(dev))
    un = torch.rand(1, 1, device=dev, generator=g, dtype=wide(dev))
    sampled = (probs, ua, un) if not s.greedy else (None, None, None)
    return logits, sampled[0], ids, sampled[1], sampled[2]


def state(v, b, c):
    return v.tolist(), b.d_ids.tolist(), b.back.item(), [x.item() for x in c]


def counters():
    c = [torch.tensor(100, device=dev) for _ in range(NC)]
    for x in c:
        torch._dynamo.mark_static_address(x)
    return c


bad = 0
for name, s in (("greedy", GREEDY), ("sampled", Sampling(temperature=1.0))):
    for k in range(1, 9):
        rec, b_cap, c_cap, static = Recorder(cap), Buffers(k, dev), counters(), None
        for m in list(range(k + 1)) * 2:
            x = case(k, m, s, 1000 * k + m + 7 * (static is not None))
            b, c = Buffers(k, dev), counters()
            want = state(decide(*x, b, c, k, s), b, c)
            b, c = Buffers(k, dev), counters()
            plain = state(fused(*x, b, c, k, s), b, c)
            if static is None:
                static = tuple(None if t is None else t.clone() for t in x)
            for buf, t in zip(static, x, strict=True):
                if buf is not None:
                    buf.copy_(t)
            for t in c_cap:
                t.fill_(100)
            def run(*y, b=b_cap, c=c_cap, k=k, s=s):
                return fused(*y, b, c, k, s)

            def undo(b=b_cap, c=c_cap):
                torch._foreach_add_(c, b.back)

            v = rec.replay(("v", k), run, static, warm_ups=2, undo=undo, held=True)
            if cap:
                torch.cuda.synchronize()
            got = state(v, b_cap, c_cap)
            ok = want == plain == got
            bad += not ok
            print(name, k, m, "ok" if ok else
                  f"DIFFER eager {want} compiled {plain} captured {got}", flush=True)
print("bad", bad)
