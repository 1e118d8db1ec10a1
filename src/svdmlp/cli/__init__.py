"""The ``svdmlp`` command (also ``python -m svdmlp``): argparse in, library calls out.

Each command is one module of this package with its parser (``add_parser``) and its handler
(``run``); the options several commands share live in :mod:`svdmlp.cli.options`. Handlers import
torch and transformers only when they run, so ``svdmlp --help`` answers at once.

Every handler returns an :class:`~svdmlp.cli.options.Outcome`: the exit status and the record that
``--json FILE`` writes. Bad input (a ValueError, or an OSError: a file missing, in the way or unwritable,
a full disk) exits with status 2 and one line on standard error; anything else is a bug, reported in one
line with exit status 1 (``SVDMLP_TRACEBACK=1`` shows its traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

from svdmlp import __version__
from svdmlp.cli import (
    bench,
    compress,
    evaluate,
    generate,
    info,
    options,
    plan,
    quantize,
    serve,
    sweep,
    upgrade,
)
from svdmlp.paths import check_output

COMMANDS = (compress, quantize, evaluate, generate, serve, upgrade, info, plan, bench, sweep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svdmlp",
        description="Compress LLM MLPs with block-aligned SVD and run them fast. "
        "keep = fraction of MLP parameters kept (the NeuronMLP paper's compression ratio is 1 - keep).",
    )
    parser.add_argument("--version", action="version", version=f"svdmlp {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


class _Terminated(Exception):
    """SIGTERM, raised where the command is, so that its cleanups (scratch and staging directories) run."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return _run(args)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    json_target = getattr(args, "json", None)
    # With --json -, standard output carries the JSON alone: the report goes to standard error.
    report_stream = sys.stderr if json_target == "-" else sys.stdout
    try:
        if json_target not in (None, "-"):
            check_output(json_target)  # before the command's work, not after it
        with contextlib.redirect_stdout(report_stream):
            outcome = args.run(args)
            if json_target not in (None, "-"):
                options.write_json(outcome.record, json_target)
                print(f"wrote {json_target}")
    except (ValueError, OSError) as err:  # bad input; files missing, in the way, unwritable; a full disk
        print(f"svdmlp {args.command}: error: {_first_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except Exception as err:  # a bug: a short report, the traceback on request
        if os.environ.get("SVDMLP_TRACEBACK"):
            raise
        print(
            f"svdmlp {args.command}: internal error: {type(err).__name__}: {_first_line(err)} "
            "(a bug in svdmlp: run again with SVDMLP_TRACEBACK=1 for the traceback, and report it)",
            file=sys.stderr,
        )
        return 1
    if json_target == "-":
        options.write_json(outcome.record, "-")
    return outcome.code


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err).strip() else type(err).__name__
