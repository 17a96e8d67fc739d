"""Train loss and valid BLEU over updates for a few runs, side by side (``tfx.studies.run_curves``).

    python scripts/figures/plot_run_curves.py --out docs/figures/nf_12_probe.png \\
        --title "12+12, Multi30k De->En, 3 epochs" \\
        rezero=results/converged_nf_12/runs/grid/rezero/lr0.0005_d0.3_w1000 \\
        fixup=results/converged_nf_12/runs/grid/fixup/lr0.0005_d0.3_w1000

Each LABEL=RUN names a run folder (one holding ``metrics.jsonl``). Needs tfx's plot extra (matplotlib).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.reporting.metrics_log import FILENAME
from tfx.studies.run_curves import plot_run_curves


def labelled_run(text: str) -> tuple[str, Path]:
    """``LABEL=RUN`` -> (label, run folder), for the positional arguments."""
    label, sep, run = text.partition("=")
    if not sep or not label or not run:
        raise argparse.ArgumentTypeError(f"{text!r}: want LABEL=RUN_FOLDER, e.g. rezero=results/x/runs/grid/rezero/w0")
    return label, Path(run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=labelled_run, metavar="LABEL=RUN")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--title", default="")
    p.add_argument("--window", type=int, default=50, help="updates in each point's train-loss mean")
    args = p.parse_args(argv)
    if missing := [str(run / FILENAME) for _, run in args.runs if not (run / FILENAME).is_file()]:
        print(f"no run record: {', '.join(missing)} (name run folders, each with its {FILENAME})", file=sys.stderr)
        return 2
    plot_run_curves(dict(args.runs), args.out, args.title, args.window)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
