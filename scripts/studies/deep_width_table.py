"""Deep at width: the first 30 updates of ``+experiment=deep`` at d 512 under several optimizer settings.

Each candidate is the deep recipe (T-Fixup, no LayerNorm, no warmup) plus a few overrides; each
(candidate, N) is one ``python -m tfx.train`` run in ``OUT/runs/<candidate>_N<N>`` on the toy task
with 256-token batches, fp32, one thread, a log line per update. Validation is reduced to 16
sentences (the end-of-run one cannot be switched off) and the run's checkpoints are deleted once its
losses are read: at 100+100 layers one checkpoint_last.pt holds ~6 GB of weights and Adam moments.

Per run the table gives the train loss (bits) at update 1, the max over updates 1..U, the loss at U,
and ``pass``: no update above the loss at update 1 and the loss at U below it (issue 13's criterion).
Losses come from the run's own log (``<run>/train.log``, one line per update).

    python scripts/studies/deep_width_table.py --out outputs/deep_width --depths 6 24 [--candidates ...] [--jobs 2]
    python scripts/studies/deep_width_table.py --out outputs/deep_width --collect   # the table from finished runs

``--first-step LR ...`` predicts the spike without training: one gradient at init on the run's first
batch, then for each lr Adam's exact first update (AdamW at t = 1: p(1 - lr wd) - lr g / (|g| + eps),
i.e. lr x sign(g) for every weight that has a gradient, whatever its size) and the loss on the run's
second batch, dropout off; the weights go back between lrs. One backward and one forward per lr: at
N = 200 a few minutes instead of hours, and it matched the trained update-2 loss within 0.4 bits.

    python scripts/studies/deep_width_table.py --out outputs/deep_width --depths 200 --first-step 5e-5 3e-5

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

REPO = Path(__file__).resolve().parents[2]

# name -> the overrides on top of the deep recipe (conf/experiment/deep.yaml as it was before issue 13:
# Adam(0.9, 0.98), lr 5e-4, no warmup, no clipping).
CANDIDATES: dict[str, list[str]] = {
    "adam_5e-4": ["optim.name=adam", "optim.lr=5e-4", "optim.clip_norm=0"],
    "adam_2e-4": ["optim.name=adam", "optim.lr=2e-4", "optim.clip_norm=0"],
    "adam_1e-4": ["optim.name=adam", "optim.lr=1e-4", "optim.clip_norm=0"],
    "adam_5e-5": ["optim.name=adam", "optim.lr=5e-5", "optim.clip_norm=0"],
    "adam_3e-5": ["optim.name=adam", "optim.lr=3e-5", "optim.clip_norm=0"],
    "radam_5e-4": ["optim.name=radam", "optim.lr=5e-4", "optim.clip_norm=0"],
    "adam_5e-4_clip25": ["optim.name=adam", "optim.lr=5e-4", "optim.clip_norm=25"],
    "adam_5e-4_clip1": ["optim.name=adam", "optim.lr=5e-4", "optim.clip_norm=1"],
}

# "[2026-11-30 08:40:01,234][tfx.train][INFO] - update 3/30 | epoch 1 | loss 9.123 | lr 5.00e-04"
LINE = re.compile(r"^\[(?P<time>[\d\- :,]+)\].*update (?P<step>\d+)/\d+ \| epoch \d+ \| loss (?P<loss>\S+) \|")
DIVERGED = "consecutive non-finite steps"


@dataclass
class Row:
    candidate: str
    depth: int
    losses: list[float]  # train loss (bits) per logged update, in order
    seconds_per_update: float  # from the log's time stamps, updates 1..U
    diverged: bool  # the trainer stopped on non-finite steps

    @property
    def passed(self) -> bool:
        """No update's loss above update 1's, the last below it, all finite, and no divergence."""
        ls = self.losses
        if self.diverged or len(ls) < 2 or not all(math.isfinite(x) for x in ls):
            return False
        return max(ls) <= ls[0] and ls[-1] < ls[0]


def overrides(
    candidate: str, depth: int, updates: int, precision: str, run_dir: Path, device: str = "cpu", extra: tuple = ()
) -> list[str]:
    # One CPU thread per run on a CPU (runs go two at a time on 2 cores); all of them beside a GPU, where the CPU
    # only builds and initializes the model, and one thread would make that the slow part.
    threads = 1 if device == "cpu" else 0
    return [
        "+experiment=deep", "data=toy", "data.max_tokens=256", "data.toy_valid_size=16", "data.toy_test_size=16",
        f"model.encoder_layers={depth}", f"model.decoder_layers={depth}",
        f"train.max_updates={updates}", f"train.threads={threads}", f"train.precision={precision}",
        f"train.device={device}",
        "train.log_every_updates=1", "train.layer_stats_every_updates=0", "train.validate_every_updates=0",
        "train.save_every_updates=0", "train.save_every_epochs=0", "train.valid_max_sentences=4",
        "train.progress=true", f"hydra.run.dir={run_dir}", *CANDIDATES[candidate], *extra,
    ]  # fmt: skip


def parse_log(text: str) -> tuple[list[float], float, bool]:
    """(losses per update, seconds per update, diverged) from a run's log text."""
    losses, times = [], []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            losses.append(float(m["loss"]))
            times.append(datetime.strptime(m["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    per_update = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else math.nan
    return losses, per_update, DIVERGED in text


def run_one(candidate: str, depth: int, args: argparse.Namespace) -> Row:
    run_dir = args.out / "runs" / f"{candidate}_N{depth}"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run: the trainer would otherwise resume
    run = overrides(candidate, depth, args.updates, args.precision, run_dir, args.device, args.extra)
    cmd = [sys.executable, "-m", "tfx.train", *run]
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return collect_one(candidate, depth, args.out)


def collect_one(candidate: str, depth: int, out: Path) -> Row:
    log = out / "runs" / f"{candidate}_N{depth}" / "train.log"
    losses, per_update, diverged = parse_log(log.read_text() if log.exists() else "")
    return Row(candidate, depth, losses, per_update, diverged)


def _bits(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 1000 else f"{x:.3g}"


def table(rows: list[Row], updates: int) -> str:
    lines = [
        "| candidate | N | loss @1 | max loss 1..U | loss @U | U | s/update | pass |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if not r.losses:
            lines.append(f"| {r.candidate} | {r.depth} | - | - | - | 0 | - | no run |")
            continue
        verdict = "yes" if r.passed else ("no (diverged)" if r.diverged else "no")
        if len(r.losses) < updates and not r.diverged:
            verdict += f" (so far: {len(r.losses)} of {updates} updates)"
        lines.append(
            f"| {r.candidate} | {r.depth} | {r.losses[0]:.2f} | {_bits(max(r.losses))} | {_bits(r.losses[-1])} | "
            f"{len(r.losses)} | {r.seconds_per_update:.2f} | {verdict} |"
        )
    return "\n".join(lines)


def first_step_probe(model, first, second, optim, lrs: list[float]) -> tuple[float, dict[float, float]]:
    """(loss on ``second`` now, {lr: loss on ``second`` after Adam's first update on ``first``}), bits/token.

    Adam's first update (bias-corrected m = g, v = g^2; AdamW's decoupled decay) is applied in
    place and undone after each lr; losses are label-smoothed as in training, dropout off.
    """
    import torch

    from tfx.data import PAD
    from tfx.optim.loss import label_smoothed_loss

    def bits(batch) -> torch.Tensor:
        loss, _ = label_smoothed_loss(model(batch.src_tokens, batch.prev_output_tokens), batch.target,
                                      optim.label_smoothing, PAD)  # fmt: skip
        return loss / batch.ntokens / math.log(2)

    model.eval()
    with torch.no_grad():
        before = bits(second).item()
    model.train()
    bits(first).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    model.eval()
    after = {}
    with torch.no_grad():
        for lr in lrs:
            for p in params:
                p.mul_(1 - lr * optim.weight_decay).sub_(p.grad / (p.grad.abs() + optim.eps), alpha=lr)
            after[lr] = bits(second).item()
            for p in params:
                p.add_(p.grad / (p.grad.abs() + optim.eps), alpha=lr).div_(1 - lr * optim.weight_decay)
    model.zero_grad(set_to_none=True)
    return before, after


def first_step_losses(overrides: list[str], lrs: list[float]) -> tuple[float, dict[float, float]]:
    """``first_step_probe`` on the run that ``overrides`` describe: its model, init and first two batches."""
    import torch

    from tfx.config import compose_config
    from tfx.data import PAD, collate, make_batches, prepare_data
    from tfx.init import apply_init
    from tfx.model import build_model

    cfg = compose_config([o for o in overrides if not o.startswith("hydra.")])
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    corpus = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train",))
    train = corpus.splits["train"]
    order = make_batches(train, cfg.data.max_tokens, cfg.data.max_sentences, shuffle=True, seed=cfg.train.seed)
    model = build_model(cfg.model, corpus.tokenizer.vocab_size, PAD)
    apply_init(model, cfg.init.name, seed=cfg.train.seed)
    return first_step_probe(model, collate(train, order[0]), collate(train, order[1]), cfg.optim, lrs)


def first_step_table(args: argparse.Namespace) -> str:
    lines = ["| N | before | " + " | ".join(f"lr {lr:g}" for lr in args.first_step) + " |"]
    lines.append("|---:|---:|" + "---:|" * len(args.first_step))
    for depth in args.depths:
        before, after = first_step_losses(overrides("adam_5e-4", depth, 1, args.precision, args.out), args.first_step)
        lines.append(f"| {depth} | {before:.2f} | " + " | ".join(f"{after[lr]:.2f}" for lr in args.first_step) + " |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--depths", type=int, nargs="+", default=[6, 24])
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("extra", nargs="*", metavar="OVERRIDE", help="more Hydra overrides for every run")
    p.add_argument("--device", default="cpu", help="train.device: cpu, or cuda for the bf16 check on a GPU")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    p.add_argument("--collect", action="store_true", help="only read the finished runs under OUT/runs")
    p.add_argument("--first-step", type=float, nargs="+", metavar="LR", help="the one-update probe at these lrs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    if args.first_step:
        text = first_step_table(args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first_step.md").write_text(text + "\n")
        return 0
    plan = [(c, n) for n in args.depths for c in args.candidates]
    if args.collect:
        rows = [collect_one(c, n, args.out) for c, n in plan]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(lambda cn: run_one(*cn, args), plan))
    text = table(rows, args.updates)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "deep_width_table.md").write_text(text + "\n")
    (args.out / "deep_width_table.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
