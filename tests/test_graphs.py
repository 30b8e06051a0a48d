"""The graph engine: its static-cache path equals the eager engine token for token (CPU, no
capture), and its CUDA graphs equal it too (GPU only: `PYTHONPATH=src python3 -m pytest
tests/test_graphs.py` on a CUDA host)."""

import copy
import math
import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, GPT2Config

from decodelab.config.settings import Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines import pipelined as pipelined_loop
from decodelab.engines.cuda import capture, fused, graphs
from decodelab.engines.decode import decode
from decodelab.engines.speculative import Spans, autoregressive, generate

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
SAMPLED = Sampling(temperature=1.0)
PROMPT = list(range(3, 15))


def tiny(n_layer: int, n_embd: int, seed: int, device: str = "cpu"):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=2, vocab_size=48, n_positions=128,
                        bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(config).to(device).eval()


@pytest.fixture(scope="module")
def pair():
    """A target and a smaller random draft that agree on some greedy tokens, not all."""
    return tiny(2, 64, seed=0), tiny(1, 32, seed=1)


def static(model):
    return graphs.Engine(model, capture=False)


def seeded(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def test_static_autoregressive_equals_eager(pair):
    target, _ = pair
    ids = torch.tensor([PROMPT])
    assert decode(static(target), ids, 40).tokens == decode(target, ids, 40).tokens


@pytest.mark.parametrize("budget", [1, 48])
def test_fused_models_speculate_as_eager(pair, budget):
    """`fused`'s models (their products MatvecLinear, matmuls off a GPU) behind the uncaptured
    engine. A round with one token left proposes none and reads the draft's vocabulary from its
    LM head: on an H100 a MatvecLinear head raised AttributeError there."""
    ours = [static(fused.prepare(copy.deepcopy(m))) for m in pair]
    assert generate(*ours, PROMPT, budget, 4).tokens == generate(*pair, PROMPT, budget, 4).tokens


@pytest.mark.parametrize("k", [1, 3, 5])
def test_static_greedy_speculative_equals_eager(pair, k):
    target, draft = pair
    eager = generate(target, draft, PROMPT, 48, k)
    ours = generate(static(target), static(draft), PROMPT, 48, k)
    assert ours.tokens == eager.tokens
    assert ours.accepted == eager.accepted
    assert (ours.draft_prefill_passes, eager.draft_prefill_passes) == (k, 1)  # one span each
    assert 0 in eager.accepted or min(eager.accepted) < k  # a rejection, so a rollback ran
    assert max(eager.accepted) > 0  # and an acceptance


def test_static_sampled_keeps_the_rejection_rule(pair):
    target, draft = pair
    runs = [generate(t, d, PROMPT, 48, 4, SAMPLED, seeded("cpu", 5), seeded("cpu", 6))
            for t, d in [(target, draft), (static(target), static(draft))]]
    assert runs[1].tokens == runs[0].tokens
    assert runs[1].accepted == runs[0].accepted
    assert len(set(runs[0].accepted)) > 1


def test_static_sampled_autoregressive_equals_eager(pair):
    """The fair baseline draws on the same uniforms through the engine's fused steps."""
    target, _ = pair
    runs = [autoregressive(m, PROMPT, 40, SAMPLED, seeded("cpu", 3)).tokens
            for m in (target, static(target))]
    assert runs[1] == runs[0]
    assert len(set(runs[0])) > 5


class Reusing(graphs.Engine):
    """A graph engine's contract at its worst, off a GPU: each pass overwrites what the engine's
    earlier passes returned (NaN, token -1), as graphs sharing one memory pool may."""

    def __init__(self, model, pipelined: bool = False):
        super().__init__(model, capture=False, pipelined=pipelined)
        self.returned: list[torch.Tensor] = []

    def replay(self, key, fn, inputs, advance, held=False):
        if not held:
            inputs = tuple(None if x is None else x.clone() for x in inputs)  # its buffers
        for t in self.returned:
            t.fill_(float("nan") if t.is_floating_point() else -1)
        out = super().replay(key, fn, inputs, advance, held)
        self.returned = [t for t in (out if isinstance(out, tuple) else (out,))
                         if isinstance(t, torch.Tensor)]
        return out


def many_sequences_equal_eager(target, draft, engine, s: Sampling) -> None:
    """Every loop on `engine`, over several K and prompts of two lengths (graphs of each), gives
    the eager loops' tokens."""
    t_engine, d_engine = engine(target), engine(draft)
    device = target.device.type
    for k, prompt in [(3, PROMPT), (1, PROMPT[:7]), (4, PROMPT), (2, PROMPT[:7])]:
        runs = [generate(t, d, prompt, 30, k, s, seeded(device, 5), seeded(device, 6))
                for t, d in [(target, draft), (t_engine, d_engine)]]
        assert runs[1].tokens == runs[0].tokens
        assert runs[1].accepted == runs[0].accepted
        baseline = [autoregressive(m, prompt, 20, s, seeded(device, 3)).tokens
                    for m in (target, t_engine)]
        assert baseline[1] == baseline[0]
    ids = torch.tensor([PROMPT], device=device)
    assert decode(d_engine, ids, 20).tokens == decode(draft, ids, 20).tokens


@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_loops_read_no_output_past_the_engines_next_pass(pair, s):
    """The loops use a pass's outputs before the engine's next pass, or copy them: what lets a
    graph engine run many sequences (the H200's graph study, whose kept first logits a later
    replay overwrote, stopped at the finite check)."""
    many_sequences_equal_eager(*pair, Reusing, s)


def pipelined(model, engine=graphs.Engine):
    return engine(model, capture=False, pipelined=True) if engine is graphs.Engine else \
        engine(model, pipelined=True)


def same_but_the_last_call(ours, theirs, sampled: bool) -> None:
    """A pipelined run against the synced loop's: the same tokens and accepted counts, but for
    the last call, which proposes all K where the synced loop proposes what the budget leaves (in
    sampled mode its last token then comes from other uniforms)."""
    assert len(ours.tokens) == len(theirs.tokens)
    assert ours.tokens[:-1] == theirs.tokens[:-1]
    assert ours.tokens == theirs.tokens or sampled
    assert ours.accepted[:-1] == theirs.accepted[:-1]


@pytest.mark.parametrize("engine", [graphs.Engine, Reusing])
@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_pipelined_loop_draws_what_the_synced_loop_draws(pair, engine, s):
    """Greedy: the target's own tokens; sampled: the synced loop's on the same seeds (the same
    rule and uniforms), over several K and prompt lengths (two tokens: no draft prefill); on the
    engine that poisons what its earlier passes returned too. Run twice on one engine: the
    caches' lengths are handed back exactly, so a new sequence starts clean."""
    target, draft = pair
    t_engine, d_engine = pipelined(target, engine), pipelined(draft, engine)
    accepted = set()
    for k, prompt in [(3, PROMPT), (1, PROMPT[:2]), (5, PROMPT[:3]), (4, PROMPT)]:
        synced = generate(target, draft, prompt, 40, k, s, seeded("cpu", 5), seeded("cpu", 6))
        for _ in range(2):
            ours = generate(t_engine, d_engine, prompt, 40, k, s, seeded("cpu", 5),
                            seeded("cpu", 6))
            same_but_the_last_call(ours, synced, not s.greedy)
        assert ours.proposed == k * ours.target_calls and math.isnan(ours.host_gap_s)
        accepted |= {(k, n) for n in ours.accepted}
    assert {n for k, n in accepted if 0 < n < k} and {(1, 0), (1, 1)} & accepted  # rollbacks


def test_pipelined_loop_runs_one_iteration_ahead_and_none_past_the_budget(pair, monkeypatch):
    """The host reads an iteration's verdict while the next is launched (two in flight), and
    launches no iteration the budget may not need: each launched one is read and counted."""
    target, draft = pair
    in_flight, launched = [], []
    receive, iterate = pipelined_loop.Verdicts.receive, pipelined_loop.iterate
    monkeypatch.setattr(pipelined_loop.Verdicts, "receive",
                        lambda self: in_flight.append(len(self)) or receive(self))
    monkeypatch.setattr(pipelined_loop, "iterate",
                        lambda *a: launched.append(1) or iterate(*a))
    out = generate(pipelined(target), pipelined(draft), PROMPT, 40, 3)
    assert max(in_flight) == 2
    assert len(launched) == out.target_calls == len(in_flight)


class Syncs(TorchDispatchMode):
    """The operators that read a tensor's value on the host (a sync on a GPU) run inside."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default):
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_a_pipelined_iteration_never_reads_a_value_on_the_host(pair, monkeypatch, s):
    """No host sync inside an iteration (proposal, verification, verdict, rollbacks, next
    inputs), on the CPU where the same operators run uncaptured; the host reads only the copy
    of each verdict. Negative control: a branch on a tensor, or a rollback by _foreach_sub_
    (which reads its tensor scalar on the host), is caught."""
    target, draft = pair
    syncs, iterate = Syncs(), pipelined_loop.iterate

    def watched(*args):
        with syncs:
            return iterate(*args)

    monkeypatch.setattr(pipelined_loop, "iterate", watched)
    generate(pipelined(target), pipelined(draft), PROMPT, 30, 3, s, seeded("cpu", 1),
             seeded("cpu", 2))
    assert syncs.found == []
    with syncs:
        assert bool(torch.tensor(2) > 0)
        torch._foreach_sub_([torch.tensor(3)], torch.tensor(1))
    assert len(syncs.found) == 2


class Launches(TorchDispatchMode):
    """The operators that run inside and outside the graph recorders' replays."""

    def __init__(self):
        super().__init__()
        self.depth, self.outside = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.depth:
            self.outside.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_a_pipelined_iteration_launches_nothing_outside_its_graphs_but_draws(pair, monkeypatch,
                                                                              s):
    """Outside the replays of its three graphs (proposal, verification with the verdict's
    rollbacks) an iteration launches only the uniforms' draws: on a GPU each launch outside a
    graph is device time between passes (copies into the verdict graph and two rollback graphs
    kept the sampled loop's overhead at 6.4% of an iteration on an H100). Negative control: a
    copy outside a replay is seen."""
    launches, replay = Launches(), capture.Recorder.replay

    def inside(*args, **kwargs):
        launches.depth += 1
        try:
            return replay(*args, **kwargs)
        finally:
            launches.depth -= 1

    monkeypatch.setattr(capture.Recorder, "replay", inside)
    target, draft = pair
    t_engine, d_engine = pipelined(target), pipelined(draft)
    generate(t_engine, d_engine, PROMPT, 30, 3, s, seeded("cpu", 1), seeded("cpu", 2))  # prefill
    buffers, iterate = t_engine.buffers[3], pipelined_loop.iterate
    with torch.inference_mode(), launches:
        iterate(t_engine, d_engine, buffers, 3, s, seeded("cpu", 1), seeded("cpu", 2),
                Spans())
    assert launches.outside == ([] if s.greedy else ["rand"] * 3)
    with launches:
        torch.zeros(2).copy_(torch.ones(2))
    assert "copy_" in launches.outside


def test_a_run_that_failed_midway_leaves_the_next_one_clean(pair, monkeypatch):
    """A pipelined run interrupted after some iterations (its caches' positions advanced on the
    device, never told to the host) leaves its engines decoding the next sequence as new ones."""
    target, draft = pair
    t_engine, d_engine = pipelined(target), pipelined(draft)
    iterate, calls = pipelined_loop.iterate, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return iterate(*args)

    monkeypatch.setattr(pipelined_loop, "iterate", failing)
    with pytest.raises(KeyboardInterrupt):
        generate(t_engine, d_engine, PROMPT, 40, 3)
    monkeypatch.setattr(pipelined_loop, "iterate", iterate)
    assert t_engine.counters()[0].item() > len(PROMPT)  # the failed run's writes
    other = PROMPT[::-1]
    again = generate(t_engine, d_engine, other, 40, 3)
    assert again.tokens == decode(target, torch.tensor([other]), 40).tokens


def test_pipelined_engines_fall_back_where_the_loop_cannot_run(pair):
    """A one-token prompt (the draft is fed two), K = 0 and the wrong rules of verification
    run the synced loop on the same engines; a budget past the static cache is refused."""
    target, draft = pair
    t_engine, d_engine = pipelined(target), pipelined(draft)
    want = decode(target, torch.tensor([PROMPT[:1]]), 20).tokens
    assert generate(t_engine, d_engine, PROMPT[:1], 20, 3).tokens == want
    assert generate(t_engine, d_engine, PROMPT, 20, 0).target_calls == 20
    small = graphs.Engine(target, capture=False, max_len=40, pipelined=True)
    with pytest.raises(DecodelabError, match="do not fit its static cache of 40"):
        generate(small, pipelined(draft), PROMPT, 24, 4)


def test_rollback_by_position_hides_stale_slots(pair):
    """Tokens written past the position and then rolled back leave the next logits as a fresh
    cache gives them."""
    target, _ = pair
    engine = static(target)
    cache = engine.new_cache()
    engine(torch.tensor([PROMPT]), past_key_values=cache)
    engine(torch.tensor([[40, 41, 42, 43]]), past_key_values=cache)
    cache.crop(-4)
    assert cache.get_seq_length() == len(PROMPT)
    after = engine(torch.tensor([[7]]), past_key_values=cache).logits[0, -1].clone()
    fresh = target(input_ids=torch.tensor([PROMPT + [7]])).logits[0, -1]
    torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-5)


