"""A stop signal inside validation ends it at the next batch, saves the last completed update, and the run resumed
from there ends where the uninterrupted run ends (issue 69).

Real SIGTERMs sent to this process (``os.kill``) from inside validation's loss pass or its decode; the tiny
toy run of ``tests.test_train`` (2+2 layers, d 32), CPU, fp32, one thread: the resumed and the uninterrupted
runs are compared exactly (weights, validation records, checkpoint names).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import tfx.evaluation.decode as decode
import tfx.evaluation.validate as validate
from tests.test_train import REPO, TINY_OVERRIDES, join_two_ranks, rendezvous_ports, tiny_cfg
from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.config import Config
from tfx.runtime import stop
from tfx.train import train

# fp32 pinned (tiny_cfg): CI runs these in its first pass only (docs/testing.md)
pytestmark = pytest.mark.fixed_precision


class SignalInValidation:
    """Sends ``signum`` to this process at the ``at``-th batch of the ``at_validation``-th validation's loss pass
    (``where="loss"``) or decode (``where="decode"``), and counts the batches each pass ran after it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at_validation: int, where: str, signum: int) -> None:
        self.at_validation, self.where, self.signum = at_validation, where, signum
        self.validations, self.sent_at, self.after = 0, None, {"loss": 0, "decode": 0}
        collate, greedy, valid_loss = validate.collate, decode.greedy_decode, validate.valid_loss

        def counting_valid_loss(*args, **kwargs):
            self.validations += 1
            return valid_loss(*args, **kwargs)

        def counting(kind, fn):
            def wrapped(*args, **kwargs):
                if self.sent_at is not None:
                    self.after[kind] += 1
                elif kind == self.where and self.validations == self.at_validation:
                    self.sent_at = time.perf_counter()
                    os.kill(os.getpid(), self.signum)  # handled before the next bytecode: mid-batch
                return fn(*args, **kwargs)

            return wrapped

        monkeypatch.setattr(validate, "valid_loss", counting_valid_loss)
        monkeypatch.setattr(validate, "collate", counting("loss", collate))
        monkeypatch.setattr(decode, "greedy_decode", counting("decode", greedy))


def valid_records(run: Path) -> list[tuple[int, float, float]]:
    """(update, valid loss, valid BLEU) of every validation in the run's metrics.jsonl."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["valid/loss"], r["valid/bleu"]) for r in lines if r["event"] == "valid"]


def outcome(run: Path) -> tuple[dict, list[str], list[tuple[int, float, float]], int]:
    """The run's final weights, checkpoint names, validations and best checkpoint's update."""
    ckpts = run / "checkpoints"
    weights = load_checkpoint(ckpts / "checkpoint_last.pt")["model"]
    names = sorted(p.name for p in ckpts.glob("checkpoint_*.pt"))
    return weights, names, valid_records(run), load_checkpoint(ckpts / "checkpoint_best.pt")["step"]


def assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    (w1, names1, valid1, best1), (w2, names2, valid2, best2) = outcome(resumed), outcome(uninterrupted)
    assert names1 == names2 and valid1 == valid2 and best1 == best2
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=0, atol=0, msg=name)


def run_cfg(tmp_path: Path, **train_kw) -> Config:
    settings = {"max_updates": 0, "save_every_epochs": 1, "keep_last": 10, "valid_max_sentences": 0, **train_kw}
    return tiny_cfg(tmp_path, **settings)


@pytest.mark.parametrize("where", ["loss", "decode"])
def test_sigterm_inside_an_epoch_end_validation_stops_at_the_next_batch_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    cfg = run_cfg(tmp_path, max_epochs=3)
    reference = tmp_path / "uninterrupted"
    train(cfg, reference)
    run = tmp_path / "run"
    signaller = SignalInValidation(monkeypatch, at_validation=2, where=where, signum=signal.SIGTERM)
    summary = train(cfg, run)
    assert summary["stopped_by"] == "SIGTERM" and signaller.sent_at is not None
    assert signaller.after == {"loss": 0, "decode": 0}  # the batch in progress ended it: no other batch ran
    saved = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")
    state = saved["train_state"]
    assert state["epoch"] == 2 and state["validated_step"] < saved["step"]  # epoch 2 finished, not validated
    assert len(valid_records(run)) == 1
    monkeypatch.undo()
    train(cfg, run)  # the same command again
    assert_same_run(run, reference)


def test_sigterm_inside_a_scheduled_validation_is_caught_up_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate_every_updates=5: the validation at update 10 is cut; the resumed run does it (and the save and
    hooks due with it) before its first update, as the uninterrupted run did."""
    cfg = run_cfg(tmp_path, max_updates=14, validate_every_updates=5, save_every_updates=5, save_every_epochs=0)
    reference = tmp_path / "uninterrupted"
    train(cfg, reference)
    run = tmp_path / "run"
    SignalInValidation(monkeypatch, at_validation=2, where="decode", signum=signal.SIGTERM)
    summary = train(cfg, run)
    assert summary["stopped_by"] == "SIGTERM" and summary["step"] == 10
    monkeypatch.undo()
    train(cfg, run)
    assert_same_run(run, reference)


