"""``bench e2e``: whole-model generation speed, dense against compressed, in the same engine.

Every row is one model variant (dense, its MLPs low-rank at one keep, or its MLP weights quantized as
users deploy them, with or without a low-rank correction) at one batch size: the
prefill throughput, the decode time per step (one new token for each of the B sequences), and the
weight-streaming floor of a decode step, ``bytes of every weight read / measured bandwidth``, with
the % of it reached. Decode at small batches is weight streaming, so the floor ratio of dense to
compressed is the ideal speedup. Optionally, Hugging Face ``generate`` (dynamic cache, eager) is
timed at batch 1 as the baseline the engine has to beat.

Speed does not depend on the factors' values, so compressed variants get random factors of the
ranks ``keep`` gives: no calibration, no SVD, the same shapes a real compression produces. Quantized
variants round the model's own weights to nearest, and a correction's factors are random too.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from svdmlp import arch, lowrank, models
from svdmlp.backends import choice
from svdmlp.bench import energy
from svdmlp.bench.ceilings import measure_ceilings
from svdmlp.bench.kernel import CPU_CEILING_SIZES, CUDA_CEILING_SIZES
from svdmlp.decompose import Factors
from svdmlp.engine import Engine
from svdmlp.int_weights import STORED, factor_scheme
from svdmlp.quantize import Quantization
from svdmlp.quantized_linear import QuantizedLinear
from svdmlp.ranks import check_keep, rank_for_keep, uniform_ranks

# A Llama-3.2-1B-shaped model with random weights: the GPU benchmark needs no download.
RANDOM_MODEL = "random-llama-3.2-1b"
LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "rope_theta": 500000.0,
}


@dataclass(frozen=True)
class E2EConfig:
    """What to run. ``models`` entries are RANDOM_MODEL, anything :func:`svdmlp.models.load_dense` takes, or None."""

    device: torch.device
    models: tuple[str | None, ...]
    keeps: tuple[float, ...]
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    repeats: int
    dtype: torch.dtype
    align: int
    backend: str
    hf_baseline: bool
    price_per_hour: float | None = None  # device-hour price for the cost column (--price)
    compile: str | None = None  # torch.compile each engine's decode step in this mode (--compile)
    factor_bits: tuple[int, ...] = (16,)  # each keep once per entry: 16 float factors, 8/4 quantized
    quantized: tuple[str, ...] = ()  # dense variants, MLP weights quantized: SCHEME[+KEEP] (--quantize)

    def __post_init__(self) -> None:
        if not self.keeps:
            raise ValueError("no keep to benchmark")
        for keep in self.keeps:
            check_keep(keep)
        bad_batches = [b for b in self.batches if not 1 <= b <= 64]
        if not self.batches or bad_batches:
            raise ValueError(f"batch sizes must be in [1, 64], got {list(self.batches)}")
        for name in ("prompt_len", "repeats", "align"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.price_per_hour is not None and self.price_per_hour <= 0:
            raise ValueError(f"the price per device-hour must be positive, got {self.price_per_hour}")
        for bits in self.factor_bits:
            factor_scheme(bits)  # a ValueError naming the choices
        for spec in self.quantized:
            dense_quantization(spec)  # a ValueError naming the choices
        if self.new_tokens < 2:
            raise ValueError(
                f"new_tokens must be >= 2 (a prefill token, then decode steps), got {self.new_tokens}"
            )

    def to_dict(self) -> dict:
        return {
            "device": str(self.device),
            "models": [m or models.DEFAULT_MODEL for m in self.models],
            "keeps": list(self.keeps),
            "batches": list(self.batches),
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "repeats": self.repeats,
            "dtype": str(self.dtype).removeprefix("torch."),
            "align": self.align,
            "backend": self.backend,
            "hf_baseline": self.hf_baseline,
            "price_per_hour": self.price_per_hour,
            "compile": self.compile,
            "factor_bits": list(self.factor_bits),
            "quantized": list(self.quantized),
        }


def dense_quantization(spec: str) -> Quantization:
    """A quantized variant, ``SCHEME[+KEEP[-int8|-int4]]`` (:class:`~svdmlp.quantize.Quantization`): a
    scheme stored packed (:data:`svdmlp.int_weights.STORED`), rounded to nearest, and a random low-rank
    correction keeping ``KEEP`` of each weight's parameters (speed does not depend on its values)."""
    how = Quantization.parse(spec, fitted=False)
    if how.scheme not in STORED or how.gptq:
        raise ValueError(
            f"quantized variant {spec!r}: the scheme must be one of {', '.join(STORED)}, rounded to nearest"
        )
    return how


