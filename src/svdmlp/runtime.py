"""Where and in what dtype a command runs, from its ``--device`` / ``--dtype`` options.

Shared by every command that loads a model (``compress``, ``eval``, ``generate``, ``sweep``); imported
lazily by the CLI, since it imports torch.
"""

from __future__ import annotations

import torch


def resolve_runtime(args) -> tuple[str, torch.dtype]:
    """(device, dtype): cuda and bfloat16 when a GPU is available, else cpu and float32, unless asked."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is available")
    dtype_name = args.dtype or ("bfloat16" if torch.device(device).type == "cuda" else "float32")
    return device, getattr(torch, dtype_name)


def quiet_transformers() -> None:
    """Silence transformers' warnings and progress bars (the commands print their own progress)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
