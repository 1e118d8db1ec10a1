from pathlib import Path

import pytest
import torch

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import arch, corpora
from svdmlp.compression import calibration
from svdmlp.config import CalibrationSpec, CompressConfig


def test_windows_are_seeded_disjoint_and_shaped(tokenizer):
    a = calibration.token_windows(tokenizer, SAMPLE_TEXT, 6, 32, seed=0)
    b = calibration.token_windows(tokenizer, SAMPLE_TEXT, 6, 32, seed=0)
    c = calibration.token_windows(tokenizer, SAMPLE_TEXT, 6, 32, seed=1)
    assert a.shape == (6, 32) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)
    ids = tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    starts = []
    for row in a.tolist():  # every window is a real span of the text
        start = next(i for i in range(len(ids) - 31) if ids[i : i + 32] == row)
        starts.append(start)
    assert all(later - earlier >= 32 for earlier, later in zip(starts, starts[1:], strict=False))
    assert calibration.tokens_hash(a) == calibration.tokens_hash(b) != calibration.tokens_hash(c)


def test_more_windows_than_the_text_holds_overlap_instead_of_failing(tokenizer):
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 500, 64, seed=0)
    assert windows.shape == (500, 64)


@pytest.mark.parametrize(
    "text, message", [("", "empty"), ("   \n", "empty"), ("the fox", "one window needs")]
)
def test_bad_calibration_text(tokenizer, text, message):
    with pytest.raises(ValueError, match=message):
        calibration.token_windows(tokenizer, text, 4, 32, seed=0)


