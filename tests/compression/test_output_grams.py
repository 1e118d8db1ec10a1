import functools
import weakref

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from conftest import backward_stopped_at, count_calls, tiny_model
from svdmlp import arch, decompose
from svdmlp.compression import gram, output_grams
from svdmlp.compression.calibration import tokens_hash


def _windows(n=3, length=16, seed=0):
    return torch.randint(0, 300, (n, length), generator=torch.Generator().manual_seed(seed))


SHA, OTHER = tokens_hash(_windows()), tokens_hash(_windows(seed=1))  # what marks a spilled sweep's files


def _hook_count(model) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()
    )


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
@pytest.mark.parametrize("loss", output_grams.LOSSES)
def test_grams_are_symmetric_psd_and_shaped(model_type, loss):
    model = tiny_model(model_type)
    spec = arch.resolve(model.config.model_type)
    grams = output_grams.collect_output_grams(model, spec, _windows(), [0, 1], loss=loss, progress=False)
    assert set(grams) == {0, 1}
    hidden, inter = model.config.hidden_size, model.config.intermediate_size
    for entry in grams.values():
        assert entry.tokens == 3 * 16
        for name, size in (("gate", inter), ("up", inter), ("down", hidden)):
            gram = entry.gram(name)
            assert gram.shape == (size, size) and gram.dtype == torch.float64
            torch.testing.assert_close(gram, gram.T, rtol=0, atol=0)
            eigenvalues = torch.linalg.eigvalsh(gram)
            assert eigenvalues.min() >= -1e-6 * eigenvalues.max() and eigenvalues.max() > 0


def test_grams_equal_the_gradients_autograd_gives():
    """The labels loss's gradients at one layer's projection outputs, captured by retain_grad."""
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    windows = _windows(n=4)
    mlp = getattr(arch.decoder_layers(model, spec)[1], spec.mlp)
    captured = {name: [] for name in arch.PROJECTIONS}
    outputs = {}

    def keep(name):
        def hook(module, args, output):
            output.retain_grad()
            outputs[name] = output

        return hook

    hooks = [getattr(mlp, spec.projection(n)).register_forward_hook(keep(n)) for n in arch.PROJECTIONS]
    for batch in windows.split(2):
        logits = model(input_ids=batch, use_cache=False).logits
        F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
        ).backward()
        for name in arch.PROJECTIONS:
            captured[name].append(outputs[name].grad.reshape(-1, outputs[name].shape[-1]).double())
    for hook in hooks:
        hook.remove()
    model.zero_grad(set_to_none=True)
    grams = output_grams.collect_output_grams(
        model, spec, windows, [1], loss="labels", batch_size=2, progress=False
    )
    for name in arch.PROJECTIONS:
        g = torch.cat(captured[name])
        expected = g.T @ g
        torch.testing.assert_close(
            grams[1].gram(name), expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max())
        )


def test_the_model_is_left_as_it_was():
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    frozen = model.model.layers[0].mlp.up_proj.weight
    frozen.requires_grad_(False)  # a caller's own choice, restored as found
    before = {name: p.requires_grad for name, p in model.named_parameters()}
    hooks = _hook_count(model)
    reference = model(input_ids=_windows(n=1)).logits.detach()
    output_grams.collect_output_grams(model, spec, _windows(), [0, 1], progress=False)
    assert {name: p.requires_grad for name, p in model.named_parameters()} == before
    assert all(p.grad is None for p in model.parameters())
    assert _hook_count(model) == hooks and not model.training
    after = model(input_ids=_windows(n=1))
    torch.testing.assert_close(after.logits.detach(), reference)
    assert after.logits.requires_grad  # the graph starts from the weights again, not the embeddings


def test_hooks_and_flags_are_restored_when_the_forward_fails(monkeypatch):
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    hooks = _hook_count(model)

    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(output_grams, "_loss", fail)
    with pytest.raises(RuntimeError, match="boom"):
        output_grams.collect_output_grams(model, spec, _windows(), [0], progress=False)
    assert _hook_count(model) == hooks
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_sampled_loss_is_seeded_and_differs_from_the_labels():
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)

    def collect(**kwargs):
        return output_grams.collect_output_grams(model, spec, _windows(), [1], progress=False, **kwargs)[1]

    a, b, c = collect(seed=3), collect(seed=3), collect(seed=4)
    torch.testing.assert_close(a.down, b.down, rtol=0, atol=0)
    assert not torch.allclose(a.down, c.down)
    assert not torch.allclose(a.down, collect(loss="labels").down)


