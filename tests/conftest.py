"""Shared fixtures: tiny random models of every supported architecture, a tiny tokenizer, text.

Everything is built offline from configs; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

# Before any import: huggingface_hub reads these when it is first imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

# Without a GPU the Triton kernels run under the interpreter. The variable must be set before
# anything imports triton (transformers does, below), or triton.language's helpers break.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

VOCAB = 320
HIDDEN, INTER, LAYERS = 64, 96, 2

# model_type -> extra config kwargs; every supported architecture of svdmlp.arch.
ARCH_CONFIGS = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16},
}

SAMPLE_TEXT = " ".join(
    f"the {adj} {noun} {verb} over the {adj2} hill number {i}."
    for i, (adj, noun, verb, adj2) in enumerate(
        zip(
            ["quick", "lazy", "brave", "quiet", "old", "young", "red", "pale"] * 40,
            ["fox", "dog", "king", "queen", "ghost", "sailor", "clown", "witch"] * 40,
            ["jumps", "walks", "speaks", "sings", "runs", "sleeps", "falls", "waits"] * 40,
            ["green", "dark", "high", "far", "cold", "bright", "long", "wet"] * 40,
            strict=True,
        )
    )
)


def tiny_config(model_type: str, **overrides):
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **ARCH_CONFIGS[model_type],
    )
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A random model whose MLP inputs are far from white (so whitening has something to do)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), dtype=torch.float32)
    return model.eval()


def untied_model(model_type: str, **overrides) -> torch.nn.Module:
    """A tiny model with untied embeddings: tied tiny Gemmas only ever repeat the last prompt token,
    which makes a generation test vacuous."""
    return tiny_model(model_type, tie_word_embeddings=False, **overrides)


def compress_for_generation(model, tokenizer, text_file) -> torch.nn.Module:
    """Compress a tiny model in place (keep 0.5, 4 calibration windows of 32 tokens) and return it:
    the compressed model the generation tests run."""
    from svdmlp.compression import pipeline
    from svdmlp.config import CalibrationSpec, CompressConfig

    config = CompressConfig(keep=0.5, align=8, calibration=CalibrationSpec(str(text_file), 4, 32))
    pipeline.compress(model, tokenizer, config, progress=False)
    return model


def hf_greedy(model, prompts: list[list[int]], new: int, stop=None) -> list[list[int]]:
    """Hugging Face greedy continuations, left-padded as the engine pads, cut after a stop token."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=stop,
    )
    rows = []
    for row in out[:, width:].tolist():
        if stop is not None and stop in row:
            row = row[: row.index(stop) + 1]
        rows.append(row)
    return rows


@pytest.fixture(autouse=True)
def _one_thread(request):
    """Tiny matrices gain nothing from threads, and OpenMP spinning on a busy 2-core box costs up to
    100x; one thread also makes results independent of the machine. Slow tests keep all threads."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on SAMPLE_TEXT, small enough for VOCAB, with a BOS token."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]
    )
    backend.train_from_iterator([SAMPLE_TEXT], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    # A BOS token the tokenizer does not add itself: Gemma's convention puts it first (arch.bos_token_id).
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    return tokenizer


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text(SAMPLE_TEXT, encoding="utf-8")
    return path


@pytest.fixture
def model_dir(tmp_path, tokenizer):
    """A saved tiny Llama (config + safetensors + tokenizer), as a user's local model directory."""
    path = tmp_path / "tiny-llama"
    tiny_model("llama").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_llama(path, tokenizer):
    """A tiny Llama and ``tokenizer`` saved to ``path``, as a user's local model directory; returns ``path``."""
    tiny_model("llama").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_checkpoint(root, tokenizer, keep: float = 0.5):
    """``svdmlp compress`` run on the CPU on a tiny Llama, everything under ``root``.

    Returns (model_dir, text_file, checkpoint_dir); text_file holds SAMPLE_TEXT and is the calibration
    text (4 windows of 32 tokens, ranks aligned to 8).
    """
    from svdmlp.cli import main

    model_dir = save_tiny_llama(root / "tiny-llama", tokenizer)
    text = root / "text.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    ckpt = root / "ckpt"
    argv = [
        "compress",
        model_dir,
        "--keep",
        keep,
        "--align",
        8,
        "--calib",
        text,
        "--effort",
        "fast",
        "--method",
        "whiten",
    ]
    argv += ["--calib-samples", 4, "--calib-seq-len", 32, "--out", ckpt]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        assert main([str(a) for a in argv]) == 0
    return model_dir, text, ckpt


