"""``svdmlp serve``: an OpenAI-compatible server for a checkpoint, which is vLLM's (``vllm serve``) with
svdmlp's plugin, started only once the checkpoint has been checked.

What ``vllm serve`` would find out after minutes of starting, or only in a worker's log, is refused here
at once with one line: a checkpoint whose files differ from their recorded hashes or are missing, one
written before checkpoints carried their ``quantization_config`` (format 1 to 3), an svdmlp record this
svdmlp cannot read, MLPs only partly low-rank (``--targets``), and a vLLM that is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "serve",
        help="serve a checkpoint with vLLM (OpenAI-compatible API)",
        description="Check a checkpoint, then start vLLM's OpenAI-compatible server on it (svdmlp's "
        "plugin runs its MLPs low-rank). Options after -- go to `vllm serve` as they are, e.g. "
        "-- --max-model-len 4096 --enforce-eager. Needs vLLM in this environment: make serve-env.",
    )
    p.add_argument("directory", help="an svdmlp checkpoint (format 4)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="GPUs (or CPU workers) to shard the model over"
    )
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: options for `vllm serve`")
    p.set_defaults(run=run)


def run(args: argparse.Namespace):
    from svdmlp import checkpoint

    spec = checkpoint.servable(args.directory)
    partial = [index for index in spec.layers if not spec.fully_compressed(index)]
    if partial:
        raise ValueError(
            f"{args.directory} has only some projections of layer {partial[0]} low-rank (--targets); "
            "vLLM serves checkpoints whose compressed MLPs are low-rank whole"
        )
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "vLLM is not installed in this environment: run `make serve-env`, then "
            f"`.venv-vllm/bin/svdmlp serve {args.directory}` (or pip install vllm beside svdmlp)"
        )
    extra = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(args.directory),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--tensor-parallel-size",
        str(args.tensor_parallel_size),
        *extra,
    ]
    print(f"svdmlp serve: {len(spec.layers)} low-rank MLPs; starting: {' '.join(command[1:])}", flush=True)
    os.execv(sys.executable, command)  # vLLM's server in this process: signals and exit status are its own
