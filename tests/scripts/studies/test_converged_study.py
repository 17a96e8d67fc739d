"""scripts/studies/converged_study.py: the grid's finalists and the choice among them at convergence, mean +- std over
seeds, and a micro study that trains (grid, then the finalist with patience, continuing its grid run as a fresh
run would train), decodes, reports and resumes without redoing work. CPU, fp32."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.conftest import load_script
from tests.scripts.studies.test_budget_study import small_corpus
from tfx.config import compose_config
from tfx.reporting.metrics_log import read_metrics
from tfx.studies.arms import write_arms
from tfx.studies.harness import CHECKOUT


@pytest.fixture(scope="module")
def cs() -> ModuleType:
    return load_script("studies/converged_study")


def test_the_32k_arm_is_t_fixup_at_32k_target_tokens_per_update(cs: ModuleType, tmp_path: Path) -> None:
    args = cs.parse_args(["--out", str(tmp_path), "--data-dir", str(tmp_path)])
    write_arms(tmp_path / "arms", ["tfixup_32k"])
    search = f"hydra.searchpath=[file://{tmp_path / 'arms'}]"
    cfg = compose_config([search, *cs.shared_overrides(args), "+arm=tfixup_32k"])
    assert (cfg.data.max_tokens, cfg.model.norm, cfg.init.name) == (32768, "none", "tfixup")
    assert cfg.optim.warmup_updates == 0
    assert {w for _, _, w in cs.grid_settings("tfixup_32k", args)} == {0}  # warmup-free, as T-Fixup


def _valid_run(folder: Path, bleus: list[float], ended: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [{"event": "valid", "step": 10 * i, "valid/bleu": b} for i, b in enumerate(bleus, 1)]
    lines += [{"event": "end", "step": 10 * len(bleus), "status": ended}] if ended else []
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_grid_picks_a_warmup_per_lr_and_dropout_and_warmup_free_arms_keep_warmup_0(
    cs: ModuleType, tmp_path: Path
) -> None:
    args = cs.parse_args(["--out", str(tmp_path), "--lrs", "0.0005", "0.001", "--dropouts", "0.1", "0.3",
                          "--warmups", "0", "400"])  # fmt: skip
    assert cs.grid_settings("tfixup", args) == [(0.0005, 0.1, 0), (0.0005, 0.3, 0), (0.001, 0.1, 0), (0.001, 0.3, 0)]
    assert len(cs.grid_settings("postln", args)) == 8
    scores = {(0.0005, 0.3, 0): [10, 20], (0.0005, 0.3, 400): [12, 24.5], (0.001, 0.3, 0): [5], (0.001, 0.3, 400): [],
              (0.0005, 0.1, 0): [20, 30], (0.0005, 0.1, 400): [20, 29], (0.001, 0.1, 0): [22, 31],
              (0.001, 0.1, 400): [22, 31]}  # fmt: skip
    for setting, bleus in scores.items():
        if bleus:
            _valid_run(tmp_path / "runs" / "grid" / "postln" / cs.setting_name(*setting), bleus)
    finalists = cs.grid_finalists(tmp_path, "postln", args)
    assert finalists == {"postln_lr0.0005_d0.1": (0.0005, 0.1, 0), "postln_lr0.0005_d0.3": (0.0005, 0.3, 400),
                         "postln_lr0.001_d0.1": (0.001, 0.1, 0),  # equals: the first in grid order
                         "postln_lr0.001_d0.3": (0.001, 0.3, 0)}  # fmt: skip
    assert cs.best_valid(tmp_path / "runs" / "grid" / "postln" / "lr0.0005_d0.3_w400") == (24.5, 2)
    # converged, the settings that led the grid (31, 30 against 24.5) end worse: the arm takes the slow starter
    for name, bleus in {
        "postln_lr0.0005_d0.1": [20, 30, 31, 31.5, 31],
        "postln_lr0.001_d0.1": [22, 31, 32, 31],
        "postln_lr0.0005_d0.3": [12, 24.5, 30, 33, 34, 33.8],
        "postln_lr0.001_d0.3": [5],
    }.items():
        _valid_run(cs.final_runs(tmp_path, name, [1])[1], bleus)
    assert cs.chosen_finalist(tmp_path, finalists) == "postln_lr0.0005_d0.3"
    unvalidated = {"postln_lr0.01_d0.1": (0.01, 0.1, 0), **finalists}  # first, and no valid record (diverged)
    assert cs.chosen_finalist(tmp_path, unvalidated) == "postln_lr0.0005_d0.3"
    (tmp_path / "runs" / "grid" / "postln" / "lr0.001_d0.3_w0" / "metrics.jsonl").unlink()
    with pytest.raises(SystemExit, match="no finished grid run for arm postln, lr 0.001, dropout 0.3"):
        cs.grid_finalists(tmp_path, "postln", args)


class _RecordingQueue:
    """Stands in for ``RunQueue``: records the commands a stage runs, in order, each with exit code 0; a training
    run "converges" (its metrics end in an early stop) and is then followed by what ``then`` runs on its slot."""

    stopped = False

    def __init__(self) -> None:
        self.cmds: list[list[str]] = []

    def run_all(self, cmds: list[list[str]], priority: int, env: dict | None = None, capture: bool = False,
                then: Any = None) -> list[subprocess.CompletedProcess]:  # fmt: skip
        done = []
        for i, cmd in enumerate(cmds):
            done.append(self.run_here(cmd, priority))
            if run := next((Path(a.split("=", 1)[1]) for a in cmd if a.startswith("hydra.run.dir=")), None):
                _valid_run(run, [30.0, 31.0], ended="early stop: no valid/bleu gain in 1 validations")
            if then is not None:
                then(i, done[-1])
        return done

    def run_here(self, cmd: list[str], priority: int, env: dict | None = None,
                 capture: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
        self.cmds.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    def done(self, priority: int) -> None:  # an arm's stages ended: nothing waits on its slots here
        pass


def test_a_re_run_trains_again_only_the_runs_that_were_stopped_or_never_started(cs: ModuleType, tmp_path: Path) -> None:
    args = cs.parse_args(["--out", str(tmp_path), "--lrs", "0.0005", "--dropouts", "0.1",
                          "--warmups", "0", "100", "400", "1000"])  # fmt: skip
    ends = {0: "early stop: no valid/bleu gain in 3 validations", 100: "diverged", 400: "stopped by SIGTERM"}
    for warmup, status in ends.items():  # warmup 1000 has no folder: never started
        run = cs.grid_run(tmp_path, "postln", (0.0005, 0.1, warmup))
        _valid_run(run, [5.0])
        with (run / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"event": "end", "step": 10, "status": status}) + "\n")
    runs = {w: cs.grid_run(tmp_path, "postln", (0.0005, 0.1, w)) for w in (0, 100, 400, 1000)}
    assert [cs.finished(runs[w]) for w in runs] == [True, False, False, False]  # only a finished run is decoded
    assert [cs.ended(runs[w]) for w in runs] == [True, True, False, False]  # a diverged run would diverge again
    queue = _RecordingQueue()
    assert cs.run_grid(args, "postln", queue, 0) == 0
    queued = [next(a for a in cmd if a.startswith("hydra.run.dir=")) for cmd in queue.cmds]
    assert queued == [f"hydra.run.dir={runs[400]}", f"hydra.run.dir={runs[1000]}"]


def test_each_finalist_is_decoded_on_its_slot_as_soon_as_it_converges(cs: ModuleType, tmp_path: Path) -> None:
    """So a run that ended has its test scores in its records even if the study stops (or the machine goes) before
    the other finalists end; one that ended before the study was stopped is decoded first when it resumes."""
    args = cs.parse_args(["--out", str(tmp_path), "--data-dir", str(tmp_path), "--lrs", "0.0005", "0.001",
                          "--dropouts", "0.1", "0.3", "--warmups", "0"])  # fmt: skip
    finalists = {cs.finalist_name("postln", lr, d): (lr, d, 0) for lr in args.lrs for d in args.dropouts}
    runs = [cs.final_runs(tmp_path, name, [1])[1] for name in finalists]
    _valid_run(runs[2], [29.0, 30.5], ended="early stop: no valid/bleu gain in 3 validations")  # before a stop
    queue = _RecordingQueue()
    assert cs.run_tuned(args, "postln", finalists, [1], queue, 0) == (0, 0)

    def what(cmd: list[str]) -> str:
        if "tfx.train" in cmd:
            return "train " + next(a for a in cmd if a.startswith("hydra.run.dir=")).split("/")[-2]
        if "tfx.average" in cmd:
            return "average " + Path(cmd[cmd.index("--run-dir") + 1]).parent.name
        return "decode " + Path(cmd[cmd.index("--output") + 1]).parents[2].name

    def decoded(name: str) -> list[str]:  # its window average, then best and average, each on every test set
        return [f"average {name}", *[f"decode {name}"] * len(cs.KINDS)]

    a, b, ended, c = (run.parent.name for run in runs)
    expected = [*decoded(ended), f"train {a}", *decoded(a), f"train {b}", *decoded(b), f"train {c}", *decoded(c)]
    assert [what(cmd) for cmd in queue.cmds] == expected
    decodes = [cmd for cmd in queue.cmds if "tfx.evaluate" in cmd]  # one process per checkpoint: every test set
    assert all(len(cmd[cmd.index("--src") + 1 : cmd.index("--ref")]) == len(cs.TEST_SETS) for cmd in decodes)


def test_one_finalist_trains_every_seed_at_once_and_several_wait_for_seed_1_to_choose(
    cs: ModuleType, tmp_path: Path
) -> None:
    args = cs.parse_args(["--out", str(tmp_path), "--lrs", "0.0005", "--dropouts", "0.3", "--seeds", "1", "2", "3"])
    lone = {"tfixup_lr0.0005_d0.3": (0.0005, 0.3, 0)}
    assert cs.seeds_with_finalists(lone, args.seeds) == [1, 2, 3]
    queue = _RecordingQueue()
    assert cs.run_tuned(args, "tfixup", lone, cs.seeds_with_finalists(lone, args.seeds), queue, 0) == (0, 0)
    queued = [next(a for a in cmd if a.startswith("train.seed=")) for cmd in queue.cmds if "tfx.train" in cmd]
    assert queued == ["train.seed=1", "train.seed=2", "train.seed=3"]  # one batch: all three share the slots
    two = {**lone, "tfixup_lr0.001_d0.3": (0.001, 0.3, 0)}
    assert cs.seeds_with_finalists(two, args.seeds) == [1]  # seeds 2 and 3 train the choice, once seed 1 made it
    assert cs.seeds_with_finalists(lone, [2]) == [1, 2]  # seed 1 chooses (and continues its grid run) regardless


def _one_line_corpus(cs: ModuleType, data: Path) -> Path:
    """Every file a study checks for, one line each: enough for a study whose queue trains nothing."""
    data.mkdir()
    for name in ["train", "valid", *cs.TEST_SETS]:
        for lang in ("de", "en"):
            (data / f"{name}.{lang}").write_text("x\n")
    return data


def test_an_arm_tuned_elsewhere_added_to_a_recorded_study_is_reported_with_its_grid_of_one(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepNorm's study recorded its args; a later run adds T-Fixup with --tuned. The report reads the recorded
    args, so they gain T-Fixup's setting: its grid is that one run, not lrs x dropouts with empty cells (CPU, the
    queue stubbed: no training)."""
    data = _one_line_corpus(cs, tmp_path / "data")
    monkeypatch.setattr(cs, "RunQueue", lambda *a: _RecordingQueue())
    base = ["--out", str(tmp_path / "study"), "--data-dir", str(data), "--lrs", "0.001", "--dropouts", "0.3",
            "--warmups", "400"]  # fmt: skip
    cs.run_study(cs.parse_args([*base, "--arms", "deepnorm"]))
    cs.run_study(cs.parse_args([*base, "--arms", "deepnorm", "tfixup", "--tuned", "tfixup=5e-4,0.3,0"]))
    recorded = argparse.Namespace(**json.loads((tmp_path / "study" / "study.json").read_text())["args"])
    assert cs.grid_settings("tfixup", recorded) == [(5e-4, 0.3, 0)]
    assert cs.grid_settings("deepnorm", recorded) == [(0.001, 0.3, 400)]
    assert "| 0.0005 | 0.3 | **30.00 / 31.00** |" in cs.write_report(tmp_path / "study")


