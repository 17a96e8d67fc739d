"""Methods at the end of training on Multi30k: a tuning grid per arm, finalists to convergence, seeds, test BLEU.

Each arm goes through the stages in turn. The arms share ``--jobs`` slots and a free slot goes to the earliest
arm's waiting run (``tfx.studies.queue``): arms still finish in order, so an interrupted study has whole arms, and
a later arm trains on the slots an earlier one leaves idle (its long finalist still training, say):

1. **Grid** (``--grid-epochs`` epochs, seed 1): peak lr (``--lrs``) x dropout (``--dropouts``) x warmup updates
   (``--warmups``; an arm whose method trains without warmup keeps 0 only), greedy valid BLEU each epoch. An arm
   tuned elsewhere (``--tuned ARM=LR,DROPOUT,WARMUP``; the GPU preset's arms, at the settings their CPU studies
   chose) has a grid of that one setting; its other seeds start when that run ends, beside seed 1.
2. **Finalists** (seed 1): per peak lr and dropout, the grid's best warmup, trained on to convergence: until valid
   BLEU has not improved for ``--patience`` epochs (``train.patience``) or ``--max-epochs``; numbered checkpoints
   each epoch. The finalist with the best valid BLEU is the arm's setting. Why not take the grid's best outright:
   a short budget rewards what starts fastest, the higher lr and the weaker dropout, and both ended worse on
   Multi30k (T-Fixup: lr 1e-3 / dropout 0.1 led its grid and peaked at epoch 9; docs/methods.md).
3. **Seeds** (the other ``--seeds``): the arm's setting to convergence (with seed 1 when the grid has one
   setting per lr and dropout, one finalist: nothing is left to choose).
4. **Test** (beam 5, every finalist and seed, each on its slot as soon as it converges, so a run that has ended
   carries its scores whatever becomes of the machine): the best-valid checkpoint, and the average of the best
   window of numbered checkpoints chosen on valid (``tfx.average --best-window``), on test2016, test_2017_flickr
   and test_2018_flickr, as sacreBLEU (13a, cased) and as the lowercased tokenized BLEU the Multi30k literature
   reports. The table reports the arm's setting; the finalists' table each finalist's test2016.

Outputs in ``--out``: ``converged_study.md`` (mean +- std over seeds and each seed's value, epochs to the best valid
score, the chosen setting, each arm against T-Fixup by paired bootstrap on every test decode, every finalist's valid
BLEU, each arm's grid, where each run stands, wall time), ``converged_study.png`` (valid BLEU per epoch, the mean
per arm with the seeds' range as a band, the other finalists dashed), ``converged_grid.png`` (each arm's grid as a
heatmap: what its lr, dropout and warmup were chosen from), ``study.json`` and ``runs/`` (one TensorBoard folder).
Everything resumes: run the same command again after an interruption; finished runs do not train again and scored
decodes are not redone.
``--replot`` rewrites table and figures from the run folders. ``--layers 12`` is the deeper table (12 + 12
layers, d 256); ``--direction en-de`` the other direction. The study harness is ``tfx.studies``: tfx must be
installed (``pip install -e ".[study]"``).

Usage (CPU; an epoch of the 3+3 model takes about 8 minutes on one AVX2 thread in fp32, 2 on a bf16 one)::

    python scripts/converged_study.py --out results/converged --arms tfixup postln --seeds 1   # results/README.md
    python scripts/converged_study.py --out outputs/converged --tuned postln=1e-3,0.1,400   # a grid of one for postln
    python scripts/converged_study.py --out outputs/converged_gpu --preset gpu   # CPU-tuned arms, 3 seeds, one GPU
    python scripts/converged_study.py --preset gpu --dry-run    # its plan, every arm's config composed; no training
    scripts/gpu_converged.sh OUT    # the GPU preset at 3+3 and 12+12 inside a time box (one device call)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.bleu import paired_bootstrap
from tfx.data.sources import read_lines
from tfx.metrics_log import FILENAME, read_metrics
from tfx.studies.arms import ARMS, write_arm, write_arms
from tfx.studies.harness import CHECKOUT, missing_files, open_study, run_recorded, train_command, train_or_replot
from tfx.studies.queue import STOPPED, RunQueue

DEFAULT_ARMS = ["tfixup", "postln", "postln_tfixup_lr", "preln", "deepnorm", "admin", "xavier_noln"]
# Each arm's setting (peak lr, dropout, warmup updates) as its CPU study chose it, 3+3 De->En (docs/methods.md):
# T-Fixup and Post-LN fp32 (2026-12-01/02), Pre-LN, Admin bf16 (2026-12-03), DeepNorm bf16 (2026-12-04: the best
# finalist so far; its lr 5e-4 finalists had not converged). The GPU preset trains these.
TUNED_ON_CPU: dict[str, Setting] = {"tfixup": (5e-4, 0.3, 0), "postln": (1e-3, 0.1, 400), "preln": (5e-4, 0.3, 0),
                                    "admin": (1e-3, 0.3, 0), "deepnorm": (1e-3, 0.3, 400)}  # fmt: skip
WARMUP_FREE = {"tfixup", "xavier_noln", "postln_nowarmup"}  # methods whose recipe is no warmup at all
TEST_SETS = {"test": "test2016", "test_2017_flickr": "test2017 flickr", "test_2018_flickr": "test2018 flickr"}
KINDS = {"best": "checkpoints/checkpoint_best.pt", "avg": "average.pt"}  # what is decoded, per run folder
Setting = tuple[float, float, int]  # (peak lr, dropout, warmup updates)
WINDOW = 5  # numbered checkpoints averaged, at most (the window is chosen on valid)
DASHES = ["--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]  # the not-chosen finalists in the figure


def setting_name(lr: float, dropout: float, warmup: int) -> str:  # a grid run's folder
    return f"lr{lr:g}_d{dropout:g}_w{warmup}"


def shared_overrides(args: argparse.Namespace) -> list[str]:
    """What every run of the study shares."""
    src, tgt = args.direction.split("-")
    layers = f"model.encoder_layers={args.layers}", f"model.decoder_layers={args.layers}"
    return ["+experiment=multi30k", f"data.local_dir={args.data_dir}", f"data.src_lang={src}",
            f"data.tgt_lang={tgt}", *layers, f"train.threads={args.threads}",
            f"train.precision={args.precision}",
            "train.max_minutes=0", "train.validate_every_minutes=0", "train.validate_every_updates=0",
            "train.progress=false", *args.overrides]  # fmt: skip


def grid_settings(arm: str, args: argparse.Namespace) -> list[Setting]:
    """An arm's grid: its ``--tuned`` setting alone, or lr x dropout x warmup (warmup 0 for a warmup-free method)."""
    if tuned := args.tuned.get(arm):
        return [tuple(tuned)]
    warmups = [0] if ARMS[arm][0] in WARMUP_FREE else args.warmups
    return [(lr, d, w) for lr in args.lrs for d in args.dropouts for w in warmups]


