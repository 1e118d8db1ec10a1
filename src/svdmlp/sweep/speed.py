"""``sweep --bench FILE``: a ``bench e2e --json`` file's decode speed per keep, paired with the sweep's
perplexity, so the report shows the quality/speed trade-off.

The file is checked when the sweep starts (before any compression), so a wrong path or schema costs
nothing. Speeds come from the bench's own variants (random factors of the ranks its keeps give, see
:mod:`svdmlp.bench.e2e`); each bench keep is paired with the sweep point of the same target keep, or
else the nearest one, for the whitened method (the first method when the sweep has no ``whiten``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from svdmlp.bench.e2e_report import SCHEMA

PREFERRED_METHOD = "whiten"


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _row_problem(row) -> str | None:
    """What is wrong with one row, or None. Only the fields the sweep reads are required."""
    if not isinstance(row, dict):
        return "is not an object"
    if not isinstance(row.get("model"), str) or not isinstance(row.get("variant"), str):
        return "lacks a model or variant name"
    keep = row.get("keep", "missing")
    if keep is not None and not (_number(keep) and 0.0 < keep <= 1.0):
        return f"has keep {keep!r} (expected null for dense, or a number in (0, 1])"
    batch = row.get("batch")
    if not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
        return f"has batch {batch!r} (expected an integer >= 1)"
    step = row.get("decode_s_per_step")
    if not (_number(step) and step > 0):
        return f"has decode_s_per_step {step!r} (expected a positive number)"
    for key in ("ideal_speedup", "weight_bytes"):
        if key in row and not (_number(row[key]) and row[key] > 0):
            return f"has {key} {row[key]!r} (expected a positive number)"
    return None


@dataclass(frozen=True)
class Bench:
    """A checked ``bench e2e --json`` file: ``path`` as given on the command line, ``data`` its content."""

    path: str
    data: dict

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(row["model"] for row in self.data["rows"]))

    def model_for(self, sweep_model: str) -> str:
        """The bench model paired with the sweep's: the same one if measured, else the file's first."""
        for name in self.models:
            if same_model(name, sweep_model):
                return name
        return self.models[0]

    def _section(self, outer: dict, key: str) -> dict:
        return outer[key] if isinstance(outer.get(key), dict) else {}

    @property
    def config(self) -> dict:
        """The run's settings (device, dtype, align, ...); empty if the file lacks them."""
        return self._section(self.data, "config")

    def provenance(self) -> str:
        """Device, machine, date and run settings of the file, in words, ending with its path."""
        environment = self._section(self.data, "environment")
        device, config = self._section(environment, "device"), self.config
        words = [f"`svdmlp bench e2e` on {device.get('name') or 'an unrecorded device'}"]
        if device.get("type"):
            words[0] += f" ({device['type']})"
        if environment.get("machine"):
            words.append(f"machine {environment['machine']}")
        if environment.get("timestamp"):
            words.append(f"dated {environment['timestamp']}")
        settings = [f"{key} {config[key]}" for key in ("dtype", "backend", "align") if key in config]
        if settings:
            words.append(", ".join(settings))
        return "; ".join(words) + f"; file `{self.path}`"


def same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    first, second = Path(a), Path(b)
    return first.is_dir() and second.is_dir() and first.resolve() == second.resolve()


def load(path: Path | str) -> Bench:
    """Read and check a ``bench e2e --json`` file; FileNotFoundError or ValueError (one line) if unusable."""
    where = f"--bench {path}"
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"{where}: no such file")
    if not file.is_file():
        raise ValueError(f"{where}: not a file")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err.msg} at line {err.lineno})") from None
    found = data.get("schema") if isinstance(data, dict) else None
    if found != SCHEMA:
        raise ValueError(
            f"{where}: not a `svdmlp bench e2e --json` file (schema {found!r}, expected {SCHEMA!r})"
        )
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: no rows")
    for index, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            raise ValueError(f"{where}: row {index} {problem}")
    seen = set()
    for row in rows:
        key = (row["model"], row["keep"], row["batch"])
        if key in seen:
            raise ValueError(f"{where}: {row['model']} {row['variant']} batch {row['batch']} appears twice")
        seen.add(key)
    for model, keep, batch in seen:
        if keep is not None and (model, None, batch) not in seen:
            raise ValueError(f"{where}: {model} has keep {keep:g} at batch {batch} but no dense row there")
    if all(keep is None for _, keep, _ in seen):
        raise ValueError(f"{where}: only dense rows (no keep was benchmarked)")
    return Bench(str(path), data)