@pytest.mark.parametrize("model_type, index", [("llama", 1), ("gemma3_text", 1), ("llama", 0)])
def test_grams_equal_the_inputs_the_projections_see(model_type, index):
    """Also when the forward stops early after the last calibrated layer (index 0 of 2)."""
    model = tiny_model(model_type)
    spec = arch.resolve(model.config.model_type)
    layers = arch.decoder_layers(model, spec)
    captured = {"gate": [], "down": []}
    mlp = getattr(layers[index], spec.mlp)
    hooks = [
        getattr(mlp, spec.gate).register_forward_pre_hook(
            lambda m, a: captured["gate"].append(a[0].double())
        ),
        getattr(mlp, spec.down).register_forward_pre_hook(
            lambda m, a: captured["down"].append(a[0].double())
        ),
    ]
    windows = torch.randint(0, 300, (5, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for batch in windows.split(2):
            model(input_ids=batch, use_cache=False)
    for hook in hooks:
        hook.remove()
    grams = calibration.collect_grams(model, spec, windows, [index], batch_size=2, progress=False)
    assert set(grams) == {index}
    for key, attr in (("gate", "gate_up"), ("down", "down")):
        x = torch.cat([t.reshape(-1, t.shape[-1]) for t in captured[key]])
        torch.testing.assert_close(getattr(grams[index], attr), x.T @ x, rtol=1e-5, atol=1e-5)
    assert grams[index].tokens == 5 * 16
    # hooks are gone: a further forward pass changes nothing
    before = grams[index].gate_up.clone()
    assert model(input_ids=windows[:1]).logits.shape == (1, 16, 320)  # the stop hook is gone too
    assert torch.equal(before, grams[index].gate_up)


@pytest.mark.parametrize(
    "weights, num_samples, expected",
    [([1.0], 5, [5]), ([0.75, 0.25], 8, [6, 2]), ([0.5, 0.5], 3, [2, 1]), ([0.99, 0.01], 4, [3, 1])],
)
def test_window_shares_sum_up_and_give_every_text_one(weights, num_samples, expected):
    assert calibration.window_shares(weights, num_samples) == expected


def test_mixture_windows_take_each_share_from_its_text(tokenizer):
    other = " ".join(["numbers one two three four five six seven eight nine ten"] * 40)
    windows = calibration.mixture_windows(tokenizer, [(SAMPLE_TEXT, 0.75), (other, 0.25)], 8, 16, seed=0)
    assert windows.shape == (8, 16)
    torch.testing.assert_close(windows[:6], calibration.token_windows(tokenizer, SAMPLE_TEXT, 6, 16, seed=0))
    torch.testing.assert_close(windows[6:], calibration.token_windows(tokenizer, other, 2, 16, seed=0))


def _ngrams(ids: list[int], n: int) -> set[int]:
    return {hash(tuple(ids[i : i + n])) for i in range(len(ids) - n + 1)}


def test_calibration_windows_never_come_from_the_evaluation_texts(tokenizer):
    """The built-in split: windows of every local calibration source share no 48-token span with the
    held-out texts that evaluation scores (the other domains' splits are tested in tests/corpora)."""
    config = CompressConfig(calibration=CalibrationSpec("python:1,prose:1", 24, 64))
    windows = calibration.config_windows(tokenizer, config, None)
    heldout = []
    for source in ("python-heldout", "prose-heldout"):
        heldout += tokenizer(corpora.read_text(source), add_special_tokens=False)["input_ids"]
    seen = _ngrams(heldout, 48)
    assert windows.shape == (24, 64)
    assert all(not (_ngrams(row, 48) & seen) for row in windows.tolist())


def test_healing_trains_and_validates_on_disjoint_windows_of_every_source(tokenizer, tmp_path):
    texts = {
        "a.txt": " ".join(f"apple {i * 7919 % 100003}" for i in range(1500)),  # no span repeats
        "b.txt": " ".join(f"berry {i * 104729 % 100019}" for i in range(1500)),
    }
    paths = []
    for name, text in texts.items():
        paths.append(tmp_path / name)
        paths[-1].write_text(text)
    config = CompressConfig(calibration=CalibrationSpec(f"{paths[0]}:3,{paths[1]}:1", 4, 16))
    training, validation = calibration.training_and_validation(
        tokenizer, config, None, 8, 16, seed=5, bos=7, per_source=2
    )
    assert training.shape == (8, 17) and (training[:, 0] == 7).all()
    assert list(validation) == [str(p) for p in paths] and all(
        v.shape == (2, 17) for v in validation.values()
    )
    for path, windows in validation.items():
        ids = tokenizer(Path(path).read_text(), add_special_tokens=False)["input_ids"]
        spans = {tuple(ids[i : i + 16]): i for i in range(len(ids) - 15)}
        starts = {spans[tuple(row[1:])] for row in windows.tolist()}
        taken = [spans[tuple(row[1:])] for row in training.tolist() if tuple(row[1:]) in spans]
        assert all(abs(a - b) >= 16 for a in starts for b in taken)  # no validation token was trained on
    from_b = sum(int("berry" in tokenizer.decode(row[1:])) for row in training.tolist())
    assert from_b == 2  # the sources' shares (6 and 2 of 8)
    again = calibration.training_and_validation(tokenizer, config, None, 8, 16, seed=5, bos=7, per_source=2)
    assert torch.equal(again[0], training)


def test_self_calibration_is_sampled_by_the_model_and_mixes_with_text(tokenizer, text_file):
    model = tiny_model("llama")
    config = CompressConfig(calibration=CalibrationSpec(f"self:1,{text_file}:1", 4, 16))
    windows = calibration.config_windows(tokenizer, config, None, bos=5, model=model)
    again = calibration.config_windows(tokenizer, config, None, bos=5, model=tiny_model("llama"))
    assert windows.shape == (4, 17) and torch.equal(windows, again)  # the same seed, the same samples
    assert (windows[:, 0] == 5).all()
    text_part = calibration.token_windows(tokenizer, SAMPLE_TEXT, 2, 16, seed=0)
    assert torch.equal(windows[2:, 1:], text_part)
    other_seed = calibration.config_windows(tokenizer, config, None, seed=1, bos=5, model=model)
    assert not torch.equal(other_seed[:2], windows[:2])
    with pytest.raises(ValueError, match="'self' calibration needs the model"):
        calibration.config_windows(tokenizer, config, None)
