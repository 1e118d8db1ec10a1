"""``svdmlp plan``: argparse wiring for the tile planner (the main CLI adds it as a subcommand)."""

from __future__ import annotations

import argparse
import json

from svdmlp.plan.hardware import HARDWARE, get_hardware
from svdmlp.plan.planner import plan_model
from svdmlp.plan.report import describe_hardware, format_plan
from svdmlp.plan.shapes import resolve_shapes

DEFAULT_TOKENS = "1,16,128,512,2048,8192"


def parse_tokens(text: str) -> tuple[int, ...]:
    """``"1,16,128"`` → ``(1, 16, 128)``; ValueError for anything but positive integers."""
    try:
        tokens = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--tokens must be comma-separated positive integers, got {text!r}") from None
    if not tokens or min(tokens) < 1:
        raise ValueError(f"--tokens must be comma-separated positive integers, got {text!r}")
    return tokens


def add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``plan [MODEL] --keep K --hardware H [--align N] [--tokens ...] [--json]``."""
    parser = subparsers.add_parser(
        "plan",
        help="choose kernel blocks and predict bytes, floors and speedups for a model's MLP",
        description=(
            "Tile planner: block-aligned ranks at --keep, fused-kernel blocks from the on-chip budget "
            "(NeuronMLP Eq. 10/11), HBM bytes of each schedule and roofline floors, dense vs low-rank."
        ),
    )
    parser.add_argument(
        "model",
        nargs="?",
        default="default",
        help="built-in model name (default: smollm2-135m; 'paper' = the six paper models) "
        "or a local Hugging Face model directory",
    )
    parser.add_argument("--keep", type=float, default=0.8, help="fraction of parameters kept (default 0.8)")
    parser.add_argument("--hardware", default="h200", choices=sorted(HARDWARE), help="device profile")
    parser.add_argument("--align", type=int, default=128, help="rank alignment (default 128)")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"token counts M (default {DEFAULT_TOKENS})")
    parser.add_argument("--json", action="store_true", help="end the output with one line of JSON")
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Print a plan per MLP shape; with ``--json`` the last line is the whole plan as one JSON object."""
    tokens = parse_tokens(args.tokens)
    hw = get_hardware(args.hardware)
    plans = [plan_model(hw, shape, args.keep, args.align, tokens) for shape in resolve_shapes(args.model)]
    print(describe_hardware(hw))
    for plan in plans:
        print()
        print(format_plan(plan))
    if args.json:
        payload = {
            "hardware": hw.to_dict(),
            "keep": args.keep,
            "align": args.align,
            "tokens": list(tokens),
            "models": [plan.to_dict() for plan in plans],
        }
        print(json.dumps(payload))
    return 0
