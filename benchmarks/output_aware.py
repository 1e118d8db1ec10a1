"""Output-aware (two-sided, K-FAC) SVD against input whitening on a real model, one-shot, uniform ranks.

Every layer is factorised from the dense model's statistics: the input Grams ``XᵀX`` (what
``svdmlp compress`` whitens by today) and, for the output-aware variants, the output-gradient Grams
``G_out`` of :mod:`svdmlp.compression.output_grams` (the true Fisher from sampled tokens, or the
empirical one from the window's own next tokens), optionally damped towards the identity
(``G_out + λ·mean(diag)·I``, :meth:`svdmlp.compression.decompose.Whitening.from_gram`).

Calibration is an equal mixture of Shakespeare (calibration plays), GSM8K and Python source (the
standard library's ``json/``, ``collections/__init__.py``, ``functools.py``, ``typing.py``). λ is chosen
on a validation set drawn from the calibration texts (another seed); perplexity is then scored on
domains outside the calibration: Shakespeare's held-out plays, ``argparse.py`` + ``dataclasses.py``,
and the prose of ``pydoc_data/topics.py``. Results go to a Markdown file as they come.

    python benchmarks/output_aware.py                      # the full experiment (~25 min on 2 cores)
    python benchmarks/output_aware.py --quick              # a smoke run of the same code path
"""

from __future__ import annotations

import argparse
import copy
import math
import resource
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from svdmlp import arch, corpora, lowrank, models
from svdmlp.compression import calibration, decompose, output_grams, ranks
from svdmlp.evaluate.perplexity import perplexity, text_windows

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CALIBRATION_PYTHON = ("json", "collections/__init__.py", "functools.py", "typing.py")
HELDOUT_PYTHON = ("argparse.py", "dataclasses.py")
TOPICS = "pydoc_data/topics.py"


def python_files(names) -> list[Path]:
    files = []
    for name in names:
        path = STDLIB / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return files


def read_files(files: list[Path]) -> str:
    return "\n\n".join(path.read_text(encoding="utf-8") for path in files)


def topics_prose() -> str:
    namespace: dict = {}
    exec(compile((STDLIB / TOPICS).read_text(encoding="utf-8"), TOPICS, "exec"), namespace)
    return "\n\n".join(namespace["topics"].values())


def line_overlap(text: str, reference: str) -> float:
    """Fraction of ``text``'s long lines (40+ characters, stripped) that occur verbatim in ``reference``."""
    seen = {line.strip() for line in reference.splitlines()}
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 40]
    return sum(line in seen for line in lines) / max(1, len(lines))


@dataclass(frozen=True)
class Variant:
    """How each projection is weighted on its output side: None (input whitening only) or
    ``(loss, damping)``, the output-gradient Gram of that loss damped by that λ."""

    name: str
    label: str
    output: dict[str, tuple[str, float] | None]

    @classmethod
    def uniform(cls, name, label, choice) -> Variant:
        return cls(name, label, dict.fromkeys(arch.PROJECTIONS, choice))


def relative_error(weight, factors, input_gram, output_gram=None) -> float:
    """:func:`decompose.weighted_relative_error` in float32 (a diagnostic column: 4 digits suffice, and
    float64 GEMMs would cost minutes over 90 projections and a dozen weightings on 2 shared cores)."""
    w = weight.detach().float()
    err = w - factors.v.float() @ factors.u.float()
    gi = input_gram.float()
    go = None if output_gram is None else output_gram.float()

    def square(m):
        return ((m if go is None else go @ m) * (m @ gi)).sum()

    return float((square(err).clamp(min=0) / square(w)).sqrt())


