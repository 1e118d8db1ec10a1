"""vLLM serves svdmlp checkpoints through the plugin: its greedy tokens are svdmlp's engine's (compressed
and dense SmolLM2-135M, tiny models of every architecture, int8/int4 factors), the same at tensor-parallel
size 2, and the MLP it holds is the checkpoint's factors, byte for byte.

These tests run in the vLLM environment (``make serve-env``, ``.venv-vllm``); elsewhere they are skipped.
Each engine takes tens of seconds to start on a CPU, so engines are shared where a test allows.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

from safetensors import safe_open  # noqa: E402

from conftest import SAMPLE_TEXT, tiny_model, untied_model  # noqa: E402
from svdmlp import checkpoint, checkpoint_record, models  # noqa: E402
from svdmlp.compression import pipeline  # noqa: E402
from svdmlp.config import CalibrationSpec, CompressConfig  # noqa: E402
from svdmlp.engine.engine import Engine  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW_TOKENS = 32
# vLLM's CPU attention wants heads of 32 or more: the tiny models here use 64.
VLLM_TINY = dict(
    hidden_size=128, intermediate_size=512, num_attention_heads=2, num_key_value_heads=1, head_dim=64
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_settings():
    """The function that counts the MLP's bytes is sent to vLLM's workers pickled."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        yield


