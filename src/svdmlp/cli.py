"""The ``svdmlp`` command: argparse in, library calls out. No logic of its own beyond printing."""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from svdmlp import __version__
from svdmlp.bench.cli import add_bench_parser
from svdmlp.config import HEALS, LoraSpec
from svdmlp.plan.cli import add_plan_parser
from svdmlp.sweep.cli import add_sweep_parser

DTYPES = ("float32", "bfloat16", "float16")


def _csv(kind):
    def parse(text: str):
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


def _add_runtime_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="compute dtype (default: float32 on CPU, bfloat16 on CUDA)",
    )
    parser.add_argument(
        "--backend", choices=("auto", "torch", "triton"), default="auto", help="kernels for low-rank layers"
    )


def add_perplexity_options(parser: argparse.ArgumentParser, default_texts: str) -> None:
    """Perplexity texts, literature sets and windows (``eval`` and ``sweep``; read by
    ``commands.eval_texts`` and ``commands.eval_settings``). ``default_texts`` is --text's default, in words."""
    parser.add_argument(
        "--text",
        action="append",
        default=None,
        help=f"text file, 'shakespeare-heldout' or 'gsm8k' (repeatable; default: {default_texts})",
    )
    parser.add_argument(
        "--dataset", action="append", default=[], help="wikitext2, ptb or c4 through `datasets` (repeatable)"
    )
    parser.add_argument(
        "--data-files",
        action="append",
        default=[],
        metavar="SET=PATH",
        help="local copy of a --dataset, e.g. wikitext2=test.parquet",
    )
    parser.add_argument(
        "--seq-len", type=int, default=2048, help="tokens per window (default 2048, as in the literature)"
    )
    parser.add_argument(
        "--max-windows", type=int, default=None, help="score only the first N windows of each text"
    )
    parser.add_argument("--batch-size", type=int, default=1)


def add_lora_options(parser: argparse.ArgumentParser) -> None:
    """The knobs of distillation healing ("lora"), shared by compress and sweep."""
    parser.add_argument(
        "--heal-steps", type=int, default=LoraSpec.steps, help="lora: training steps (default %(default)s)"
    )
    parser.add_argument(
        "--heal-lr", type=float, default=LoraSpec.lr, help="lora: peak learning rate (default %(default)s)"
    )
    parser.add_argument(
        "--heal-seq-len",
        type=int,
        default=LoraSpec.seq_len,
        help="lora: tokens per step (default %(default)s)",
    )


def add_task_options(parser: argparse.ArgumentParser) -> None:
    """lm-eval zero-shot tasks (``eval`` and ``sweep``)."""
    parser.add_argument(
        "--tasks",
        type=_csv(str),
        default=(),
        metavar="NAME[,NAME]",
        help="lm-eval tasks, e.g. arc_easy,hellaswag; 'paper' = the paper's six, 'paper+' adds boolq,mathqa",
    )
    parser.add_argument(
        "--include-path", default=None, metavar="DIR", help="folder of extra lm-eval task YAMLs (local tasks)"
    )
    parser.add_argument("--limit", type=int, default=None, help="score only the first N documents per task")
    parser.add_argument("--seed", type=int, default=0, help="lm-eval's seeds (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svdmlp",
        description="Compress LLM MLPs with block-aligned SVD and run them fast. "
        "keep = fraction of MLP parameters kept (the NeuronMLP paper's compression ratio is 1 - keep).",
    )
    parser.add_argument("--version", action="version", version=f"svdmlp {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("compress", help="factorise a model's MLPs and save a checkpoint")
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="built-in model (smollm2-135m, qwen2.5-coder-0.5b), .gguf file, model directory or hub id "
        "(default: smollm2-135m)",
    )
    p.add_argument(
        "--keep", type=float, default=0.8, help="fraction of MLP parameters kept, in (0, 1] (default 0.8)"
    )
    p.add_argument(
        "--method", choices=("whiten", "svd"), default="whiten", help="activation-aware (whiten) or plain SVD"
    )
    p.add_argument("--align", type=int, default=32, help="ranks are multiples of this (default 32)")
    p.add_argument(
        "--calib",
        default="shakespeare",
        metavar="SOURCE[:WEIGHT],...",
        help="calibration text: 'shakespeare' (default), 'gsm8k' or a file; a comma-separated list with "
        "weights mixes them, e.g. shakespeare:3,notes.txt:1",
    )
    p.add_argument("--calib-samples", type=int, default=32, help="calibration windows (default 32)")
    p.add_argument(
        "--calib-seq-len", type=int, default=512, help="tokens per calibration window (default 512)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--targets", type=_csv(str), default=("gate", "up", "down"), help="projections to factorise"
    )
    p.add_argument("--layers", type=_csv(int), default=None, help="decoder layer indices (default: all)")
    p.add_argument(
        "--allocate",
        action="store_true",
        help="one rank per layer from measured sensitivity (the KL each layer alone causes at the rank "
        "rule's rank), within the parameter budget of --keep (default: the rank rule everywhere)",
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="calibrate each layer on the outputs of the already-compressed layers before it",
    )
    p.add_argument(
        "--heal",
        choices=HEALS,
        default="none",
        help="closed-form: fit each down projection to compensate the compressed gate/up (needs "
        "--sequential); lora: train the factors to match the dense model's next-token distribution "
        "on calibration text; closed-form+lora: both (default none)",
    )
    add_lora_options(p)
    p.add_argument(
        "--save-dtype",
        choices=DTYPES,
        default="bfloat16",
        help="dtype of the saved weights (default bfloat16)",
    )
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing svdmlp checkpoint at --out")
    _add_runtime_options(p)
    p.set_defaults(func="compress")

    p = commands.add_parser(
        "eval", help="perplexity and zero-shot accuracy of a checkpoint (and its dense base) or of a model"
    )
    p.add_argument(
        "target", nargs="?", default=None, help="checkpoint directory or model (default: built-in model)"
    )
    add_perplexity_options(p, "shakespeare-heldout unless only --dataset or --tasks are given")
    add_task_options(p)
    p.add_argument("--no-baseline", action="store_true", help="skip the dense base model of a checkpoint")
    p.add_argument("--json", action="store_true", help="end the output with one JSON line")
    p.add_argument("--output", default=None, metavar="FILE", help="also write the JSON result to FILE")
    _add_runtime_options(p)
    p.set_defaults(func="evaluate")

    p = commands.add_parser("generate", help="generate text with a checkpoint or a model")
    p.add_argument(
        "target", nargs="?", default=None, help="checkpoint directory or model (default: built-in model)"
    )
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=1.0, help="sample from the top-p probability mass")
    p.add_argument("--seed", type=int, default=0, help="seeds sampling (default 0)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument(
        "--engine",
        choices=("fast", "hf"),
        default="fast",
        help="fast: static cache, CUDA-graph decoding, streamed (default); hf: Hugging Face generate",
    )
    _add_runtime_options(p)
    p.set_defaults(func="generate")

    p = commands.add_parser("info", help="what a checkpoint holds: config, ranks, keep, errors")
    p.add_argument("directory")
    p.add_argument("--json", action="store_true", help="print svdmlp.json as is")
    p.set_defaults(func="info")

    add_plan_parser(commands)
    add_bench_parser(commands)
    add_sweep_parser(
        commands, add_perplexity_options, add_task_options, add_lora_options, _add_runtime_options
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Built-in commands name a function of svdmlp.commands (imported only now: torch and
    # transformers take seconds to import, and --help should not wait for them).
    func = getattr(import_module("svdmlp.commands"), args.func) if isinstance(args.func, str) else args.func
    try:
        return func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"svdmlp {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
