"""The depth map on Multi30k De->En: every method, unchanged, at N = 6, 24, 48 layers per side, then 100 and 200.

Stage 1: each method (T-Fixup, Post-LN with its warmup, Pre-LN, DeepNorm, Admin, DyT, Derf where
conf/method/derf.yaml exists, ReZero, Fixup) at its chosen 3+3 setting (``+experiment=multi30k method=NAME``) at
N = 6, 24, 48; a cell that diverges or gets stuck has one retry at the smallest change its paper or the 12+12
probes point to. Stage 2: N = 100 and 200 for T-Fixup and the method (``--others``: up to 3) that trained best
at N = 48.
d 128, 2 epochs, fp32, one thread a run, two runs at once; the measured cost, the outcome rule and the retries
are in ``tfx.studies.depth_map`` and ``tfx.studies.depth_cells`` (docs/depth.md, "The depth map on Multi30k").

Outputs in ``--out``: ``depth_map.md`` (the map, then every run: setting, outcome, valid BLEU per epoch, greedy
test2016 BLEU, s/update, peak MB, wall time), ``depth_map.png`` (BLEU against depth, log-x), ``study.json`` (the
plan and the stage-2 choice), ``runs/`` (one TensorBoard folder, per-layer heatmaps under ``layers/``). Run the same
command again after a stop (SIGTERM, Ctrl-C): finished cells are skipped, unfinished ones resume from
``checkpoint_last.pt``. ``--replot`` rewrites table and figure from the run folders; ``--dry-run`` prints the cells.

Usage::

    nice -n 5 python scripts/studies/depth_map.py --out results/depth_map          # both stages; resumes
    python scripts/studies/depth_map.py --out results/depth_map --dry-run          # the cells and their overrides
    python scripts/studies/depth_map.py --out results/depth_map --replot
    tensorboard --logdir results/depth_map/runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.studies.depth_cells import STAGE1_DEPTHS, STAGE2_DEPTHS, study_methods
from tfx.studies.depth_map import dry_run, run_study
from tfx.studies.depth_map_report import write_report
from tfx.studies.harness import CHECKOUT, train_or_replot


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("outputs/depth_map"))
    p.add_argument("--data-dir", type=Path, default=CHECKOUT.parent / "shared" / "data" / "multi30k",
                   help="Multi30k as raw text files: train, valid, test (test2016) .de/.en")  # fmt: skip
    p.add_argument("--methods", nargs="+", metavar="METHOD", help="default: every method of the map that has a YAML")
    p.add_argument("--depths", type=int, nargs="+", default=STAGE1_DEPTHS, help="stage 1, layers per side")
    p.add_argument("--deep-depths", type=int, nargs="+", default=STAGE2_DEPTHS, help="stage 2, layers per side")
    p.add_argument("--others", type=int, default=1,
                   help="methods besides T-Fixup that go on to stage 2 (each ~7 one-thread hours)")  # fmt: skip
    p.add_argument("--epochs", type=int, default=2, help="train.max_epochs of every run (no patience)")
    p.add_argument("--beam", type=int, default=1, help="test2016 decoding beam (1: greedy)")
    p.add_argument("--jobs", type=int, default=2, help="runs (and decodes) at once")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    p.add_argument("--until", choices=["stage1", "all"], default="all",
                   help="stage1: stop when stage 1 has ended (the same command without it goes on)")  # fmt: skip
    p.add_argument("--replot", action="store_true", help="rewrite depth_map.md/.png from --out; train nothing")
    p.add_argument("--dry-run", action="store_true", help="print the cells and their overrides; train nothing")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run")
    args = p.parse_args(argv)
    for name in ("epochs", "jobs", "threads", "beam"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.others < 0 or min(args.depths + args.deep_depths) < 1:
        p.error("--others must be >= 0 and every depth >= 1")
    try:
        args.methods = study_methods(args.methods)
    except ValueError as err:
        p.error(str(err))
    args.out, args.data_dir = args.out.resolve(), args.data_dir.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return dry_run(args) if args.dry_run else train_or_replot(args, run_study, write_report)


if __name__ == "__main__":
    sys.exit(main())
