"""What the figures drawn from tables in docs/ share: reading a Markdown table row, and one look for every figure.

``scripts/figures/plot_epoch_table.py`` and ``scripts/figures/plot_headline.py`` draw committed tables whose run
folders are not kept; both read rows with ``cells`` and end with ``finish``, so their figures look alike.
Needs tfx's plot extra (``pip install -e ".[plot]"``, matplotlib) only where a figure is finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is the plot extra: imported where a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def cells(line: str) -> list[str]:
    """The cells of one markdown table row, bold markers around a cell dropped."""
    return [c.strip().strip("*") for c in line.strip().strip("|").split("|")]


def finish(fig: Figure, ax: Axes, title: str, path: Path, legend: str) -> None:
    """Title, grid and legend as every figure drawn from docs/ has them, then the PNG (small: 90 dpi)."""
    import matplotlib.pyplot as plt

    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc=legend)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