def test_grams_do_not_depend_on_how_many_rows_are_gathered_per_update(monkeypatch):
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)

    def collect():
        return output_grams.collect_output_grams(model, spec, _windows(), [0, 1], progress=False)

    whole = collect()  # every window's rows in one update per layer
    monkeypatch.setattr(output_grams, "BufferedGram", functools.partial(gram.BufferedGram, rows=5))
    small = collect()  # 16-token windows, 5 rows at a time: updates across windows' boundaries
    for index in (0, 1):
        for name in arch.PROJECTIONS:
            expected = whole[index].gram(name)  # float32 products: rounding relative to the largest entry
            torch.testing.assert_close(
                small[index].gram(name), expected, rtol=0, atol=1e-5 * float(expected.abs().max())
            )


@pytest.mark.parametrize("spilled", [False, True])
def test_the_backward_pass_holds_two_copies_of_the_hidden_states(tmp_path, monkeypatch, spilled):
    # The windows' hidden states are the calibration's largest tensors after the Grams: the batches'
    # last ones are dropped before the backward pass, each layer's inputs are taken one batch at a time
    # (from disk, a copy each: tensors mapping the file would keep its pages resident) and its output
    # gradients let go batch by batch as the gradients below them are made.
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    through, seen = output_grams._backward_through, []

    def watched(model, spec, index, batches, inputs, gradients, *args):
        taken = []

        def one_at_a_time():
            for hidden in inputs:
                # The batch before is let go as this one is handed on (zip holds it while reading this).
                assert all(ref() is None for ref in taken[:-1]), "an earlier batch's inputs are still held"
                taken.append(weakref.ref(hidden))
                yield hidden
                del hidden

        below = through(model, spec, index, batches, one_at_a_time(), gradients, *args)
        seen.append((all(batch.hidden is None for batch in batches), len(taken), len(gradients), len(below)))
        return below

    monkeypatch.setattr(output_grams, "_backward_through", watched)
    spill = tmp_path if spilled else None
    output_grams.collect_output_grams(
        model, spec, _windows(), [0, 1], batch_size=2, progress=False, spill=spill, windows_sha256=SHA
    )
    assert seen == [(True, 2, 0, 2), (True, 2, 0, 2)]  # two batches of the three windows, each layer


def _uniform(rows: int, seed: int) -> torch.Tensor:
    return torch.rand(rows, 1, generator=torch.Generator().manual_seed(seed))


def test_sample_draws_each_token_as_often_as_its_probability():
    probabilities = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0]).repeat(20000, 1)
    draws = output_grams.sample(probabilities, _uniform(len(probabilities), 0))
    counts = torch.bincount(draws, minlength=5).double() / len(draws)
    assert counts[1] == 0 and counts[4] == 0  # probability zero, first and last: never drawn
    torch.testing.assert_close(counts, probabilities[0].double(), rtol=0, atol=0.01)


def test_sample_follows_its_draws_and_takes_unnormalised_rows():
    probabilities = torch.rand(50, 300, generator=torch.Generator().manual_seed(1))
    first = output_grams.sample(probabilities, _uniform(50, 2))
    again = output_grams.sample(probabilities, _uniform(50, 2))
    other = output_grams.sample(probabilities, _uniform(50, 3))
    scaled = output_grams.sample(probabilities * 7, _uniform(50, 2))
    assert torch.equal(first, again) and not torch.equal(first, other) and torch.equal(first, scaled)
    assert first.dtype == torch.int64 and first.shape == (50,) and int(first.max()) < 300


def test_unknown_loss_is_refused():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="loss must be one of"):
        output_grams.collect_output_grams(model, arch.resolve("llama"), _windows(), [0], loss="kl")


