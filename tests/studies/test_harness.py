"""tfx/studies/: the arm files a multirun sweeps, the one multirun command, the study record, train-or-replot."""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tfx.config import compose_config
from tfx.files import atomic
from tfx.studies import harness
from tfx.studies.arms import ARMS, write_arm, write_arms
from tfx.studies.harness import CHECKOUT, multirun, open_study, running_mean, save_study, train_or_replot


def test_each_arm_file_overrides_the_method_and_adds_its_settings(tmp_path: Path) -> None:
    write_arms(tmp_path, ["tfixup_radam", "postln"])
    assert sorted(p.name for p in (tmp_path / "arm").iterdir()) == ["postln.yaml", "tfixup_radam.yaml"]
    text = (tmp_path / "arm" / "tfixup_radam.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    body = OmegaConf.create(text)
    assert OmegaConf.to_container(body) == {"defaults": [{"override /method": "tfixup"}], "optim": {"name": "radam"}}
    assert OmegaConf.to_container(OmegaConf.create((tmp_path / "arm" / "postln.yaml").read_text())) == {
        "defaults": [{"override /method": "postln"}]
    }
    assert all((CHECKOUT / "conf" / "method" / f"{method}.yaml").is_file() for method, _ in ARMS.values())


def test_a_tuned_arm_file_carries_its_own_settings_and_hydra_selects_it_by_a_dotted_name(tmp_path: Path) -> None:
    write_arm(tmp_path / "tuned" / "postln_tfixup_lr_d0.3.yaml", "postln_tfixup_lr",
              ["optim.lr=0.001", "optim.warmup_updates=400", "model.dropout=0.3"])  # fmt: skip
    body = OmegaConf.to_container(OmegaConf.create((tmp_path / "tuned" / "postln_tfixup_lr_d0.3.yaml").read_text()))
    assert body == {"defaults": [{"override /method": "postln"}], "model": {"dropout": 0.3},
                    "optim": {"offset_decay": True, "lr": 0.001, "warmup_updates": 400}}  # fmt: skip
    cfg = compose_config([f"hydra.searchpath=[file://{tmp_path}]", "+tuned=postln_tfixup_lr_d0.3"])
    assert (cfg.model.norm, cfg.optim.lr, cfg.optim.warmup_updates, cfg.model.dropout) == ("post", 0.001, 400, 0.3)


def test_multirun_is_one_joblib_sweep_from_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], Any]] = []

    def run(cmd: list[str], cwd: Any = None) -> subprocess.CompletedProcess:
        calls.append((cmd, cwd))
        return subprocess.CompletedProcess(cmd, 3)

    monkeypatch.setattr(harness.subprocess, "run", run)
    assert multirun(tmp_path, ["tfixup"], 2, "${hydra:runtime.choices.arm}", ["+arm=tfixup", "train.seed=1"]) == 3
    ((cmd, cwd),) = calls
    assert cmd[:5] == [sys.executable, "-m", "tfx.train", "-m", "hydra/launcher=joblib"]
    assert cmd[5:] == [
        "hydra.launcher.n_jobs=2", f"hydra.searchpath=[file://{tmp_path / 'arms'}]",
        f"hydra.sweep.dir={tmp_path / 'runs'}", "hydra.sweep.subdir=${hydra:runtime.choices.arm}",
        "+arm=tfixup", "train.seed=1",
    ]  # fmt: skip
    assert cwd == CHECKOUT and (CHECKOUT / "conf" / "config.yaml").is_file()
    assert (tmp_path / "arms" / "arm" / "tfixup.yaml").is_file()  # written before the sweep starts


