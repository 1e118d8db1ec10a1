"""What a compression will need, from the model's shapes alone: the predicted peak memory of each
step and the time it takes, stated before any work starts (``svdmlp compress``'s first line) and
checked against ``--max-memory``. The command line compresses every model from disk (a hub model is
downloaded first), one decoder layer at a time: that is the compression predicted here.

Memory is counted as the step's largest live tensors: weights loaded in float32, Gram matrices and
their Cholesky roots in float64 (a root is one n² buffer: the copy of a Gram, or a Gram read from
disk, factorised in place), logits in float32, calibration activations, plus the interpreter with torch and
transformers loaded. Time is counted in floating-point operations at rates measured on this machine
in a fraction of a second (:meth:`Rates.measure`): forward passes and Gram accumulation (float32
products over the block upper triangle, :mod:`svdmlp.compression.gram`) at the float32
matrix-product rate, roots (``ROOT_FLOPS·n³``), weightings and SVDs at the float64 one, each at
:data:`ACHIEVED` of that rate. BENCHMARKS.md compares both with measured runs.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import torch

from svdmlp import ranks
from svdmlp.compression.journal import resumable
from svdmlp.compression.steps import allocation, calibration, factorisation, healing
from svdmlp.compression.steps.allocation import MEASURED_KEEPS
from svdmlp.compression.steps.sizes import BASE_BYTES, F32, GB, Sizes
from svdmlp.config import CompressConfig


@dataclass(frozen=True)
class Shapes:
    """The sizes of a decoder-only model that its compression's cost depends on."""

    hidden: int
    inter: int
    layers: int
    vocab: int
    layer_params: int  # one decoder layer's parameters (attention, MLP, norms)
    tied: bool
    heads: int = 1  # attention heads (a backward pass keeps each layer's attention probabilities)

    @classmethod
    def of_config(cls, config) -> Shapes:
        text = getattr(config, "text_config", config)
        hidden, inter = text.hidden_size, text.intermediate_size
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or hidden // heads
        kv = getattr(text, "num_key_value_heads", None) or heads
        attention = hidden * head_dim * (2 * heads + 2 * kv)
        return cls(
            hidden=hidden,
            inter=inter,
            layers=text.num_hidden_layers,
            vocab=text.vocab_size,
            layer_params=attention + 3 * hidden * inter + 2 * hidden,
            tied=bool(getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))),
            heads=heads,
        )

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.vocab * self.hidden * (1 if self.tied else 2)


# Floating-point operations of an n × n float64 Cholesky root (n³/3) and its power iteration for the
# ridge, as c·n³ at the float64 product rate: 0.4 fits decompose.Whitening.from_gram at n = 8192 on the
# development machine (5.5 s at 48 GFLOP/s, before the power iteration was cut from 32 to 12 passes).
ROOT_FLOPS = 0.4
# The fraction of a 1024³ product's rate that a compression's mixed work reaches on average (SVDs and
# triangular solves, autograd, products of small or skinny matrices, reading weights from disk):
# counted at the full rate, measured runs took 1.49× (Qwen2.5-Coder-0.5B, default recipe), 1.59×
# (SmolLM2-135M, thorough) and about 1.4× (Qwen2.5-Coder-1.5B, projected from its first steps) the
# predicted time on 2 cores (BENCHMARKS.md, 2026-12-03).
ACHIEVED = 0.67


# Below this share of its cores while it timed its products, the first line says the cores are busy.
BUSY_SHARE = 0.75