def grid_run(out: Path, arm: str, setting: Setting) -> Path:
    return out / "runs" / "grid" / arm / setting_name(*setting)


def run_grid(args: argparse.Namespace, arm: str, queue: RunQueue, priority: int) -> int:
    """Stage 1: the arm's grid runs that have not ended, all queued at once."""
    shared = [*shared_overrides(args), f"train.max_epochs={args.grid_epochs}", "train.seed=1"]
    runs = [(grid_run(args.out, arm, s), [*shared, *setting_overrides(s), f"+arm={arm}"])
            for s in grid_settings(arm, args) if not ended(grid_run(args.out, arm, s))]  # fmt: skip
    return train_all(args.out, queue, priority, runs)


def train_all(out: Path, queue: RunQueue, priority: int, runs: list[tuple[Path, list[str]]],
              then: Callable[[int, subprocess.CompletedProcess], None] | None = None) -> int:  # fmt: skip
    """Train each (run folder, overrides) on a slot of ``queue`` (``then(i, done)`` as run ``i`` ends); 0, or the
    first failure's exit code (a diverged run is a finding, not a failure), or ``STOPPED`` when the study was stopped
    meanwhile."""

    done = queue.run_all([train_command(out, run, overrides) for run, overrides in runs], priority, then=then)
    codes = [0 if d.returncode and end_status(run) == "diverged" else d.returncode
             for d, (run, _) in zip(done, runs, strict=True)]  # fmt: skip
    return STOPPED if queue.stopped else next((code for code in codes if code), 0)


def best_valid(run: Path) -> tuple[float, int]:
    """(best greedy valid BLEU, the epoch it came at) of a run; (nan, 0) without validations."""
    return best_of(valid_curve(run))


def best_of(curve: list[float]) -> tuple[float, int]:
    """(the best of a valid-BLEU curve, its epoch; the first of equals); (nan, 0) for no validations."""
    if not curve:
        return math.nan, 0
    best = max(range(len(curve)), key=curve.__getitem__)
    return curve[best], best + 1


def finalist_name(arm: str, lr: float, dropout: float) -> str:
    return f"{arm}_lr{lr:g}_d{dropout:g}"


def grid_finalists(out: Path, arm: str, args: argparse.Namespace) -> dict[str, Setting]:
    """Per peak lr and dropout, the grid setting with the best valid BLEU (the first of equals, in grid order), by
    ``finalist_name``: the short budget chooses the warmup, convergence chooses lr and dropout."""
    finalists = {}
    for lr, dropout in lr_dropouts(arm, args):
        scored = [(best_valid(out / "runs" / "grid" / arm / setting_name(*s))[0], s)
                  for s in grid_settings(arm, args) if s[:2] == (lr, dropout)]  # fmt: skip
        scored = [(bleu, s) for bleu, s in scored if not math.isnan(bleu)]
        if not scored:
            grid = out / "runs" / "grid" / arm
            raise SystemExit(f"no finished grid run for arm {arm}, lr {lr:g}, dropout {dropout:g} in {grid}")
        finalists[finalist_name(arm, lr, dropout)] = max(scored, key=lambda pair: pair[0])[1]
    return finalists


def lr_dropouts(arm: str, args: argparse.Namespace) -> list[tuple[float, float]]:
    """The (peak lr, dropout) pairs of an arm's grid, in grid order: one finalist each."""
    return list(dict.fromkeys(s[:2] for s in grid_settings(arm, args)))


def seeds_with_finalists(finalists: dict[str, Setting], seeds: list[int]) -> list[int]:
    """The seeds that train alongside the finalists: seed 1, whose runs choose among them, and, when there is one
    finalist (chosen before it trains), the other seeds too, rather than after seed 1 has converged: a study of
    one setting and two seeds then takes the wall time of one run on two slots, not of two."""
    return [1, *(s for s in seeds if s != 1)] if len(finalists) == 1 else [1]


def chosen_finalist(out: Path, finalists: dict[str, Setting]) -> str:
    """The finalist whose converged seed-1 run has the best valid BLEU (the first of equals; one that never
    validated, e.g. diverged, ranks last)."""

    def bleu(name: str) -> float:
        score = best_valid(final_runs(out, name, [1])[1])[0]
        return -math.inf if math.isnan(score) else score

    return max(finalists, key=bleu)