@contextlib.contextmanager
def served(directory, dtype: str = "float32", tensor_parallel_size: int = 1):
    """A vLLM engine on ``directory`` for as long as the block runs, then shut down."""
    with pytest.MonkeyPatch.context() as patch:
        if tensor_parallel_size > 1:  # one NUMA node here: vLLM's CPU workers need their cores named
            cores = sorted(os.sched_getaffinity(0))
            share = max(1, len(cores) // tensor_parallel_size)
            binding = "|".join(
                ",".join(map(str, cores[i * share : (i + 1) * share])) for i in range(tensor_parallel_size)
            )
            patch.setenv("VLLM_CPU_OMP_THREADS_BIND", binding)
        llm = vllm.LLM(
            str(directory),
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=True,  # no minutes of compiling for a test
            max_model_len=256,
            kv_cache_memory_bytes=128 * 2**20,
            seed=0,
        )
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()


def vllm_greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    params = vllm.SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(
        [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


def svdmlp_greedy(directory, prompts: list[list[int]], dtype=torch.float32) -> list[list[int]]:
    model, _, _ = checkpoint.load_any(str(directory), dtype=dtype)
    engine = Engine(model, max_batch=1)
    return [engine.generate([p], NEW_TOKENS).tokens[0] for p in prompts]


# The plugin's parameters on vLLM's layers: factors, and a quantized weight's (its "weight_values", ...)
FACTORS = {"gate_up_u_t", "gate_v_t", "up_v_t", "u_t", "v_t"}


def _mlp_factor_bytes(model) -> int:
    """Bytes vLLM holds for the low-rank MLPs or the quantized ones: the parameters the plugin
    registered, quantized ones as their values, scales and zero points."""
    total = 0
    for name, p in model.named_parameters():
        stored = name.rsplit(".", 1)[-1]
        base = stored.removesuffix("_values").removesuffix("_scales").removesuffix("_zeros")
        if base in FACTORS or (base == "weight" and base != stored):  # not vLLM's own dense "weight"
            total += p.numel() * p.element_size()
    return total


def checkpoint_factor_bytes(directory, float_bytes: int = 4) -> int:
    """Bytes of the checkpoint's low-rank factors as a float32 engine holds them: floating ones at
    ``float_bytes`` an element, quantized ones (integer values and scales) as stored."""
    total = 0
    for name in json.loads((directory / "svdmlp.json").read_text())["weights"]["files"]:
        with safe_open(directory / name, framework="pt") as handle:
            for key in handle.keys():
                if key.rsplit(".", 1)[-1] in ("values", "scales", "zeros") or key.endswith("_t"):
                    tensor = handle.get_tensor(key)
                    size = float_bytes if tensor.is_floating_point() else tensor.element_size()
                    total += tensor.numel() * size
    return total


def _compress(model, tokenizer, out, text, dtype=None, **overrides):
    config = CompressConfig(
        calibration=CalibrationSpec(str(text), 8, 64), **{"keep": 0.5, "align": 8, **overrides}
    )
    report = pipeline.compress(model, tokenizer, config, progress=False)
    return checkpoint.save(out, model, tokenizer, config, report, base_model="test", dtype=dtype)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M compressed at keep 0.8 (plain whitened SVD on 8 windows: the shapes and the plugin
    are what is tested here, not the recipe), and its dense directory."""
    root = tmp_path_factory.mktemp("smollm2")
    dense = models.resolve_model_path("smollm2-135m")
    model, tokenizer, _ = models.load_dense(dense, dtype=torch.float32)
    text = root / "calib.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    ckpt = _compress(
        model, tokenizer, root / "ckpt", text, torch.bfloat16, keep=0.8, align=32, method="whiten"
    )
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    return ckpt, dense, prompts


@pytest.mark.slow
def test_compressed_smollm2_matches_svdmlp_and_holds_the_factors(smollm2):
    ckpt, _, prompts = smollm2
    with served(ckpt) as llm:
        assert vllm_greedy(llm, prompts) == svdmlp_greedy(ckpt, prompts)
        held = llm.apply_model(_mlp_factor_bytes)
    assert held == [checkpoint_factor_bytes(ckpt)]  # float32 here: the bf16 factors' elements at 4 bytes


@pytest.mark.slow
def test_dense_smollm2_matches_svdmlp(smollm2):
    _, dense, prompts = smollm2
    with served(dense) as llm:
        assert vllm_greedy(llm, prompts) == svdmlp_greedy(dense, prompts)


def test_tensor_parallel_two_gives_the_same_tokens_and_halves_what_is_split(tokenizer, tmp_path):
    # SmolLM2-135M has 9 attention heads, which vLLM cannot split in two: a tiny Llama stands in.
    ckpt = _compress(untied_model("llama", **VLLM_TINY), tokenizer, tmp_path / "ckpt", _text(tmp_path))
    prompts = [tokenizer(p)["input_ids"] for p in ("the quick fox", "the old king walks")]
    with served(ckpt, tensor_parallel_size=2) as llm:
        assert vllm_greedy(llm, prompts) == svdmlp_greedy(ckpt, prompts)
        per_rank = llm.apply_model(_mlp_factor_bytes)
    # Each rank holds gate/up's shrink factor and down's expand factor whole, half of the other three.
    spec = checkpoint_record.servable(ckpt)
    hidden, inter = VLLM_TINY["hidden_size"], VLLM_TINY["intermediate_size"]
    expected = sum(
        4
        * (
            (r["gate"] + r["up"]) * hidden
            + r["down"] * hidden
            + (r["gate"] + r["up"] + r["down"]) * inter // 2
        )
        for r in spec.layers.values()
    )
    assert per_rank == [expected, expected]


def prompt_logprobs(llm, prompt: list[int]) -> torch.Tensor:
    """vLLM's log-probability of each prompt token after the first, given the ones before it."""
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0)
    (output,) = llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    return torch.tensor(
        [step[t].logprob for step, t in zip(output.prompt_logprobs[1:], prompt[1:], strict=True)]
    )


def svdmlp_prompt_logprobs(directory, prompt: list[int]) -> torch.Tensor:
    model, _ = checkpoint.load(directory, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]


@pytest.mark.parametrize(
    "model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"]
)
def test_every_architecture(model_type, tokenizer, tmp_path):
    # vLLM's Gemmas always tie the LM head to the embeddings, as the released models do.
    tied = model_type.startswith("gemma")
    model = tiny_model(model_type, tie_word_embeddings=tied, **VLLM_TINY)
    ckpt = _compress(model, tokenizer, tmp_path / "ckpt", _text(tmp_path))
    prompts = [tokenizer(p)["input_ids"] for p in ("the quick fox jumps over", "the old king walks")]
    with served(ckpt) as llm:
        assert vllm_greedy(llm, prompts) == svdmlp_greedy(ckpt, prompts)
        theirs = prompt_logprobs(llm, prompts[0])
    torch.testing.assert_close(theirs, svdmlp_prompt_logprobs(ckpt, prompts[0]), rtol=0, atol=2e-4)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_factors_stay_quantized(bits, tokenizer, tmp_path):
    ckpt = _compress(
        untied_model("llama", **VLLM_TINY), tokenizer, tmp_path / "ckpt", _text(tmp_path), factor_bits=bits
    )
    prompts = [tokenizer(p)["input_ids"] for p in ("the quick fox", "the old king walks")]
    expected = svdmlp_greedy(ckpt, prompts)
    with served(ckpt) as llm:
        assert vllm_greedy(llm, prompts) == expected
        assert llm.apply_model(_mlp_factor_bytes) == [checkpoint_factor_bytes(ckpt)]
    with served(ckpt, tensor_parallel_size=2) as llm:
        assert vllm_greedy(llm, prompts) == expected


@pytest.mark.parametrize(("weights", "bits"), [("int4-asym", 16), ("int8", 8)])
def test_quantized_weights_and_their_corrections_are_served_as_stored(weights, bits, tokenizer, tmp_path):
    ckpt = _compress(
        untied_model("llama", **VLLM_TINY),
        tokenizer,
        tmp_path / "ckpt",
        _text(tmp_path),
        keep=1.0,
        sequential=True,
        quantize=weights,
        correction_keep=0.1,
        factor_bits=bits,
    )
    prompts = [tokenizer(p)["input_ids"] for p in ("the quick fox", "the old king walks")]
    expected = svdmlp_greedy(ckpt, prompts)
    with served(ckpt) as llm:
        assert vllm_greedy(llm, prompts) == expected
        assert llm.apply_model(_mlp_factor_bytes) == [checkpoint_factor_bytes(ckpt)]
        theirs = prompt_logprobs(llm, prompts[1])
    torch.testing.assert_close(theirs, svdmlp_prompt_logprobs(ckpt, prompts[1]), rtol=0, atol=2e-4)
    with served(ckpt, tensor_parallel_size=2) as llm:
        assert vllm_greedy(llm, prompts) == expected


def _text(root):
    path = root / "calib.txt"
    path.write_text(SAMPLE_TEXT, encoding="utf-8")
    return path


def test_a_checkpoint_with_partial_targets_is_refused_with_one_reason(tokenizer, tmp_path):
    ckpt = _compress(
        untied_model("llama", **VLLM_TINY), tokenizer, tmp_path / "ckpt", _text(tmp_path), targets=("gate",)
    )
    with pytest.raises(Exception, match="low-rank whole"):
        with served(ckpt):
            pass