@dataclass(frozen=True)
class Pairing:
    """One row of the speed-vs-quality table: a bench keep (None: dense) and the sweep point paired."""

    keep: float | None
    record: dict
    exact: bool
    decode: dict[int, tuple[float, float]]  # batch -> (speedup over dense, decode seconds per step)
    ideal: float | None

    @property
    def label(self) -> str:
        return "dense" if self.keep is None else f"{self.keep:g}"


@dataclass(frozen=True)
class Comparison:
    """The bench model and method compared, the batch sizes present, and one pairing per variant."""

    model: str
    method: str
    batches: list[int]
    pairings: list[Pairing]
    has_ideal: bool

    @property
    def plot_batch(self) -> int:
        return 1 if 1 in self.batches else self.batches[0]


def _floating(records: list[dict]) -> list[dict]:
    """The compressed points with floating-point factors: those the bench's keeps stand for."""
    return [r for r in records if r["method"] != "dense" and r.get("factor_bits", 16) == 16]


def method_of(records: list[dict]) -> str:
    methods = list(dict.fromkeys(r["method"] for r in _floating(records)))
    return PREFERRED_METHOD if PREFERRED_METHOD in methods else methods[0]


def nearest(records: list[dict], method: str, keep: float) -> tuple[dict, bool]:
    """The point of ``method`` whose target keep is nearest ``keep`` (ties: the smaller keep), and
    whether it is the same keep."""
    candidates = [r for r in _floating(records) if r["method"] == method]
    # Rounded: 0.65 is as near 0.6 as 0.7, whatever the floats say.
    best = min(candidates, key=lambda r: (round(abs(r["target_keep"] - keep), 9), r["target_keep"]))
    return best, math.isclose(best["target_keep"], keep, abs_tol=1e-9)


def compare(bench: Bench, records: list[dict]) -> Comparison:
    """Pair each keep the bench measured (on the sweep's model if it has it) with a sweep point."""
    model = bench.model_for(records[0]["sweep"]["model"])
    rows = [row for row in bench.data["rows"] if row["model"] == model]
    batches = sorted({row["batch"] for row in rows})
    dense = {row["batch"]: row for row in rows if row["keep"] is None}
    method = method_of(records)
    dense_record = next(r for r in records if r["point"] == "dense")
    pairings = []
    for keep in dict.fromkeys(row["keep"] for row in rows):
        mine = {row["batch"]: row for row in rows if row["keep"] == keep}
        decode = {
            batch: (dense[batch]["decode_s_per_step"] / row["decode_s_per_step"], row["decode_s_per_step"])
            for batch, row in sorted(mine.items())
        }
        record, exact = (dense_record, True) if keep is None else nearest(records, method, keep)
        pairings.append(Pairing(keep, record, exact, decode, _ideal(mine, dense)))
    pairings.sort(key=lambda p: -1.0 if p.keep is None else -p.keep)  # dense, then keeps falling
    return Comparison(model, method, batches, pairings, all(p.ideal is not None for p in pairings))


def _ideal(mine: dict[int, dict], dense: dict[int, dict]) -> float | None:
    """Dense bytes per step over this variant's (the file's ``ideal_speedup``, else from weight_bytes)."""
    for batch, row in mine.items():
        if "ideal_speedup" in row:
            return row["ideal_speedup"]
        if "weight_bytes" in row and "weight_bytes" in dense[batch]:
            return dense[batch]["weight_bytes"] / row["weight_bytes"]
    return None
