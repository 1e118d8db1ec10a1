"""``svdmlp upgrade``: a checkpoint of an earlier format written again in this svdmlp's, so that
transformers and vLLM load it (format 4 added the ``quantization_config`` they load it by)."""

from __future__ import annotations

import argparse

from svdmlp.cli import options


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "upgrade",
        help="write a checkpoint again in the current format (so transformers and vLLM load it)",
        description="Loads the checkpoint (checking every file's hash) and saves the same tensors, config "
        "and report in the current format: in place, atomically, or to --out.",
    )
    p.add_argument("checkpoint", help="an svdmlp checkpoint directory")
    p.add_argument("--out", help="write the upgraded checkpoint here instead of in place")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it is a checkpoint")
    options.add_json(p, "the upgraded checkpoint's path and format")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    from svdmlp import checkpoint

    before = checkpoint.read_metadata(args.checkpoint)["format_version"]
    if args.out is not None:
        checkpoint.check_target(args.out, args.overwrite)
    path = checkpoint.upgrade(args.checkpoint, args.out, args.overwrite)
    print(f"format {before} -> {checkpoint.FORMAT_VERSION}; saved {path}")
    return options.Outcome(0, {"checkpoint": str(path), "format_version": checkpoint.FORMAT_VERSION})