def test_sigint_inside_the_final_validation_is_redone_by_the_relaunch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_updates=7 ends mid-epoch with no epoch-end validation: the final one is cut, the relaunch (budget
    spent) validates update 7 and writes its best checkpoint."""
    cfg = run_cfg(tmp_path, max_updates=7)
    reference = tmp_path / "uninterrupted"
    train(cfg, reference)
    run = tmp_path / "run"
    SignalInValidation(monkeypatch, at_validation=1, where="loss", signum=signal.SIGINT)
    assert train(cfg, run)["stopped_by"] == "SIGINT"
    assert not (run / "checkpoints" / "checkpoint_best.pt").exists()  # no validation finished: no best yet
    monkeypatch.undo()
    train(cfg, run)
    assert_same_run(run, reference)


def test_a_configured_slurm_signal_stops_the_run_like_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = run_cfg(tmp_path, max_epochs=2, stop_signals=["SIGTERM", "SIGUSR1"])
    SignalInValidation(monkeypatch, at_validation=1, where="decode", signum=signal.SIGUSR1)
    assert train(cfg, tmp_path / "run")["stopped_by"] == "SIGUSR1"


def test_check_is_a_no_op_outside_a_stop_block_and_raises_inside_once_a_signal_arrived() -> None:
    stop.check()
    previous = signal.getsignal(signal.SIGTERM)
    with stop.StopSignal() as received:
        stop.check()
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(stop.StopRequested, match="SIGTERM"):
            stop.check()
        assert received.received == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is previous
    stop.check()


def _ddp_stopped_in_validation(rank: int, cfg: Config, run_dir: str, port: int, out: str) -> None:
    """Rank 0 gets SIGTERM inside its first validation, while rank 1 waits for it in a collective."""
    join_two_ranks(rank, port)
    if rank == 0:
        SignalInValidation(pytest.MonkeyPatch(), at_validation=1, where="decode", signum=signal.SIGTERM)
    logging.getLogger("tfx").addHandler(logging.FileHandler(f"{out}.{rank}.log"))
    torch.save(train(cfg, Path(run_dir))["stopped_by"], f"{out}.{rank}")


@pytest.mark.slow
def test_two_ddp_ranks_stop_together_when_rank_0_is_signalled_inside_validation(tmp_path: Path) -> None:
    """gloo, two CPU ranks, fp32: rank 1 waits in the validation's broadcast; both stop, rank 0 alone writes and
    says so (issue 69: every rank logged "stopped by SIGTERM ... wrote checkpoint_last.pt")."""
    cfg = run_cfg(tmp_path, max_epochs=2, layer_stats_every_updates=0)
    out = str(tmp_path / "stopped_by")
    with rendezvous_ports(1) as (port,):
        mp.spawn(_ddp_stopped_in_validation, args=(cfg, str(tmp_path / "ddp"), port, out), nprocs=2, join=True)
    assert torch.load(f"{out}.0") == "SIGTERM" and torch.load(f"{out}.1") == "SIGTERM"
    saved = load_checkpoint(tmp_path / "ddp" / "checkpoints" / "checkpoint_last.pt")
    assert saved["train_state"]["validated_step"] < saved["step"]
    assert "stopped by SIGTERM" in Path(f"{out}.0.log").read_text()
    assert "stopped by" not in Path(f"{out}.1.log").read_text()


def test_a_relaunched_finished_run_reports_the_epochs_it_trained(tmp_path: Path, caplog) -> None:
    """A 5-update run of 32-update epochs trained 0.16 epochs; relaunched, it said "5 updates, 5.00 epochs"."""
    cfg = run_cfg(tmp_path, max_updates=5)
    train(cfg, tmp_path / "run")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tfx"):
        train(cfg, tmp_path / "run")
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done (")]
    assert len(done) == 1 and ": 5 updates, 0.16 epochs," in done[0], done


@pytest.mark.slow
def test_sigterm_during_data_preparation_ends_the_process_at_once_and_the_same_command_then_runs(
    tmp_path: Path,
) -> None:
    """Before the first update there is nothing to save: SIGTERM keeps its default action (the process ends at
    once) and every cache entry is written atomically, so the relaunch finds whole entries or none. The slowest
    preparation CI can afford: a 100k-sentence toy corpus (sentencepiece, then encoding about 2 s a side)."""
    cmd = [sys.executable, "-m", "tfx.train", f"hydra.run.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'c'}",
           "data.toy_train_size=100000", "train.max_updates=1", *TINY_OVERRIDES]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list((tmp_path / "c").glob("spm-*.model")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)  # the sentencepiece model is written: the corpus is being encoded
    proc.send_signal(signal.SIGTERM)
    sent = time.perf_counter()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM and time.perf_counter() - sent < 2.0
    relaunch = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert relaunch.returncode == 0, relaunch.stderr[-2000:]
    assert "does not load" not in relaunch.stdout + relaunch.stderr  # no entry was left damaged to rebuild
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")["step"] == 1


def test_resume_never_refuses_a_folder_that_already_holds_a_run(tmp_path: Path) -> None:
    """train.resume=never would start at update 0 over the folder's checkpoints: refused in one line instead."""
    train(run_cfg(tmp_path, max_updates=2), tmp_path / "run")
    with pytest.raises(CheckpointError, match="train.resume=never, but .* already holds a run"):
        train(run_cfg(tmp_path, max_updates=4, resume="never"), tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")["step"] == 2
