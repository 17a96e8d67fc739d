"""A figure from a table of valid BLEU per epoch in docs/: runs from different studies on one set of axes.

A study draws its own runs (``scripts/studies/converged_study.py --replot``); a comparison across studies (a setting
one step past the grid's edge against the chosen one, whose run folder lives on another machine) exists only as a
table in docs/converged.md. This draws that table: one line per row, x the epoch, the best epoch marked; rows whose
name says "(chosen)" solid, the others dashed (each its own dash), one colour per method (the row name's first
word).

    python scripts/figures/plot_epoch_table.py --section "The grid's edge" --out docs/figures/grid_edge_bf16.png

Needs tfx's plot extra (``pip install -e ".[plot]"``, matplotlib).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.studies.doc_figures import cells, finish

CHECKOUT = Path(__file__).resolve().parents[2]
PAGE = CHECKOUT / "docs" / "converged.md"
COLUMN = "valid BLEU per epoch"
DASHES = ["--", ":", "-.", (0, (5, 1, 1, 1, 1, 1))]  # a method's other settings, in the table's order


def epoch_table(page: Path, section: str) -> dict[str, list[float]]:
    """Row name -> valid BLEU per epoch, from the first table with a ``COLUMN`` column under the heading that
    contains ``section`` (up to the next heading)."""
    lines = page.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#") and section in line), None)
    if start is None:
        raise ValueError(f"{page}: no heading containing {section!r}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    header = next((i for i in range(start, end) if lines[i].startswith("|") and COLUMN in cells(lines[i])), None)
    if header is None:
        raise ValueError(f"{page}: no table with a {COLUMN!r} column under {lines[start]!r}")
    column = cells(lines[header]).index(COLUMN)
    rows = {}
    for line in lines[header + 2 : end]:
        if not line.startswith("|"):
            break
        row = cells(line)
        try:
            rows[row[0]] = [float(v.strip("*")) for v in row[column].split()]
        except (IndexError, ValueError):
            raise ValueError(f"{page}: row {row[0]!r} has no numbers in its {COLUMN!r} cell") from None
    return rows


def plot(rows: dict[str, list[float]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours: dict[str, str] = {}
    others: dict[str, int] = {}  # method -> its settings drawn dashed so far
    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    for name, bleu in rows.items():
        method = name.split()[0]
        colour = colours.setdefault(method, f"C{len(colours)}")
        if chosen := "(chosen)" in name:
            style = "-"
        else:
            others[method] = others.get(method, -1) + 1
            style = DASHES[others[method] % len(DASHES)]
        epochs = range(1, len(bleu) + 1)
        ax.plot(epochs, bleu, color=colour, linestyle=style, linewidth=2.0 if chosen else 1.3, label=name)
        best = max(range(len(bleu)), key=bleu.__getitem__)
        ax.plot(best + 1, bleu[best], marker="o", color=colour)
    ax.set(xlabel="epoch", ylabel="valid BLEU (greedy)")
    low = min(min(b[2:] or b) for b in rows.values())  # the first epochs would squash the end, where runs differ
    ax.set_ylim(bottom=max(0.0, low - 2))
    finish(fig, ax, title, path, legend="lower right")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--page", type=Path, default=PAGE, help="the Markdown page holding the table")
    p.add_argument("--section", required=True, help="text of the heading the table stands under")
    p.add_argument("--title", help="the figure's title (default: the heading's text)")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = p.parse_args(argv)
    try:
        rows = epoch_table(args.page, args.section)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plot(rows, args.title or args.section, args.out)
    print(f"{len(rows)} runs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
