"""The literature's perplexity sets (WikiText-2, PTB, C4) through Hugging Face ``datasets``.

Each set is turned into one text exactly as the GPTQ / SVD-LLM evaluation code does it, then scored
with :mod:`svdmlp.evaluate.perplexity` (non-overlapping 2048-token windows in the literature):

- ``wikitext2``: ``wikitext`` / ``wikitext-2-raw-v1``, test split, rows joined with ``"\\n\\n"``.
- ``ptb``: ``ptb_text_only`` / ``penn_treebank``, test split, sentences joined with ``" "``.
- ``c4``: ``allenai/c4``, file ``en/c4-validation.00000-of-00008.json.gz``, the first 2000
  documents (SVD-LLM's subset), joined with ``" "``.

Users without a network pass ``data_files`` pointing at local copies in the same format (json,
jsonl, parquet, csv or text), and the same columns, separator and document limit apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PerplexitySet:
    path: str
    name: str | None
    split: str
    column: str
    separator: str
    max_documents: int | None = None
    data_files: str | None = None


SETS: dict[str, PerplexitySet] = {
    "wikitext2": PerplexitySet("wikitext", "wikitext-2-raw-v1", "test", "text", "\n\n"),
    "ptb": PerplexitySet("ptb_text_only", "penn_treebank", "test", "sentence", " "),
    "c4": PerplexitySet(
        "allenai/c4", None, "validation", "text", " ", 2000, "en/c4-validation.00000-of-00008.json.gz"
    ),
}

_LOCAL_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".gz": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
}


def check(name: str, data_files: str | None = None) -> None:
    """Fail now on an unknown set or a local copy that cannot be read, before any model loads."""
    if name not in SETS:
        raise ValueError(f"unknown perplexity set {name!r}; expected one of {sorted(SETS)}")
    if data_files is not None:
        _local_builder(data_files)


def load_text(name: str, data_files: str | None = None) -> str:
    """The evaluation text of set ``name``; from ``data_files`` (a local file) when given."""
    check(name, data_files)
    spec = SETS[name]
    try:
        from datasets import load_dataset
    except ImportError:
        raise ValueError(
            "perplexity sets need the 'datasets' package: pip install 'svdmlp[datasets]'"
        ) from None
    try:
        if data_files is not None:
            dataset = load_dataset(_local_builder(data_files), data_files=str(data_files), split="train")
        else:
            dataset = load_dataset(spec.path, spec.name, split=spec.split, data_files=spec.data_files)
    except FileNotFoundError:
        raise
    except Exception as err:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ...)
        where = data_files or f"{spec.path} from the Hugging Face hub"
        raise ValueError(
            f"could not load perplexity set {name!r} ({where}): {str(err).splitlines()[0]}"
        ) from None
    if spec.column not in dataset.column_names:
        raise ValueError(
            f"{name!r} data has columns {dataset.column_names}; expected a {spec.column!r} column"
        )
    documents = dataset[spec.column]
    if spec.max_documents is not None:
        documents = documents[: spec.max_documents]
    return spec.separator.join(documents)


def _local_builder(data_files: str) -> str:
    path = Path(data_files)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    builder = _LOCAL_BUILDERS.get(path.suffix)
    if builder is None:
        raise ValueError(f"cannot read {path}: expected one of {sorted(_LOCAL_BUILDERS)}")
    return builder
