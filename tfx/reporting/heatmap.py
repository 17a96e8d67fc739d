"""A (layers, updates) array of per-layer statistics drawn as a labelled RGB heatmap, log-scale colour.

Training never needs matplotlib (a dev/plot extra): numpy draws the cells and the colour bar, and
Pillow, which TensorBoard itself requires, writes the few labels. The colour scale is logarithmic
because per-layer norms span decades when something goes wrong, and that is what the picture is for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# matplotlib's viridis at five stops, dark purple -> yellow: perceptually even, still readable in grey.
STOPS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)
NON_FINITE = (255, 0, 0)  # inf or NaN: red, a colour viridis never reaches
NON_POSITIVE = (0, 0, 0)  # 0 has no logarithm (a layer that got no gradient): black

# The cell area aims at this size (cells are whole pixels, so it varies): the whole image then fits
# TensorBoard's image card (~330 px) unscaled, so its labels stay legible.
PLOT_WIDTH, PLOT_HEIGHT = 220, 160
LEFT, TOP, BOTTOM, GAP, BAR, RIGHT = 56, 16, 15, 5, 10, 40  # margins and colour-bar geometry, pixels
INK = (0, 0, 0)


def colormap(t: np.ndarray) -> np.ndarray:
    """``t`` in [0, 1] (any shape) -> uint8 RGB of shape ``t.shape + (3,)``, linear between the stops."""
    x = np.clip(t, 0.0, 1.0) * (len(STOPS) - 1)
    lo = np.minimum(np.floor(x).astype(np.int64), len(STOPS) - 2)
    frac = (x - lo)[..., None]
    return np.rint(STOPS[lo] * (1 - frac) + STOPS[lo + 1] * frac).astype(np.uint8)


def log_range(values: np.ndarray) -> tuple[float, float]:
    """(smallest, largest) finite positive value: the ends of the colour bar; (1, 1) when there is none."""
    ok = values[np.isfinite(values) & (values > 0)]
    return (float(ok.min()), float(ok.max())) if ok.size else (1.0, 1.0)


def colors(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """RGB of each value on a log scale from ``lo`` (dark) to ``hi`` (bright); 0 black, inf/NaN red."""
    span = math.log10(hi) - math.log10(lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (np.log10(values) - math.log10(lo)) / span if span > 0 else np.full(values.shape, 0.5)
    rgb = colormap(np.nan_to_num(t, nan=0.0, posinf=1.0, neginf=0.0))
    rgb[values <= 0] = NON_POSITIVE
    rgb[~np.isfinite(values)] = NON_FINITE
    return rgb


def render(values: np.ndarray, title: str, steps: Sequence[int]) -> np.ndarray:
    """(layers, updates) values -> (H, W, 3) uint8: layer 0 at the top, updates left to right, a colour bar.

    ``steps`` are the updates of the columns (first and last are written under the cells).
    """
    n_layers, n_cols = values.shape
    lo, hi = log_range(values)
    cell_h, cell_w = max(1, PLOT_HEIGHT // n_layers), max(1, PLOT_WIDTH // n_cols)
    cells = np.repeat(np.repeat(colors(values, lo, hi), cell_h, axis=0), cell_w, axis=1)
    h, w = cells.shape[:2]
    bar_x = LEFT + w + GAP
    canvas = np.full((TOP + h + BOTTOM, bar_x + BAR + RIGHT, 3), 255, dtype=np.uint8)
    canvas[TOP : TOP + h, LEFT : LEFT + w] = cells
    canvas[TOP : TOP + h, bar_x : bar_x + BAR] = colors(np.geomspace(hi, lo, h)[:, None], lo, hi)
    image = Image.fromarray(canvas)
    _labels(ImageDraw.Draw(image), title, n_layers, steps, (lo, hi), (h, w, bar_x))
    return np.asarray(image)


def _labels(
    draw: ImageDraw.ImageDraw, title: str, n_layers: int, steps: Sequence[int], scale: tuple[float, float],
    geometry: tuple[int, int, int],
) -> None:  # fmt: skip
    """Title, first/last layer, first/last update, and the colour bar's two ends."""
    h, w, bar_x = geometry
    font = ImageFont.load_default()
    draw.text((LEFT, 2), title, fill=INK, font=font)
    draw.text((2, TOP), "layer 0", fill=INK, font=font)
    draw.text((2, TOP + h - 11), f"layer {n_layers - 1}", fill=INK, font=font)
    draw.text((LEFT, TOP + h + 3), f"update {steps[0]}", fill=INK, font=font)
    last = f"{steps[-1]}"
    draw.text((LEFT + w - draw.textlength(last, font=font), TOP + h + 3), last, fill=INK, font=font)
    lo, hi = scale
    draw.text((bar_x + BAR + 3, TOP), f"{hi:.2g}", fill=INK, font=font)
    draw.text((bar_x + BAR + 3, TOP + h - 11), f"{lo:.2g}", fill=INK, font=font)