def say(message: str) -> None:
    """A timestamped progress line between the runs' own logs: where a study of days stands, at a glance."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] study: {message}", flush=True)


def run_tuned(args: argparse.Namespace, arm: str, settings: dict[str, Setting], seeds: list[int], queue: RunQueue,
              priority: int) -> tuple[int, int]:  # fmt: skip
    """Stages 2 and 3: the named settings of ``arm`` (its finalists, or its chosen one), each seed, to convergence,
    all queued at once, each decoded as soon as it has converged (on its slot, before the next run). So a run that
    has ended carries its test scores and hypotheses in its records, whatever happens to the study or the machine
    before the others end (results/README.md), and every finalist has a test score. Each name becomes
    ``tuned/<name>.yaml``; seed 1 continues its grid run (``continue_grid_run``); runs that have ended are left out
    (their decodes still run, unless scored). (exit code, failed decodes)."""
    for name, setting in settings.items():
        continue_grid_run(grid_run(args.out, arm, setting), final_runs(args.out, name, [1])[1])
        write_arm(args.out / "arms" / "tuned" / f"{name}.yaml", arm, setting_overrides(setting))
    runs = [(run, [*converged_overrides(args), f"train.seed={seed}", f"+tuned={name}"])
            for name in settings for seed, run in final_runs(args.out, name, seeds).items()]  # fmt: skip
    failed = [run_decodes(args, [run for run, _ in runs if ended(run)], queue, priority)]  # ended before this call
    todo = [(run, overrides) for run, overrides in runs if not ended(run)]

    def decode(i: int, done: subprocess.CompletedProcess) -> None:  # on run i's slot, as it ends
        failed.append(run_decodes(args, [todo[i][0]], queue, priority, here=True))

    code = train_all(args.out, queue, priority, todo, then=decode)
    return code, sum(failed)


def setting_overrides(setting: Setting) -> list[str]:
    lr, dropout, warmup = setting
    return [f"optim.lr={lr}", f"model.dropout={dropout}", f"optim.warmup_updates={warmup}"]


def converged_overrides(args: argparse.Namespace) -> list[str]:
    """What every run trained to convergence (finalists, seeds) shares: the study's, then patience and saves."""
    return [*shared_overrides(args), f"train.max_epochs={args.max_epochs}", f"train.patience={args.patience}",
            "train.save_every_epochs=1", f"train.keep_last={keep_last(args.patience)}"]  # fmt: skip


def keep_last(patience: int) -> int:
    """Numbered checkpoints a converged run keeps: enough for every window of ``WINDOW`` that ends between the
    best epoch (``patience`` before the last) and the last, so ``--best-window`` has windows to choose from."""
    return WINDOW + patience + 2


def continue_grid_run(grid: Path, final: Path) -> None:
    """Start the converged seed-1 run from the grid's (seed 1, the same setting) instead of training its first
    ``--grid-epochs`` epochs again: the lr schedules have no horizon and resume is exact, so continuing is the
    run a fresh start would give, for ``--grid-epochs`` epochs less. The grid run stays as it was: checkpoints
    are hard links (tfx replaces a checkpoint by renaming, never writes into one), the logs copies (the metrics
    without the grid's end record: this run has not ended), and the folder appears whole or not at all."""
    if final.exists() or not finished(grid):
        return
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "checkpoints").mkdir(parents=True)
    for ckpt in (grid / "checkpoints").glob("*.pt"):
        try:
            os.link(ckpt, partial / "checkpoints" / ckpt.name)
        except OSError:  # a file system without hard links
            shutil.copy2(ckpt, partial / "checkpoints" / ckpt.name)
    if (grid / "train.log").exists():
        shutil.copy2(grid / "train.log", partial / "train.log")
    with (grid / FILENAME).open() as src, (partial / FILENAME).open("w") as dst:  # without the grid's end:
        dst.writelines(line for line in src if json.loads(line)["event"] != "end")  # this run has not ended
    if (grid / "tb").is_dir():
        shutil.copytree(grid / "tb", partial / "tb")
    partial.rename(final)


def final_runs(out: Path, name: str, seeds: list[int]) -> dict[int, Path]:
    """The converged runs of a finalist (``finalist_name``), by seed."""
    return {seed: out / "runs" / "final" / name / f"seed{seed}" for seed in seeds}


def score_path(run: Path, kind: str, test: str) -> Path:
    return run / "test" / f"{kind}_{test}.bleu.json"


def hyp_path(run: Path, kind: str, test: str) -> Path:
    return run / "test" / f"{kind}_{test}.hyp"


def average_command(run: Path) -> list[str] | None:
    """The valid-chosen window average of a finished run, unless it is there or every decode of it is scored (a
    study copied without its checkpoints, ``results/README.md``, has the scores and nothing to average)."""
    if (run / KINDS["avg"]).exists() or all(score_path(run, "avg", test).exists() for test in TEST_SETS):
        return None
    window = min(WINDOW, len(list((run / "checkpoints").glob("checkpoint_*_*.pt"))))  # a short run has fewer
    return [sys.executable, "-m", "tfx.average", "--run-dir", str(run), "--best-window", str(max(window, 1)),
            "--quiet", "--output", str(run / KINDS["avg"])]  # fmt: skip


