"""The start and finish every course plot shares.

`new_figure` picks matplotlib's headless Agg backend when no Jupyter kernel is running (a
script, a test, a benchmark), so plotting never needs a display; in a notebook the kernel's
inline backend draws the figure under the cell. `finish` lays the figure out and saves it when
a path is given. A plot function draws between the two and returns the figure.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def new_figure(figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A new matplotlib figure and its axes."""
    import matplotlib

    if "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def finish(fig: Any, path: str | os.PathLike | None = None, *, dpi: int = 100) -> Any:
    """Tight layout, saved as an image at `path` when given; returns `fig`."""
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig
