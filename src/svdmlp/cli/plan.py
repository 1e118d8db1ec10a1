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
        action=options.Extend,
        default=DEFAULT_TOKENS,
        help=f"token counts M (default {','.join(map(str, DEFAULT_TOKENS))})",
    )
    parser.add_argument(
        "--launches",
        action="store_true",
        help="also the launch model: every launch of the Triton backend (tiles, programs, waves, bytes "
        "in flight per SM, bytes, FLOPs, predicted time) against the dense and unfused baselines; "
        "bf16, GPU profiles only, needs Triton",
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
    if args.launches and hw.kind != "gpu":
        raise ValueError(f"--launches models the Triton kernels on a GPU; {hw.name} is not one")
    plans = [
        plan_model(hw, shape, args.keep, args.align, args.tokens) for shape in resolve_shapes(args.model)
    ]
    print(describe_hardware(hw))
    launch_records = []
    for plan in plans:
        print()
        print(format_plan(plan))
        if args.launches:
            launch_records.append(_print_launches(hw, plan))
    record = {
        "hardware": hw.to_dict(),
        "keep": args.keep,
        "align": args.align,
        "tokens": list(args.tokens),
        "models": [plan.to_dict() for plan in plans],
    }
    if args.launches:
        record["launches"] = launch_records
    return options.Outcome(0, record)


def _print_launches(hw, plan) -> dict:
    from svdmlp.plan.launches import predict_mlp, rule_problems
    from svdmlp.plan.render import launch_summary_table, launch_table

    rows = [predict_mlp(hw, plan.shape, plan.ranks, m) for m in (row.m for row in plan.rows)]
    print(f"\nLaunch model, {plan.shape.name} (bf16; predictions, see svdmlp.plan.launches):")
    print(launch_table(rows))
    print()
    print(launch_summary_table(rows))
    problems = [problem for row in rows for problem in rule_problems(hw, row)]
    for problem in problems:
        print(f"rule broken: {problem}")
    return {"model": plan.shape.name, "rows": [row.to_dict() for row in rows], "rule_problems": problems}
