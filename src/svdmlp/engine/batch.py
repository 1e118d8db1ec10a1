"""Prompts of different lengths as one left-padded batch.

Left padding puts every prompt's last token in the same slot, so one decode step serves the whole
batch: each new token goes to the same cache slot in every row. Pad slots are masked out of
attention for the rest of the run, and positions (for the rotary embeddings) count real tokens
only, so every row computes what it would compute alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_ID = 0  # any valid id: pad slots are masked, their tokens never influence a real one


@dataclass(frozen=True)
class PromptBatch:
    """input_ids (B, L) left-padded; mask (B, L) 1 on real tokens; positions (B, L); lengths (B,)."""

    input_ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    lengths: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]


def left_pad(prompts: list[list[int]], device: torch.device) -> PromptBatch:
    """Left-pad token-id lists into one batch; an empty batch or an empty prompt is a ValueError."""
    if not prompts:
        raise ValueError("no prompts given: expected a non-empty list of token-id lists")
    empty = [i for i, prompt in enumerate(prompts) if len(prompt) == 0]
    if empty:
        raise ValueError(f"prompts {empty} are empty: every prompt needs at least one token")
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)  # pads take position 0: masked anyway
    return PromptBatch(
        input_ids.to(device), mask.to(device), positions.to(device), tuple(len(p) for p in prompts)
    )
