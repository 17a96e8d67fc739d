"""Stability vs depth: T-Fixup against the baselines at N = 6..200 layers per side, one Hydra multirun of tfx.train.

Each (arm, depth) is one ``tfx.train`` run in ``<out>/runs/<arm>_N<depth>/``, launched by Hydra's joblib launcher
(``--jobs`` runs at once, ``--threads`` torch threads each, deepest first); everything in the table comes from
each run's own ``metrics.jsonl`` (``tfx/reporting/metrics_log.py``). An arm is a ``method`` (conf/method/) plus, for
``tfixup_radam``, the optimizer the T-Fixup reference code ran (``optim.name=radam``): methods compare on one
optimizer, so RAdam is an override of the study, not a method. Each arm is written as a config in
``<out>/arms/arm/`` and Hydra's search path gets that folder, so one sweep ``+arm=...`` covers every arm.

Every run: toy data (256-token batches), d_model ``--d-model`` (FFN 2x), 4 heads, dropout 0, Adam(0.9, 0.98) at
lr 5e-4, weight decay 1e-4, label smoothing 0.1, no clipping, fp32, ``--updates`` updates; the methods that warm
up (postln, deepnorm, admin) warm up over a quarter of them (``optim.budget_warmup``). Per run, the table gives:

- ``first``/``max``/``final``: the train loss (bits/token, label-smoothed) of update 1 / the highest of any update
  (the first-update spike at width) / the mean of the last 10 updates;
- ``valid``: ``valid/loss`` of the end-of-run validation (none when the run stopped on non-finite steps);
- ``diverged``: ``non-finite`` (the trainer stopped after 10 consecutive non-finite steps, or the final loss is
  not finite), ``loss rose`` (final above first), ``no``, or why the run did not end (``unfinished``,
  ``stopped by SIGTERM``);
- ``max/median Δf``: ``probe/output_change`` (``tfx.reporting.statistics.OutputChange``) over the first 100 updates: the
  RMS change per update of the logits of 8 fixed valid sentences, T-Fixup's Θ(η) claim.

Outputs: ``depth_study.md`` (the table), ``depth_study.png`` (train loss, one panel per arm, one line per depth),
``study.json`` (the arms, depths, overrides and wall time), ``runs/`` (one TensorBoard folder:
``tensorboard --logdir <out>/runs``). ``--replot`` rewrites the table and figure from ``study.json`` and the
runs' metrics files without training. A run stopped by SIGTERM/SIGINT resumes from its ``checkpoint_last.pt``
when the command is run again; once the launch ends, runs that ended lose their checkpoints
(``--keep-checkpoints`` keeps them), so running them again trains them again.
A later invocation into the same ``--out`` with the same settings adds its arms and depths to the study.
Extra ``KEY=VALUE`` arguments go to every run (e.g. ``data=multi30k data.local_dir=../shared/data/multi30k``).
The arms and the study harness are ``tfx.studies``: tfx must be installed (``pip install -e ".[study]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.studies.arms import ARMS
from tfx.studies.harness import multirun, open_study, running_mean, train_or_replot

STUDY_ARMS = [arm for arm in ARMS if arm not in ("postln_tfixup_lr", "tfixup_32k")]  # its default arms
FINAL_WINDOW = 10  # updates averaged into the final train loss
SMOOTH = 10  # running-mean window of the plotted curves


def run_overrides(args: argparse.Namespace) -> list[str]:
    """What every run of the study shares (the arm and the depth are swept)."""
    d = args.d_model
    return [
        "data=toy", "data.max_tokens=256", f"model.d_model={d}", f"model.ffn_dim={2 * d}",
        "model.heads=4", "model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0",
        "optim.lr=5e-4", f"optim.budget_warmup={max(1, args.updates // 4)}", "train.precision=fp32",
        f"train.max_updates={args.updates}", f"train.threads={args.threads}", "train.validate_every_updates=0",
        "train.valid_max_sentences=4", "train.save_every_epochs=0", "train.log_every_updates=10",
        "train.progress=false", "train.probe_updates=100", "train.probe_sentences=8", *args.overrides,
    ]  # fmt: skip


def launch(args: argparse.Namespace) -> int:
    """One multirun over arms x depths, deepest first (a run that diverged ends itself, not the sweep)."""
    depths = ",".join(str(n) for n in sorted(args.depths, reverse=not args.shallow_first))
    sweep = [f"model.encoder_layers={depths}", "model.decoder_layers=${model.encoder_layers}",
             "+arm=" + ",".join(args.methods), *run_overrides(args)]  # fmt: skip
    return multirun(args.out, args.methods, args.jobs, "${hydra:runtime.choices.arm}_N${model.encoder_layers}", sweep)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from a run's metrics records."""
    updates = [r for r in records if r["event"] == "update"]
    losses = [r["train/loss"] for r in updates]
    probe = [r["probe/output_change"] for r in updates if "probe/output_change" in r]
    valid = [r["valid/loss"] for r in records if r["event"] == "valid"]
    ends = [r for r in records if r["event"] == "end"]
    status = ends[-1]["status"] if ends else "unfinished"
    final = statistics.fmean(losses[-FINAL_WINDOW:]) if losses else math.nan
    if status == "diverged" or not math.isfinite(final):
        diverged = "non-finite"
    elif status != "completed":
        diverged = status
    else:
        diverged = "loss rose" if final > losses[0] else "no"
    finite = bool(probe) and all(math.isfinite(v) for v in probe)
    return {
        "losses": losses, "first": losses[0] if losses else math.nan, "final": final,
        "max": max(losses) if losses and all(map(math.isfinite, losses)) else math.nan,
        "valid": valid[-1] if valid else math.nan, "diverged": diverged,
        "max_df": max(probe) if finite else math.nan, "median_df": statistics.median(probe) if finite else math.nan,
        "skipped": sum(r["event"] == "skipped" for r in records),
        "seconds": ends[-1]["train_seconds"] if ends else math.nan,
    }  # fmt: skip