def build_model(name: str | None, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The dense model: the random Llama-3.2-1B shape (seeded) or a real model loaded from disk/hub."""
    if name != RANDOM_MODEL:
        return models.load_dense(name, dtype=dtype, device=str(device))[0]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA_1B), dtype=dtype)
    return model.eval()


def _random_factors(rank: int, n_in: int, n_out: int, device) -> Factors:
    """Random factors of a rank-``rank`` ``n_out × n_in`` matrix, scaled so products keep their size."""
    return Factors(
        u=torch.randn(rank, n_in, device=device) / math.sqrt(n_in),
        v=torch.randn(n_out, rank, device=device) / math.sqrt(rank),
    )


def install_random_lowrank(model: torch.nn.Module, keep: float, align: int, backend: str) -> dict[str, int]:
    """Swap every MLP for a low-rank one with random factors of the ranks ``keep`` gives; its ranks."""
    spec = arch.of_model(model)
    weight = arch.dense_projection(model, spec, 0, "gate").weight
    for index in range(len(arch.decoder_layers(model, spec))):
        linears = {name: arch.dense_projection(model, spec, index, name) for name in arch.PROJECTIONS}
        shapes = {name: (linear.in_features, linear.out_features) for name, linear in linears.items()}
        ranks = uniform_ranks(shapes, keep, align)
        factors = {
            name: _random_factors(ranks[name], n_in, n_out, weight.device)
            for name, (n_in, n_out) in shapes.items()
        }
        lowrank.install(model, spec, index, ranks, weight.dtype, weight.device, factors)
    lowrank.set_backend(model, backend)
    return ranks


def install_quantized(model: torch.nn.Module, spec: str, align: int) -> dict[str, int] | None:
    """Swap every MLP projection for a :class:`QuantizedLinear` of its weight (rounded to nearest) as
    ``spec`` (:func:`dense_quantization`) says, with random correction factors; the correction's ranks."""
    variant = dense_quantization(spec)
    how, keep = STORED[variant.scheme], variant.correction_keep
    factors_how = factor_scheme(variant.correction_bits)
    model_spec = arch.of_model(model)
    ranks = None
    for index, layer in enumerate(arch.decoder_layers(model, model_spec)):
        mlp = getattr(layer, model_spec.mlp)
        for name in arch.PROJECTIONS:
            linear = arch.dense_projection(model, model_spec, index, name)
            correction = None
            if keep:
                rank = rank_for_keep(linear.in_features, linear.out_features, keep, align)
                ranks = {**(ranks or {}), name: rank}
                correction = _random_factors(
                    rank, linear.in_features, linear.out_features, linear.weight.device
                )
            module = QuantizedLinear.of(linear, how, correction=correction, factors_how=factors_how)
            setattr(mlp, model_spec.projection(name), module)
    return ranks


def streamed_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every weight once (tied ones once; quantized factors
    packed, with their scales), except an untied input embedding, of which a step reads only its
    tokens' rows."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tensors = {id(t): t for t in model.state_dict(keep_vars=True).values()}  # quantized factors are buffers
    return sum(t.numel() * t.element_size() for t in tensors.values() if t is not embedding or t is head)


def _wall(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def hf_generate_seconds(model, prompt: list[int], new_tokens: int) -> float:
    """Wall seconds of one Hugging Face ``generate`` call at batch 1 making exactly ``new_tokens``."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    options = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    with torch.no_grad():
        return _wall(lambda: model.generate(ids, pad_token_id=0, **options), device)


@dataclass
class Variant:
    """One model variant under test: dense (keep None; its MLP quantized when named so), or random
    low-rank MLPs at ``keep``; ``ranks``: the low-rank modules' or the quantized MLP's correction's."""

    name: str
    model: torch.nn.Module
    keep: float | None
    ranks: dict[str, int] | None
    engine: Engine


def measure_batch(variants: list[Variant], batch: int, config: E2EConfig, prompts: list[list[int]]) -> dict:
    """Median prefill and decode-step seconds of every variant at one batch size.

    The variants take turns within each repeat, so load from other processes (a shared CPU) or
    clock changes hit them alike instead of biasing whichever ran during the noisy moment.
    """
    for variant in variants:
        variant.engine.generate(prompts, config.new_tokens)  # warm-up; captures the graph on CUDA
    results = {v.name: [] for v in variants}
    for _ in range(config.repeats):
        for variant in variants:
            results[variant.name].append(variant.engine.generate(prompts, config.new_tokens))
    return {
        name: {
            "prefill_s": statistics.median(r.prefill_s for r in runs),
            "decode_s_per_step": statistics.median(r.decode_s_per_step for r in runs),
            "graph": runs[0].graph,
            "compiled": runs[0].compiled,
            "note": runs[0].note,
        }
        for name, runs in results.items()
    }


def measure_hf(variants: list[Variant], config: E2EConfig, prompt: list[int]) -> dict[str, float]:
    """Hugging Face ``generate``'s seconds per decode step at batch 1, (T(n) − T(1)) / (n − 1),
    the variants taking turns as in :func:`measure_batch`."""
    for variant in variants:
        hf_generate_seconds(variant.model, prompt, 2)  # warm-up
    full = {v.name: [] for v in variants}
    one = {v.name: [] for v in variants}
    for _ in range(config.repeats):
        for variant in variants:
            full[variant.name].append(hf_generate_seconds(variant.model, prompt, config.new_tokens))
            one[variant.name].append(hf_generate_seconds(variant.model, prompt, 1))
    return {
        name: max(statistics.median(full[name]) - statistics.median(one[name]), 0.0) / (config.new_tokens - 1)
        for name in full
    }


def build_variants(name: str | None, config: E2EConfig, log: Callable[[str], None]) -> list[Variant]:
    """The dense model, one copy per keep (and factor storage) with random low-rank MLPs, and one per
    quantized variant, each with its engine."""
    variants = []
    for keep, bits in [(None, 16)] + [(keep, bits) for keep in config.keeps for bits in config.factor_bits]:
        model = build_model(name, config.device, config.dtype)
        ranks = None if keep is None else install_random_lowrank(model, keep, config.align, config.backend)
        variant = "dense" if keep is None else f"keep {keep:g}"
        how = factor_scheme(bits)
        if how is not None:
            for module in lowrank.lowrank_modules(model):
                module.quantize_factors(how)
            variant += f" {how.name}"
        log(f"{name or models.DEFAULT_MODEL} {variant}" + ("" if ranks is None else f": ranks {ranks}"))
        variants.append(Variant(variant, model, keep, ranks, _engine(model, config)))
    for spec in config.quantized:
        model = build_model(name, config.device, config.dtype)
        ranks = install_quantized(model, spec, config.align)
        log(
            f"{name or models.DEFAULT_MODEL} dense {spec}"
            + ("" if ranks is None else f": correction ranks {ranks}")
        )
        variants.append(Variant(f"dense {spec}", model, None, ranks, _engine(model, config)))
    return variants


def _engine(model: torch.nn.Module, config: E2EConfig) -> Engine:
    return Engine(
        model,
        max_batch=max(config.batches),
        max_seq_len=config.prompt_len + config.new_tokens,
        sync_every=config.new_tokens,  # no host sync inside the timed decode
        compile=config.compile is not None,
        compile_mode=config.compile or "default",
    )


def measure_model(
    name: str | None, config: E2EConfig, bandwidth: float, log: Callable[[str], None]
) -> list[dict]:
    """Rows of one model: every variant at every batch size, with floors and speedups over dense."""
    variants = build_variants(name, config, log)
    generator = torch.Generator().manual_seed(0)
    vocab = variants[0].engine.vocab
    hf = {}
    if config.hf_baseline and 1 in config.batches:
        prompt = torch.randint(1, vocab, (config.prompt_len,), generator=generator).tolist()
        hf = measure_hf(variants, config, prompt)
    rows = []
    for batch in config.batches:
        prompts = torch.randint(1, vocab, (batch, config.prompt_len), generator=generator).tolist()
        measured = measure_batch(variants, batch, config, prompts)
        dense_s, dense_bytes = measured["dense"]["decode_s_per_step"], streamed_bytes(variants[0].model)
        for variant in variants:
            m, weight_bytes = measured[variant.name], streamed_bytes(variant.model)
            step_s, floor_s = m["decode_s_per_step"], weight_bytes / bandwidth
            row = {
                "model": name or models.DEFAULT_MODEL,
                "variant": variant.name,
                "keep": variant.keep,
                "ranks": variant.ranks,
                "batch": batch,
                "prefill_s": m["prefill_s"],
                "prefill_tokens_per_s": batch * config.prompt_len / m["prefill_s"],
                "decode_s_per_step": step_s,
                "decode_tokens_per_s": batch / step_s,
                "weight_bytes": weight_bytes,
                "floor_s": floor_s,
                "pct_of_floor": 100 * floor_s / step_s,
                "speedup_vs_dense": dense_s / step_s,
                "ideal_speedup": dense_bytes / weight_bytes,
                "graph": m["graph"],
                "compiled": m["compiled"],
                "note": m["note"],
            }
            row["joules_per_token"], why = energy.joules_per_token(
                lambda v=variant, p=prompts: v.engine.generate(p, config.new_tokens),
                batch * config.new_tokens,
                config.device,
            )
            if why is not None:
                row["energy_note"] = why
            if config.price_per_hour is not None:
                row["dollars_per_million_tokens"] = energy.dollars_per_million_tokens(
                    step_s, batch, config.price_per_hour
                )
            if batch == 1 and variant.name in hf:
                row["hf_decode_s_per_step"] = hf[variant.name]
                row["engine_vs_hf"] = hf[variant.name] / step_s
            rows.append(row)
            log(
                f"  {variant.name} batch {batch}: prefill {m['prefill_s'] * 1e3:.1f} ms, decode {step_s * 1e3:.2f} ms/step"
            )
    return rows


def run(config: E2EConfig, log: Callable[[str], None]) -> dict:
    """Measure the bandwidth, then every model × (dense, each keep) × batch size."""
    sizes = CUDA_CEILING_SIZES if config.device.type == "cuda" else CPU_CEILING_SIZES
    ceilings = measure_ceilings(config.device, config.dtype, *sizes)
    log(f"copy bandwidth ({ceilings.dtype}): {ceilings.bandwidth / 1e9:.1f} GB/s")
    start = time.perf_counter()
    rows = []
    for name in config.models:
        rows += measure_model(name, config, ceilings.bandwidth, log)
        if config.device.type == "cuda":
            torch.cuda.empty_cache()
    # What the Triton backend ran for each shape and token bucket: the fused path or the unfused chain
    # (the first device run's compressed decode was slower than dense because this said "unfused").
    chosen = [{"key": [str(part) for part in key], "path": path} for key, path in choice.choices().items()]
    for made in chosen:
        log(f"backend ran the {made['path']} path for {', '.join(made['key'])}")
    return {
        "config": config.to_dict(),
        "ceilings": ceilings.to_dict(),
        "rows": rows,
        "backend_choices": chosen,
        "elapsed_s": time.perf_counter() - start,
    }