def decode_commands(args: argparse.Namespace, run: Path) -> list[list[str]]:
    """The beam-5 decodes of a finished run that are not scored yet: one process per checkpoint (best, average), which
    loads it once and decodes each test set not scored yet."""
    src, tgt = args.direction.split("-")
    cmds = []
    for kind, name in KINDS.items():
        if tests := [test for test in TEST_SETS if not score_path(run, kind, test).exists()]:
            cmds.append([sys.executable, "-m", "tfx.evaluate", str(run / name),
                         "--src", *(str(args.data_dir / f"{test}.{src}") for test in tests),
                         "--ref", *(str(args.data_dir / f"{test}.{tgt}") for test in tests),
                         "--output", *(str(hyp_path(run, kind, test)) for test in tests),
                         "--beam", "5", "--tok-bleu", "--quiet"])  # fmt: skip
    return cmds


def run_decodes(args: argparse.Namespace, runs: list[Path], queue: RunQueue, priority: int, here: bool = False) -> int:
    """Stage 4: per finished run, its average, then its decodes (what is scored is not decoded again), each on a
    slot of ``queue`` (``here``: one after another on the slot the caller holds); the number that failed."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}

    def failures(cmds: list[list[str]]) -> int:
        if here:
            results = [queue.run_here(cmd, priority, env, capture=True) for cmd in cmds]
        else:
            results = queue.run_all(cmds, priority, env, capture=True)
        for done in results:
            if done.returncode not in (0, STOPPED):
                lines = done.stderr.strip().splitlines() or ["failed"]
                print(f"{' '.join(done.args[:4])}: {lines[-1]}", file=sys.stderr)
        return sum(done.returncode != 0 for done in results)

    runs = [run for run in runs if finished(run)]
    failed = failures([cmd for run in runs if (cmd := average_command(run))])
    for run in runs:
        (run / "test").mkdir(parents=True, exist_ok=True)
    return failed + failures([cmd for run in runs for cmd in decode_commands(args, run)])


def end_status(run: Path) -> str | None:
    """How a run's metrics end: ``completed``, ``early stop: ...``, ``diverged``, ``stopped by ...``; None before
    its first end."""
    ends = [r for r in read_metrics(run / FILENAME) if r["event"] == "end"] if (run / FILENAME).exists() else []
    return ends[-1]["status"] if ends else None


def finished(run: Path) -> bool:
    """A run that completed or stopped early: what is chosen among and decoded."""
    return not (end_status(run) or "stopped").startswith(("stopped", "diverged"))


def ended(run: Path) -> bool:
    """A run that does not train again: finished, or diverged (resuming would diverge again); one read."""
    return not (end_status(run) or "stopped").startswith("stopped")


def test_scores(run: Path, kind: str, test: str) -> tuple[float, float]:
    """(sacreBLEU, lowercased tokenized BLEU) of one decode; nan where it is not scored."""
    path = score_path(run, kind, test)
    if not path.exists():
        return math.nan, math.nan
    scores = json.loads(path.read_text())["scores"]
    return scores[0]["score"], (scores[1]["score"] if len(scores) > 1 else math.nan)


def mean_std(values: list[float], digits: int = 2) -> str:
    """``mean ± std (v1 / v2 / ...)`` over the finite values (sample std; one value: no ±); each value to
    ``digits`` places, mean and std to at least one (epochs are whole, their mean need not be)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "—"
    each = " / ".join(f"{v:.{digits}f}" for v in finite)
    if len(finite) == 1:
        return each
    places = max(digits, 1)
    return f"{statistics.fmean(finite):.{places}f} ± {statistics.stdev(finite):.{places}f} ({each})"


def valid_curve(run: Path) -> list[float]:
    """Greedy valid BLEU per validation (per epoch in this study); one per update, the first: before the fix
    of 2026-12-02 a run resumed after its last validation validated that update again."""
    records = read_metrics(run / FILENAME) if (run / FILENAME).exists() else []
    by_step: dict[int, float] = {}
    for record in records:
        if record["event"] == "valid":
            by_step.setdefault(record["step"], record["valid/bleu"])
    return [by_step[step] for step in sorted(by_step)]


def in_arm_order(by_arm: dict[str, Any]) -> dict[str, Any]:
    """``by_arm`` in ``ARMS``'s order, T-Fixup first: a study whose arms were added over several runs of the
    script (Pre-LN's first, say) reports them, and tests them against T-Fixup, as one that had them all at once."""
    return dict(sorted(by_arm.items(), key=lambda item: list(ARMS).index(item[0])))