@dataclass
class Factoriser:
    """Factors and their errors per (layer, projection, output weighting), each computed once and
    shared by every variant that uses them."""

    model: torch.nn.Module
    spec: arch.ArchSpec
    input_grams: dict
    output_grams: dict  # loss -> {layer: OutputGrams}
    ranks_by_name: dict[str, int]
    fisher: str  # the loss whose raw Gram defines the two-sided error
    cache: dict = field(default_factory=dict)

    def factors(self, index: int, name: str, choice) -> tuple[decompose.Factors, float, float]:
        key = (index, name, choice)
        if key not in self.cache:
            weight = arch.dense_projection(self.model, self.spec, index, name).weight
            whitening = self.input_grams[index].whitening(name)
            output = (
                None if choice is None else self.output_grams[choice[0]][index].whitening(name, choice[1])
            )
            factors = decompose.Decomposition.of(weight, whitening, output).factors(self.ranks_by_name[name])
            gram = self.input_grams[index].input_gram(name)
            fisher = self.output_grams[self.fisher][index].gram(name)
            errors = relative_error(weight, factors, gram), relative_error(weight, factors, gram, fisher)
            self.cache[key] = (factors, *errors)
        return self.cache[key]

    def compressed(self, variant: Variant) -> tuple[torch.nn.Module, dict]:
        """A copy of the dense model with every layer factorised as ``variant`` says, and its mean
        relative errors: input-weighted and two-sided on the raw ``fisher`` Gram."""
        model = copy.deepcopy(self.model)
        errors = {"input": [], "two_sided": []}
        for index in sorted(self.input_grams):
            factors = {}
            for name in arch.PROJECTIONS:
                factors[name], input_error, two_sided = self.factors(index, name, variant.output[name])
                errors["input"].append(input_error)
                errors["two_sided"].append(two_sided)
            dense = arch.dense_projection(model, self.spec, index, "gate").weight
            lowrank.install(model, self.spec, index, self.ranks_by_name, dense.dtype, dense.device, factors)
        return model, {key: sum(v) / len(v) for key, v in errors.items()}


