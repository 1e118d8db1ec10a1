"""What every plot shares: a figure drawn without pyplot, and one way to finish and save it.

Figures are built from :class:`matplotlib.figure.Figure` directly, so that drawing a plot neither
needs a display nor switches the backend of a user's own pyplot session. matplotlib is imported here
only when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path


def new_figure(figsize: tuple[float, float], panels: int | None = None):
    """``(figure, axes)``: one Axes, or with ``panels`` a list of that many side by side."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    if panels is None:
        return figure, figure.subplots()
    return figure, list(figure.subplots(1, panels, squeeze=False)[0])


def save_figure(figure, path: Path, title: str | None = None) -> None:
    """Title the figure (if asked), fit its layout, and write it to ``path`` as a PNG."""
    if title is not None:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
