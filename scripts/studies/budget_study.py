"""Methods on real data at a fixed CPU budget: Multi30k De->En, every method the same minutes of training.

One Hydra multirun of ``tfx.train +experiment=multi30k`` (3+3 layers, d 256, 2048-token batches, tied decoder
embeddings) over the arms of ``tfx.studies.arms`` (``method`` + what the arm adds), ``--jobs`` runs at once,
one torch thread each, fp32, ``--minutes`` of training per run (``train.max_minutes``; validation time is not
counted), greedy validation BLEU every ``--minutes / 3``. The default arms are the six methods plus
``postln_tfixup_lr``: Post-LN with its warmup, then T-Fixup's decay lr * sqrt(4000 / (4000 + t)) instead of
lr * sqrt(W / t), the row that separates the init from the schedule.

Then each run's final model (``checkpoints/checkpoint_last.pt``: the weights after the budget, not the best
validation) translates the test sets with beam 5 (``python -m tfx.evaluate``, ``--jobs`` at a time, one thread
each), and the table gives, per arm: updates in the budget, final train loss (mean of the last 20 updates,
bits), greedy valid BLEU at 1/3, 2/3 and the whole budget, and test sacreBLEU on each test set.

Outputs: ``budget_study.md`` (the table), ``budget_study.png`` (valid BLEU over training minutes, train loss over
updates), ``study.json`` (arms, overrides, wall time) and ``runs/`` (one TensorBoard folder). ``--replot``
rewrites the table and figure from the run folders. Runs stopped by a signal resume when the command is run
again; decodes already scored (``runs/<arm>/test/<set>.bleu.json``) are not redone.
The arms and the study harness are ``tfx.studies``: tfx must be installed (``pip install -e ".[study]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.studies.arms import ARMS, DEFAULT_ARMS
from tfx.studies.harness import (
    CHECKOUT,
    missing_files,
    multirun,
    open_study,
    run_recorded,
    running_mean,
    train_or_replot,
    write_line,
)

TEST_LABELS = {"test": "test2016", "test_2017_flickr": "test2017 flickr", "test_2018_flickr": "test2018 flickr"}
TEST_SETS = list(TEST_LABELS)  # file stems in --data-dir
FINAL_WINDOW = 20  # updates averaged into the final train loss
SMOOTH = 20


# Every arm on the default schedule of the budget it was measured at (lr 5e-4, dropout 0.3, a 100-update warmup for
# the methods that warm up), not each method's converged setting (the `tuned` table of conf/experiment/multi30k.yaml):
# the budget study asks how each method does on its own defaults early in training.
DEFAULT_SCHEDULE = ["optim.lr=5e-4", "model.dropout=0.3", "optim.budget_warmup=100"]


def run_overrides(args: argparse.Namespace) -> list[str]:
    """What every run shares (the arm is swept, after these: +experiment comes first, so the arm's method wins)."""
    return [
        "+experiment=multi30k", *DEFAULT_SCHEDULE, f"data.local_dir={args.data_dir}",
        f"train.max_minutes={args.minutes}",
        f"train.validate_every_minutes={args.minutes / 3}", f"train.threads={args.threads}",
        f"train.precision={args.precision}", "train.progress=false", *args.overrides,
    ]  # fmt: skip


def launch(args: argparse.Namespace) -> int:
    """The training multirun, in ``--methods`` order (joblib hands the next arm to whichever job frees first)."""
    sweep = [*run_overrides(args), "+arm=" + ",".join(args.methods)]
    return multirun(args.out, args.methods, args.jobs, "${hydra:runtime.choices.arm}", sweep)


def decode_jobs(out: Path, arms: list[str], data_dir: Path) -> list[list[str]]:
    """``tfx.evaluate`` commands (beam 5, final weights) for every finished run's unscored test sets."""
    cmds = []
    for arm in arms:
        ckpt = out / "runs" / arm / "checkpoints" / "checkpoint_last.pt"
        for name in TEST_SETS:
            hyp = out / "runs" / arm / "test" / f"{name}.hyp"  # tfx.evaluate scores it in <name>.bleu.json
            if ckpt.exists() and not score_path(out / "runs" / arm, name).exists():
                cmds.append([
                    sys.executable, "-m", "tfx.evaluate", str(ckpt), "--src", str(data_dir / f"{name}.de"),
                    "--ref", str(data_dir / f"{name}.en"), "--beam", "5", "--quiet", "--output", str(hyp),
                ])  # fmt: skip
    return cmds


def decode_all(cmds: list[list[str]], jobs: int) -> int:
    """Run the decodes ``jobs`` at a time, one thread each; the number that failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def one(cmd: list[str]) -> int:
        Path(cmd[-1]).parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(cmd, cwd=CHECKOUT, env=env, capture_output=True, text=True)
        bleu = [line for line in done.stdout.splitlines() if line.startswith("BLEU")] or ["no score"]
        write_line(f"{Path(cmd[-1]).relative_to(Path(cmd[-1]).parents[2])}: {bleu[0]}", sys.stdout)
        if done.returncode:
            write_line(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed", sys.stderr)
        return done.returncode

    with ThreadPoolExecutor(jobs) as pool:
        return sum(code != 0 for code in pool.map(one, cmds))


def score_path(run: Path, name: str) -> Path:
    return run / "test" / f"{name}.bleu.json"


def test_bleu(path: Path) -> float:
    """sacreBLEU of a ``tfx.evaluate`` report (its first score is sacreBLEU)."""
    if not path.exists():
        return math.nan
    return json.loads(path.read_text())["scores"][0]["score"]


def summarize(run: Path, minutes: float) -> dict[str, Any]:
    """One row from a run's metrics records and its test reports."""
    records = read_metrics(run / FILENAME)
    losses = [r["train/loss"] for r in records if r["event"] == "update"]
    valid = [(r["valid/train_minutes"], r["valid/bleu"]) for r in records if r["event"] == "valid"]
    ends = [r for r in records if r["event"] == "end"]
    marks = [minutes / 3, 2 * minutes / 3, minutes]
    # the last validation within half a minute past each mark: the one the minute schedule triggered
    at = [max((v for v in valid if v[0] <= m + 0.5), default=(math.nan, math.nan))[1] for m in marks]
    return {
        "updates": len(losses), "status": ends[-1]["status"] if ends else "unfinished",
        "final": statistics.fmean(losses[-FINAL_WINDOW:]) if losses else math.nan, "losses": losses,
        "valid": valid, "valid_at": at, "test": [test_bleu(score_path(run, n)) for n in TEST_SETS],
    }  # fmt: skip


def fmt(value: float, spec: str = ".2f") -> str:
    return "—" if math.isnan(value) else format(value, spec)


def write_table(out: Path, study: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    m = study["minutes"]
    lines = [
        f"# Methods at a fixed budget: Multi30k De->En, {m:g} training minutes per run, "
        f"wall {study['wall_seconds'] / 60:.1f} min ({study['jobs']} jobs)",
        "",
        "Every run: `" + " ".join(study["overrides"]) + "`; arms: "
        + "; ".join(f"`{a}`: " + " ".join(f"`{o}`" for o in [f"method={ARMS[a][0]}", *ARMS[a][1]])
                    for a in study["arms"]) + ". Test: beam 5, final weights, sacreBLEU.",
        "",
        f"| arm | updates | status | final loss | valid @{m / 3:.3g} | valid @{2 * m / 3:.3g} | valid @{m:.3g} | "
        + " | ".join(TEST_LABELS.values()) + " |",
        "|---|---:|---|---:|---:|---:|---:|" + "---:|" * len(TEST_SETS),
    ]  # fmt: skip
    for arm, r in rows.items():
        cells = [str(r["updates"]), r["status"], fmt(r["final"], ".3f"), *map(fmt, r["valid_at"]), *map(fmt, r["test"])]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / "budget_study.md").write_text(text)
    return text


def plot(path: Path, rows: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bleu, loss) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, r in rows.items():
        if r["valid"]:
            bleu.plot(*zip(*r["valid"], strict=True), marker="o", label=arm)
        finite = [v if math.isfinite(v) else math.nan for v in r["losses"]]
        loss.plot(range(1, len(finite) + 1), running_mean(finite, SMOOTH), label=arm)
    bleu.set(xlabel="training minutes", ylabel="valid BLEU (greedy)", title="valid BLEU")
    loss.set(xlabel="update", ylabel=f"train loss (bits), mean of {SMOOTH}", yscale="log", title="train loss")
    for ax in (bleu, loss):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path) -> str:
    study = json.loads((out / "study.json").read_text())
    runs = {arm: out / "runs" / arm for arm in study["arms"]}
    rows = {arm: summarize(run, study["minutes"]) for arm, run in runs.items() if (run / FILENAME).exists()}
    plot(out / "budget_study.png", rows)
    return write_table(out, study, rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("outputs/budget_study"))
    p.add_argument("--data-dir", type=Path, default=CHECKOUT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--methods", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS), help="arms, in launch order")
    p.add_argument("--minutes", type=float, default=30.0, help="training minutes per run")
    p.add_argument("--jobs", type=int, default=2, help="runs (and decodes) at once")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--precision", default="fp32", help="train.precision of every run")
    p.add_argument("--replot", action="store_true", help="only rewrite the table and figure from <out>")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run")
    args = p.parse_args(argv)
    args.out, args.data_dir = args.out.resolve(), args.data_dir.resolve()
    return args


def train_and_decode(args: argparse.Namespace) -> int:
    """``study.json`` first (so ``--replot`` works on a stopped study), then training, then the test decodes.

    A later invocation into the same ``--out`` with the same settings adds its arms to the study."""
    if problem := missing_files(args.data_dir, ["train", "valid", *TEST_SETS]):
        print(problem, file=sys.stderr)
        return 2
    path = args.out / "study.json"
    fresh = {"arms": [], "minutes": args.minutes, "jobs": args.jobs, "overrides": run_overrides(args),
             "wall_seconds": 0.0}  # fmt: skip
    if (study := open_study(path, fresh, args.methods)) is None:
        return 2

    def work() -> tuple[int, int]:
        code = launch(args)
        return code, decode_all(decode_jobs(args.out, args.methods, args.data_dir), args.jobs) if code == 0 else 0

    return run_recorded(path, study, work)


def main(argv: list[str] | None = None) -> int:
    return train_or_replot(parse_args(argv), train_and_decode, report)


if __name__ == "__main__":
    sys.exit(main())