class Report:
    """The Markdown results file, rewritten after every new line so that a cut run keeps its results."""

    def __init__(self, path: Path, header: list[str]):
        self.path, self.lines = path, list(header)
        self.flush()

    def add(self, *lines: str) -> None:
        self.lines += lines
        for line in lines:
            print(line, flush=True)
        self.flush()

    def flush(self) -> None:
        self.path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=models.DEFAULT_MODEL)
    parser.add_argument("--keep", type=float, default=0.8)
    parser.add_argument("--align", type=int, default=32)
    parser.add_argument("--calib-samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-windows", type=int, default=8)
    parser.add_argument("--val-windows", type=int, default=1, help="validation windows per calibration text")
    parser.add_argument(
        "--dampings",
        default="0.1,1",
        help="λ grid for the validation (besides 0; extended ×10 while the largest wins)",
    )
    parser.add_argument("--losses", default="sampled,labels", help="output-gradient losses to collect")
    parser.add_argument("--layers", type=int, default=None, help="compress only the first N layers")
    # 2 at most (the machine's cores, shared); under another process's load 1 thread ran eigh 2.5x faster.
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/output_aware_results.md"))
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, short windows")
    args = parser.parse_args()
    if args.quick:
        args.calib_samples, args.seq_len, args.eval_windows, args.layers = 3, 64, 1, 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    losses = [loss for loss in args.losses.split(",") if loss]
    fisher = losses[0]  # the loss whose raw Gram defines the two-sided error column
    dampings = [float(d) for d in args.dampings.split(",") if d]

    started = time.perf_counter()
    model, tokenizer, location = models.load_dense(args.model)
    spec = arch.of_model(model)
    bos = arch.bos_token_id(spec, tokenizer)
    layers = arch.decoder_layers(model, spec)
    indices = list(range(len(layers) if args.layers is None else args.layers))
    gate = arch.dense_projection(model, spec, 0, "gate")
    shapes = {
        "gate": (gate.in_features, gate.out_features),
        "up": (gate.in_features, gate.out_features),
        "down": (gate.out_features, gate.in_features),
    }
    ranks_by_name = ranks.uniform_ranks(shapes, args.keep, args.align)

    calib_files = python_files(CALIBRATION_PYTHON)
    heldout_files = python_files(HELDOUT_PYTHON)
    assert not set(calib_files) & set(heldout_files) and STDLIB / TOPICS not in calib_files
    calib_texts = {
        "shakespeare": corpora.read_text("shakespeare"),
        "gsm8k": corpora.read_text("gsm8k"),
        "python": read_files(calib_files),
    }
    eval_texts = {
        "shakespeare-heldout": corpora.read_text("shakespeare-heldout"),
        "python (argparse, dataclasses)": read_files(heldout_files),
        "prose (pydoc topics)": topics_prose(),
    }
    calib_all = "\n".join(calib_texts.values())
    overlaps = {name: line_overlap(text, calib_all) for name, text in eval_texts.items()}

    mixture = [(text, 1.0) for text in calib_texts.values()]
    windows = arch.with_bos(
        calibration.mixture_windows(tokenizer, mixture, args.calib_samples, args.seq_len, 0), bos
    )
    val_count = args.val_windows * len(mixture)
    val_windows = calibration.mixture_windows(tokenizer, mixture, val_count, args.seq_len, 1)
    # The validation windows must not be calibration windows (another seed; checked, not assumed).
    calib_rows = {tuple(row) for row in windows[:, windows.shape[1] - args.seq_len :].tolist()}
    assert not any(tuple(row) in calib_rows for row in val_windows.tolist())
    eval_windows = {
        name: text_windows(tokenizer, text, args.seq_len, args.eval_windows)
        for name, text in eval_texts.items()
    }

    report = Report(
        args.out,
        [
            "# Output-aware (two-sided) SVD vs input whitening",
            "",
            f"model `{location}`, keep {args.keep} uniform (align {args.align}): ranks {ranks_by_name}, "
            f"{len(indices)} layers, one-shot; calibration {args.calib_samples} × {args.seq_len} tokens, equal "
            f"mixture of {', '.join(calib_texts)} (Python: {', '.join(CALIBRATION_PYTHON)}); validation "
            f"{val_count} × {args.seq_len} from the same texts (seed 1); evaluation {args.eval_windows} × "
            f"{args.seq_len} per domain; {args.threads} threads.",
            "",
            "Held-out domains' long lines found verbatim in the calibration texts: "
            + ", ".join(f"{name} {100 * share:.1f}%" for name, share in overlaps.items())
            + f" (files: calibration {[p.name for p in calib_files]}, held-out {[p.name for p in heldout_files]}, "
            f"{TOPICS}).",
            "",
        ],
    )
    report.add(f"- load and windows: {time.perf_counter() - started:.1f} s")

    tick = time.perf_counter()
    input_grams = calibration.collect_grams(model, spec, windows, indices, progress=False)
    report.add(
        f"- input Grams (forward only, stops after the last layer): {time.perf_counter() - tick:.1f} s"
    )
    out_grams: dict = {}

    def collect(loss: str) -> None:
        tick = time.perf_counter()
        out_grams[loss] = output_grams.collect_output_grams(
            model, spec, windows, indices, loss=loss, progress=False
        )
        collected = time.perf_counter() - tick
        tick = time.perf_counter()
        for index in indices:
            for name in arch.PROJECTIONS:
                out_grams[loss][index].whitening(name)
        size = sum(
            g.numel() * g.element_size() for e in out_grams[loss].values() for g in (e.gate, e.up, e.down)
        )
        report.add(
            f"- output-gradient Grams, loss {loss!r}: forward + backward {collected:.1f} s, "
            f"eigendecompositions {time.perf_counter() - tick:.1f} s, {size / 2**30:.2f} GiB (float64)"
        )

    collect(fisher)
    tick = time.perf_counter()
    for index in indices:
        for name in arch.PROJECTIONS:
            input_grams[index].whitening(name)
    size = sum((e.gate_up.numel() + e.down.numel()) * 8 for e in input_grams.values())
    report.add(
        f"- input Grams' eigendecompositions: {time.perf_counter() - tick:.1f} s, {size / 2**30:.2f} GiB"
    )
    factoriser = Factoriser(model, spec, input_grams, out_grams, ranks_by_name, fisher)

    def score(compressed, windows_by_name) -> dict[str, float]:
        return {
            name: perplexity(compressed, w, batch_size=1, progress=False, bos=bos).perplexity
            for name, w in windows_by_name.items()
        }

    # Validation: λ for the Fisher weighting, chosen on the calibration texts' own held-out windows.
    report.add("", f"## Validation (calibration texts, {val_count} windows): choosing λ", "")
    report.add(
        "| variant | val ppl | input-weighted err | two-sided err | factorise s | score s |",
        "|---|---|---|---|---|---|",
    )
    val_ppl = {}

    def validate(variant: Variant) -> float:
        tick = time.perf_counter()
        compressed, errors = factoriser.compressed(variant)
        mid = time.perf_counter()
        val_ppl[variant.name] = score(compressed, {"val": val_windows})["val"]
        report.add(
            f"| {variant.label} | {val_ppl[variant.name]:.3f} | {errors['input']:.4f} | {errors['two_sided']:.4f} "
            f"| {mid - tick:.1f} | {time.perf_counter() - mid:.1f} |"
        )
        return val_ppl[variant.name]

    def damped(loss: str, damping: float, label: str = "") -> Variant:
        return Variant.uniform(f"{loss}-{damping:g}", label or f"{loss} λ={damping:g}", (loss, damping))

    validate(Variant.uniform("input", "input whitening", None))
    grid = {d: validate(damped(fisher, d)) for d in [0.0, *dampings]}
    while min(grid, key=grid.get) == max(grid) and len(grid) < len(dampings) + 3:  # best at the edge: go on
        grid[10 * max(grid)] = validate(damped(fisher, 10 * max(grid)))
    best = min(grid, key=grid.get)
    report.add("", f"Chosen λ = {best:g} (lowest validation perplexity among the {fisher} weightings).", "")

    report.add("## Held-out perplexity", "")
    names = list(eval_windows)
    report.add(
        "| method | " + " | ".join(names) + " | geo-mean ratio | input err | two-sided err | s |",
        "|---|" + "---|" * (len(names) + 4),
    )
    tick = time.perf_counter()
    dense = score(model, eval_windows)
    report.add(
        "| dense | "
        + " | ".join(f"{dense[n]:.3f}" for n in names)
        + f" | 1 | 0 | 0 | {time.perf_counter() - tick:.0f} |"
    )

    def evaluate(variant: Variant) -> None:
        tick = time.perf_counter()
        compressed, errors = factoriser.compressed(variant)
        ppl = score(compressed, eval_windows)
        ratios = [ppl[n] / dense[n] for n in names]
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        cells = " | ".join(f"{ppl[n]:.3f} (×{r:.4f})" for n, r in zip(names, ratios, strict=True))
        report.add(
            f"| {variant.label} | {cells} | **{geomean:.4f}** | {errors['input']:.4f} "
            f"| {errors['two_sided']:.4f} | {time.perf_counter() - tick:.0f} |"
        )

    evaluate(Variant.uniform("input", "(a) input whitening", None))
    evaluate(damped(fisher, 0.0, f"(b) two-sided, {fisher} raw"))
    evaluate(damped(fisher, best, f"(c) two-sided, {fisher} λ={best:g}"))
    only = {"gate": (fisher, best), "up": (fisher, best), "down": None}
    evaluate(Variant("gate-up", f"(d1) {fisher} λ={best:g} on gate/up only", only))
    only = {"gate": None, "up": None, "down": (fisher, best)}
    evaluate(Variant("down", f"(d2) {fisher} λ={best:g} on down only", only))
    for loss in losses[1:]:
        collect(loss)
        evaluate(damped(loss, 0.0, f"(b') two-sided, {loss} raw"))
        evaluate(damped(loss, best, f"(c') two-sided, {loss} λ={best:g}"))
    report.add(
        "",
        "Errors: mean over the compressed projections of the relative input-weighted error "
        "‖(W−W')Xᵀ‖/‖WXᵀ‖ and of the two-sided one ‖S_out(W−W')S_in‖/‖S_out W S_in‖ on the "
        f"raw {fisher} Gram (float32). Seconds: factorising (each weighting's factors once, shared) and scoring.",
        "",
        f"- total: {(time.perf_counter() - started) / 60:.1f} min, peak RSS {peak_rss_gib():.1f} GiB",
    )


if __name__ == "__main__":
    main()
