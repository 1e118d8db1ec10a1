"""One evaluation run: perplexity on texts and accuracy on lm-eval tasks, under recorded settings.

``svdmlp eval`` and ``svdmlp sweep`` score every model through :func:`score`, so a sweep's points and
an eval's rows mean the same thing, and :func:`provenance` is what every JSON result carries to be
reproducible: the protocol line, versions, seed and the definition of keep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

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

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {self.seq_len}")
        if self.max_windows is not None and self.max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {self.max_windows}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        object.__setattr__(self, "tasks", expand_tasks(self.tasks))

    def protocol(self, dtype: torch.dtype, device: str) -> str:
        """The perplexity protocol in one line, printed above every result."""
        first = f" (first {self.max_windows})" if self.max_windows else ""
        return (
            f"token-level perplexity: non-overlapping {self.seq_len}-token windows{first}, no BOS, "
            f"{str(dtype).removeprefix('torch.')} on {device}"
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["tasks"] = list(self.tasks)
        return data


def score(model, tokenizer, texts: list[tuple[str, str]], settings: EvalSettings, label: str) -> dict:
    """``{"perplexity": {text: ppl}, "tasks": {task: TaskResult dict}}`` for one model."""
    ppl = {}
    for name, text in texts:
        windows = perplexity.text_windows(tokenizer, text, settings.seq_len, settings.max_windows)
        result = perplexity.perplexity(model, windows, settings.batch_size, desc=f"{label}: {name}")
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
        )
        tasks = {r.name: r.to_dict() for r in results}
    return {"perplexity": ppl, "tasks": tasks}


def failures(rows: list[dict]) -> list[str]:
    """One line per task that has no score in some row, with its reason."""
    return [
        f"task {task} failed on {row['kind']}: {result['error']}"
        for row in rows
        for task, result in row.get("tasks", {}).items()
        if result["error"]
    ]


def provenance(settings: EvalSettings, dtype: torch.dtype, device: str) -> dict:
    """What a JSON result records besides its numbers, so that it can be reproduced and compared."""
    versions = installed_versions(("svdmlp", "torch", "transformers", "lm_eval"))
    return {
        "protocol": settings.protocol(dtype, device),
        "settings": settings.to_dict(),
        "seed": settings.seed,
        "keep_definition": KEEP_DEFINITION,
        "versions": versions,
    }
