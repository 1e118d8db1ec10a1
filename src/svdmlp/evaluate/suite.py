"""One evaluation run: perplexity on texts and accuracy on lm-eval tasks, under recorded settings.

``svdmlp eval`` and ``svdmlp sweep`` score every model through :func:`score`, so a sweep's points and
an eval's rows mean the same thing, and :func:`provenance` is what every JSON result carries to be
reproducible: the protocol line, versions, seed and the definition of keep.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import torch

from svdmlp import arch
from svdmlp.engine.engine import context_length
from svdmlp.evaluate import harness, perplexity
from svdmlp.versions import installed_versions

KEEP_DEFINITION = (
    "keep = fraction of MLP parameters kept, r*(in+out)/(in*out) per matrix; "
    "the NeuronMLP paper's compression ratio is 1 - keep"
)
# Names ``--tasks`` expands: the paper's six zero-shot tasks, and those plus BoolQ and MathQA.
TASK_GROUPS = {"paper": harness.PAPER_TASKS, "paper+": harness.PAPER_TASKS + harness.EXTRA_TASKS}


def expand_tasks(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Task names with the groups of ``TASK_GROUPS`` expanded, duplicates dropped, order kept."""
    expanded = [task for name in names for task in TASK_GROUPS.get(name, (name,))]
    return tuple(dict.fromkeys(expanded))