def write_report(out: Path) -> str:
    study = json.loads((out / "study.json").read_text())
    study["settings"], study["finalists"] = in_arm_order(study["settings"]), in_arm_order(study.get("finalists", {}))
    args = argparse.Namespace(**{"tuned": {}, **study["args"]})  # a study recorded before --tuned existed has none
    lines = [
        f"# Converged comparison: Multi30k {args.direction}, {args.layers}+{args.layers} layers, seeds {args.seeds}",
        "",
        f"Every run: `{' '.join(study['overrides'])}`; grid: lr {args.lrs} x dropout {args.dropouts} x warmup "
        f"{args.warmups} ({args.grid_epochs} epochs, seed 1; warmup-free methods: warmup 0){tuned_text(args)}; per lr "
        f"and dropout the grid's best warmup trained on (patience {args.patience}, at most {args.max_epochs} epochs), "
        f"the best on valid is the arm's setting. Test: beam 5; `best` = the best-valid checkpoint, `avg` = the best "
        f"window of {WINDOW} numbered checkpoints on valid. sacreBLEU (13a, cased) / tokBLEU (lowercased, tokenized). "
        f"Wall time {study['wall_seconds'] / 60:.1f} min.",
        "",
        "| arm | setting | epochs to best | valid | " + " | ".join(
            f"{label} {kind} sacre / tok" for label in TEST_SETS.values() for kind in KINDS) + " |",
        "|---|---|---|---|" + "---|" * (len(TEST_SETS) * len(KINDS)),
    ]  # fmt: skip
    for arm, setting in study["settings"].items():
        runs = list(final_runs(out, finalist_name(arm, *setting[:2]), args.seeds).values())
        bests = [best_valid(r) for r in runs]
        epochs = mean_std([float(e) for _, e in bests if e], digits=0)
        cells = [setting_name(*setting), epochs, mean_std([b for b, _ in bests])]
        for test in TEST_SETS:
            for kind in KINDS:
                pairs = [test_scores(r, kind, test) for r in runs]
                cells.append(f"{mean_std([p[0] for p in pairs])} / {mean_std([p[1] for p in pairs])}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += significance_lines(out, study, args)
    test = next(iter(TEST_SETS))
    label = TEST_SETS[test]
    lines += ["", f"Finalists (seed 1; greedy valid BLEU, best and at the end of the grid's budget; {label} sacreBLEU "
              "of the best-valid checkpoint, beam 5: is the choice on valid the choice on test?):", "",
              f"| arm | setting | grid valid | converged valid | epochs to best | epochs | {label} | chosen |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, finalists in study.get("finalists", {}).items():
        for name, setting in finalists.items():
            run = final_runs(out, name, [1])[1]
            curve = valid_curve(run)
            bleu, epoch = best_of(curve)
            grid = max(curve[: args.grid_epochs], default=math.nan)
            mark = "yes" if arm in study["settings"] and list(setting) == list(study["settings"][arm]) else ""
            scored = f"{test_scores(run, 'best', test)[0]:.2f}".replace("nan", "—")
            cells = [arm, setting_name(*setting), f"{grid:.2f}", f"{bleu:.2f}", str(epoch), str(len(curve)), scored,
                     mark]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    lines += grid_lines(out, study, args)
    lines += run_lines(out)
    text = "\n".join(lines) + "\n"
    (out / "converged_study.md").write_text(text)
    plot(out, study, args)
    plot_grid(out, study, args)
    return text


def run_lines(out: Path) -> list[str]:
    """Where each converged run stands: its valid BLEU per epoch and how it ended (`...`: still training or
    stopped before it ended), so a study stopped mid-way (a GPU window's box) shows what each run reached."""
    runs = sorted((out / "runs" / "final").glob("*/seed*"))
    if not runs:
        return []
    lines = ["", "Where each run stands (greedy valid BLEU per epoch; how it ended, `...` while it has not):", ""]
    for run in runs:
        curve = " ".join(f"{b:.2f}" for b in valid_curve(run))
        lines.append(f"- {run.parent.name}/{run.name}: {curve} [{end_status(run) or '...'}]")
    return lines


def tuned_text(args: argparse.Namespace) -> str:
    """The report's words for the arms whose setting was tuned elsewhere (``--tuned``), if any."""
    if not args.tuned:
        return ""
    return "; tuned elsewhere, a grid of one setting: " + ", ".join(
        f"{a} {setting_name(*s)}" for a, s in args.tuned.items())  # fmt: skip


def grid_cells(out: Path, arm: str, args: argparse.Namespace) -> dict[tuple[float, float], dict[int, list[float]]]:
    """An arm's grid: per (lr, dropout), per warmup, the greedy valid BLEU of each epoch run so far."""
    cells: dict[tuple[float, float], dict[int, list[float]]] = {}
    for lr, dropout, warmup in grid_settings(arm, args):
        cells.setdefault((lr, dropout), {})[warmup] = valid_curve(grid_run(out, arm, (lr, dropout, warmup)))
    return cells


def grid_lines(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Each arm's grid as a table, a row per lr and dropout and a column per warmup: the valid BLEU after each
    epoch, the setting each finalist continues in bold, `...` after a run that has not ended."""
    lines = []
    for arm in in_arm_order(dict.fromkeys(study["arms"])):
        cells = grid_cells(out, arm, args)
        if not any(curve for row in cells.values() for curve in row.values()):
            continue
        warmups = list(next(iter(cells.values())))
        finalists = {tuple(s) for s in study.get("finalists", {}).get(arm, {}).values()}
        lines += ["", f"{arm}'s grid (seed 1; greedy valid BLEU after epoch 1 / ... / {args.grid_epochs}; bold: the "
                  "setting a finalist continues):", "",
                  "| lr | dropout | " + " | ".join(f"warmup {w}" for w in warmups) + " |",
                  "|---|---|" + "---|" * len(warmups)]  # fmt: skip
        for (lr, dropout), row in cells.items():
            texts = []
            for warmup, curve in row.items():
                text = " / ".join(f"{b:.2f}" for b in curve) or "—"
                if curve and not ended(grid_run(out, arm, (lr, dropout, warmup))):
                    text += " ..."
                texts.append(f"**{text}**" if (lr, dropout, warmup) in finalists else text)
            lines.append(f"| {lr:g} | {dropout:g} | " + " | ".join(texts) + " |")
    return lines


def plot_grid(out: Path, study: dict[str, Any], args: argparse.Namespace) -> dict[str, list[list[float]]]:
    """``converged_grid.png``: a heatmap per arm of its grid's valid BLEU at the grid's last epoch (rows lr and
    dropout, columns warmup; one colour scale for every arm, the finalists framed). Returns each arm's matrix (nan
    where a run has not reached that epoch); no figure when no grid run has."""
    matrices, grids, finalists = {}, {}, study.get("finalists", {})
    for arm in in_arm_order(dict.fromkeys(study["arms"])):
        grids[arm] = grid_cells(out, arm, args)
        last = [[c[args.grid_epochs - 1] if len(c) >= args.grid_epochs else math.nan for c in row.values()]
                for row in grids[arm].values()]  # fmt: skip
        if any(math.isfinite(v) for row in last for v in row):
            matrices[arm] = last
    if not matrices:
        return matrices
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    values = [v for m in matrices.values() for row in m for v in row if math.isfinite(v)]
    low, high = min(values), max(values)
    widths = [len(m[0]) for m in matrices.values()]  # a column per warmup, the same size in every panel
    fig, axes = plt.subplots(1, len(matrices), figsize=(2.0 + 1.0 * sum(widths), 3.0), squeeze=False,
                             gridspec_kw={"width_ratios": widths}, layout="constrained")  # fmt: skip
    for k, (ax, (arm, matrix)) in enumerate(zip(axes[0], matrices.items(), strict=True)):
        warmups, rows = list(next(iter(grids[arm].values()))), list(grids[arm])
        framed = {tuple(s) for s in finalists.get(arm, {}).values()}
        image = ax.imshow(matrix, cmap="viridis", vmin=low, vmax=high, aspect="auto")
        for i, j in itertools.product(range(len(rows)), range(len(warmups))):
            if math.isfinite(value := matrix[i][j]):
                dark = value < (low + high) / 2  # white on viridis' dark half, black on its light half
                ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8, color="white" if dark else "k")
            if (*rows[i], warmups[j]) in framed:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_xticks(range(len(warmups)), [str(w) for w in warmups], fontsize=8)
        ax.set_yticks(range(len(rows)), [f"{lr:g} / {d:g}" for lr, d in rows] if k == 0 else [], fontsize=8)
        ax.set(title=arm, xlabel="warmup")
    axes[0][0].set_ylabel("peak lr / dropout")
    fig.colorbar(image, ax=axes[0].tolist(), label=f"valid BLEU, epoch {args.grid_epochs} (red: finalist)")
    fig.savefig(out / "converged_grid.png", dpi=110)
    plt.close(fig)
    return matrices


def significance_lines(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Each arm against the first arm (T-Fixup, in ``in_arm_order``), seed by seed (seed s against T-Fixup's seed
    s), on every test decode: sacreBLEU difference and the paired bootstrap's p-value. Test-set noise only: a
    row is two runs; the seeds' spread is the table's ± above."""
    settings = study["settings"]
    if len(settings) < 2:
        return []
    baseline, tgt = next(iter(settings)), args.direction.split("-")[1]
    paths = {test: Path(args.data_dir) / f"{test}.{tgt}" for test in TEST_SETS}
    refs = {test: read_lines(path) for test, path in paths.items() if path.is_file()}  # once, for every seed
    rows = [seed_row(out, settings, seed, refs) for seed in args.seeds]
    return ["", f"Against {baseline}, seed by seed (sacreBLEU difference and the paired bootstrap's p-value, 1000 "
            f"resamples, sacrebleu's --paired-bs, so 0.001 is its smallest p: the test set's sampling noise, not the "
            f"seeds'):", "",
            "| arm | seed | " + " | ".join(f"{label} {kind}" for label in TEST_SETS.values() for kind in KINDS) + " |",
            "|---|---|" + "---|" * (len(TEST_SETS) * len(KINDS)),
            *(f"| {arm} | {seed} | " + " | ".join(cells) + " |" for seed, row in zip(args.seeds, rows, strict=True)
              for arm, cells in row.items())]  # fmt: skip


def seed_row(out: Path, settings: dict[str, Any], seed: int, refs: dict[str, list[str]]) -> dict[str, list[str]]:
    """One seed's cells for each arm after the first, against the first arm's run of the same seed; a dash where a
    decode is missing (not run yet) or a test set has no references in ``refs`` (a replot away from the corpus)."""
    baseline, *others = settings
    runs = {arm: final_runs(out, finalist_name(arm, *settings[arm][:2]), [seed])[seed] for arm in settings}
    cells: dict[str, list[str]] = {arm: [] for arm in others}
    for test, kind in itertools.product(TEST_SETS, KINDS):
        scored = [arm for arm in others if score_path(runs[arm], kind, test).exists()]
        results = {}
        if scored and score_path(runs[baseline], kind, test).exists() and test in refs:
            hyps = {arm: read_lines(hyp_path(runs[arm], kind, test)) for arm in [baseline, *scored]}
            results = paired_bootstrap(hyps.pop(baseline), hyps, refs[test])
        for arm in others:
            r = results.get(arm)
            cells[arm].append(f"{r.score - r.baseline:+.2f} (p {r.p_value:.3f})" if r else "—")
    return cells


def plot(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Valid BLEU per epoch: each arm's setting, the mean over seeds with their range as a band; the arm's other
    finalists (seed 1) dashed, in the same colour, each with its own dashes. An arm still choosing (a replot
    during the study) shows its finalists so far, all dashed. Returns the legend's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    finalists = study.get("finalists", {})
    for arm in dict.fromkeys([*study["settings"], *finalists]):
        color, setting = None, study["settings"].get(arm)
        if setting is not None:
            color = plot_setting(ax, out, arm, setting, args.seeds)
        others = [(n, o) for n, o in finalists.get(arm, {}).items() if setting is None or list(o) != list(setting)]
        state = "not chosen" if setting is not None else "converging"
        for (name, other), dashes in zip(others, itertools.cycle(DASHES)):  # a dash pattern per finalist
            if curve := valid_curve(final_runs(out, name, [1])[1]):
                (line,) = ax.plot(range(1, len(curve) + 1), curve, linestyle=dashes, linewidth=1, color=color,
                                  label=f"{arm} ({setting_name(*other)}, {state})")  # fmt: skip
                color = line.get_color()  # the arm's colour, for its other finalists
    ax.set(xlabel="epoch", ylabel="valid BLEU (greedy)", title="valid BLEU per epoch (mean; band: seeds' range)")
    ax.grid(alpha=0.3)
    labels = [text.get_text() for text in ax.legend(fontsize=7).get_texts()]
    fig.tight_layout()
    fig.savefig(out / "converged_study.png", dpi=110)
    plt.close(fig)
    return labels


def plot_setting(ax: Any, out: Path, arm: str, setting: Setting, seeds: list[int]) -> str | None:
    """An arm's chosen setting: the mean over its seeds' curves, their range as a band; returns its colour."""
    curves = [c for c in map(valid_curve, final_runs(out, finalist_name(arm, *setting[:2]), seeds).values()) if c]
    if not curves:
        return None
    n = max(map(len, curves))
    at = [[c[i] for c in curves if i < len(c)] for i in range(n)]
    epochs = range(1, n + 1)
    (line,) = ax.plot(epochs, [statistics.fmean(v) for v in at], marker="o", markersize=3,
                      label=f"{arm} ({setting_name(*setting)})")  # fmt: skip
    ax.fill_between(epochs, [min(v) for v in at], [max(v) for v in at], alpha=0.2, color=line.get_color())
    return line.get_color()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("outputs/converged_study"))
    p.add_argument("--data-dir", type=Path, default=CHECKOUT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), help=f"default: {' '.join(DEFAULT_ARMS)}")
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers (12: the deeper table)")
    p.add_argument("--direction", choices=["de-en", "en-de"], default="de-en")
    p.add_argument("--seeds", type=int, nargs="+", help="default: 1 (the gpu preset: 1 2 3)")
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--max-epochs", type=int, default=30)
    p.add_argument("--grid-epochs", type=int, default=3, help="epochs per grid run (the shorter budget)")
    p.add_argument("--lrs", type=float, nargs="+", default=[5e-4, 1e-3])
    p.add_argument("--dropouts", type=float, nargs="+", default=[0.1, 0.3])
    p.add_argument("--warmups", type=int, nargs="+", default=[0, 100, 400, 1000])
    p.add_argument("--jobs", type=int, default=2, help="runs (and decodes) at once")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--tuned", nargs="+", default=[], metavar="ARM=LR,DROPOUT,WARMUP", type=tuned_setting,
                   help="an arm's setting tuned elsewhere: its grid is that one setting")  # fmt: skip
    p.add_argument("--preset", choices=["cpu", "gpu"], default="cpu",
                   help="gpu: the arms the CPU studies tuned, at their settings (TUNED_ON_CPU), 3 seeds, bf16, "
                        "every run at once on one CUDA device")  # fmt: skip
    p.add_argument("--replot", action="store_true")
    p.add_argument("--dry-run", action="store_true",
                   help="train nothing: print the plan, composing each arm's config (checks a preset)")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run (before the options)")
    args = p.parse_args(argv)
    args.tuned = dict(args.tuned)
    if args.preset == "gpu":
        # One GPU window holds no grid (16 settings x 3 epochs per arm), so each arm trains the setting its CPU
        # grid and finalists chose. A 3+3 d256 run is host-bound and leaves an H200 mostly idle: every run
        # shares the device at once, one host core each (16 on the device machine). The CPU recipe otherwise
        # (padded 2048-token batches, eager): the settings were tuned on it.
        args.arms = args.arms or list(TUNED_ON_CPU)
        args.tuned = {**{arm: TUNED_ON_CPU[arm] for arm in args.arms if arm in TUNED_ON_CPU}, **args.tuned}
        args.seeds, args.threads, args.precision = args.seeds or [1, 2, 3], 1, "bf16"
        args.jobs = min(len(args.arms) * len(args.seeds), 16)
        if all(arm in args.tuned for arm in args.arms):  # nothing to choose: seeds 2 and 3 wait one epoch, not 3
            args.grid_epochs = 1
        args.overrides = ["train.device=cuda", *args.overrides]
    args.arms, args.seeds = args.arms or DEFAULT_ARMS, args.seeds or [1]
    if unknown := [arm for arm in args.tuned if arm not in args.arms]:
        p.error(f"--tuned names {', '.join(unknown)}, not among --arms {' '.join(args.arms)}")
    args.out, args.data_dir = args.out.resolve(), args.data_dir.resolve()
    return args


