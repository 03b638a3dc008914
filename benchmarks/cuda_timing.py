"""Per-call GPU time inside a CUDA graph: what a kernel costs when the engine replays graphs."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def graph_us(fn: Callable[[], object], reps: int = 20) -> float:
    """Median over 7 replays of a graph of `reps` back-to-back `fn()` calls, in µs per call.

    Three eager warm-up calls on a side stream (Triton compiles, caches allocate) and one
    untimed replay come first.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)
