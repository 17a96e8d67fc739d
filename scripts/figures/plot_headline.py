"""The README's figure: valid BLEU of each method over 30 CPU training minutes on Multi30k De->En.

The numbers are read from the budget study's table in ``docs/methods.md`` ("Methods at a fixed CPU budget
on real data": ``python scripts/studies/budget_study.py --out outputs/budget_study``, measured 2026-11-30 14:29-16:44
UTC on the shared 2-core development VM; the table was committed in 0308c6d, the runs' own commit is not
recorded): greedy valid BLEU at 10, 20 and 30 training minutes, three points per method. Its run folders
are not kept, so the figure is drawn from the committed table, not from ``metrics.jsonl``
(``budget_study.py --replot`` draws the full curves from run folders).

    python scripts/figures/plot_headline.py            # -> docs/figures/budget_valid_bleu.png

Needs tfx's plot extra (``pip install -e ".[plot]"``, matplotlib).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.studies.doc_figures import cells, finish

CHECKOUT = Path(__file__).resolve().parents[2]
TABLE_PAGE = CHECKOUT / "docs" / "methods.md"
FIGURE = CHECKOUT / "docs" / "figures" / "budget_valid_bleu.png"
HEADER = "| arm | updates | final loss | valid @10 min | valid @20 | valid @30 |"
MINUTES = (10, 20, 30)  # the columns valid @10 min, @20, @30


def budget_table(page: Path = TABLE_PAGE) -> dict[str, list[float]]:
    """arm -> valid BLEU at 10, 20 and 30 minutes, from the first table whose header starts with ``HEADER``."""
    lines = page.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADER)), None)
    if start is None:
        raise ValueError(f"{page}: no budget-study table (a row starting {HEADER!r})")
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        row = cells(line)
        rows[row[0]] = [float(v) for v in row[3:6]]
    return rows


def plot(rows: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for arm, bleu in rows.items():
        ax.plot(MINUTES, bleu, marker="o", label=arm, linewidth=2.2 if arm == "tfixup" else 1.2)
    ax.set(xlabel="training minutes (1 CPU thread)", ylabel="valid BLEU (greedy)", xticks=MINUTES, xlim=(8, 38))
    title = "Multi30k De->En, 30 CPU minutes per method: early training, untuned schedules"
    finish(fig, ax, title, path, legend="center right")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", type=Path, default=TABLE_PAGE, help="the page holding the budget-study table")
    p.add_argument("--out", type=Path, default=FIGURE)
    args = p.parse_args(argv)
    try:
        rows = budget_table(args.table)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plot(rows, args.out)
    print(f"{len(rows)} methods -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