def collect(out: Path, arms: list[str], depths: list[int]) -> dict[tuple[str, int], dict[str, Any]]:
    """Every run that wrote a metrics file, by (arm, depth)."""
    rows = {}
    for arm in arms:
        for n in depths:
            path = out / "runs" / f"{arm}_N{n}" / FILENAME
            if path.exists():
                rows[arm, n] = summarize(read_metrics(path))
    return rows


def fmt(value: float, spec: str = ".3f") -> str:
    return "—" if math.isnan(value) else format(value, spec)


def write_table(out: Path, study: dict[str, Any], rows: dict[tuple[str, int], dict[str, Any]]) -> str:
    lines = [
        f"# Depth study: {len(rows)} of {len(study['arms']) * len(study['depths'])} runs, "
        f"wall {study['wall_seconds'] / 60:.1f} min ({study['jobs']} jobs)"
        + ("" if study.get("finished", True) else ", the last launch did not finish"),
        "",
        "Every run: `" + " ".join(study["overrides"]) + "`; arms: "
        + "; ".join(f"`{a}`: " + " ".join(f"`{o}`" for o in [f"method={ARMS[a][0]}", *ARMS[a][1]])
                    for a in study["arms"]) + ".",
        "",
        "| arm | N | first loss | max loss | final loss | valid loss | diverged | max Δf | median Δf | skipped "
        "| train s |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for (arm, n), r in rows.items():
        lines.append(
            f"| {arm} | {n} | {fmt(r['first'])} | {fmt(r['max'])} | {fmt(r['final'])} | {fmt(r['valid'])} | "
            f"{r['diverged']} | "
            f"{fmt(r['max_df'], '.3g')} | {fmt(r['median_df'], '.3g')} | {r['skipped']} | {fmt(r['seconds'], '.0f')} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "depth_study.md").write_text(text)
    return text


def plot(path: Path, arms: list[str], depths: list[int], rows: dict[tuple[str, int], dict[str, Any]]) -> None:
    """One panel per arm (its own log-y range: Xavier without LN starts far above the rest), one line per depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("viridis")([i / max(len(depths) - 1, 1) for i in range(len(depths))])
    cols = min(len(arms), 4)
    fig, axes = plt.subplots(-(-len(arms) // cols), cols, figsize=(4 * cols, 3.2 * -(-len(arms) // cols)),
                             sharex=True, squeeze=False)  # fmt: skip
    for ax, arm in zip(axes.flat, arms, strict=False):
        for n, color in zip(sorted(depths), colors, strict=True):
            if (arm, n) in rows:
                r = rows[arm, n]
                finite = [v if math.isfinite(v) else math.nan for v in r["losses"]]
                label = f"N={n}" + ("" if r["diverged"] == "no" else f" ({r['diverged']})")
                ax.plot(range(1, len(finite) + 1), running_mean(finite, SMOOTH), color=color, label=label)
        ax.set(title=arm, yscale="log", xlabel="update")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(arms) :]:
        ax.set_visible(False)
    axes[0, 0].set_ylabel(f"train loss (bits), mean of {SMOOTH}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path) -> str:
    """Table and figure from ``study.json`` and the runs' metrics files."""
    study = json.loads((out / "study.json").read_text())
    rows = collect(out, study["arms"], study["depths"])
    plot(out / "depth_study.png", study["arms"], study["depths"], rows)
    return write_table(out, study, rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("outputs/depth_study"))
    p.add_argument("--methods", nargs="+", default=STUDY_ARMS, choices=list(ARMS), help="arms of the study")
    p.add_argument("--depths", type=int, nargs="+", default=[6, 24, 100, 200], help="layers per side")
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--d-model", type=int, default=32, help="FFN is 2x")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (joblib processes)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--shallow-first", action="store_true", help="shallowest depth first (default: deepest)")
    p.add_argument("--keep-checkpoints", action="store_true")
    p.add_argument("--replot", action="store_true", help="only rewrite the table and figure from <out>")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    return args


def train_all(args: argparse.Namespace) -> int:
    """Launch the study; ``study.json`` first (so ``--replot`` works on a stopped study), its wall time last.

    A later invocation into the same ``--out`` with the same settings adds its arms and depths to the study
    (e.g. ``--depths 200`` after ``--depths 6 24 100``) and its wall time to the total.
    """
    path = args.out / "study.json"
    fresh = {"arms": [], "depths": [], "jobs": args.jobs, "overrides": run_overrides(args), "wall_seconds": 0.0}
    if (study := open_study(path, fresh, args.methods)) is None:
        return 2
    study["depths"] = sorted(set(study["depths"]) | set(args.depths))
    study["finished"] = False
    path.write_text(json.dumps(study, indent=1))
    tic = time.perf_counter()
    try:
        code = launch(args)
    except KeyboardInterrupt:
        code = 130
    study["wall_seconds"] += time.perf_counter() - tic
    study["finished"] = code == 0
    path.write_text(json.dumps(study, indent=1))
    if code != 0:
        print(f"stopped (exit {code}); re-run the same command to finish, or --replot", file=sys.stderr)
        return code
    if not args.keep_checkpoints:  # runs stopped by a signal keep theirs, to resume
        for run in (args.out / "runs").glob(f"*/{FILENAME}"):
            ends = [r for r in read_metrics(run) if r["event"] == "end"]
            if ends and ends[-1]["status"] in ("completed", "diverged"):
                shutil.rmtree(run.parent / "checkpoints", ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return train_or_replot(parse_args(argv), train_all, report)


if __name__ == "__main__":
    sys.exit(main())
