"""Token-level perplexity under one pinned protocol (the GPTQ / SVD-LLM one).

Protocol:
1. The whole text is tokenized once, without special tokens.
2. The token stream is cut into non-overlapping windows of ``seq_len`` tokens from the start; the
   incomplete tail is dropped. ``max_windows`` keeps only the first windows (for quick runs).
3. Each window is scored independently (no context carried over). Without a BOS token, every token
   but the first of a window is predicted (``seq_len − 1`` predictions per window: the literature's
   protocol). With one (the model's convention, e.g. Gemma's ``<bos>``), it is put before each window
   and every token of the window is predicted (``seq_len`` predictions).
4. Perplexity = exp(total negative log-likelihood / number of predicted tokens), in float32 logits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from svdmlp import arch


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    nll: float
    predicted_tokens: int
    windows: int
    seq_len: int

    def to_dict(self) -> dict:
        return asdict(self)


def text_windows(tokenizer, text: str, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping token windows of ``text`` per the protocol above: LongTensor (n, seq_len)."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"max_windows must be >= 1, got {max_windows}")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    count = ids.numel() // seq_len
    if count == 0:
        raise ValueError(f"text has {ids.numel()} tokens; one evaluation window needs seq_len = {seq_len}")
    if max_windows is not None:
        count = min(count, max_windows)
    return ids[: count * seq_len].view(count, seq_len)


@torch.no_grad()
def perplexity(
    model: torch.nn.Module,
    windows: torch.Tensor,
    batch_size: int = 1,
    progress: bool = True,
    desc: str = "perplexity",
    bos: int | None = None,
) -> PerplexityResult:
    """Score token windows (from :func:`text_windows`) with ``model``, each after ``bos`` if given."""
    device = next(model.parameters()).device
    total_nll, predicted = 0.0, 0
    for batch in tqdm(windows.split(batch_size), desc=desc, unit="batch", disable=not progress):
        batch = arch.with_bos(batch.to(device), bos)
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()  # (B, L-1, V)
        targets = batch[:, 1:]
        total_nll += F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        ).item()
        predicted += targets.numel()
    mean = total_nll / predicted
    return PerplexityResult(math.exp(mean), mean, predicted, windows.shape[0], windows.shape[1])