def test_new_cache_starts_over(pair):
    target, _ = pair
    engine = static(target)
    ids = torch.tensor([PROMPT])
    first = decode(engine, ids, 10).tokens
    assert decode(engine, ids, 10).tokens == first


def test_a_full_static_cache_is_refused(pair):
    target, _ = pair
    engine = graphs.Engine(target, capture=False, max_len=len(PROMPT))
    cache = engine.new_cache()
    engine(torch.tensor([PROMPT]), past_key_values=cache)
    with pytest.raises(DecodelabError, match="static cache of 12"):
        engine(torch.tensor([[1]]), past_key_values=cache)


def test_engine_choice_names_the_key(pair):
    target, _ = pair
    assert graphs.engine(target, "eager", "speculative.pairs.p.engine") is target
    with pytest.raises(DecodelabError, match="'speculative.pairs.p.engine'.*CUDA device"):
        graphs.engine(target, "graph", "speculative.pairs.p.engine")
    with pytest.raises(DecodelabError, match="'sweep.engine'.*'jit' is not one of"):
        graphs.engine(target, "jit", "sweep.engine")
    with pytest.raises(DecodelabError, match="'sweep.engine': engine 'compiled' needs a CUDA"):
        graphs.engine(target, "compiled", "sweep.engine")


@CUDA
def test_graph_autoregressive_equals_eager():
    target = tiny(4, 128, seed=0, device="cuda")
    ids = torch.tensor([PROMPT], device="cuda")
    engine = graphs.Engine(target)
    eager = decode(target, ids, 60).tokens
    assert decode(engine, ids, 60).tokens == eager
    assert decode(engine, ids, 60).tokens == eager  # replayed graphs, a new sequence
    assert set(engine.recorder.graphs) == {(len(PROMPT), 1), (1, 1)}


