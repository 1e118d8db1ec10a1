"""CUDA-graph capture, shared by the generation engine and the benchmarks."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture_graph(fn: Callable[[], object]) -> Callable[[], None]:
    """Capture ``fn`` in a CUDA graph and return its replay.

    Warm-up runs on a side stream first, as capture requires (lazy initialisation, Triton's JIT and
    autotuning must not happen inside the capture).
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay
