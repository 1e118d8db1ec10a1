"""Plots are drawn without pyplot and saved the same way everywhere."""

from __future__ import annotations

import subprocess
import sys

from svdmlp.plots import new_figure, save_figure


def test_one_panel_and_several(tmp_path):
    figure, axes = new_figure((4, 3))
    axes.plot([1, 2], [3, 4])
    save_figure(figure, tmp_path / "a" / "one.png", "a title")
    assert (tmp_path / "a" / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert figure.texts[0].get_text() == "a title"
    figure, axes = new_figure((8, 3), panels=3)
    assert len(axes) == 3
    save_figure(figure, tmp_path / "three.png")
    assert (tmp_path / "three.png").stat().st_size > 0


def test_drawing_leaves_pyplot_alone(tmp_path):
    """A user's pyplot session keeps its backend: plotting neither imports pyplot nor switches it."""
    code = (
        "import sys; from svdmlp.plots import new_figure, save_figure; "
        f"figure, axes = new_figure((2, 2)); save_figure(figure, {str(tmp_path / 'p.png')!r}); "
        "print('matplotlib.pyplot' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