@pytest.mark.slow  # Inductor compiles each shape once: about a minute on 2 cores
@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor needs a C++ compiler on a CPU")
@pytest.mark.parametrize("name", ["compiled", "autotuned", "fused"])
def test_compiled_static_path_equals_eager(pair, name):
    """`fused` off CUDA: its Linear layout compiled, its attention SDPA (no Triton)."""
    target, _ = pair
    ids = torch.tensor([PROMPT])
    model = fused.prepare(copy.deepcopy(target)) if name == "fused" else target
    engine = graphs.Engine(model, capture=False, compile=graphs.COMPILE_OPTIONS[name])
    assert decode(engine, ids, 30).tokens == decode(target, ids, 30).tokens


@pytest.mark.slow  # eleven compilations: about half a minute on 2 cores
@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor needs a C++ compiler on a CPU")
def test_a_compiled_engine_compiles_every_shape_a_speculative_run_feeds():
    """Prefill, one token and K + 1 for K = 1..8 are more shapes than dynamo's default limit of
    8 compilations, past which it ran the rest uncompiled with a log line: every one is compiled.
    Negative control: a limit reached is an error, not a silent fallback."""
    model = tiny(1, 32, seed=1)
    engine = graphs.Engine(model, capture=False, compile={})
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        for n in [12, *range(1, 11)]:
            engine(torch.tensor([PROMPT[:n]]), past_key_values=engine.new_cache())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 11
    other = graphs.Engine(tiny(1, 32, seed=2), capture=False, compile={})
    with torch._dynamo.config.patch(recompile_limit=1), torch.inference_mode(), \
            pytest.raises(Exception, match="fail_on_recompile_limit_hit"):
        for n in (2, 3):
            other(torch.tensor([PROMPT[:n]]), past_key_values=other.new_cache())


