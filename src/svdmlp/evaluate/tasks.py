"""Local multiple-choice tasks for lm-eval: a JSONL file and a YAML that points at it.

Hub tasks need a network; a local task in the same format (``dataset_path: json``) runs anywhere,
through the same lm-eval code path. Records are ``{"question", "choices", "label"}`` with ``label``
the index of the right choice, scored like ARC: ``Question: ...\\nAnswer:`` followed by each choice,
with ``acc`` and ``acc_norm``.
"""

from __future__ import annotations

import json
from pathlib import Path

_TEMPLATE = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{choices}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_multiple_choice_task(directory: str | Path, name: str, records: list[dict]) -> Path:
    """Write ``NAME.jsonl`` and ``NAME.yaml`` into ``directory`` (an lm-eval ``--include-path``).

    Returns:
        The YAML's path.
    """
    if not name.isidentifier():
        raise ValueError(f"task name must be letters, digits and underscores, got {name!r}")
    if not records:
        raise ValueError(f"task {name!r} has no records")
    for i, record in enumerate(records):
        if set(record) != {"question", "choices", "label"}:
            raise ValueError(
                f"record {i} of {name!r} has keys {sorted(record)}; expected question, choices, label"
            )
        if not 0 <= record["label"] < len(record["choices"]):
            raise ValueError(f"record {i} of {name!r}: label {record['label']} is not a choice index")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    data = (folder / f"{name}.jsonl").resolve()
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    path = folder / f"{name}.yaml"
    path.write_text(_TEMPLATE.format(name=name, data=json.dumps(str(data))), encoding="utf-8")
    return path
