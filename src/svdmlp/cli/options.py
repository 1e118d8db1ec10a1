"""The options more than one command takes: each declared once here and read once, into a typed value.

Every ``add_*`` declares a group of options on a command's parser; the function beside it turns the
parsed values into what the library takes (a :class:`~svdmlp.config.CalibrationSpec`, an
:class:`~svdmlp.evaluate.suite.EvalSettings`, a device and dtype...). Nothing here imports torch at
import time: ``svdmlp --help`` stays quick.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from svdmlp.arch import BOS_MODES
from svdmlp.backends import BACKENDS
from svdmlp.config import (
    CALIB_TOKENS_PER_WIDTH,
    EFFORTS,
    FACTOR_BITS,
    CalibrationSpec,
    Effort,
    LoraSpec,
    checked_keep,
)
from svdmlp.paths import write_output

DTYPES = ("float32", "bfloat16", "float16")
# The built-in models (svdmlp.models.PACKAGED, which this module does not import: it loads torch).
BUILT_IN_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m")
MODEL_HELP = (
    f"built-in model ({', '.join(BUILT_IN_MODELS)}), .gguf file, model directory or hub id "
    f"(default: {BUILT_IN_MODELS[0]})"
)


def comma_list(kind: Callable[[str], object] = str) -> Callable[[str], tuple]:
    """An argparse type: ``"a,b"`` -> ``(kind("a"), kind("b"))``, blanks dropped, a usage error otherwise."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


# --- numbers checked as they are parsed: a usage error (exit 2) before anything loads ---------------


def _number(text: str, kind: type) -> float:
    """``text`` as an int or a finite float; an argparse usage error otherwise (nan, inf, words)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _within(kind: type, accepts: Callable[[float], bool], expected: str) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` that ``accepts``; a usage error naming ``expected`` otherwise."""

    def parse(text: str) -> float:
        value = _number(text, kind)
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value:g}")
        return value

    return parse


# Counts, lengths and sizes; a memory budget in GB (nan, inf or -1 refused); a temperature; top-p.
positive_int = _within(int, lambda value: value >= 1, "an integer >= 1")
positive_float = _within(float, lambda value: value > 0, "a number > 0")
nonnegative_float = _within(float, lambda value: value >= 0, "a number >= 0")
probability = _within(float, lambda value: 0 < value <= 1, "a number in (0, 1]")


def keep_fraction(text: str) -> float:
    """An argparse type: a keep that :func:`svdmlp.config.checked_keep` accepts (in [MIN_KEEP, 1])."""
    try:
        return checked_keep(_number(text, float))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class Extend(argparse.Action):
    """With a :func:`comma_list` type: ``--keep 0.9,0.8 --keep 0.7`` is ``(0.9, 0.8, 0.7)``, a repeated
    flag adding to the list (argparse's own store would keep only the last one, silently), a value
    given again counted once (``--batch 1 --batch 1`` is ``(1,)``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        before = getattr(namespace, self.dest)
        added = values if before is self.default else (*before, *values)
        setattr(namespace, self.dest, tuple(dict.fromkeys(added)))


# --- where and how a command runs ---------------------------------------------------------------


def add_runtime(parser: argparse.ArgumentParser, dtype: bool = True, backend: bool = True) -> None:
    """``--device`` (and ``--dtype``, ``--backend``): every command that runs a model."""
    parser.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)"
    )
    if dtype:
        parser.add_argument(
            "--dtype",
            choices=DTYPES,
            default=None,
            help="compute dtype (default: bfloat16 on CUDA, float32 on CPU)",
        )
    if backend:
        parser.add_argument(
            "--backend",
            choices=BACKENDS,
            default="auto",
            help="kernels for low-rank layers (default auto: triton on CUDA, torch elsewhere)",
        )


def runtime(args: argparse.Namespace):
    """(torch.device, torch.dtype) of ``--device`` and ``--dtype`` (see :func:`svdmlp.runtime.resolve`)."""
    from svdmlp.runtime import quiet_transformers, resolve

    quiet_transformers()
    return resolve(args.device, getattr(args, "dtype", None))


# --- compression --------------------------------------------------------------------------------


def model_shapes(name: str | None):
    """The :class:`~svdmlp.compression.footprint.Shapes` of model ``name`` from its config alone (no
    weights read). Compression reads any model's weights from disk, a hub model's once downloaded
    (:func:`svdmlp.models.load_for_compression`), so its predictions are for a model on disk."""
    from svdmlp import models
    from svdmlp.compression import footprint

    return footprint.Shapes.of_config(models.load_config(name)[1])


def add_effort(parser: argparse.ArgumentParser) -> None:
    """``--effort``: the named budget whose recipe and budgets fill every option not given (compress, sweep)."""
    parser.add_argument(
        "--effort",
        choices=EFFORTS,
        default="default",
        help="the recipe and budgets of every option below not given: "
        + "; ".join(f"{name}: {effort.about}" for name, effort in EFFORTS.items())
        + " (default: default)",
    )


def add_factor_bits(parser: argparse.ArgumentParser, help: str) -> None:
    """``--factor-bits 16|8|4``: the width one model's factors are stored or scored in (``compress``,
    ``eval``)."""
    parser.add_argument(
        "--factor-bits", type=int, choices=sorted(FACTOR_BITS, reverse=True), default=16, help=help
    )


def add_align(parser: argparse.ArgumentParser) -> None:
    """``--align``: rank alignment (``compress`` and ``sweep``)."""
    parser.add_argument(
        "--align", type=positive_int, default=32, help="ranks are multiples of this (default 32)"
    )


def add_calibration(parser: argparse.ArgumentParser, samples: int | None = 32, what: str = "") -> None:
    """The calibration text (``compress``, ``sweep``, and ``eval --gptq``, whose help says ``what`` it is
    for); ``samples`` is ``--calib-samples``' default (None: set later, by ``--effort``)."""
    parser.add_argument(
        "--calib",
        default="general",
        metavar="SOURCE[:WEIGHT],...",
        help=f"calibration text{what}: 'general' (default: the five built-in domains shakespeare, gsm8k, "
        "python, prose, chat at equal weights), one of them, 'languages' (22 other languages), 'web' "
        "(HTML, JavaScript, CSS), 'self' (the model's own samples) or a file; a comma-separated list with "
        "weights mixes them, e.g. general:5,languages:1,web:1 or general:3,notes.txt:1",
    )
    parser.add_argument(
        "--calib-samples",
        type=positive_int,
        default=samples,
        help=f"calibration windows (default {samples})"
        if samples is not None
        else "calibration windows (default: as --effort says, 32, more for a wide MLP: about "
        f"{CALIB_TOKENS_PER_WIDTH} tokens per unit of its intermediate width, to the nearest multiple of "
        "32; Qwen2.5-Coder-0.5B 128, Qwen2.5-Coder-1.5B 224)",
    )
    parser.add_argument(
        "--calib-seq-len", type=positive_int, default=512, help="tokens per calibration window (default 512)"
    )