@dataclass(frozen=True)
class EvalSettings:
    """How every model of a run is scored (perplexity windows, tasks, seeds)."""

    seq_len: int = 2048
    max_windows: int | None = None
    batch_size: int = 1
    tasks: tuple[str, ...] = ()
    include_path: str | None = None
    limit: int | None = None
    seed: int = 0
    bos: str = "auto"

    def __post_init__(self) -> None:
        if self.bos not in arch.BOS_MODES:
            raise ValueError(f"bos must be one of {arch.BOS_MODES}, got {self.bos!r}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {self.seq_len}")
        if self.max_windows is not None and self.max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {self.max_windows}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        object.__setattr__(self, "tasks", expand_tasks(self.tasks))

    def bos_tokens(self, model, tokenizer) -> tuple[int | None, int | None]:
        """(the BOS id put before every window or None, the one the model's convention asks for or None)."""
        convention = arch.bos_token_id(arch.of_model(model), tokenizer)
        if self.bos == "auto":
            return convention, convention
        if self.bos == "no":
            return None, convention
        if tokenizer.bos_token_id is None:
            raise ValueError("--bos yes: this model's tokenizer defines no BOS token")
        return tokenizer.bos_token_id, convention

    def protocol(self, dtype: torch.dtype, device: str, bos: int | None, convention: int | None) -> str:
        """The perplexity protocol in one line, printed above every result."""
        first = f" (first {self.max_windows})" if self.max_windows else ""
        if bos is None:
            special = (
                "no BOS"
                if convention is None
                else f"no BOS (against the model's convention: BOS {convention})"
            )
        else:
            special = f"BOS {bos} first" + (" (the model's convention)" if bos == convention else " (asked)")
        return (
            f"token-level perplexity: non-overlapping {self.seq_len}-token windows{first}, {special}, "
            f"{str(dtype).removeprefix('torch.')} on {device}"
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["tasks"] = list(self.tasks)
        return data


def score(model, tokenizer, texts: list[tuple[str, str]], settings: EvalSettings, label: str) -> dict:
    """``{"perplexity": {text: ppl}, "tasks": {task: TaskResult dict}, "bos": {...}}`` for one model;
    ``bos`` records the BOS id each sequence started with and the model's convention (None: none)."""
    bos, convention = settings.bos_tokens(model, tokenizer)
    if texts:
        check_window(model, settings.seq_len + (bos is not None), bos is not None)
    ppl = {}
    for name, text in texts:
        windows = perplexity.text_windows(tokenizer, text, settings.seq_len, settings.max_windows)
        result = perplexity.perplexity(model, windows, settings.batch_size, desc=f"{label}: {name}", bos=bos)
        ppl[name] = result.perplexity
    tasks = {}
    if settings.tasks:
        results = harness.run_tasks(
            model,
            tokenizer,
            list(settings.tasks),
            settings.include_path,
            settings.limit,
            settings.batch_size,
            settings.seed,
            add_bos_token=bos is not None,
        )
        tasks = {r.name: r.to_dict() for r in results}
    return {"perplexity": ppl, "tasks": tasks, "bos": {"token_id": bos, "convention": convention}}


def check_window(model, positions: int, with_bos: bool) -> None:
    """Refuse windows longer than the model's context before scoring any: past it the positions are
    ones the model never saw (a perplexity that means nothing), and a window of 100,000 tokens held
    the CPU for minutes in one attention call that no signal interrupts."""
    limit = context_length(model)
    if positions > limit:
        lead = " and its BOS token" if with_bos else ""
        raise ValueError(
            f"a window of {positions - with_bos} tokens{lead} is longer than the model's context of {limit} "
            f"positions (max_position_embeddings): give --seq-len {limit - with_bos} or less"
        )


def ratios_to_dense(dense: dict[str, float], compressed: dict[str, float]) -> dict:
    """``{"ratios": {text: compressed / dense}, "geomean": over them all, "groups": {group: geomean}}``
    over the texts both scored: the per-domain summary every comparison reports (one domain's gain
    cannot hide another's loss the way an arithmetic mean of perplexities lets a low-perplexity domain
    vanish). ``groups`` keeps the held-out domains and the unseen suites apart
    (:func:`svdmlp.corpora.group_of`): a recipe can fit its calibration's kinds of text and lose on
    the rest, and one mean over both would hide it."""
    from svdmlp import corpora

    names = [name for name in compressed if name in dense]
    ratios = {name: compressed[name] / dense[name] for name in names}
    members: dict[str, list[str]] = {}
    for name in names:
        if (group := corpora.group_of(name)) is not None:
            members.setdefault(group, []).append(name)
    return {
        "ratios": ratios,
        "geomean": _geometric_mean(list(ratios.values())),
        "groups": {
            group: {"geomean": _geometric_mean([ratios[n] for n in texts]), "texts": texts}
            for group, texts in members.items()
        },
    }


def _geometric_mean(values: list[float]) -> float | None:
    """The geometric mean of positive ``values`` (None for none)."""
    return statistics.geometric_mean(values) if values else None


def means_line(summary: dict) -> str:
    """``geometric mean: in-domain x1.348 (5 texts), unseen x1.902 (8 texts), all x1.654``; one mean
    alone when every text is in one group or in none."""
    groups = summary["groups"]
    grouped = sum(len(g["texts"]) for g in groups.values())
    if len(groups) == 0 or (len(groups) == 1 and grouped == len(summary["ratios"])):
        return f"geometric mean x{summary['geomean']:.3f}"
    parts = [f"{name} x{g['geomean']:.3f} ({len(g['texts'])} texts)" for name, g in groups.items()]
    return "geometric mean: " + ", ".join([*parts, f"all x{summary['geomean']:.3f}"])


def failures(rows: list[dict]) -> list[str]:
    """One line per task that has no score in some row, with its reason, and per perplexity that is
    not a finite number (finite weights can still overflow in half precision): a run with either
    exits 1, so that a script never takes a NaN for a result."""
    lines = [
        f"perplexity of {name} on {row['kind']} is {value}: the model's outputs overflowed or the "
        "text has no scorable token; try --dtype float32"
        for row in rows
        for name, value in row.get("perplexity", {}).items()
        if not math.isfinite(value)
    ]
    return lines + [
        f"task {task} failed on {row['kind']}: {result['error']}"
        for row in rows
        for task, result in row.get("tasks", {}).items()
        if result["error"]
    ]


def provenance(settings: EvalSettings, dtype: torch.dtype, device: str, bos: dict) -> dict:
    """What a JSON result records besides its numbers, so that it can be reproduced and compared
    (``bos``: what :func:`score` recorded of the BOS token)."""
    versions = installed_versions(("svdmlp", "torch", "transformers", "lm_eval"))
    return {
        "protocol": settings.protocol(dtype, device, bos["token_id"], bos["convention"]),
        "bos": bos,
        "settings": settings.to_dict(),
        "seed": settings.seed,
        "keep_definition": KEEP_DEFINITION,
        "versions": versions,
    }