def test_whitenings_are_cached_per_damping_and_are_roots_of_the_damped_gram(monkeypatch):
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    entry = output_grams.collect_output_grams(model, spec, _windows(), [0], progress=False)[0]
    calls = []
    real = decompose.Whitening.from_gram
    monkeypatch.setattr(decompose.Whitening, "from_gram", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain = entry.whitening("gate")
    assert entry.whitening("gate") is plain
    damped = entry.whitening("gate", 0.5)
    assert entry.whitening("gate", 0.5) is damped and len(calls) == 2
    expected = entry.gate + 0.5 * entry.gate.diagonal().mean() * torch.eye(
        entry.gate.shape[0], dtype=torch.float64
    )
    # Up to the ridge (48 tokens: the 96² Gram is singular).
    scale = float(expected.abs().max())
    torch.testing.assert_close(damped.gram(), expected, rtol=1e-6, atol=1e-5 * scale)
    entry.whitening("down", 0.5)
    assert len(calls) == 3


def test_spilled_grams_give_the_same_grams_to_float32_and_roots_and_are_deleted_after(tmp_path):
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    kept = output_grams.collect_output_grams(model, spec, _windows(), [1], progress=False)[1]
    spilled = output_grams.collect_output_grams(model, spec, _windows(), [1], progress=False, spill=tmp_path)[
        1
    ]
    assert spilled.gate is None and spilled.path.parent == tmp_path  # nothing of it left in memory
    with safe_open(spilled.path, framework="pt") as handle:
        assert {handle.get_slice(name).get_dtype() for name in handle.keys()} == {"F32"}  # half of float64
    for name in ("gate", "up", "down"):
        read = spilled.gram(name)
        assert read.dtype == torch.float64
        torch.testing.assert_close(read, kept.gram(name).float().double(), rtol=0, atol=0)
        torch.testing.assert_close(
            spilled.whitening(name, 0.1).lower, kept.whitening(name, 0.1).lower, rtol=1e-5, atol=1e-7
        )
    spilled.discard()
    assert not spilled.path.exists()


def _spilled_grams(model, spec, layers: list[int], spill) -> dict[int, dict[str, torch.Tensor]]:
    """Each chosen layer's output-gradient Grams by projection, made spilling into ``spill``."""
    grams = output_grams.collect_output_grams(
        model, spec, _windows(), layers, progress=False, spill=spill, windows_sha256=SHA
    )
    return {index: {name: entry.gram(name) for name in arch.PROJECTIONS} for index, entry in grams.items()}


def _assert_same_grams(continued: dict, whole: dict) -> None:
    """A continued sweep's Grams are the unstopped one's, bit for bit."""
    assert continued.keys() == whole.keys()
    for index, entry in whole.items():
        for name, expected in entry.items():
            torch.testing.assert_close(continued[index][name], expected, rtol=0, atol=0)


def test_a_spilled_sweep_stopped_between_layers_continues_where_it_stopped(tmp_path, monkeypatch):
    model = tiny_model("llama", num_hidden_layers=4)
    spec = arch.resolve(model.config.model_type)

    def collect(spill):
        return _spilled_grams(model, spec, [0, 1, 3], spill)

    (tmp_path / "whole").mkdir()
    whole = collect(tmp_path / "whole")
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    with backward_stopped_at(monkeypatch, 1) as backward, pytest.raises(KeyboardInterrupt):
        collect(stopped)
    assert backward == [3, 2] and output_grams.stopped_at(stopped) == 1
    through = output_grams._backward_through

    layers_run = []
    monkeypatch.setattr(
        output_grams,
        "_backward_through",
        lambda m, s, index, *a: layers_run.append(index) or through(m, s, index, *a),
    )
    forward = count_calls(monkeypatch, output_grams, "run_layer")
    continued = collect(stopped)
    assert layers_run == [1, 0] and forward == []  # no layer forward again, layers 3 and 2 not again
    assert output_grams.stopped_at(stopped) is None
    _assert_same_grams(continued, whole)


def test_a_gradient_left_by_another_sweep_is_not_continued(tmp_path, monkeypatch):
    model = tiny_model("llama")
    spec = arch.resolve(model.config.model_type)
    with backward_stopped_at(monkeypatch, 0), pytest.raises(KeyboardInterrupt):
        output_grams.collect_output_grams(
            model, spec, _windows(seed=1), [0, 1], progress=False, spill=tmp_path, windows_sha256=OTHER
        )
    assert output_grams.stopped_at(tmp_path) == 0
    fresh = output_grams.collect_output_grams(
        model, spec, _windows(), [0, 1], progress=False, spill=tmp_path, windows_sha256=SHA
    )
    expected = output_grams.collect_output_grams(model, spec, _windows(), [0, 1], progress=False)
    for index in (0, 1):
        torch.testing.assert_close(fresh[index].gram("down"), expected[index].gram("down"), rtol=0, atol=1e-6)


def test_a_spilled_forward_pass_stopped_continues_from_the_last_inputs_kept(tmp_path, monkeypatch):
    model = tiny_model("llama", num_hidden_layers=4)
    spec = arch.resolve(model.config.model_type)
    layers = arch.decoder_layers(model, spec)

    def collect(spill):
        return _spilled_grams(model, spec, [1, 3], spill)

    (tmp_path / "whole").mkdir()
    whole = collect(tmp_path / "whole")
    run_layer, ran = output_grams.run_layer, []

    def stop_in_layer_2(layer, *args):
        index = list(layers).index(layer)
        if index == 2:
            raise KeyboardInterrupt
        ran.append(index)
        return run_layer(layer, *args)

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    monkeypatch.setattr(output_grams, "run_layer", stop_in_layer_2)
    with pytest.raises(KeyboardInterrupt):
        collect(stopped)
    assert sorted(p.name for p in stopped.iterdir()) == [
        "inputs-00001.safetensors",
        "inputs-00002.safetensors",
    ]
    ran.clear()
    monkeypatch.setattr(
        output_grams,
        "run_layer",
        lambda layer, *a: ran.append(list(layers).index(layer)) or run_layer(layer, *a),
    )
    continued = collect(stopped)
    assert ran == [2, 2, 2, 3, 3, 3]  # three windows through layers 2 and 3: 0 and 1 not again
    _assert_same_grams(continued, whole)
