"""``bench e2e``: whole-model generation speed, dense against compressed, in the same engine.

Every row is one model variant (dense, or its MLPs low-rank at one keep) at one batch size: the
prefill throughput, the decode time per step (one new token for each of the B sequences), and the
weight-streaming floor of a decode step, ``bytes of every weight read / measured bandwidth``, with
the % of it reached. Decode at small batches is weight streaming, so the floor ratio of dense to
compressed is the ideal speedup. Optionally, Hugging Face ``generate`` (dynamic cache, eager) is
timed at batch 1 as the baseline the engine has to beat.

Speed does not depend on the factors' values, so compressed variants get random factors of the
ranks ``keep`` gives: no calibration, no SVD, the same shapes a real compression produces.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from svdmlp import arch, decompose, models, modules, pipeline, swap
from svdmlp.bench.kernel import CPU_CEILING_SIZES, CUDA_CEILING_SIZES
from svdmlp.bench.timing import measure_ceilings
from svdmlp.engine import Engine

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
    """What to run. ``models`` entries are RANDOM_MODEL, a model directory, a hub id or None (default)."""

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

    def __post_init__(self) -> None:
        bad_keeps = [k for k in self.keeps if not 0.0 < k <= 1.0]
        if not self.keeps or bad_keeps:
            raise ValueError(f"keep values must be in (0, 1], got {list(self.keeps)}")
        bad_batches = [b for b in self.batches if not 1 <= b <= 64]
        if not self.batches or bad_batches:
            raise ValueError(f"batch sizes must be in [1, 64], got {list(self.batches)}")
        for name in ("prompt_len", "repeats", "align"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
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
        }


def build_model(name: str | None, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The dense model: the random Llama-3.2-1B shape (seeded) or a real model loaded from disk/hub."""
    if name != RANDOM_MODEL:
        return models.load_dense(name, dtype=dtype, device=str(device))[0]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA_1B), dtype=dtype)
    return model.eval()


def install_random_lowrank(model: torch.nn.Module, keep: float, align: int, backend: str) -> dict[str, int]:
    """Swap every MLP for a low-rank one with random factors of the ranks ``keep`` gives; its ranks."""
    spec = pipeline.arch_of(model)
    weight = swap.dense_projection(model, spec, 0, "gate").weight
    ranks = {}
    for index in range(len(arch.decoder_layers(model, spec))):
        factors = {}
        for name in ("gate", "up", "down"):
            linear = swap.dense_projection(model, spec, index, name)
            n_in, n_out = linear.in_features, linear.out_features
            rank = decompose.rank_for_keep(n_in, n_out, keep, align)
            factors[name] = decompose.Factors(
                u=torch.randn(rank, n_in, device=weight.device) / math.sqrt(n_in),
                v=torch.randn(n_out, rank, device=weight.device) / math.sqrt(rank),
            )
            ranks[name] = rank
        swap.install_lowrank(model, spec, index, ranks, weight.dtype, weight.device, factors)
    modules.set_backend(model, backend)
    return ranks


def streamed_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter once (tied ones once), except an
    untied input embedding, of which a step reads only its tokens' rows."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding or p is head)


