import pytest

from svdmlp import backends


def test_auto_is_torch_on_cpu():
    assert backends.resolve("auto", "cpu") == "torch"
    assert backends.get("torch").name == "torch"


def test_triton_explicitly_on_cpu_says_why(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="backend 'triton' is unavailable: .*CUDA"):
        backends.resolve("triton", "cpu")


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        backends.resolve("cuda", "cpu")
    with pytest.raises(ValueError, match="no concrete backend"):
        backends.get("auto")