@dataclass(frozen=True)
class Rates:
    """This machine's speeds of float32 and float64 matrix products (FLOP/s), as this process got them,
    and ``share``, the fraction of its threads' time the cores gave it meanwhile (below 1 when other
    processes had them)."""

    f32: float
    f64: float
    share: float = 1.0

    @classmethod
    def measure(cls) -> Rates:
        """Time a 1024³ product in each precision, the fastest of three (about 1 s on 2 cores): one
        product alone was once taken beside another process's burst, and the first line said 21 minutes
        for a 10-minute run. A busier neighbour that lasts (a run at a higher priority) slows all three:
        the process's CPU time against its threads' wall time says by how much. The rate per CPU second
        is itself lower beside a neighbour (caches and memory shared): 134 GFLOP/s float32 at a share of
        0.5, 190 alone on the development machine, so the time alone is at most ``share`` of this one."""
        threads = torch.get_num_threads()
        shares = []

        def rate(matrix: torch.Tensor) -> float:
            matrix @ matrix  # warm up
            fastest = float("inf")
            for _ in range(3):
                started, cpu = time.perf_counter(), time.process_time()
                matrix @ matrix
                wall = time.perf_counter() - started
                if wall < fastest:
                    fastest, share = wall, (time.process_time() - cpu) / (threads * wall)
            shares.append(share)
            return 2 * matrix.shape[0] ** 3 / fastest

        a = torch.randn(1024, 1024)
        f32, f64 = rate(a), rate(a.double())
        return cls(f32=f32, f64=f64, share=min(1.0, max(shares)))

    def root(self, n: int) -> float:
        """Seconds of an ``n × n`` float64 Cholesky root (:class:`~svdmlp.decompose.Whitening`)."""
        return ROOT_FLOPS * n**3 / self.f64

    def achieved(self) -> Rates:
        """The rates a compression's work reaches on average: :data:`ACHIEVED` of these."""
        return Rates(self.f32 * ACHIEVED, self.f64 * ACHIEVED, self.share)


@dataclass(frozen=True)
class Footprint:
    """The predicted peak bytes and seconds of each step of one compression."""

    memory: dict[str, float]
    seconds: dict[str, float]
    rates: Rates
    disk: float = 0.0  # scratch bytes at their peak, beside the output

    def to_dict(self) -> dict:
        """What a compression's JSON record keeps of the prediction, to compare with the measurement."""
        return {
            "memory_bytes": self.memory,
            "seconds": self.seconds,
            "disk_bytes": self.disk,
            "rates_flops": {"float32": self.rates.f32, "float64": self.rates.f64},
            "cores_share": self.rates.share,
        }

    def without(self, steps: list[str]) -> Footprint:
        """The footprint of the other steps (those of a stopped run that are done)."""
        keep = {step: v for step, v in self.memory.items() if step not in steps}
        return Footprint(
            keep, {s: v for s, v in self.seconds.items() if s not in steps}, self.rates, self.disk
        )

    @property
    def peak(self) -> tuple[str, float]:
        """The step whose memory is the largest, and that memory in bytes (nothing: the base)."""
        if not self.memory:
            return "none", BASE_BYTES
        step = max(self.memory, key=self.memory.get)
        return step, self.memory[step]

    def pace_line(self, done: list[str], elapsed: float) -> str:
        """After the steps ``done`` (in order) took ``elapsed`` seconds: how far the run is against the
        prediction, and the time left at this run's own pace (the remaining steps' predicted seconds
        scaled by the measured/predicted ratio so far)."""
        predicted = sum(self.seconds.get(step, 0.0) for step in done)
        left = [step for step in self.seconds if step not in done]
        text = f"{done[-1]} done at {_duration(elapsed)} (predicted {_duration(predicted)})"
        if not left:
            return text
        pace = elapsed / predicted if predicted > 0 else 1.0
        remaining = pace * sum(self.seconds[step] for step in left)
        return f"{text}; about {_duration(remaining)} left at this pace ({', '.join(left)})"

    def table(self) -> str:
        """Each step's predicted peak memory and time, the scratch disk and the rates they were timed
        at: what ``--dry-run`` prints."""
        steps = list(dict.fromkeys([*self.memory, *self.seconds]))
        width = max([len("step"), *map(len, steps)])
        rows = [f"{'step':<{width}}  peak memory  time"]
        for step in steps:
            memory = f"{self.memory[step] / GB:.1f} GB" if step in self.memory else "-"
            seconds = _duration(self.seconds[step]) if step in self.seconds else "-"
            rows.append(f"{step:<{width}}  {memory:>11}  {seconds}")
        rows.append(
            f"scratch disk {self.disk / GB:.1f} GB at its peak; timed at float32 {self.rates.f32 / 1e9:.0f} "
            f"and float64 {self.rates.f64 / 1e9:.0f} GFLOP/s (measured now, with {self.rates.share:.0%} "
            f"of the cores), {ACHIEVED:.0%} of them achieved"
        )
        return "\n".join(rows)

    def line(self) -> str:
        if not self.seconds:
            return "predicted: every step is done, the checkpoint is left to save"
        step, peak = self.peak
        total = sum(self.seconds.values())
        slowest = max(self.seconds, key=self.seconds.get)
        disk = f", scratch disk {self.disk / GB:.1f} GB" if self.disk >= 0.05 * GB else ""
        busy = ""
        if self.rates.share < BUSY_SHARE:
            busy = (
                f"; the cores are busy (this process got {self.rates.share:.0%} of them), so the time is "
                f"at that pace: at most about {_duration(total * self.rates.share)} if they free up"
            )
        return (
            f"predicted: peak memory {peak / GB:.1f} GB ({step}), time {_duration(total)} "
            f"({slowest} {_duration(self.seconds[slowest])}){disk}, from the model's shapes{busy}"
        )