def tuned_setting(text: str) -> tuple[str, Setting]:
    """``ARM=LR,DROPOUT,WARMUP`` -> (arm, (lr, dropout, warmup)), for ``--tuned``."""
    try:
        arm, values = text.split("=")
        lr, dropout, warmup = values.split(",")
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r} (one of {', '.join(ARMS)})")
        return arm, (float(lr), float(dropout), int(warmup))
    except ValueError as err:
        message = f"{text!r}: want ARM=LR,DROPOUT,WARMUP, e.g. tfixup=5e-4,0.3,0 ({err})"
        raise argparse.ArgumentTypeError(message) from None


def run_study(args: argparse.Namespace) -> int:
    """study.json first, then grid, converged runs and decodes; a re-run continues where it stopped."""
    src, tgt = args.direction.split("-")
    if problem := missing_files(args.data_dir, ["train", "valid", *TEST_SETS], (src, tgt)):
        print(problem, file=sys.stderr)
        return 2
    path = args.out / "study.json"
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("replot", "out")}
    fresh = {"arms": [], "overrides": shared_overrides(args), "args": saved, "settings": {}, "wall_seconds": 0.0}
    if (study := open_study(path, fresh, args.arms)) is None:
        return 2
    # an arm tuned elsewhere that this run adds: the report draws its grid (of one) from the recorded args
    study["args"]["tuned"] = {**study["args"].get("tuned", {}), **saved["tuned"]}
    # seeds that this run adds: the report's tables and figure go by the recorded seeds
    study["args"]["seeds"] = sorted({*study["args"]["seeds"], *saved["seeds"]})

    lock, queue = threading.Lock(), RunQueue(args.jobs, CHECKOUT, len(args.arms))

    def record(key: str, arm: str, value: Any) -> None:  # arms record from their own threads
        with lock:
            study.setdefault(key, {})[arm] = value
            path.write_text(json.dumps(study, indent=1))

    def stages(arm: str, priority: int) -> tuple[int, int]:
        try:
            return arm_stages(arm, priority)
        finally:
            queue.done(priority)

    def arm_stages(arm: str, priority: int) -> tuple[int, int]:
        """One arm's stages in turn; (exit code, failed decodes)."""
        if code := run_grid(args, arm, queue, priority):
            return code, 0
        finalists = grid_finalists(args.out, arm, args)
        record("finalists", arm, finalists)
        say(
            f"{arm}: grid done; finalists (grid valid BLEU) "
            + ", ".join(
                f"{setting_name(*s)} ({best_valid(grid_run(args.out, arm, s))[0]:.2f})" for s in finalists.values()
            )
        )
        if len(finalists) == 1:  # nothing to choose: the table shows its seeds as they end, even if stopped
            record("settings", arm, next(iter(finalists.values())))
        first = seeds_with_finalists(finalists, args.seeds)
        code, failed = run_tuned(args, arm, finalists, first, queue, priority)
        if code:
            return code, failed
        name = chosen_finalist(args.out, finalists)
        record("settings", arm, finalists[name])
        bleu, epoch = best_valid(final_runs(args.out, name, [1])[1])
        say(f"{arm}: its finalists converged; chose {name} (valid BLEU {bleu:.2f} at epoch {epoch})")
        code, more = run_tuned(args, arm, {name: finalists[name]}, [s for s in args.seeds if s not in first], queue,
                               priority)  # fmt: skip
        if code:
            return code, failed + more
        runs = list(final_runs(args.out, name, args.seeds).values())
        run_decodes(args, runs, queue, priority)  # each was decoded as it converged: this retries what failed then
        test = next(iter(TEST_SETS))
        say(
            f"{arm}: decoded; {TEST_SETS[test]} sacreBLEU of the best-valid checkpoint, by seed: "
            + " / ".join(f"{test_scores(run, 'best', test)[0]:.2f}" for run in runs)
        )
        every = {*runs, *(final_runs(args.out, n, [1])[1] for n in finalists)}
        return 0, sum(len(decode_commands(args, run)) for run in every if finished(run))  # decodes still unscored

    def work() -> tuple[int, int]:
        """Every arm's stages at once, sharing ``--jobs`` slots; a free slot goes to the earliest arm, so arms
        still finish in order and a later arm's runs use the slots an earlier one leaves idle."""
        write_arms(args.out / "arms", args.arms)
        with ThreadPoolExecutor(len(args.arms)) as pool:
            arms = [pool.submit(stages, arm, priority) for priority, arm in enumerate(args.arms)]
            try:
                results = [arm.result() for arm in arms]
            except BaseException:  # SIGTERM, Ctrl-C or an arm's error: the runs save and stop, the rest waits
                queue.stop()
                raise
        return next((code for code, _ in results if code), 0), sum(failed for _, failed in results)

    return run_recorded(path, study, work)


