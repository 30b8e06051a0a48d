"""CUDA graphs recorded once per key and replayed after that, sharing one memory pool.

A graph reads its inputs from buffers fixed at capture, so a replay first copies the new inputs
there; its outputs are buffers too, rewritten by the next replay. A caller whose inputs are its own
fixed buffers (another graph's outputs, a loop's state) has the graph read them in place (`held`):
no copy, where each costs a launch. Graphs sharing a pool may reuse each other's memory: a graph
captured earlier may replay over a later one's outputs, so a caller uses what a replay returns
before its pool's next replay, or copies it. Without capture (any device) `replay` simply runs the
function: what the CPU tests run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Recorder:
    """One pool of graphs, one per key (which must name every shape and constant the recorded
    function depends on)."""

    def __init__(self, capture: bool):
        self.capture = capture
        self.graphs: dict[object, tuple[torch.cuda.CUDAGraph, tuple, object]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def recorded(self, key, fn, inputs: tuple, warm_ups: int = 1,
                 undo: Callable[[], None] = lambda: None, held: bool = False):
        """(graph, its input buffers, its outputs) of fn(*inputs): captured on first use, after
        `warm_ups` runs on a side stream, each followed by `undo` (what takes back a run's side
        effects, such as a cache's writes). `held`: the inputs themselves are the buffers."""
        if key not in self.graphs:
            static = tuple(x if x is None or held else x.clone() for x in inputs)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warm_ups):
                    fn(*static)
                    undo()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = fn(*static)
            self.graphs[key] = graph, static, out
        return self.graphs[key]

    def replay(self, key, fn, inputs: tuple, warm_ups: int = 1,
               undo: Callable[[], None] = lambda: None, held: bool = False):
        """fn(*inputs) from the key's graph (recorded on first use); None inputs stay None.
        `held`: the inputs are buffers that the caller keeps for as long as the graph lives, read
        in place; other tensors passed later are copied into them."""
        if not self.capture:
            return fn(*inputs)
        graph, static, out = self.recorded(key, fn, inputs, warm_ups, undo, held)
        for buffer, x in zip(static, inputs, strict=True):
            if buffer is not None and buffer is not x:
                buffer.copy_(x)
        graph.replay()
        return out