@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor needs a C++ compiler on a CPU")
@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_a_compiled_verdict_draws_what_the_synced_loop_draws(pair, s):
    """A pipelined engine's compiled verdict (`fuse_verdict`), here without capture: the synced
    loop's tokens and accepted counts on the same seeds, one compilation per K."""
    target, draft = pair
    engines = [graphs.Engine(m, capture=False, pipelined=True, fuse_verdict=True) for m in pair]
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for k, prompt in [(3, PROMPT), (1, PROMPT[:2])]:
        synced = generate(target, draft, prompt, 40, k, s, seeded("cpu", 5), seeded("cpu", 6))
        ours = generate(*engines, prompt, 40, k, s, seeded("cpu", 5), seeded("cpu", 6))
        same_but_the_last_call(ours, synced, not s.greedy)
        assert_caches_end_where_the_host_says(engines)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before == 2


def assert_caches_end_where_the_host_says(engines):
    """Every layer's position on the device is the length the loop left its cache at."""
    for engine in engines:
        assert {c.item() for c in engine.counters()} == {engine.slots.length}


@CUDA
@pytest.mark.parametrize("name, k", [("compiled", 1), ("compiled", 4), ("autotuned", 4),
                                     ("fused", 1), ("fused", 4)])
def test_compiled_graph_speculative_equals_eager(name, k):
    target, draft = tiny(2, 64, seed=0, device="cuda"), tiny(1, 32, seed=1, device="cuda")
    eager = generate(target, draft, PROMPT, 64, k)
    ours = generate(*(graphs.engine(m, name, "test") for m in (target, draft)), PROMPT, 64, k)
    assert ours.tokens == eager.tokens
    assert ours.accepted == eager.accepted
    assert min(eager.accepted) < k