def calibration_windows(args: argparse.Namespace, effort: Effort, inter: int) -> int:
    """``--calib-samples`` if given, else ``effort``'s count for an MLP ``inter`` wide (compress, sweep)."""
    if args.calib_samples is not None:
        return args.calib_samples
    return effort.calibration_windows(inter, args.calib_seq_len)


def calibration_spec(args: argparse.Namespace) -> CalibrationSpec:
    return CalibrationSpec(args.calib, args.calib_samples, args.calib_seq_len)


def add_lora(parser: argparse.ArgumentParser, steps: int | None = LoraSpec.steps) -> None:
    """The knobs of distillation healing ("lora"), shared by compress and sweep; ``steps`` is
    ``--heal-steps``' default (None: set later, by ``--effort``)."""
    parser.add_argument(
        "--heal-steps",
        type=positive_int,
        default=steps,
        help=f"lora: training steps (default {steps if steps is not None else 'as --effort says'})",
    )
    parser.add_argument(
        "--heal-relative-lr",
        type=positive_float,
        default=LoraSpec.relative_lr,
        help="lora: each factor's peak learning rate as a fraction of its RMS (default %(default)s)",
    )
    parser.add_argument(
        "--heal-lr",
        type=positive_float,
        default=LoraSpec.lr,
        help="lora: one fixed peak learning rate for every factor instead (default: each its own)",
    )
    parser.add_argument(
        "--heal-seq-len",
        type=positive_int,
        default=LoraSpec.seq_len,
        help="lora: tokens per step (default %(default)s)",
    )


def lora_spec(args: argparse.Namespace, steps: int | None = None) -> LoraSpec:
    """The healing flags' spec; ``steps`` when given stands for ``--heal-steps``."""
    steps = args.heal_steps if steps is None else steps
    return LoraSpec(steps, args.heal_lr, args.heal_seq_len, args.heal_relative_lr)


# --- evaluation ---------------------------------------------------------------------------------


def add_perplexity(parser: argparse.ArgumentParser, default_texts: str) -> None:
    """Perplexity texts, literature sets and windows (``eval`` and ``sweep``); ``default_texts`` is
    --text's default, in words."""
    parser.add_argument(
        "--text",
        action="append",
        default=None,
        help=(
            "text file, built-in source (python-heldout, report-latex) or suite of unseen texts (dev, report) "
            f"(repeatable; default: {default_texts})"
        ),
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
        "--seq-len",
        type=positive_int,
        default=2048,
        help="tokens per window (default 2048, as in the literature)",
    )
    parser.add_argument(
        "--max-windows", type=positive_int, default=None, help="score only the first N windows of each text"
    )
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument(
        "--bos",
        choices=BOS_MODES,
        default="auto",
        help="a BOS token before each window: auto follows the model's convention (Gemma: always; others: "
        "as their tokenizer says), no is the literature's protocol on Llama models (default auto)",
    )


