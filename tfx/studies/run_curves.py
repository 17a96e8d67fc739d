"""Training curves of a few runs side by side, from their ``metrics.jsonl``: does each leave the loss plateau, and when.

A probe (the 12+12 runs of ``scripts/studies/converged_study.py --layers 12 --until grid``) stops after a few
epochs, so the study's own figure (valid BLEU per epoch) has three points a run. Train loss per update shows the
plateau and the moment a run leaves it; valid BLEU per validation is drawn beside it on the same update axis.
``scripts/figures/plot_run_curves.py`` is the command line. Needs tfx's plot extra (matplotlib) to draw.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from tfx.reporting.metrics_log import FILENAME, read_metrics


def loss_curve(run: Path, window: int = 50) -> tuple[list[int], list[float]]:
    """(updates, train loss in bits averaged over the last ``window`` updates up to each): the run's updates in
    order; a non-finite loss stays in the record but not in the mean, which then covers fewer updates."""
    steps, means, recent = [], [], deque(maxlen=window)
    for record in read_metrics(run / FILENAME):
        if record.get("event") != "update" or "train/loss" not in record:
            continue
        recent.append(record["train/loss"])
        finite = [v for v in recent if math.isfinite(v)]
        steps.append(record["step"])
        means.append(sum(finite) / len(finite) if finite else math.nan)
    return steps, means


def valid_points(run: Path) -> tuple[list[int], list[float]]:
    """(updates, greedy valid BLEU) at each validation of the run."""
    records = [r for r in read_metrics(run / FILENAME) if r.get("event") == "valid" and "valid/bleu" in r]
    return [r["step"] for r in records], [r["valid/bleu"] for r in records]


def plot_run_curves(runs: dict[str, Path], path: Path, title: str, window: int = 50) -> None:
    """Two panels over updates: train loss (a ``window``-update mean) and valid BLEU, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, run in runs.items():
        (line,) = loss_ax.plot(*loss_curve(run, window), linewidth=1.2, label=label)
        bleu_ax.plot(*valid_points(run), marker="o", markersize=3, color=line.get_color(), label=label)
    loss_ax.set(xlabel="update", ylabel=f"train loss, bits (mean of {window} updates)")
    bleu_ax.set(xlabel="update", ylabel="valid BLEU (greedy)")
    for ax in (loss_ax, bleu_ax):
        ax.grid(alpha=0.3)
    bleu_ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
