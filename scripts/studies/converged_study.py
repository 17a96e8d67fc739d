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
   Multi30k (T-Fixup: lr 1e-3 / dropout 0.1 led its grid and peaked at epoch 9; docs/converged.md).
3. **Seeds** (the other ``--seeds``): the arm's setting to convergence (with seed 1 when the grid has one
   setting per lr and dropout, one finalist: nothing is left to choose). An arm tuned elsewhere whose ``--seeds``
   leave out 1 (seed 1 converged in another study, or on a machine since replaced) trains those seeds only: no
   grid run, no seed 1.
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
``--replot`` rewrites table and figures from the run folders (``tfx.studies.converged_report``; where the runs and
decodes lie in ``--out``, and what they hold: ``tfx.studies.converged_runs``). ``--layers 12`` is the deeper table
(12 + 12 layers, d 256); ``--direction en-de`` the other direction. The study harness is ``tfx.studies``: tfx must be
installed (``pip install -e ".[study]"``).

Usage (CPU; an epoch of the 3+3 model takes about 8 minutes on one AVX2 thread in fp32, 2 on a bf16 one)::

    python scripts/studies/converged_study.py --out results/converged --arms tfixup postln --seeds 1  # results/README
    python scripts/studies/converged_study.py --out outputs/converged --tuned postln=1e-3,0.1,400  # postln: one setting
    python scripts/studies/converged_study.py --out results/converged_nf --arms rezero fixup dyt --until grid  # grids
    python scripts/studies/converged_study.py --out results/converged_nf_s2 --arms tfixup dyt \
        --tuned tfixup=5e-4,0.3,0 dyt=1e-3,0.3,0 --seeds 2  # second seeds of chosen settings only
    python scripts/studies/converged_study.py --out outputs/converged_gpu --preset gpu  # CPU-tuned arms, 3 seeds, a GPU
    python scripts/studies/converged_study.py --preset gpu --dry-run  # its plan, every arm's config composed
    scripts/gpu/gpu_converged.sh OUT    # the GPU preset at 3+3 and 12+12 inside a time box (one device call)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)

from tfx.checkpoints.numbered import window_checkpoints
from tfx.reporting.metrics_log import FILENAME
from tfx.studies.arms import ARMS, DEFAULT_ARMS, add_conf_dirs, conf_dirs, write_arm, write_arms
from tfx.studies.converged_report import write_report
from tfx.studies.converged_runs import (
    KINDS,
    TEST_SETS,
    WINDOW,
    Setting,
    best_valid,
    end_status,
    ended,
    final_runs,
    finalist_name,
    finished,
    grid_run,
    grid_settings,
    hyp_path,
    lr_dropouts,
    score_path,
    setting_name,
    test_scores,
)
from tfx.studies.harness import (
    CHECKOUT,
    missing_files,
    open_study,
    run_recorded,
    searchpath,
    train_command,
    train_or_replot,
    write_line,
)
from tfx.studies.queue import STOPPED, RunQueue

# Each arm's setting (peak lr, dropout, warmup updates) as its CPU study chose it, 3+3 De->En (docs/converged.md):
# T-Fixup and Post-LN fp32 (2026-12-01/02), Pre-LN, Admin bf16 (2026-12-03), DeepNorm bf16 (2026-12-04: the best
# finalist so far; its lr 5e-4 finalists had not converged). The GPU preset trains these.
TUNED_ON_CPU: dict[str, Setting] = {"tfixup": (5e-4, 0.3, 0), "postln": (1e-3, 0.1, 400), "preln": (5e-4, 0.3, 0),
                                    "admin": (1e-3, 0.3, 0), "deepnorm": (1e-3, 0.3, 400)}  # fmt: skip


def shared_overrides(args: argparse.Namespace) -> list[str]:
    """What every run of the study shares."""
    src, tgt = args.direction.split("-")
    layers = f"model.encoder_layers={args.layers}", f"model.decoder_layers={args.layers}"
    return ["+experiment=multi30k", f"data.local_dir={args.data_dir}", f"data.src_lang={src}",
            f"data.tgt_lang={tgt}", *layers, f"train.threads={args.threads}",
            f"train.precision={args.precision}",
            "train.max_minutes=0", "train.validate_every_minutes=0", "train.validate_every_updates=0",
            "train.progress=false", *args.overrides]  # fmt: skip


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


def seeds_only(arm: str, args: argparse.Namespace) -> bool:
    """Whether ``arm`` trains its ``--seeds`` alone: its setting came with ``--tuned`` and seed 1, whose grid run
    would choose nothing, is not asked for (it converged in another study, or on a machine since replaced)."""
    return arm in args.tuned and 1 not in args.seeds


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
    write_line(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] study: {message}", sys.stdout)


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