@CUDA
def test_graph_replays_the_static_path_exactly_in_bfloat16():
    """A graph runs the kernels of the static path it captured: bit for bit, even where bfloat16
    rounding makes the eager engine's attention over fewer keys differ."""
    target = tiny(4, 128, seed=0, device="cuda").to(torch.bfloat16)
    ids = torch.tensor([PROMPT], device="cuda")
    ours = decode(graphs.Engine(target), ids, 60).tokens
    assert ours == decode(graphs.Engine(target, capture=False), ids, 60).tokens


@CUDA
@pytest.mark.parametrize("k", [1, 4, 7])
def test_graph_greedy_speculative_equals_eager(k):
    # The CPU fixture's shapes: larger random models fall into one repeated token that the draft
    # always matches, and no rollback would run.
    target, draft = tiny(2, 64, seed=0, device="cuda"), tiny(1, 32, seed=1, device="cuda")
    eager = generate(target, draft, PROMPT, 64, k)
    ours = generate(graphs.Engine(target), graphs.Engine(draft), PROMPT, 64, k)
    assert ours.tokens == eager.tokens
    assert ours.accepted == eager.accepted
    assert min(eager.accepted) < k  # a rejection, so a rollback ran
    assert max(eager.accepted) > 0


@CUDA
def test_graph_sampled_keeps_the_rejection_rule():
    target, draft = tiny(4, 128, seed=0, device="cuda"), tiny(1, 64, seed=1, device="cuda")
    runs = [generate(t, d, PROMPT, 64, 4, SAMPLED, seeded("cuda", 5), seeded("cuda", 6))
            for t, d in [(target, draft), (graphs.Engine(target), graphs.Engine(draft))]]
    assert runs[1].tokens == runs[0].tokens
    assert runs[1].accepted == runs[0].accepted