def dry_run(args: argparse.Namespace) -> int:
    """The study's plan, without training: per arm, its stages' runs, each composed as its sweep would compose it
    (the arm, a finalist's settings, the shared overrides and the preset), so a bad override, arm or preset fails
    here in seconds instead of after the grid on a GPU."""
    import tempfile

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tfx.config import compose_config

    with tempfile.TemporaryDirectory() as folder:
        search, total = f"hydra.searchpath=[file://{folder}]", 0
        for arm in args.arms:
            grid = grid_settings(arm, args)
            write_arm(Path(folder) / "tuned" / "plan.yaml", arm, setting_overrides(grid[0]))
            finalists, seeds = len(lr_dropouts(arm, args)), len(args.seeds) - (1 in args.seeds)
            try:
                cfg = compose_config([search, *converged_overrides(args), "+tuned=plan"])
            except (HydraException, OmegaConfBaseException, ValueError) as err:
                print(f"arm {arm}: {type(err).__name__}: {str(err).splitlines()[0]}", file=sys.stderr)
                return 2
            runs = len(grid) * args.grid_epochs + finalists * (args.max_epochs - args.grid_epochs)
            runs += seeds * args.max_epochs
            total += runs
            print(f"{arm}: grid {len(grid)} runs x {args.grid_epochs} epochs; {finalists} finalists and "
                  f"{seeds} more seeds to convergence (<= {args.max_epochs} epochs); "
                  f"at most {runs} epochs | {cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers "
                  f"norm={cfg.model.norm} init={cfg.init.name} | device {cfg.train.device} {cfg.train.precision} "
                  f"batching={cfg.data.batching} compile={cfg.train.compile} | {args.jobs} runs at once, "
                  f"{cfg.train.threads} threads each")  # fmt: skip
    print(f"at most {total} epochs in all; decodes: {len(TEST_SETS) * len(KINDS)} beam-5 per seed per arm")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return dry_run(args) if args.dry_run else train_or_replot(args, run_study, write_report)


if __name__ == "__main__":
    sys.exit(main())