def add_tasks(parser: argparse.ArgumentParser) -> None:
    """lm-eval zero-shot tasks (``eval`` and ``sweep``)."""
    parser.add_argument(
        "--tasks",
        type=comma_list(),
        action=Extend,
        default=(),
        metavar="NAME[,NAME]",
        help="lm-eval tasks, e.g. arc_easy,hellaswag; 'paper' = the paper's six, 'paper+' adds boolq,mathqa",
    )
    parser.add_argument(
        "--include-path", default=None, metavar="DIR", help="folder of extra lm-eval task YAMLs (local tasks)"
    )
    parser.add_argument(
        "--limit", type=positive_int, default=None, help="score only the first N documents per task"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds lm-eval (and a sweep's calibration; default 0)"
    )


def eval_settings(args: argparse.Namespace):
    """The :class:`~svdmlp.evaluate.suite.EvalSettings` of ``add_perplexity`` and ``add_tasks``."""
    from svdmlp.evaluate import suite

    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise FileNotFoundError(f"--include-path {args.include_path} is not a directory")
    return suite.EvalSettings(
        seq_len=args.seq_len,
        max_windows=args.max_windows,
        batch_size=args.batch_size,
        tasks=args.tasks,
        include_path=args.include_path,
        limit=args.limit,
        seed=args.seed,
        bos=args.bos,
    )


def eval_sources(args: argparse.Namespace, default: tuple[str, ...] = ()) -> list[str]:
    """The names of what to score, checked now (before any model loads): ``--text`` sources, or
    ``default`` when there is no ``--text`` and no ``--dataset`` (naming a perplexity set replaces
    the default texts), then each ``--dataset`` set. Every name must be distinct: it keys the results.
    """
    from svdmlp import corpora
    from svdmlp.evaluate import datasets

    files = data_files(args)
    unknown = sorted(set(files) - set(args.dataset))
    if unknown:
        raise ValueError(f"--data-files given for {unknown}, which are not among --dataset {args.dataset}")
    sources = corpora.expand(args.text or ([] if args.dataset else list(default)))
    names = [*sources, *args.dataset]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{repeated} named more than once among --text and --dataset")
    for source in sources:
        corpora.check_source(source)
    for name in args.dataset:
        datasets.check(name, files.get(name))
    return names


def data_files(args: argparse.Namespace) -> dict[str, str]:
    """``--data-files SET=PATH`` as ``{SET: PATH}``."""
    files = {}
    for item in args.data_files:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--data-files expects SET=PATH, got {item!r}")
        files[name] = path
    return files


def eval_texts(args: argparse.Namespace, names: list[str], tokenizer) -> list[tuple[str, str]]:
    """(name, text) of each of :func:`eval_sources`' ``names``: built-in and file texts (``chat`` in
    ``tokenizer``'s chat template), then the ``--dataset`` sets, from their ``--data-files`` copy
    when one is given."""
    from svdmlp import corpora
    from svdmlp.evaluate import datasets

    files = data_files(args)
    return [
        (
            name,
            datasets.load_text(name, files.get(name))
            if name in args.dataset
            else corpora.read_text(name, tokenizer),
        )
        for name in names
    ]


# --- machine-readable output --------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a command ends with: its exit status and the record that ``--json`` writes (None: none)."""

    code: int = 0
    record: dict | None = None


# svdmlp.engine.engine.COMPILE_MODES, named here so that ``--help`` does not import torch (a test keeps
# the two equal).
COMPILE_MODES = ("default", "max-autotune")


def add_compile(parser: argparse.ArgumentParser, what: str) -> None:
    """``--compile`` and ``--compile-mode MODE`` (which implies it): the engine's decode step compiled
    (``Engine(compile=..., compile_mode=...)``; read with :func:`compile_mode`)."""
    parser.add_argument(
        "--compile",
        action="store_true",
        help=f"torch.compile {what} decode step (full graph, static shapes) before it is captured: on a "
        "GPU about 40%% less time per token, after 20-40 s of compiling",
    )
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default=None,
        help="implies --compile; max-autotune also times inductor's matmul kernels against cuBLAS for each "
        "of the step's shapes (minutes more to compile; default: default)",
    )


def compile_mode(args: argparse.Namespace) -> str | None:
    """The engine's compile mode the flags ask for, or None for no compiling."""
    if args.compile_mode is not None:
        return args.compile_mode
    return "default" if args.compile else None


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json FILE``, the same on every command: the result as JSON to FILE, or with ``-`` to
    standard output (the human-readable report then goes to standard error)."""
    parser.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help=f"write {what} as JSON to FILE ('-': standard output, the report moving to standard error)",
    )


def write_json(record: dict, target: str) -> None:
    """Write ``record`` to ``target`` ('-' for standard output; a file as :func:`svdmlp.paths.write_output`
    writes one: through links, never over a directory or a device)."""
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_output(target, text)