def thin_calibration(shapes: Shapes, config: CompressConfig) -> str | None:
    """A warning when the calibration windows hold fewer tokens than the MLP's intermediate width, else
    None. Its input Gram (and, with fisher, its output-gradient Grams) then have rank at most the tokens:
    the weighting treats every direction the windows never reached as one that does not matter, and
    text that does reach them loses it. (Qwen2.5-Coder-1.5B on 8 windows, 4,104 tokens for an 8960-wide
    MLP: ×2.7 perplexity over the domains at keep 0.8, ×20 on one unseen text, where the 0.5B model on
    16 windows, 8,208 tokens for 4864, lost ×1.35 and ×4.1; docs/results/sizes.)"""
    calibration = config.calibration
    tokens = calibration.num_samples * (calibration.seq_len + 1)
    if not config.needs_calibration or tokens >= shapes.inter:
        return None
    enough = math.ceil(shapes.inter / (calibration.seq_len + 1))
    return (
        f"warning: {calibration.num_samples} calibration windows are {tokens:,} tokens, fewer than the "
        f"MLP's {shapes.inter:,}-wide intermediate, so its Grams miss directions that other text uses; "
        f"pass --calib-samples {enough} or more"
    )


def available_memory() -> float | None:
    """Bytes of memory available to a new allocation (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def checkpoint_bytes(shapes: Shapes, config: CompressConfig, compressed: int, save_bytes: int) -> float:
    """Bytes of the checkpoint of ``compressed`` layers compressed as ``config`` says, ``save_bytes`` per
    weight (its tokenizer and records are small)."""
    h, i = shapes.hidden, shapes.inter
    rank = ranks.rank_for_keep(h, i, config.keep, config.align)
    saved = len(config.targets) * (h * i - min(h * i, (h + i) * rank))
    return (shapes.params - compressed * saved) * save_bytes


def predict(
    shapes: Shapes,
    config: CompressConfig,
    compressed: int,
    rates: Rates,
    resident_healing: bool = False,
    keeps_probed: tuple[float, ...] = (),
    measured: int = 0,
) -> Footprint:
    """The footprint of compressing ``compressed`` decoder layers of a model of ``shapes`` as ``config``
    says, its weights read from disk one unit at a time: each step's cost, as the step's module predicts
    it (:mod:`svdmlp.compression.steps`). With ``resident_healing``, the model is loaded whole for
    distillation. Its allocation probes each layer at each of ``keeps_probed`` (a sweep's keeps,
    measured at once: :func:`~svdmlp.compression.steps.allocation.measure_shared`; default its own keep)
    but the ``measured`` layers, whose sensitivity is recorded already."""
    s = Sizes(shapes, config, compressed, rates.achieved())
    h, i = s.h, s.i
    # The compression writes each compressed layer to the scratch directory (in float32: its attention
    # and its factors at keep's rank) and, with fisher, every layer's output-gradient Grams (float32)
    # and, while they are made, the hidden states entering each layer (deleted as the backward sweep
    # spills the Grams: counting both whole is an upper bound) and the gradient the sweep has reached.
    factors = compressed * s.compressed_layer * F32
    spilled = compressed * (2 * i * i + h * h) * F32 + (shapes.layers + 1) * s.tokens * h * F32
    disk = factors + (spilled if config.needs_output_grams else 0)
    costs = {
        "calibration": calibration.cost(s),
        "allocation": allocation.cost(s, keeps_probed, measured),
        "factorisation": factorisation.cost(s),
        "healing": healing.cost(s, resident_healing) if config.needs_calibration else None,
    }
    if config.quantize is not None:
        # Weights stored quantized (--quantize): one sequential walk, GPTQ (and the correction's SVD) in
        # place of the factorisation's SVD; predicted as that walk, not modelled apart. The corrections'
        # allocation (--allocate) is one more walk on the dense model and the allocation's probes.
        walk = factorisation.cost(s)
        costs = {"quantization": walk}
        probes = allocation.cost(s) if config.correction_keep else None
        if probes is not None:
            costs["allocation"] = (max(probes[0], walk[0]), probes[1] + walk[1])
    costs = {step: cost for step, cost in costs.items() if cost is not None}
    memory = {step: cost[0] for step, cost in costs.items()}
    seconds = {step: cost[1] for step, cost in costs.items()}
    return Footprint(memory, seconds, rates, disk)


@dataclass(frozen=True)
class Done:
    """What a stopped compression finished (:mod:`~svdmlp.compression.journal`): its steps, and its
    layers compressed."""

    steps: tuple[str, ...] = ()
    layers: int = 0
    measured: int = 0  # layers whose sensitivity its allocation recorded
    chosen: int | None = None  # layers its allocation chose to compress, once recorded

    @classmethod
    def of(cls, journal, before: tuple[str, ...] = ()) -> Done:
        """What ``journal`` records done, after the steps ``before`` done elsewhere (a sweep's shared
        calibration)."""
        return cls(
            before + tuple(journal.done),
            len(journal.layers()),
            len(journal.sensitivities()),
            journal.chosen(),
        )

    def left(self, candidates: int) -> int:
        """The layers left to compress of the ``candidates`` the plan selects: of those the allocation
        chose, once it is recorded (a keep-0.95 plan may leave most layers dense)."""
        return max(0, (candidates if self.chosen is None else self.chosen) - self.layers)


def predict_sweep(
    shapes: Shapes,
    configs: list[CompressConfig],
    rates: Rates,
    eval_tokens: int,
    scores: int,
    done: list[Done] | None = None,
) -> Footprint:
    """The footprint of a sweep: ``configs`` compressed one after the other, less what stopped runs
    ``done`` of each, and ``scores`` models (these and the dense one, unless it was scored earlier)
    each scored on ``eval_tokens`` tokens (its time only: scoring holds less than compressing). The
    output-gradient Grams are made once and read back for every keep (``calibration`` counts once), and
    the first point of a budget allocation measures every keep's sensitivities (the allocation
    of the others only chooses); memory is the largest of any point's steps, as each point's model and
    Grams are freed before the next."""
    memory: dict[str, float] = {}
    seconds: dict[str, float] = {}
    disk = 0.0
    done = done or [Done()] * len(configs)
    sharing: dict[str, list[int]] = {}  # the points one measurement of sensitivities serves, by plan
    for number, (config, finished) in enumerate(zip(configs, done, strict=True)):
        if resumable(config) and config.allocation == "budget" and "allocation" not in finished.steps:
            plan = json.dumps({k: v for k, v in config.to_dict().items() if k != "keep"}, sort_keys=True)
            sharing.setdefault(plan, []).append(number)
    groups = [
        group[start : start + MEASURED_KEEPS]
        for group in sharing.values()
        for start in range(0, len(group), MEASURED_KEEPS)
    ]
    measures = {group[0]: tuple(configs[n].keep for n in group) for group in groups}
    for number, (config, finished) in enumerate(zip(configs, done, strict=True)):
        compressed = finished.left(shapes.layers)
        shared = any(number in group[1:] for group in groups)
        measured = compressed if shared else finished.measured
        point = predict(shapes, config, compressed, rates, False, measures.get(number, ()), measured)
        point = point.without(list(finished.steps))
        disk = max(disk, point.disk)
        for step, value in point.memory.items():
            memory[step] = max(memory.get(step, 0.0), value)
        for step, value in point.seconds.items():
            if step != "calibration" or step not in seconds:
                seconds[step] = seconds.get(step, 0.0) + value
    # Scoring is large float32 products, at the full rate (Qwen2.5-Coder-0.5B's eight texts: 7 min measured,
    # 9 predicted).
    seconds["evaluation"] = scores * 2 * shapes.params * eval_tokens / rates.f32
    return Footprint(memory, seconds, rates, disk)