def test_seeds_added_to_a_recorded_study_are_reported(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study run with --seeds 1, then again with --seeds 1 2 (more seeds for the same arms): the recorded args
    gain seed 2, so the report has a row for it, not only for the seed the study began with (CPU, the queue
    stubbed: no training)."""
    data = _one_line_corpus(cs, tmp_path / "data")
    monkeypatch.setattr(cs, "RunQueue", lambda *a: _RecordingQueue())
    base = ["--out", str(tmp_path / "study"), "--data-dir", str(data), "--arms", "tfixup", "--tuned",
            "tfixup=5e-4,0.3,0"]  # fmt: skip
    cs.run_study(cs.parse_args([*base, "--seeds", "1"]))
    cs.run_study(cs.parse_args([*base, "--seeds", "1", "2"]))
    cs.run_study(cs.parse_args([*base, "--seeds", "1"]))  # a later run with fewer seeds forgets none
    assert json.loads((tmp_path / "study" / "study.json").read_text())["args"]["seeds"] == [1, 2]
    report = cs.write_report(tmp_path / "study")
    assert "seeds [1, 2]" in report.splitlines()[0]


def test_more_seeds_of_arms_tuned_elsewhere_train_those_seeds_only_without_a_grid_or_seed_1(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--tuned`` arms with ``--seeds 2`` (seed 1 converged in another study, on a machine since replaced): seed 2
    of each trains and is decoded, and nothing else; before, each arm trained its grid run and seed 1 again, twice
    the work. An arm with a grid still trains seed 1, which chooses (CPU, the queue stubbed: no training)."""
    data = _one_line_corpus(cs, tmp_path / "data")
    queue = _RecordingQueue()
    monkeypatch.setattr(cs, "RunQueue", lambda *a: queue)
    base = ["--out", str(tmp_path / "study"), "--data-dir", str(data), "--arms", "tfixup", "dyt", "--tuned",
            "tfixup=5e-4,0.3,0", "dyt=1e-3,0.3,0", "--seeds", "2"]  # fmt: skip
    cs.run_study(cs.parse_args(base))  # its decodes "fail": the stub writes no scores
    runs = [next(a for a in cmd if a.startswith("hydra.run.dir=")) for cmd in queue.cmds if "tfx.train" in cmd]
    trained = sorted(str(Path(run.split("=", 1)[1]).relative_to(tmp_path / "study" / "runs")) for run in runs)
    assert trained == ["final/dyt_lr0.001_d0.3/seed2", "final/tfixup_lr0.0005_d0.3/seed2"]
    decoded = {str(Path(cmd[cmd.index("tfx.evaluate") + 1]).relative_to(tmp_path / "study" / "runs"))
               for cmd in queue.cmds if "tfx.evaluate" in cmd}  # fmt: skip
    assert decoded == {f"{run}/{kind}" for run in trained for kind in cs.KINDS.values()}  # both seeds, no other
    report = cs.write_report(tmp_path / "study")
    assert "seeds [2]" in report.splitlines()[0] and "| dyt | 2 |" in report  # its row against T-Fixup's seed 2
    assert "Finalists" not in report  # nothing was chosen here: no empty finalists' table
    capsys.readouterr()
    assert cs.main([*base, "--dry-run"]) == 0
    assert "dyt: lr0.001_d0.3_w0, no grid, no seed 1; seeds 2 to convergence" in capsys.readouterr().out
    queue.cmds.clear()
    cs.run_study(cs.parse_args([*base[:4], "--arms", "rezero", "--lrs", "0.001", "--dropouts", "0.3", "--warmups",
                                "0", "--seeds", "2"]))  # fmt: skip
    runs = [next(a for a in cmd if a.startswith("hydra.run.dir=")) for cmd in queue.cmds if "tfx.train" in cmd]
    assert [Path(run).name for run in runs] == ["lr0.001_d0.3_w0", "seed1", "seed2"]  # grid, seed 1, seed 2


def test_until_grid_trains_every_arms_grid_and_no_finalist_and_the_same_command_without_it_goes_on(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--until grid`` (whole grids for several arms in a session too short for one arm's finalists): both arms'
    grids train and no finalist does; run again without it, only the finalists train (CPU, the queue stubbed)."""
    data = _one_line_corpus(cs, tmp_path / "data")
    queue = _RecordingQueue()
    monkeypatch.setattr(cs, "RunQueue", lambda *a: queue)
    base = ["--out", str(tmp_path / "study"), "--data-dir", str(data), "--arms", "rezero", "dyt", "--lrs", "0.001",
            "--dropouts", "0.3", "--warmups", "0", "400"]  # fmt: skip

    def trained() -> list[str]:
        runs = [next(a for a in cmd if a.startswith("hydra.run.dir=")) for cmd in queue.cmds if "tfx.train" in cmd]
        return sorted(str(Path(run.split("=", 1)[1]).relative_to(tmp_path / "study" / "runs")) for run in runs)

    assert cs.run_study(cs.parse_args([*base, "--until", "grid"])) == 0
    grids = [f"grid/{arm}/lr0.001_d0.3_w{w}" for arm in ("dyt", "rezero") for w in (0, 400)]
    assert trained() == grids
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the figure has no curve yet: no "no artists" warning either
        report = cs.write_report(tmp_path / "study")
    assert "| rezero | lr0.001_d0.3_w0 | 31.00 | not started | — | — | — |  |" in report  # the grid's score
    capsys.readouterr()
    assert cs.main([*base, "--until", "grid", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "then stop (--until grid); at most 6 epochs" in plan and "at most 12 epochs in all; decodes: none" in plan
    queue.cmds.clear()
    cs.run_study(cs.parse_args(base))  # its decodes "fail": the stub writes no scores
    assert trained() == ["final/dyt_lr0.001_d0.3/seed1", "final/rezero_lr0.001_d0.3/seed1"]


def test_a_finalist_still_training_is_reported_as_its_best_so_far_not_as_converged(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finalist that continues its grid run but has not ended (queued, or stopped mid-run) shows its best so far
    and its epochs with `...`: before, the table read 31.00 "converged" after the grid's 2 epochs (CPU, the queue
    stubbed)."""
    data = _one_line_corpus(cs, tmp_path / "data")
    monkeypatch.setattr(cs, "RunQueue", lambda *a: _RecordingQueue())
    args = cs.parse_args(["--out", str(tmp_path / "study"), "--data-dir", str(data), "--arms", "rezero", "--lrs",
                          "0.001", "--dropouts", "0.3", "--warmups", "0", "--until", "grid"])  # fmt: skip
    assert cs.run_study(args) == 0
    final = cs.final_runs(tmp_path / "study", "rezero_lr0.001_d0.3", [1])[1]
    cs.continue_grid_run(cs.grid_run(tmp_path / "study", "rezero", (0.001, 0.3, 0)), final)
    assert final.is_dir()
    report = cs.write_report(tmp_path / "study")
    assert "| rezero | lr0.001_d0.3_w0 | 31.00 | 31.00 ... | 2 | 2 ... | — |  |" in report
    _valid_run(final, [30.0, 31.0, 29.0, 32.0, 31.5], ended="early stop: no valid/bleu gain in 1 validations")
    assert "| rezero | lr0.001_d0.3_w0 | 31.00 | 32.00 | 4 | 5 | — |  |" in cs.write_report(tmp_path / "study")


def test_the_average_window_counts_numbered_checkpoints_only(cs: ModuleType, tmp_path: Path) -> None:
    """A user's file of the numbered shape (an average written aside) does not widen the window past the run's own
    checkpoints: before, 3 epochs plus `checkpoint_avg_last5.pt` asked `tfx.average` for a window of 4 of 3 and the
    average failed (no computation: the command is built from the folder)."""
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for name in ["checkpoint_1_10.pt", "checkpoint_2_20.pt", "checkpoint_3_30.pt", "checkpoint_avg_last5.pt"]:
        (ckpts / name).touch()
    cmd = cs.average_command(tmp_path / "run")
    assert cmd[cmd.index("--best-window") + 1] == "3"


_SAY_FROM_THREADS = """
import sys, threading
from tests.conftest import load_script
cs = load_script("studies/converged_study")
sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible, as the study's busy threads do
def arm(i):
    for j in range(1000):
        cs.say(f"arm{i}: line {j}")
threads = [threading.Thread(target=arm, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_progress_lines_from_the_arms_threads_stay_whole() -> None:
    """The arms' stages run in threads and each says where it stands; through a pipe (a study's log), print's text
    and newline were two writes another thread's line fell between (2 to 204 of these 4000 lines, three tries)."""
    done = subprocess.run([sys.executable, "-c", _SAY_FROM_THREADS], cwd=CHECKOUT, capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    lines = done.stdout.splitlines()
    whole = [line for line in lines if re.fullmatch(r"\[[\d\- :]+\] study: arm\d: line \d+", line)]
    assert len(lines) == len(whole) == 4000


def _updates(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "update"]


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_micro_study_trains_decodes_reports_and_resumes(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, data = tmp_path / "study", small_corpus(tmp_path / "data")
    for test in [t for t in cs.TEST_SETS if t != "test"]:  # every test set decodes alike; CI's time
        monkeypatch.delitem(cs.TEST_SETS, test)  # the one dict the study, its runs and its report read
    tiny = ["model.d_model=16", "model.ffn_dim=32", "model.heads=2", "data.vocab_size=60", "data.max_tokens=256",
            f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    argv = [*tiny, "--out", str(out), "--arms", "postln", "--data-dir", str(data), "--layers", "1",
            "--lrs", "0.001", "--dropouts", "0.1", "--warmups", "0", "10", "--grid-epochs", "1",
            "--max-epochs", "2", "--patience", "1", "--seeds", "1"]  # fmt: skip
    assert cs.main(argv) == 0
    progress = [line.split("] study: ")[1] for line in capsys.readouterr().out.splitlines() if "] study: " in line]
    assert progress[0].startswith("postln: grid done; finalists (grid valid BLEU) lr0.001_d0.1_w")
    assert progress[1].startswith("postln: its finalists converged; chose postln_lr0.001_d0.1 (valid BLEU ")
    assert progress[2].startswith("postln: decoded; test2016 sacreBLEU of the best-valid checkpoint, by seed: ")
    grid = sorted(p.name for p in (out / "runs" / "grid" / "postln").iterdir())
    assert grid == ["lr0.001_d0.1_w0", "lr0.001_d0.1_w10"]
    run = out / "runs" / "final" / "postln_lr0.001_d0.1" / "seed1"
    for kind in cs.KINDS:
        for test in cs.TEST_SETS:
            sacre, tok = cs.test_scores(run, kind, test)
            assert 0 <= sacre <= 100 and 0 <= tok <= 100
    table = (out / "converged_study.md").read_text()
    chosen = json.loads((out / "study.json").read_text())["settings"]["postln"]
    assert f"| postln | {cs.setting_name(*chosen)} |" in table
    assert (out / "converged_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # seed 1 continued the chosen grid run: its first epoch is the grid's record, then it trained on to its end ...
    grid_run = out / "runs" / "grid" / "postln" / cs.setting_name(*chosen)
    grid_updates, updates = _updates(grid_run), _updates(run)
    assert updates[: len(grid_updates)] == grid_updates and len(updates) > len(grid_updates)
    assert [r["event"] for r in read_metrics(run / "metrics.jsonl")].count("end") == 1
    assert all(c.samefile(run / "checkpoints" / c.name) for c in (grid_run / "checkpoints").glob("checkpoint_*_*.pt"))
    # ... and that is the run a fresh start with its settings trains (CPU fp32: equal losses)
    fresh = tmp_path / "fresh"
    overrides = list(OmegaConf.load(run / ".hydra" / "overrides.yaml"))
    assert "train.keep_last=8" in overrides  # window 5, patience 1: windows ending at the best epoch or later
    subprocess.run([sys.executable, "-m", "tfx.train", f"hydra.run.dir={fresh}",
                    f"hydra.searchpath=[file://{out / 'arms'}]", *overrides], cwd=CHECKOUT, check=True)  # fmt: skip
    assert [r["train/loss"] for r in _updates(fresh)] == pytest.approx([r["train/loss"] for r in updates], rel=1e-5)
    outputs = [p for p in out.rglob("*") if p.suffix in (".pt", ".json") and p.name != "study.json"]
    touched = {p: p.stat().st_mtime_ns for p in outputs}
    assert cs.main(argv) == 0  # resumed: nothing left to train or decode
    changed = [p for p, t in touched.items() if p.stat().st_mtime_ns != t]
    assert changed == [], changed
    # interrupted during its decodes (one score missing): a re-run decodes that one and trains nothing
    lost = cs.score_path(run, "avg", "test")
    lost.unlink()
    assert cs.main(argv) == 0 and lost.is_file()
    changed = [p for p, t in touched.items() if p != lost and p.stat().st_mtime_ns != t]
    assert changed == [], changed
    # on another machine, from the records copied without checkpoints (results/README.md): nothing to do
    for gone in [*out.rglob("checkpoints"), *out.rglob("tb")]:
        shutil.rmtree(gone)
    for gone in [*out.rglob("*.pt"), *out.rglob("train.log")]:
        gone.unlink()
    scores = {p: p.read_bytes() for p in out.rglob("*.bleu.json")}
    assert cs.main(argv) == 0
    assert {p: p.read_bytes() for p in out.rglob("*.bleu.json")} == scores and not list(out.rglob("*.pt"))
    rows = [line for line in cs.write_report(out).splitlines() if line.startswith("| postln")]
    assert rows == [line for line in table.splitlines() if line.startswith("| postln")] and len(rows) == 2


def test_a_study_under_results_stays_out_of_git_and_its_readme_does_not() -> None:
    """results/.gitignore, read by git itself: run outputs (records, checkpoints, events) are never committed."""
    if not (CHECKOUT / ".git").exists():
        pytest.skip("not a git checkout")
    run = "results/converged/runs/final/tfixup_lr0.0005_d0.3/seed1"
    kept = ["results/README.md", "results/.gitignore"]
    left = ["results/converged/study.json", f"{run}/metrics.jsonl", f"{run}/test/best_test.hyp",
            f"{run}/checkpoints/checkpoint_best.pt", f"{run}/tb/events.out.tfevents.1"]  # fmt: skip
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *kept, *left], cwd=CHECKOUT,
                             capture_output=True, text=True).stdout.split()  # fmt: skip
    assert ignored == left


def test_the_gpu_preset_dry_run_composes_every_arm_on_cuda_and_trains_nothing(
    cs: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "study"
    assert cs.main(["--out", str(out), "--preset", "gpu", "--dry-run", "--arms", "tfixup", "postln"]) == 0
    plan = capsys.readouterr().out.splitlines()
    # each arm at the setting its CPU study chose: a grid of one, its seed 1 the finalist, seeds 2 and 3 beside it
    assert plan[0].startswith("tfixup: grid 1 runs (lr0.0005_d0.3_w0) x 1 epochs; 1 finalists and 2 more seeds")
    assert plan[1].startswith("postln: grid 1 runs (lr0.001_d0.1_w400) x 1 epochs;")
    assert "norm=post init=xavier" in plan[1]
    assert all("device cuda bf16 batching=padded compile=False | 6 runs at once, 1 threads" in line
               for line in plan[:2])  # fmt: skip
    assert not out.exists()  # nothing trained, nothing written
    # a setting given for the deeper table replaces the preset's, and the plan says so before any device time
    argv = ["--out", str(out), "--preset", "gpu", "--dry-run", "--layers", "12", "--tuned", "postln=5e-4,0.1,1000"]
    assert cs.main(argv) == 0
    plan = capsys.readouterr().out.splitlines()
    assert next(line for line in plan if line.startswith("postln:")).startswith(
        "postln: grid 1 runs (lr0.0005_d0.1_w1000)"
    )
    assert next(line for line in plan if line.startswith("admin:")).startswith("admin: grid 1 runs (lr0.001_d0.3_w0)")


def test_the_gpu_preset_trains_the_cpu_tuned_arms_at_their_settings_and_tuned_overrides_one(
    cs: ModuleType, tmp_path: Path
) -> None:
    args = cs.parse_args(["--out", str(tmp_path), "--preset", "gpu", "--tuned", "deepnorm=5e-4,0.1,0"])
    assert args.arms == list(cs.TUNED_ON_CPU) and args.seeds == [1, 2, 3] and args.jobs == 15
    assert cs.grid_settings("postln", args) == [cs.TUNED_ON_CPU["postln"]] == [(1e-3, 0.1, 400)]
    assert cs.grid_settings("deepnorm", args) == [(5e-4, 0.1, 0)]  # --tuned wins over the preset's


def test_a_tuned_arm_has_a_grid_of_one_and_the_others_keep_theirs(cs: ModuleType, tmp_path: Path) -> None:
    args = cs.parse_args(["--out", str(tmp_path), "--arms", "tfixup", "postln", "--tuned", "postln=0.001,0.1,400"])
    assert cs.grid_settings("postln", args) == [(0.001, 0.1, 400)]
    assert len(cs.grid_settings("tfixup", args)) == 4 and args.grid_epochs == 3  # the CPU preset's grid
    _valid_run(tmp_path / "runs" / "grid" / "postln" / "lr0.001_d0.1_w400", [10.0, 20.0, 25.0])
    assert cs.grid_finalists(tmp_path, "postln", args) == {"postln_lr0.001_d0.1": (0.001, 0.1, 400)}
    assert cs.seeds_with_finalists(cs.grid_finalists(tmp_path, "postln", args), [1, 2]) == [1, 2]
    with pytest.raises(SystemExit):  # an arm that is not studied cannot be tuned
        cs.parse_args(["--out", str(tmp_path), "--arms", "tfixup", "--tuned", "postln=0.001,0.1,400"])
    with pytest.raises(SystemExit):
        cs.parse_args(["--out", str(tmp_path), "--tuned", "postln=0.001,0.1"])


def test_a_dry_run_names_the_arm_and_override_that_do_not_compose(
    cs: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cs.main(["model.norm=bogus", "--out", str(tmp_path), "--dry-run", "--arms", "tfixup"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arm tfixup: ValueError: model.norm='bogus'") and len(err.splitlines()) == 1