def test_a_study_record_adds_arms_and_refuses_other_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "out" / "study.json"
    fresh = {"arms": [], "overrides": ["a=1"]}
    study = open_study(path, fresh, ["tfixup", "postln"])
    assert study == {"arms": ["tfixup", "postln"], "overrides": ["a=1"]} and path.parent.is_dir()
    path.write_text(json.dumps(study))
    assert open_study(path, {"arms": [], "overrides": ["a=1"]}, ["postln", "preln"])["arms"] == [
        "tfixup", "postln", "preln",
    ]  # fmt: skip
    assert open_study(path, {"arms": [], "overrides": ["a=2"]}, ["preln"]) is None
    assert capsys.readouterr().err == f"{path} holds a study with other settings: use another --out\n"


def test_train_or_replot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trained: list[Path] = []

    def train(args: argparse.Namespace) -> int:
        trained.append(args.out)
        return 0 if args.out.name == "ok" else 7

    def report(out: Path) -> str:
        return f"table of {out.name}"

    ok, failing = (
        argparse.Namespace(out=tmp_path / "ok", replot=False),
        argparse.Namespace(out=tmp_path / "bad", replot=False),
    )
    assert train_or_replot(ok, train, report) == 0 and capsys.readouterr().out == "table of ok\n"
    assert train_or_replot(failing, train, report) == 7 and capsys.readouterr().out == ""
    replot = argparse.Namespace(out=tmp_path / "ok", replot=True)
    assert train_or_replot(replot, train, report) == 2 and trained == [tmp_path / "ok", tmp_path / "bad"]
    assert "study.json not found; run the study first" in capsys.readouterr().err
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "study.json").write_text("{}")
    assert train_or_replot(replot, train, report) == 0 and len(trained) == 2
    assert capsys.readouterr().out == "table of ok\n"


def test_a_full_disk_during_a_study_is_one_line_naming_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A failure of the machine in a study's own process (here ENOSPC raised by its train step) is one line and exit 1;
    a bug keeps its traceback. No model: precision and device do not apply."""
    monkeypatch.setattr(sys, "argv", ["scripts/studies/converged_study.py"])
    full = tmp_path / "study" / "study.json"

    def no_space(args: argparse.Namespace) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(full))

    args = argparse.Namespace(out=tmp_path / "study", replot=False)
    with pytest.raises(SystemExit) as stopped:
        train_or_replot(args, no_space, str)
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (
        f"converged_study.py: no space left on device writing {full}: free space there, or point --out at another "
        "disk\n"
    )
    with pytest.raises(KeyError):
        train_or_replot(args, lambda args: {}["bug"], str)


def test_the_study_record_is_written_whole_or_left_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """study.json holds a long study's wall time: a full disk (ENOSPC at fsync, raised by a stand-in) keeps the old
    record instead of cutting it short."""
    path = tmp_path / "study.json"
    save_study(path, {"wall_seconds": 3600.0})

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left on device"):
        save_study(path, {"wall_seconds": 7200.0})
    assert json.loads(path.read_text()) == {"wall_seconds": 3600.0}
    assert [p.name for p in tmp_path.iterdir()] == ["study.json"]


def test_running_mean_uses_what_exists_at_the_start() -> None:
    assert running_mean([4.0, 2.0, 6.0, 0.0], 2) == [4.0, 3.0, 4.0, 3.0]
    assert running_mean([1.0, 2.0, 3.0], 10) == [1.0, 1.5, 2.0]
    assert running_mean([], 3) == []


STOPPED_STUDY = """
import json, os, signal, sys, time
from pathlib import Path
from tfx.studies.harness import run_recorded

def work():
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGTERM)  # as a study stopped from outside
    time.sleep(5)
    return 0, 0

sys.exit(run_recorded(Path(sys.argv[1]), {"wall_seconds": 1.0}, work))
"""


def test_a_study_stopped_by_sigterm_records_its_wall_time(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    done = subprocess.run([sys.executable, "-c", STOPPED_STUDY, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and "re-run the same command to finish" in done.stderr
    assert 1.25 < json.loads(path.read_text())["wall_seconds"] < 5.0  # 1.0 before, plus this invocation's 0.3 s