def average_command(run: Path) -> list[str] | None:
    """The valid-chosen window average of a finished run, unless it is there or every decode of it is scored (a
    study copied without its checkpoints, ``results/README.md``, has the scores and nothing to average)."""
    if (run / KINDS["avg"]).exists() or all(score_path(run, "avg", test).exists() for test in TEST_SETS):
        return None
    window = min(WINDOW, len(window_checkpoints(run / "checkpoints")))  # a short run has fewer (tfx.average's rule)
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
                write_line(f"{' '.join(done.args[:4])}: {lines[-1]}", sys.stderr)
        return sum(done.returncode != 0 for done in results)

    runs = [run for run in runs if finished(run)]
    failed = failures([cmd for run in runs if (cmd := average_command(run))])
    for run in runs:
        (run / "test").mkdir(parents=True, exist_ok=True)
    return failed + failures([cmd for run in runs for cmd in decode_commands(args, run)])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("outputs/converged_study"))
    p.add_argument("--data-dir", type=Path, default=CHECKOUT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--arms", nargs="+", metavar="ARM",
                   help=f"of {', '.join(ARMS)} and the methods of a hydra.searchpath=[file://DIR] override's "
                        f"DIR/method/ (default: {' '.join(DEFAULT_ARMS)})")  # fmt: skip
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
    p.add_argument("--until", choices=["grid", "test"], default="test",
                   help="grid: every arm's grid, then stop (whole grids for a session too short for finalists; "
                        "the same command without it goes on to them)")  # fmt: skip
    p.add_argument("--replot", action="store_true")
    p.add_argument("--dry-run", action="store_true",
                   help="train nothing: print the plan, composing each arm's config (checks a preset)")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for every run (before the options)")
    args = p.parse_args(argv)
    add_conf_dirs(conf_dirs(args.overrides))  # methods from outside tfx (docs/layout.md) are arms too
    if unknown := [arm for arm in [*(args.arms or []), *(arm for arm, _ in args.tuned)] if arm not in ARMS]:
        p.error(f"unknown arm {', '.join(unknown)} (one of {', '.join(ARMS)})")
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
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
             if k not in ("replot", "out", "until")}  # fmt: skip
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
        if seeds_only(arm, args):
            return seeds_alone(arm, priority)
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
        if args.until == "grid":
            say(f"{arm}: --until grid: its finalists train when the study runs again without it")
            return 0, 0
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
        return decoded(arm, name, finalists, priority)

    def seeds_alone(arm: str, priority: int) -> tuple[int, int]:
        """Stages 3 and 4 for an arm that trains its seeds alone (``seeds_only``): its ``--seeds`` at its
        ``--tuned`` setting to convergence, then decoded. (exit code, failed decodes)."""
        setting = args.tuned[arm]
        record("settings", arm, setting)
        name = finalist_name(arm, *setting[:2])
        code, failed = run_tuned(args, arm, {name: setting}, args.seeds, queue, priority)
        return (code, failed) if code else decoded(arm, name, {name: setting}, priority)

    def decoded(arm: str, name: str, finalists: dict[str, Setting], priority: int) -> tuple[int, int]:
        """Stage 4 for the chosen setting's seeds, each decoded as it converged: retries what failed then, says the
        test scores; (0, decodes still unscored)."""
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
        search, overrides = searchpath(Path(folder), converged_overrides(args))
        total = 0
        for arm in args.arms:
            grid = grid_settings(arm, args)
            write_arm(Path(folder) / "tuned" / "plan.yaml", arm, setting_overrides(grid[0]))
            finalists, seeds = len(lr_dropouts(arm, args)), len(args.seeds) - (1 in args.seeds)
            try:
                cfg = compose_config([search, *overrides, "+tuned=plan"])
            except (HydraException, OmegaConfBaseException, ValueError) as err:
                print(f"arm {arm}: {type(err).__name__}: {str(err).splitlines()[0]}", file=sys.stderr)
                return 2
            runs = len(grid) * args.grid_epochs
            named = f" ({', '.join(setting_name(*g) for g in grid)})" if len(grid) <= 2 else ""  # --tuned took?
            stages = f"grid {len(grid)} runs{named} x {args.grid_epochs} epochs"
            if seeds_only(arm, args):
                runs = len(args.seeds) * args.max_epochs
                stages = f"{setting_name(*args.tuned[arm])}, no grid, no seed 1"
                then = f"seeds {' '.join(map(str, args.seeds))} to convergence (<= {args.max_epochs} epochs)"
            elif args.until == "grid":
                then = "then stop (--until grid)"
            else:
                runs += finalists * (args.max_epochs - args.grid_epochs) + seeds * args.max_epochs
                then = f"{finalists} finalists and {seeds} more seeds to convergence (<= {args.max_epochs} epochs)"
            total += runs
            print(f"{arm}: {stages}; {then}; "
                  f"at most {runs} epochs | {cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers "
                  f"norm={cfg.model.norm} init={cfg.init.name} | device {cfg.train.device} {cfg.train.precision} "
                  f"batching={cfg.data.batching} compile={cfg.train.compile} | {args.jobs} runs at once, "
                  f"{cfg.train.threads} threads each")  # fmt: skip
    decodes = "none" if args.until == "grid" else f"{len(TEST_SETS) * len(KINDS)} beam-5 per seed per arm"
    print(f"at most {total} epochs in all; decodes: {decodes}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return dry_run(args) if args.dry_run else train_or_replot(args, run_study, write_report)


if __name__ == "__main__":
    sys.exit(main())
