"""The depth map on Multi30k De->En (issue 65): which methods train, unchanged, as depth grows from 6 to 200 layers.

``scripts/studies/depth_map.py`` is its command line; the cells, their outcome rule and retries are
``tfx.studies.depth_cells``, the table and figure ``tfx.studies.depth_map_report``.

- **Stage 1**: every method at N = 6, 24, 48 layers per side, each at its chosen 3+3 setting, unchanged (what a
  user tries first: ``+experiment=multi30k method=NAME``). A cell that diverges or gets stuck runs once more at the
  smallest change its paper or docs/converged.md's 12+12 probes point to (``depth_cells.RETRIES``).
- **Stage 2** (once every stage-1 cell has its outcome): N = 100 and 200 for T-Fixup and the ``--others`` methods
  (default 1, at most the issue's 3) whose N = 48 cell trained (chosen setting, else its retry) with the highest best
  valid BLEU; the choice is recorded in ``study.json``, so a re-run keeps it.
- **Each cell** that trained: its test2016 BLEU from its best-valid checkpoint, greedy (``--beam 1``: five beams
  through 200 decoder layers would cost a tenth of the run again).

**Width and budget.** d_model 128, FFN 512, 4 heads (head dim 32; the 3+3 model's FFN at half its width), the
multi30k batch (2048 tokens: 237 updates an epoch), 2 epochs (474 updates; ``train.max_epochs``, no patience), fp32
(this CPU has AVX-512F but no BF16: bf16 would be emulated), one thread a run, two runs at once (``--jobs 2``).
Activations are recomputed in backward at N = 200 (``model.checkpoint_activations``): resident memory measured
0.88 / 2.06 / 3.57 / 6.86 GB at N = 6 / 24 / 48 / 100, so N = 200 would hold ~13.5 GB a run and two would not
fit the 23 GB machine; recomputing, it holds 6.0 GB.

Measured seconds per update (2026-12-07, 2-core Intel Xeon, AVX-512F, no BF16; tfx's trainer update on the first
Multi30k batches of ``+experiment=multi30k`` at d 128, ~1900 target tokens each; fp32; one thread): CPU time of the
process, because two other training processes and other sessions' tests kept the load at 2-6 on the two cores
(wall time was 1.2-2.4x it): N = 6 **0.86**, 24 **2.63**, 48 **5.61**, 100 **10.56** (16.98 recomputing), 200
recomputing **38.08**; as ratios to N = 6: 3.1, 6.5, 12.3, 44.3. Validation each epoch and the test decode add
about 10% (estimated from greedy decoding of 64 valid sentences, timed beside the updates). So, in one-thread hours:

- stage 1: 9 methods x (0.86 + 2.63 + 5.61 = 9.10 s) x 474 updates = 10.8 h, + 10% = **11.9 h** (~6 h wall at two
  runs at once on an idle machine), plus ~0.6 h for each retry at N = 24-48;
- stage 2: per method (10.56 + 38.08 s) x 474 = 6.4 h, + 10% = 7.0 h; T-Fixup and one other = **14 h** (``--others
  3`` would be 28 h).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tfx.studies.converged_runs import score_path
from tfx.studies.depth_cells import (
    RETRIES,
    Cell,
    cell_overrides,
    describe_setting,
    failed,
    settled,
    stage1_cells,
    stage2_methods,
    summarize,
    verdict,
)
from tfx.studies.depth_map_report import write_report
from tfx.studies.harness import CHECKOUT, missing_files, open_study, run_recorded, save_study, write_line
from tfx.studies.queue import STOPPED, RunQueue


def shared_overrides(args: argparse.Namespace) -> list[str]:
    """What every cell shares: the multi30k experiment at d 128, ``--epochs`` epochs, one validation an epoch,
    per-layer statistics every 100 updates (TensorBoard's ``layers/`` heatmaps), the best-valid checkpoint only."""
    return ["+experiment=multi30k", f"data.local_dir={args.data_dir}", "model.d_model=128", "model.ffn_dim=512",
            "model.heads=4", f"train.max_epochs={args.epochs}", "train.max_updates=0", "train.max_minutes=0",
            "train.patience=0", "train.validate_every_updates=0", "train.validate_every_minutes=0",
            "train.save_every_epochs=0", "train.layer_stats_every_updates=100", "train.seed=1",
            f"train.threads={args.threads}", f"train.precision={args.precision}", "train.progress=false",
            *args.overrides]  # fmt: skip


def train_command(out: Path, cell: Cell, shared: list[str]) -> list[str]:
    """``tfx.train`` in the cell's run folder (the same folder resumes it: ``train.resume=auto``), under
    ``tfx.studies.peak_memory``, which records the session's peak memory and wall time there."""
    run = cell.run(out)
    train = [sys.executable, "-m", "tfx.train", f"hydra.run.dir={run}", *cell_overrides(cell, shared)]
    return [sys.executable, "-m", "tfx.studies.peak_memory", str(run / "sessions.jsonl"), "--", *train]


def decode_command(run: Path, beam: int) -> list[str]:
    """The run's best-valid checkpoint on its test split (Multi30k's test2016), scored into ``test/best_test.*``."""
    hyp = score_path(run, "best", "test").with_name("best_test.hyp")
    return [sys.executable, "-m", "tfx.evaluate", str(run / "checkpoints" / "checkpoint_best.pt"), "--split", "test",
            "--output", str(hyp), "--beam", str(beam), "--quiet"]  # fmt: skip


def say(message: str) -> None:
    write_line(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] depth map: {message}", sys.stdout)


class Study:
    """One invocation: its record, its queue of ``--jobs`` slots, and each cell's life (train, retry, decode)."""

    def __init__(self, args: argparse.Namespace, study: dict[str, Any]) -> None:
        self.args, self.study, self.out = args, study, args.out
        self.shared = study["overrides"]
        self.queue = RunQueue(args.jobs, CHECKOUT)
        self.env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        self.decodes_failed = 0
        self._report_lock = threading.Lock()
        self._reporting = self._stale = False

    def stage(self, cells: list[Cell]) -> int:
        """Every cell at once on the queue's slots (a free slot goes to the earliest cell); the first failure's exit
        code, ``STOPPED`` when stopped, else 0."""
        with ThreadPoolExecutor(max(len(cells), 1)) as pool:
            futures = [pool.submit(self.cell_life, cell, i) for i, cell in enumerate(cells)]
            try:
                codes = [f.result() for f in futures]
            except BaseException:  # SIGTERM, Ctrl-C or an error: the runs save and stop, the rest waits for them
                self.queue.stop()
                raise
        return STOPPED if self.queue.stopped else next((code for code in codes if code), 0)

    def cell_life(self, cell: Cell, priority: int) -> int:
        """Train the cell (skipped when it has ended), its retry if it failed, then decode what trained."""
        code = self.train(cell, priority)
        if not code and failed(summarize(cell.run(self.out))["outcome"]):
            code = self.train(Cell(cell.depth, cell.method, retry=True), priority)
        found = verdict(self.out, cell.method, cell.depth)
        if not code and found and found[1]["outcome"] == "trained":
            self.decode(found[0], priority)
        self.report(cell)
        return code

    def train(self, cell: Cell, priority: int) -> int:
        """One run unless it has ended (a stopped one resumes from checkpoint_last.pt); 0 for a run that ended,
        diverged included (a finding, not a failure), else its exit code."""
        run = cell.run(self.out)
        if summarize(run)["outcome"] != "unfinished":
            return 0
        say(f"{cell.name}: training at {describe_setting(cell)}")
        done = self.queue.run(train_command(self.out, cell, self.shared), priority, self.env)
        if self.queue.stopped:
            return STOPPED
        result = summarize(run)
        if result["outcome"] == "unfinished":
            return done.returncode or 1
        curve = " / ".join(f"{b:.2f}" for b in result["valid_bleu"]) or "none"
        say(f"{cell.name}: {result['outcome']} (valid BLEU per epoch {curve}), {result['s_per_update']:.2f} s/update, "
            f"peak {result['peak_mb']:.0f} MB")  # fmt: skip
        return 0

    def decode(self, cell: Cell, priority: int) -> None:
        run = cell.run(self.out)
        if score_path(run, "best", "test").exists():
            return
        done = self.queue.run(decode_command(run, self.args.beam), priority, self.env, capture=True)
        if done.returncode not in (0, STOPPED):
            self.decodes_failed += 1
            lines = done.stderr.strip().splitlines() or ["failed"]
            write_line(f"{cell.name}: decode failed: {lines[-1]}", sys.stderr)
        elif done.returncode == 0:
            say(f"{cell.name}: test2016 BLEU (greedy) {summarize(run)['test_bleu']:.2f}")

    def report(self, cell: Cell) -> None:
        """Rewrite table and figure now that ``cell`` has ended. Cells end in their own threads, often together: one
        thread writes at a time, and it writes again while others asked meanwhile, so the last state is always
        written and no cell waits for a queue of reports."""
        with self._report_lock:
            self._stale = True
            mine, self._reporting = not self._reporting, True
        while mine:
            with self._report_lock:
                if not self._stale:
                    self._reporting = mine = False
                    break
                self._stale = False
            try:
                write_report(self.out)
            except BaseException:
                with self._report_lock:
                    self._reporting = False  # the next cell tries again
                raise
        planned = [c for c in _stage_cells(self.study) if not c.retry]
        ended = sum(settled(self.out, c.method, c.depth) for c in planned)
        say(f"{cell.name} done; {ended} of {len(planned)} cells have their outcome ({self.out / 'depth_map.md'})")


def _stage_cells(study: dict[str, Any]) -> list[Cell]:
    cells = stage1_cells(study["arms"], study["depths"])
    return cells + stage1_cells(study.get("stage2") or [], study["deep_depths"])


def choose_stage2(out: Path, study: dict[str, Any], others: int) -> list[str] | None:
    """Stage 2's methods, recorded once chosen; None while a cell at the deepest stage-1 depth has no outcome."""
    if study.get("stage2") is not None:
        return study["stage2"]
    deepest = max(study["depths"])
    if not all(settled(out, m, deepest) for m in study["arms"]):
        return None
    study["stage2"] = stage2_methods(out, study["arms"], deepest, others)
    return study["stage2"]


def run_study(args: argparse.Namespace) -> int:
    """study.json first, then stage 1, the choice, stage 2; a re-run continues where it stopped."""
    own_data = any(o.split("=", 1)[0] in ("data", "+data") for o in args.overrides)  # e.g. a test's toy data
    if not own_data and (problem := missing_files(args.data_dir, ["train", "valid", "test"])):
        print(problem, file=sys.stderr)
        return 2
    path = args.out / "study.json"
    fresh = {"arms": [], "depths": args.depths, "deep_depths": args.deep_depths, "overrides": shared_overrides(args),
             "args": {"jobs": args.jobs, "epochs": args.epochs, "beam": args.beam, "others": args.others},
             "stage2": None, "wall_seconds": 0.0}  # fmt: skip
    if (study := open_study(path, fresh, args.methods)) is None:
        return 2
    if (study["depths"], study["deep_depths"]) != (args.depths, args.deep_depths):
        print(f"{path} holds a study of other depths: use another --out", file=sys.stderr)
        return 2
    runner = Study(args, study)

    def work() -> tuple[int, int]:
        if code := runner.stage(stage1_cells(study["arms"], study["depths"])):
            return code, runner.decodes_failed
        if args.until == "stage1":
            say("--until stage1: stage 2 runs when the same command runs without it")
            return 0, runner.decodes_failed
        methods = choose_stage2(args.out, study, args.others)
        save_study(path, study)  # the choice, before any stage-2 run: a re-run keeps it
        if methods is None:  # a stage-1 cell without its outcome: an error was reported above
            return 1, runner.decodes_failed
        say(f"stage 2: {', '.join(methods)} at N = {', '.join(map(str, study['deep_depths']))}")
        return runner.stage(stage1_cells(methods, study["deep_depths"])), runner.decodes_failed

    code = run_recorded(path, study, work)
    write_report(args.out)  # with the wall time run_recorded added
    return code


def dry_run(args: argparse.Namespace) -> int:
    """The plan without training: each stage-1 cell's overrides and its retry's change, composed once per method and
    setting (a bad override fails here in seconds), and stage 2's rule (its choice, where the records allow one)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tfx.config import compose_config

    shared = shared_overrides(args)
    for cell in stage1_cells(args.methods, args.depths):
        retry = Cell(cell.depth, cell.method, retry=True)
        print(f"{cell.name}: {' '.join(cell_overrides(cell, shared)[len(shared) :])} | {describe_setting(cell)}")
        print(f"  if it fails, {retry.name}: {describe_setting(retry)}: {RETRIES[cell.method].why}"
              if cell.method in RETRIES else f"  if it fails, {retry.name}: {describe_setting(retry)}")  # fmt: skip
    for method in args.methods:
        for cell in (Cell(min(args.depths), method), Cell(min(args.depths), method, retry=True)):
            try:
                cfg = compose_config(cell_overrides(cell, shared))
            except (HydraException, OmegaConfBaseException, ValueError) as err:
                print(f"{cell.name}: {type(err).__name__}: {str(err).splitlines()[0]}", file=sys.stderr)
                return 2
            o, m = cfg.optim, cfg.model
            print(f"composed {cell.name}: norm={m.norm} init={cfg.init.name} lr={o.lr:g} dropout={m.dropout:g} "
                  f"warmup={o.warmup_updates} d={m.d_model} ffn={m.ffn_dim} heads={m.heads} "
                  f"epochs={cfg.train.max_epochs} {cfg.train.precision} threads={cfg.train.threads}")  # fmt: skip
    study_path = args.out / "study.json"
    chosen = None
    if study_path.exists():
        chosen = choose_stage2(args.out, json.loads(study_path.read_text()), args.others)
    rule = f"T-Fixup and the {args.others} methods that trained at N = {max(args.depths)} with the best valid BLEU"
    print(f"shared: {' '.join(shared)}")
    print(f"stage 2: N = {', '.join(map(str, args.deep_depths))} for {rule}: "
          + (", ".join(chosen) if chosen else "chosen when stage 1 has ended"))  # fmt: skip
    print(f"{len(args.methods) * len(args.depths)} stage-1 cells, {args.jobs} at once, {args.threads} thread(s) each")
    return 0
