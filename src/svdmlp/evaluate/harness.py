"""Zero-shot accuracy through lm-evaluation-harness, on the model object in memory.

The literature's accuracies come from lm-eval's task code, so we run that code rather than our own
copy of it: ``HFLM(pretrained=model)`` wraps the (compressed) model as it is, with no need to save
it in a layout lm-eval can load. Each task runs on its own, so that one which cannot load (no
network for a hub data set, a broken local YAML, a typo) is reported as failed, with the reason,
while the others still run: a result table never silently loses a column.

Multiple-choice tasks report both ``acc`` and ``acc_norm`` (length-normalised): papers print one or
the other, and on HellaSwag the two differ by up to 0.2.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass, field

import torch.nn as nn

# The NeuronMLP paper's six zero-shot tasks, then two more that SVD papers often add.
PAPER_TASKS = ("arc_easy", "arc_challenge", "openbookqa", "hellaswag", "piqa", "winogrande")
EXTRA_TASKS = ("boolq", "mathqa")
# Reported per task when the task defines them (BoolQ has no acc_norm), each with its stderr.
METRICS = ("acc", "acc_norm")


@dataclass(frozen=True)
class TaskResult:
    """One task's scores, or the reason it has none (``error``)."""

    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    samples: int | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    def to_dict(self) -> dict:
        return asdict(self)


def run_tasks(
    model: nn.Module,
    tokenizer,
    names: list[str],
    include_path: str | None = None,
    limit: int | None = None,
    batch_size: int = 1,
    seed: int = 0,
    add_bos_token: bool = False,
) -> list[TaskResult]:
    """Score ``model`` on each lm-eval task in ``names`` (zero-shot), in order; never raises per task.

    Args:
        include_path: a folder of extra task YAMLs (e.g. local JSONL tasks, see
            :mod:`svdmlp.evaluate.tasks`), searched besides lm-eval's own registry.
        limit: score only the first ``limit`` documents of each task (quick runs).
        seed: every seed lm-eval takes (sampling of documents, few-shot examples).
        add_bos_token: start every request with the tokenizer's BOS token (the model's convention).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError:
        reason = "lm-eval is not installed: pip install 'svdmlp[eval]'"
        return [TaskResult(name, error=reason) for name in names]

    for logger in ("lm-eval", "lm_eval"):  # per-task progress lines drown the table otherwise
        logging.getLogger(logger).setLevel(logging.ERROR)
    manager = _task_manager(TaskManager, include_path, defaults=False) if include_path else None
    if manager is None or not set(names) <= set(manager.all_tasks):
        manager = _task_manager(TaskManager, include_path, defaults=True)
    device = next(model.parameters()).device
    lm = HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=batch_size,
        device=str(device),
        add_bos_token=add_bos_token,
    )
    results = []
    for name in names:
        if name not in manager.all_tasks:
            where = f"lm-eval's registry or {include_path}" if include_path else "lm-eval's registry"
            results.append(TaskResult(name, error=f"unknown task {name!r}: not in {where}"))
            continue
        try:
            output = simple_evaluate(
                model=lm,
                tasks=[name],
                limit=limit,
                task_manager=manager,
                log_samples=False,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
            )
        except Exception as err:  # loading data raises anything (ConnectionError, DatasetNotFoundError, ...)
            message = str(err).strip().splitlines()[0] if str(err).strip() else ""
            results.append(TaskResult(name, error=f"{type(err).__name__}: {message}".rstrip(": ")))
            continue
        results.append(_task_result(name, output))
    return results


@functools.cache
def _task_manager(factory, include_path: str | None, defaults: bool):
    """lm-eval's task index; indexing its own ~15,000 task YAMLs takes 15 s, so only when needed."""
    return factory(include_path=include_path, include_defaults=defaults)


def _task_result(name: str, output: dict) -> TaskResult:
    """Pick ``acc``/``acc_norm`` and their stderr out of lm-eval's ``"acc,none"``-style keys."""
    scores = output["results"].get(name, {})
    metrics = {}
    for key, value in scores.items():
        metric, _, _filter = key.partition(",")
        if metric.removesuffix("_stderr") in METRICS and isinstance(value, (int, float)):
            metrics[metric] = float(value)
    if not metrics:
        return TaskResult(name, error=f"task reported none of {list(METRICS)}: {sorted(scores)}")
    samples = output.get("n-samples", {}).get(name, {}).get("effective")
    return TaskResult(name, metrics, samples)