def _wall(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def hf_decode_seconds(model, prompt: list[int], new_tokens: int, repeats: int) -> float:
    """Hugging Face ``generate``'s time per decode step at batch 1: (T(n tokens) − T(1)) / (n − 1)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)

    def run(n: int) -> float:
        options = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": False, "pad_token_id": 0}
        with torch.no_grad():
            return _wall(lambda: model.generate(ids, **options), device)

    run(2)  # warm-up
    full = statistics.median(run(new_tokens) for _ in range(repeats))
    one = statistics.median(run(1) for _ in range(repeats))
    return max(full - one, 0.0) / (new_tokens - 1)


def measure_variant(model, config: E2EConfig, bandwidth: float, log: Callable[[str], None]) -> list[dict]:
    """Prefill and decode timings of one model variant at every batch size, and its floor."""
    engine = Engine(
        model,
        max_batch=max(config.batches),
        max_seq_len=config.prompt_len + config.new_tokens,
        sync_every=config.new_tokens,  # no host sync inside the timed decode
    )
    vocab = engine.vocab
    generator = torch.Generator().manual_seed(0)
    weight_bytes = streamed_bytes(model)
    rows = []
    for batch in config.batches:
        prompts = torch.randint(1, vocab, (batch, config.prompt_len), generator=generator).tolist()
        engine.generate(prompts, config.new_tokens)  # warm-up; captures the decode graph on CUDA
        results = [engine.generate(prompts, config.new_tokens) for _ in range(config.repeats)]
        prefill_s = statistics.median(r.prefill_s for r in results)
        step_s = statistics.median(r.decode_s_per_step for r in results)
        floor_s = weight_bytes / bandwidth
        rows.append(
            {
                "batch": batch,
                "prefill_s": prefill_s,
                "prefill_tokens_per_s": batch * config.prompt_len / prefill_s,
                "decode_s_per_step": step_s,
                "decode_tokens_per_s": batch / step_s,
                "weight_bytes": weight_bytes,
                "floor_s": floor_s,
                "pct_of_floor": 100 * floor_s / step_s,
                "graph": results[0].graph,
                "note": results[0].note,
            }
        )
        log(f"  batch {batch}: prefill {prefill_s * 1e3:.1f} ms, decode {step_s * 1e3:.2f} ms/step")
    if config.hf_baseline and 1 in config.batches:
        prompt = torch.randint(1, vocab, (config.prompt_len,), generator=generator).tolist()
        hf_s = hf_decode_seconds(model, prompt, config.new_tokens, config.repeats)
        row = next(r for r in rows if r["batch"] == 1)
        row["hf_decode_s_per_step"] = hf_s
        log(f"  Hugging Face generate, batch 1: {hf_s * 1e3:.2f} ms/step")
    return rows


def run(config: E2EConfig, log: Callable[[str], None]) -> dict:
    """Measure the bandwidth, then every model × (dense, each keep) × batch size."""
    sizes = CUDA_CEILING_SIZES if config.device.type == "cuda" else CPU_CEILING_SIZES
    ceilings = measure_ceilings(config.device, config.dtype, *sizes)
    log(f"copy bandwidth ({ceilings.dtype}): {ceilings.bandwidth / 1e9:.1f} GB/s")
    start = time.perf_counter()
    rows = []
    for name in config.models:
        label = name or models.DEFAULT_MODEL
        dense = None
        for keep in (None, *config.keeps):
            model = build_model(name, config.device, config.dtype)
            ranks = (
                None if keep is None else install_random_lowrank(model, keep, config.align, config.backend)
            )
            variant = "dense" if keep is None else f"keep {keep:g}"
            log(f"{label} {variant}" + ("" if ranks is None else f" (ranks gate/up/down {ranks})"))
            measured = measure_variant(model, config, ceilings.bandwidth, log)
            del model
            if config.device.type == "cuda":
                torch.cuda.empty_cache()
            dense = dense or {r["batch"]: r for r in measured}
            for row in measured:
                base = dense[row["batch"]]
                row.update(model=label, variant=variant, keep=keep, ranks=ranks)
                row["speedup_vs_dense"] = base["decode_s_per_step"] / row["decode_s_per_step"]
                row["ideal_speedup"] = base["weight_bytes"] / row["weight_bytes"]
                if "hf_decode_s_per_step" in row:
                    row["engine_vs_hf"] = row["hf_decode_s_per_step"] / row["decode_s_per_step"]
            rows += measured
    return {
        "config": config.to_dict(),
        "ceilings": ceilings.to_dict(),
        "rows": rows,
        "elapsed_s": time.perf_counter() - start,
    }
