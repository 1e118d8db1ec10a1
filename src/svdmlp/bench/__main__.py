"""``python -m svdmlp.bench kernel ...``: the benchmarks without the main CLI (e.g. on a bare GPU box)."""

import argparse
import sys

from svdmlp.bench.cli import add_bench_parser


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m svdmlp")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *sys.argv[1:]])
    try:
        return args.func(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
