"""Padded against packed batches in one invocation: the first updates' loss curve and training speed.

Runs ``python -m tfx.train +experiment=EXPERIMENT`` once per batching (``data.batching=padded`` and
``packed``), alternating ``--repeat`` times (repeat r with ``train.seed=r+1``, so the spread between seeds
says how large a difference noise makes), with validation and numbered saves off, and reads each
run's ``metrics.jsonl``: per-update train loss (bits) and real target tokens, and the training
seconds of its end record. Prints the loss curve in windows of ``--window`` updates, both rates in
real (non-pad) target tokens per training second, and their ratio (packed / padded) per pair.

Usage (CPU, one thread, Multi30k from the staged text files)::

    python scripts/bench/bench_batching.py --out /tmp/bench_batching --updates 60 \\
        data.local_dir=../shared/data/multi30k train.threads=1 train.precision=fp32
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

BATCHINGS = ("padded", "packed")


def run(out: Path, batching: str, repeat: int, args: argparse.Namespace) -> dict:
    """One training run; its per-update losses and tokens, and its training seconds."""
    run_dir = out / f"{batching}_{repeat}"
    cmd = [sys.executable, "-m", "tfx.train", f"+experiment={args.experiment}", f"data.batching={batching}",
           f"hydra.run.dir={run_dir}", f"train.seed={repeat + 1}", f"train.max_updates={args.updates}",
           "train.validate_every_updates=0", "train.validate_every_minutes=0", "train.save_every_epochs=0",
           "train.max_minutes=0", "train.progress=false", *args.overrides]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if r["event"] == "update"]
    end = next(r for r in records if r["event"] == "end")
    return {"loss": [r["train/loss"] for r in updates], "tokens": sum(r["train/ntokens"] for r in updates),
            "seconds": end["train_seconds"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")
    p.add_argument("--experiment", default="multi30k")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--window", type=int, default=10, help="updates per row of the loss curve")
    args = p.parse_args(argv)
    results: dict[str, list[dict]] = {b: [] for b in BATCHINGS}
    for r in range(args.repeat):
        for batching in BATCHINGS:
            results[batching].append(run(args.out, batching, r, args))
    print(f"{args.experiment}, {args.updates} updates, overrides {args.overrides}\n")
    print("| updates | " + " | ".join(f"{b} loss (bits): mean, seed range" for b in BATCHINGS) + " |")
    print("|---|" + "---:|" * len(BATCHINGS))
    for start in range(0, args.updates, args.window):
        cells = []
        for b in BATCHINGS:
            per_seed = [statistics.mean(x["loss"][start : start + args.window]) for x in results[b]]
            cells.append(f"{statistics.mean(per_seed):.3f} ({min(per_seed):.3f}-{max(per_seed):.3f})")
        print(f"| {start + 1}-{min(start + args.window, args.updates)} | " + " | ".join(cells) + " |")
    rates = {b: [x["tokens"] / x["seconds"] for x in results[b]] for b in BATCHINGS}
    print("\n| batching | real tgt tokens/update | tgt tokens/s (median) |\n|---|---:|---:|")
    for b in BATCHINGS:
        per_update = statistics.mean(x["tokens"] for x in results[b]) / args.updates
        print(f"| {b} | {per_update:.0f} | {statistics.median(rates[b]):.0f} |")
    pairs = [a / b for a, b in zip(rates["packed"], rates["padded"], strict=True)]
    print(f"\npacked / padded tokens/s per pair: {', '.join(f'{x:.2f}' for x in pairs)}; "
          f"median {statistics.median(pairs):.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
