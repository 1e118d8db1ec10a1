"""``svdmlp info``: what a checkpoint holds (config, ranks, achieved keep, errors)."""

from __future__ import annotations

import argparse

from svdmlp.cli import options


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("info", help="what a checkpoint holds: config, ranks, keep, errors")
    p.add_argument("directory")
    options.add_json(p, "the checkpoint's svdmlp.json as it is")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> options.Outcome:
    from svdmlp import checkpoint_record
    from svdmlp.compression import report

    metadata = checkpoint_record.read_metadata(args.directory)
    result = report.CompressionReport.from_dict(metadata["report"])
    config = metadata["config"]
    print(
        f"checkpoint {args.directory}: {metadata['model_type']} from {metadata['base_model']}, {metadata['dtype']}"
    )
    print(
        f"method {config['method']}, keep {config['keep']}, align {config['align']}, targets {config['targets']}, "
        f"calibration {config['calibration']} sha256 {result.calibration.get('sha256', '-')[:16]}"
    )
    print(report.layer_table(result))
    print()
    print(report.summary_line(result))
    return options.Outcome(0, metadata)
