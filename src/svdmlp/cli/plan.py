"""``svdmlp plan``: the tile planner's blocks, bytes, floors and predicted speedups for a model's MLP."""

from __future__ import annotations

import argparse

from svdmlp.cli import options
from svdmlp.plan.hardware import HARDWARE

DEFAULT_TOKENS = (1, 16, 128, 512, 2048, 8192)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``plan [MODEL] --keep K --hardware H [--align N] [--tokens ...] [--json FILE]``."""
    parser = commands.add_parser(
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
    parser.add_argument(
        "--tokens",
        type=options.comma_list(int),
        default=DEFAULT_TOKENS,
        help=f"token counts M (default {','.join(map(str, DEFAULT_TOKENS))})",
    )
    options.add_json(parser, "the hardware profile and every plan")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    """Print a plan per MLP shape; the record is the whole plan."""
    from svdmlp.plan.hardware import get_hardware
    from svdmlp.plan.planner import plan_model
    from svdmlp.plan.render import describe_hardware, format_plan
    from svdmlp.plan.shapes import resolve_shapes

    hw = get_hardware(args.hardware)
    plans = [
        plan_model(hw, shape, args.keep, args.align, args.tokens) for shape in resolve_shapes(args.model)
    ]
    print(describe_hardware(hw))
    for plan in plans:
        print()
        print(format_plan(plan))
    record = {
        "hardware": hw.to_dict(),
        "keep": args.keep,
        "align": args.align,
        "tokens": list(args.tokens),
        "models": [plan.to_dict() for plan in plans],
    }
    return options.Outcome(0, record)
