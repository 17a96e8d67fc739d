"""What TensorBoard shows of a run: the custom-scalars front page, per-layer heatmaps, the HParams columns.

Per-layer statistics arrive as one number per layer (``layers/enc/act_rms/003``); as scalars a 200+200
run would draw ~800 cards. ``LayerHistory`` keeps them and draws one layers x updates image per stack
and statistic instead (``~layers/enc/act_rms``, ``~layers/dec/grad_norm``, ...: ``docs/dashboard.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tfx.config import Config
from tfx.reporting.heatmap import render

LAYER_PREFIX = "layers/"
STACKS = {"enc": "encoder", "dec": "decoder"}
# The heatmaps' tag group. Time Series, the page TensorBoard opens on, sorts every card by tag (characters by code,
# digit runs as numbers), groups them by the tag's first segment in that order and expands the first two groups
# (TensorBoard 2.21's webfiles, the metrics store). Under ``layers/`` the heatmaps led, a card per run and panel (32
# for 8 runs), before ``train/`` and ``valid/``; ``~`` sorts after every letter, so the curves come first and the
# heatmaps last, collapsed. (torch's SummaryWriter writes a tag as given; tests/reporting/test_dashboard.py checks
# the order.)
IMAGE_GROUP = "~layers"


def image_tag(panel: str) -> str:
    """The TensorBoard tag of a heatmap panel: ``layers/enc/act_rms`` -> ``~layers/enc/act_rms``."""
    return IMAGE_GROUP + "/" + panel.removeprefix(LAYER_PREFIX)


def _chart(*tags: str) -> list[Any]:
    """A custom-scalars line chart of the exact ``tags`` (they are regexes there), every run on it."""
    return ["Multiline", [f"^{tag}$" for tag in tags]]


# The Custom Scalars tab, in this order: what a comparison of runs looks at first, then the rest.
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "training": {
        "train loss (bits per token)": _chart("train/loss"),
        "valid BLEU": _chart("valid/bleu"),
        "learning rate": _chart("train/lr"),
        "gradient norm": _chart("train/grad_norm"),
    },
    "more": {
        "valid loss (bits per token)": _chart("valid/loss"),
        "train perplexity": _chart("train/ppl"),
        "throughput (tokens/s)": _chart("train/tokens_per_s"),
        "skipped (non-finite) and fp16-overflow steps": _chart("train/skipped_steps", "train/overflow_steps"),
        "output change per update (T-Fixup's bound)": _chart("probe/output_change", "probe/logprob_change"),
    },
}


# The HParams table's columns before anyone ticks a box: TensorBoard displays five, those marked as differing
# first, each group by name (so: depth, dropout, lr, method, warmup). The studies' grid is lr x dropout x warmup
# (docs/converged.md); method and depth say what is compared. precision, seed, init and the rest are a tick away.
HPARAMS_SHOWN = ("method", "lr", "dropout", "warmup", "depth")


# The HParams table's metric columns: scalars every run logs, each shown at its last value (TensorBoard's rule),
# under a short name. valid/best_bleu's last value is the run's best.
HPARAMS_METRICS = {"valid/best_bleu": "best BLEU", "valid/bleu": "last BLEU", "train/epoch": "epochs"}


def hparams(cfg: Config, precision: str | None = None) -> dict[str, Any]:
    """The HParams-tab columns: what a comparison of runs varies, every axis a study sweeps among them.

    ``precision``: what the run resolved ``train.precision`` to (``auto`` -> bf16 or fp32); the setting without it.
    ``warmup`` is the run's resolved ``optim.warmup_updates`` (a method's ``${optim.budget_warmup}`` as a number).
    """
    m = cfg.model
    return {
        "experiment": cfg.experiment,
        "method": cfg.method,
        "norm": m.norm,
        "init": cfg.init.name,
        "optim": cfg.optim.name,
        "depth": f"{m.encoder_layers}+{m.decoder_layers}",  # encoder + decoder layers, as the docs write it
        "d_model": m.d_model,
        "lr": cfg.optim.lr,
        "dropout": m.dropout,
        "warmup": cfg.optim.warmup_updates,
        "precision": precision or cfg.train.precision,
        "seed": cfg.train.seed,
        "data": cfg.data.name,
    }


def split_layer_stats(metrics: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(per-layer ``layers/*`` values, everything else): the first go to images, the rest to scalars."""
    layers = {k: v for k, v in metrics.items() if k.startswith(LAYER_PREFIX)}
    return layers, {k: v for k, v in metrics.items() if not k.startswith(LAYER_PREFIX)}


class LayerHistory:
    """Per-layer statistics of every recorded update, one panel per stack and statistic.

    A panel is ``layers/enc/act_rms``; its rows are layers (``.../003`` -> row 3), its columns the
    updates ``add`` saw, in order. Kept in memory for the process's life (after a resume it starts
    afresh): a 200-layer stack logged 1000 times is 200k floats.
    """

    def __init__(self) -> None:
        self.panels: dict[str, tuple[list[int], list[list[float]]]] = {}  # panel -> (steps, columns)

    def add(self, step: int, stats: Mapping[str, float]) -> None:
        """Append one column per panel from ``{"layers/enc/act_rms/000": v, ...}``."""
        columns: dict[str, dict[int, float]] = {}
        for key, value in stats.items():
            panel, index = key.rsplit("/", 1)
            columns.setdefault(panel, {})[int(index)] = value
        for panel, by_layer in columns.items():
            steps, cols = self.panels.setdefault(panel, ([], []))
            steps.append(step)
            cols.append([by_layer.get(i, float("nan")) for i in range(max(by_layer) + 1)])

    def images(self) -> dict[str, np.ndarray]:
        """``{tag: (H, W, 3) uint8}``: each panel's layers x updates heatmap so far, under its ``image_tag``."""
        out = {}
        for panel, (steps, cols) in self.panels.items():
            depth = max(len(c) for c in cols)
            values = np.array([c + [float("nan")] * (depth - len(c)) for c in cols], dtype=np.float64).T
            stack, stat = panel.removeprefix(LAYER_PREFIX).split("/")
            title = f"{STACKS.get(stack, stack)} {stat} (log colour)"
            out[image_tag(panel)] = render(values, title, steps)
        return out