@CUDA
@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_graph_draft_replays_a_proposal_at_once(s):
    """Every draft pass of a graph engine runs inside one graph per proposal (K passes and
    draws), keyed by the tokens it feeds first and K; its output equals the same loop uncaptured
    and the eager engine's, on the same uniforms."""
    target, draft = tiny(2, 64, seed=0, device="cuda"), tiny(1, 32, seed=1, device="cuda")
    engine = graphs.Engine(draft)
    runs = [generate(target, d, PROMPT, 64, 4, s, seeded("cuda", 5), seeded("cuda", 6))
            for d in (draft, graphs.Engine(draft, capture=False), engine)]
    assert runs[2].tokens == runs[1].tokens == runs[0].tokens
    assert {key[:2] for key in engine.recorder.graphs} <= {("draws", len(PROMPT)), ("draws", 1),
                                                  ("draws", 2)}
    assert {key[2] for key in engine.recorder.graphs} >= {4}


@CUDA
@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
def test_graphs_run_many_sequences(s):
    many_sequences_equal_eager(tiny(2, 64, seed=0, device="cuda"),
                               tiny(1, 32, seed=1, device="cuda"), graphs.Engine, s)


@CUDA
@pytest.mark.parametrize("s", [Sampling(), SAMPLED])
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_pipelined_loop_draws_what_the_synced_loop_draws(s, fuse, dtype):
    """With the verdict as eager kernels (the engine's default) and compiled (`fuse_verdict`),
    whose rollback of both caches Inductor once raced at K = 5..7: the caches end where the host
    says."""
    target, draft = (tiny(*shape, seed=i, device="cuda").to(dtype)
                     for i, shape in enumerate([(2, 64), (1, 32)]))
    engines = [graphs.engine(m, "pipelined", "test") if fuse else graphs.Engine(m, pipelined=True)
               for m in (target, draft)]  # the config's pipelined engine compiles its verdict
    synced = [graphs.Engine(m) for m in (target, draft)]
    ks = (3, 1, 4, 5, 6, 7)
    for k, prompt in zip(ks, [PROMPT, PROMPT[:2], *[PROMPT] * 4], strict=True):
        want = generate(*synced, prompt, 64, k, s, seeded("cuda", 5), seeded("cuda", 6))
        for _ in range(2):
            ours = generate(*engines, prompt, 64, k, s, seeded("cuda", 5), seeded("cuda", 6))
            same_but_the_last_call(ours, want, not s.greedy)
            assert_caches_end_where_the_host_says(engines)
    # each iteration's graphs read the loop's buffers and each other's outputs in place
    _, static, (_, _, ids) = engines[1].recorder.graphs[("pipelined", 4, s)]
    assert static[0] is engines[0].buffers[4].d_ids
    assert engines[0].recorder.graphs[("pipelined", 5)][1][0] is ids
    assert set(engines[0].between.graphs) == {("verdict", k, s, engines[1]) for k in ks}


def test_capture_off_a_gpu_is_refused(pair):
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(DecodelabError, match="CUDA graphs need a CUDA device"):
        graphs.Engine(pair[0])
