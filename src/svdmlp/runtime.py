"""Where and in what dtype svdmlp runs, from the ``--device`` / ``--dtype`` a user gives (or none).

One rule for every command: CUDA and bfloat16 when a GPU is available, else CPU and float32, unless
asked otherwise.
"""

from __future__ import annotations

import functools
import sys

import torch

DEVICE_DEFAULTS = (None, "", "auto")
# Bytes of a tensor checked at once by all_finite.
FINITE_CHECK_BYTES = 16 * 2**20


def resolve(device: str | None = None, dtype: str | None = None) -> tuple[torch.device, torch.dtype]:
    """(device, dtype): ``device`` None or "auto" picks CUDA when available; ``dtype`` None picks
    bfloat16 on CUDA and float32 elsewhere. ValueError for CUDA asked of a machine without it."""
    if device in DEVICE_DEFAULTS:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        place = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; expected cpu, cuda or cuda:N") from None
    if place.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device} was asked for but no CUDA GPU is available")
    name = dtype or ("bfloat16" if place.type == "cuda" else "float32")
    return place, getattr(torch, name)


def quiet_transformers() -> None:
    """Silence transformers' warnings and progress bars (the commands print their own progress)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


# Heap blocks at least this large are mapped apart and unmapped when freed (glibc's M_MMAP_THRESHOLD).
# Each such block is paged in afresh when it is made again: at 1 MiB, every activation of a 513-token
# window paid that, and SmolLM2's output-gradient Grams took 114 s instead of 87 s, its calibration walk
# 58 s instead of 44 s; 16 MiB gave both speeds back (BENCHMARKS.md, 2026-12-03).
MMAP_THRESHOLD = 16 * 2**20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


@functools.cache
def _glibc():
    """The C library when it is glibc (whose allocator these functions tune), else None."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Make freed tensors of :data:`MMAP_THRESHOLD` or more go back to the operating system at once (glibc
    only; False elsewhere, where nothing changes).

    glibc raises its mmap threshold each time a mapped block is freed, up to 32 MiB, after which blocks
    of up to that size come from per-thread heaps that keep their freed memory: with two threads, the
    1B-shaped compression peaked at 4.06 GB where a fixed threshold gave 3.59 GB at 1 MiB and 3.62 GB
    at 16 MiB (BENCHMARKS.md).
    Setting the threshold also turns that adjustment off. Process-wide, so the commands call it, not
    the library.
    """
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every entry of ``tensor`` is finite, checked a strip of rows at a time.

    ``torch.isfinite(t).all()`` makes an ``abs`` copy of ``t`` and boolean masks of its size: 0.86 GB
    beside an 8960² float64 Gram (BENCHMARKS.md, session 24), at the root that is the factorisation's
    peak."""
    if tensor.dim() == 0 or tensor.numel() == 0:
        return bool(torch.isfinite(tensor).all())
    row_bytes = max(1, tensor[0].numel() * tensor.element_size())
    rows = max(1, FINITE_CHECK_BYTES // row_bytes)
    return all(bool(torch.isfinite(strip).all()) for strip in tensor.split(rows))


def trim_heap() -> bool:
    """Give the operating system back the free pages glibc's heap keeps between the blocks in use
    (``malloc_trim``); False where there is no glibc.

    Tensors under :data:`MMAP_THRESHOLD` come from the heap, which keeps what they free for the next
    ones: running a decoder layer over Qwen2.5-Coder-1.5B's 224 calibration windows (hidden states of
    12.6 MB a batch, kept, between the layer's freed temporaries) left 0.66-0.80 GB free in the heap
    beside the windows' 0.71 GB, all given back by one trim (BENCHMARKS.md, session 21). Calls are cheap
    (milliseconds) and the pages come back on demand: worth it before long work that needs no
    activations (a layer's decompositions and probes), not between batches.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def peak_memory(device: torch.device) -> dict[str, int]:
    """This process's peak memory so far, in bytes: ``host``, its resident set's high-water mark (what
    ``/usr/bin/time -v`` reports), and on a CUDA ``device`` also ``cuda``, the most torch's allocator
    has held there (the CUDA context and the libraries' workspaces come on top)."""
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peaks = {"host": rss if sys.platform == "darwin" else rss * 1024}  # bytes on macOS, KiB on Linux
    if device.type == "cuda":
        peaks["cuda"] = torch.cuda.max_memory_allocated(device)
    return peaks
