"""Encoder-only T-Fixup (T-Fixup#6): an ``nn.TransformerEncoder`` converted by ``tfx.convert`` against Pre-LN and
Post-LN (with warmup, and without as the control) at 6 and 24 layers, on generated sorting, on CPU.

The model, arms, task and budget are in ``tfx.studies.encoder_only`` (docs/convert.md, "Encoder-only T-Fixup").
Outputs in ``--out``: ``runs/<run>/record.json`` (loss curve, held-out accuracy and loss, diverged or not, seconds)
and ``runs/<run>/tb/`` (TensorBoard), ``encoder_only.md`` (the table), ``encoder_only.png`` (loss curves),
``study.json`` (wall time, machine, date). Run the same command again after a stop: recorded runs are skipped.

Usage::

    nice -n 5 python scripts/studies/encoder_only.py --out results/encoder_only --jobs 2
    python scripts/studies/encoder_only.py --out results/encoder_only --replot --figure docs/img/encoder_only.png
    tensorboard --logdir results/encoder_only/runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.studies.encoder_only import ARMS, StudyConfig, run_study, write_report

DEFAULTS = StudyConfig()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/encoder_only"))
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(DEFAULTS.arms))
    p.add_argument("--depths", type=int, nargs="+", default=list(DEFAULTS.depths), help="encoder layers")
    p.add_argument("--lrs", type=float, nargs="+", default=list(DEFAULTS.lrs), help="every arm's lr grid")
    p.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULTS.seeds))
    p.add_argument("--steps", type=int, default=DEFAULTS.steps, help="Adam updates per run")
    p.add_argument("--batch", type=int, default=DEFAULTS.batch)
    p.add_argument("--warmup", type=int, default=DEFAULTS.warmup, help="postln's linear warmup, in updates")
    p.add_argument("--d-model", type=int, default=DEFAULTS.d_model)
    p.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    p.add_argument("--figure", type=Path, help="also write the figure here (docs/img/encoder_only.png)")
    p.add_argument("--replot", action="store_true", help="rewrite the table and figure from --out; train nothing")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    try:
        args.config = StudyConfig(arms=tuple(args.arms), depths=tuple(args.depths), lrs=tuple(args.lrs),
                                  seeds=tuple(args.seeds), steps=args.steps, batch=args.batch, warmup=args.warmup,
                                  d_model=args.d_model)  # fmt: skip
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.replot:
        run_study(args.config, args.out, args.jobs)
    print(write_report(args.out, args.figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