def tiny_sweep_argv(model_dir, text, out, keep: str, method: str, score_text: bool = True) -> list[str]:
    """``svdmlp sweep`` of ``model_dir`` on the CPU's smallest settings: calibration on ``text``
    (4 windows of 32 tokens, ranks aligned to 8), 2 perplexity windows of 32 tokens on ``text``
    too unless ``score_text`` is False (the caller then names what to score)."""
    argv = ["sweep", model_dir, "--keep", keep, "--method", method]
    argv += ["--text", text] if score_text else []
    argv += ["--seq-len", "32", "--max-windows", "2", "--align", "8", "--calib", text]
    argv += ["--calib-samples", "4", "--calib-seq-len", "32", "--out", out]
    return [str(a) for a in argv]


@contextmanager
def backward_stopped_at(monkeypatch, layer: int):
    """Inside the block the calibration's backward pass stops (Ctrl-C) when it reaches ``layer``; the
    layers it ran back through before are appended to the list yielded. Restored after the block."""
    from svdmlp.compression import output_grams

    through, ran = output_grams._backward_through, []

    def stopping(model, spec, index, *args):
        if index == layer:
            raise KeyboardInterrupt
        ran.append(index)
        return through(model, spec, index, *args)

    monkeypatch.setattr(output_grams, "_backward_through", stopping)
    try:
        yield ran
    finally:
        monkeypatch.setattr(output_grams, "_backward_through", through)


@contextmanager
def forward_stopped_at(monkeypatch, layer: int):
    """Inside the block the calibration's forward pass stops (Ctrl-C) as it is about to keep the inputs
    of ``layer``; the layers whose inputs it kept before are appended to the list yielded. Restored
    after the block."""
    from svdmlp.compression import output_grams

    put, kept = output_grams._LayerInputs.put, []

    def stopping(self, index, *args):
        if index == layer:
            raise KeyboardInterrupt
        kept.append(index)
        return put(self, index, *args)

    monkeypatch.setattr(output_grams._LayerInputs, "put", stopping)
    try:
        yield kept
    finally:
        monkeypatch.setattr(output_grams._LayerInputs, "put", put)


def count_calls(monkeypatch, module, name: str) -> list:
    """Wrap ``module.name`` so that each call appends to the returned list (then calls through)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``svdmlp ARGV`` in-process: (exit code, stdout, stderr)."""
    from svdmlp.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_cli_error(capsys, command: str, argv, *phrases: str) -> str:
    """Run ``argv``; expect exit 2 and exactly one stderr line ``svdmlp COMMAND: error: ...`` (after
    the prediction ``compress`` states first, when it got that far)."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (out, err)
    lines = [line for line in err.strip().splitlines() if not line.startswith("svdmlp: predicted: ")]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"svdmlp {command}: error: "), line
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    return line


def edit_metadata(directory, edit) -> dict:
    """Apply ``edit`` to a checkpoint's svdmlp.json and seal it again (its digest recomputed), as a
    deliberate editor would: what the checks behind the digest find. Returns the edited record."""
    from svdmlp import checkpoint_record

    path = Path(directory) / "svdmlp.json"
    metadata = json.loads(path.read_text())
    edit(metadata)
    if checkpoint_record.DIGEST_KEY in metadata:
        metadata[checkpoint_record.DIGEST_KEY] = checkpoint_record.digest(metadata)
    path.write_text(json.dumps(metadata))
    return metadata


def snapshot(directory) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory`` with its bytes and time of change: to show nothing was touched."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
