"""The engine's CUDA-graph path, checked on a CPU with the capture emulated.

A real capture needs a GPU (test_engine_gpu.py); without one, this runs everything else of that path:
the static full-length cache reset at each prefill, the full-length masks, the decode step built for
replay. The emulated capture warms the step up eagerly, as :func:`svdmlp.cuda_graphs.capture_graph`
does, then runs every replay as under a capture: transformers is told a CUDA stream is capturing (so
it takes the branches it takes inside a real capture), and reading a tensor's value on the host
(``item``, ``tolist``, ``bool``, ``int``, ``float``, indexing with it), which would break a capture
or freeze a value into the graph, raises.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers.utils import import_utils

from conftest import ARCH_CONFIGS, compress_for_generation, hf_greedy, untied_model
from svdmlp.engine import Engine
from svdmlp.engine import engine as engine_module
from svdmlp.lowrank import set_backend

PROMPTS = [[5, 17, 42, 99, 7, 3], [9, 8], [300, 1, 2]]
NEW = 16
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


class HostSyncInCapture(RuntimeError):
    pass


@contextlib.contextmanager
def as_if_capturing():
    """Inside: transformers sees a capturing stream, and host reads of tensor values raise."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    saved_capturing = import_utils.is_cuda_stream_capturing

    def refuse(name):
        def read(self, *args, **kwargs):
            raise HostSyncInCapture(f"Tensor.{name} inside a captured decode step")

        return read

    import_utils.is_cuda_stream_capturing = lambda: True
    for name in HOST_READS:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        import_utils.is_cuda_stream_capturing = saved_capturing


def emulated_capture(step):
    for _ in range(3):
        step()  # warm-up, eager (writes garbage into the cache, as on a GPU; the prefill resets it)

    def replay():
        with as_if_capturing():
            step()

    replay()  # the capture itself
    return replay


@pytest.fixture
def graph_engine(monkeypatch):
    """An engine on the CPU that takes the graph path, with the capture emulated."""
    monkeypatch.setattr(engine_module, "capture_graph", emulated_capture)
    # The engine syncs after a failed capture, then decodes eagerly and says why in the result's note.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def make(model, **kwargs):
        engine = Engine(model, graphs=False, **kwargs)
        engine.graphs = True  # past the constructor's CUDA check: the path, not the device
        return engine

    return make


def test_the_emulation_catches_a_host_read():
    with as_if_capturing(), pytest.raises(HostSyncInCapture):
        bool(torch.ones(1))


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_graph_path_equals_hf_generate(model_type, graph_engine):
    model = untied_model(model_type)
    result = graph_engine(model).generate(PROMPTS, NEW)
    assert result.graph, result.note
    assert result.tokens == hf_greedy(model, PROMPTS, NEW)


@pytest.mark.parametrize("model_type", ["mistral", "gemma2", "gemma3_text"])
def test_graph_path_with_a_sliding_window_shorter_than_the_text(model_type, graph_engine):
    model = untied_model(model_type, sliding_window=4)
    result = graph_engine(model).generate(PROMPTS, NEW)
    assert result.graph, result.note
    assert result.tokens == hf_greedy(model, PROMPTS, NEW)


def test_graph_path_sampling_and_reuse_equal_the_eager_path(graph_engine):
    model = untied_model("llama")
    options = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 3}
    engine = graph_engine(model)
    first = engine.generate(PROMPTS, NEW, options)
    again = engine.generate(PROMPTS, NEW, options)  # the session and its step are reused
    assert first.graph and first.tokens == again.tokens
    assert first.tokens == Engine(model).generate(PROMPTS, NEW, options).tokens


@pytest.mark.parametrize("backend", ["torch", "triton"])  # triton: its launchers, interpreted
def test_graph_path_of_a_compressed_model(backend, graph_engine, tokenizer, text_file):
    model = untied_model("qwen3")
    compress_for_generation(model, tokenizer, text_file)
    set_backend(model, backend)
    result = graph_engine(model).generate(PROMPTS, NEW)
    assert result.graph, result.note
    assert result.tokens == hf_greedy(model, PROMPTS, NEW)
