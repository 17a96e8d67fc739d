"""The trainer on CPU: loss falls, resume is exact, SIGTERM keeps work, DDP matches, TensorBoard has the tags."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import tfx.train as train_mod
from tfx.checkpoint import CheckpointError, load_checkpoint
from tfx.config import Config, DataConfig, InitConfig, ModelConfig, OptimConfig, TrainConfig
from tfx.data import make_batches, prepare_data
from tfx.train import TrainingDiverged, train

REPO = Path(__file__).resolve().parents[1]


def tiny_cfg(
    tmp_path: Path,
    data_kw: dict[str, Any] | None = None,
    model_kw: dict[str, Any] | None = None,
    optim_kw: dict[str, Any] | None = None,
    init: str = "tfixup",
    **train_kw: Any,
) -> Config:
    """A 2+2-layer d32 T-Fixup run on the toy task; ``*_kw`` override single fields of each section."""
    data = DataConfig(**{
        "source": "toy", "name": "toy", "toy_train_size": 400, "toy_valid_size": 16, "toy_test_size": 16,
        "vocab_size": 64, "cache_dir": str(tmp_path / "cache"), "max_tokens": 300, **(data_kw or {}),
    })  # fmt: skip
    model = ModelConfig(**{
        "encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "ffn_dim": 64, "heads": 4,
        "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "max_positions": 64,
        **(model_kw or {}),
    })  # fmt: skip
    train_cfg = TrainConfig(
        device="cpu", max_updates=12, progress=False, log_every_updates=2, layer_stats_every_updates=4,
        save_every_epochs=0, validate_every_updates=0, valid_max_sentences=8, threads=1,
    )  # fmt: skip
    train_cfg = dataclasses.replace(train_cfg, **train_kw)
    optim = OptimConfig(**{"lr": 2e-3, **(optim_kw or {})})
    return Config(experiment="test", data=data, model=model, init=InitConfig(init), optim=optim, train=train_cfg)


def test_tiny_run_trains_and_checkpoints(tmp_path: Path) -> None:
    summary = train(tiny_cfg(tmp_path, max_updates=40, save_every_updates=20), tmp_path / "run")
    losses = summary["losses"]
    assert len(losses) == 40 and summary["step"] == 40
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    ckpts = tmp_path / "run" / "checkpoints"
    last = load_checkpoint(ckpts / "checkpoint_last.pt")  # weights_only
    assert last["step"] == 40 and last["vocab_size"] > 0 and isinstance(last["spm_model"], bytes)
    assert {"optimizer", "rng", "train_state"} <= last.keys()
    # Best and numbered checkpoints are for evaluation: the weights, without Adam's moments.
    numbered = sorted(ckpts.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    assert [p.stem.rsplit("_", 1)[1] for p in numbered] == ["20", "40"]
    for name in ("checkpoint_best.pt", numbered[0].name, numbered[1].name):
        weights = load_checkpoint(ckpts / name)
        assert not {"optimizer", "rng", "train_state"} & weights.keys(), name
        assert weights["spm_model"] == last["spm_model"] and weights["config"] == last["config"]
    assert torch.equal(load_checkpoint(numbered[1])["model"]["encoder.embedding.embed.weight"],
                       last["model"]["encoder.embedding.embed.weight"])  # fmt: skip
    # Adam's moments are 2/3 of the last checkpoint's tensors (the rest is the sentencepiece model).
    assert numbered[1].stat().st_size < 0.7 * (ckpts / "checkpoint_last.pt").stat().st_size


@pytest.mark.parametrize("method", ["deepnorm", "admin"])
def test_method_trains_a_few_updates(tmp_path: Path, method: str) -> None:
    """DeepNorm and Admin at 3+3 layers through the trainer (Admin profiles its first batch): loss falls."""
    cfg = tiny_cfg(
        tmp_path, model_kw={"norm": method, "encoder_layers": 3, "decoder_layers": 3},
        optim_kw={"warmup_updates": 4}, init=method, max_updates=16,
    )  # fmt: skip
    losses = train(cfg, tmp_path / "run")["losses"]
    assert len(losses) == 16 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-4:]) / 4 < 0.9 * sum(losses[:4]) / 4


def test_resuming_from_a_weights_only_checkpoint_is_refused(tmp_path: Path) -> None:
    train(tiny_cfg(tmp_path, max_updates=4), tmp_path / "run")
    best = tmp_path / "run" / "checkpoints" / "checkpoint_best.pt"
    with pytest.raises(CheckpointError, match="holds weights only.*checkpoint_last.pt"):
        train(tiny_cfg(tmp_path, max_updates=8, resume=str(best)), tmp_path / "other")


def test_training_resumes_train_mode_after_each_validation(tmp_path: Path) -> None:
    """Validation runs in eval mode; every update, including those after a validation, runs with dropout on."""
    modes: list[bool] = []

    def record(trainer, metrics) -> None:  # runs right after each update, before that update's validation
        modes.append(all(m.training for m in trainer.model.modules()))

    train(tiny_cfg(tmp_path, max_updates=6, validate_every_updates=2), tmp_path / "run", on_update=record)
    assert modes == [True] * 6


def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    full = train(tiny_cfg(tmp_path, max_updates=24), tmp_path / "a")["losses"]
    first = train(tiny_cfg(tmp_path, max_updates=13), tmp_path / "b")["losses"]
    second = train(tiny_cfg(tmp_path, max_updates=24), tmp_path / "b")["losses"]
    assert len(first) == 13 and len(second) == 11
    assert first + second == full  # exact, not approximately


def test_tensorboard_tags(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tiny_cfg(tmp_path, max_updates=8), tmp_path / "run")
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {"train/loss", "train/nll_loss", "train/ppl", "train/lr", "train/grad_norm", "train/tokens_per_s",
                "valid/loss", "valid/bleu", "layers/enc/act_rms/000", "layers/dec/grad_norm/001"}  # fmt: skip
    assert expected <= tags, expected - tags
    assert "valid/samples/text_summary" in acc.Tags()["tensors"]
    assert all(v.value > 0 for v in acc.Scalars("layers/dec/grad_norm/001"))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])  # under fp16 a NaN loss is divergence, not an overflow
def test_non_finite_steps_are_skipped_then_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    real = train_mod.label_smoothed_loss

    def poisoned(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        return loss * float("nan"), nll

    monkeypatch.setattr(train_mod, "label_smoothed_loss", poisoned)
    with pytest.raises(TrainingDiverged, match="3 consecutive non-finite steps at update 0"):
        train(tiny_cfg(tmp_path, precision=precision, max_bad_steps=3), tmp_path / "run")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_two_ranks(rank: int, port: int) -> None:
    """The environment torchrun gives rank ``rank`` of 2 on this host (gloo on CPU)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )


def _ddp_worker(rank: int, cfg: Config, run_dir: str, port: int, out: str) -> None:
    join_two_ranks(rank, port)
    summary = train(cfg, Path(run_dir))
    torch.save(summary["losses"], f"{out}.{rank}")


@pytest.mark.slow
def test_two_process_gloo_ddp_matches_single_process(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, max_updates=6, layer_stats_every_updates=0)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.0))
    train_split = prepare_data(cfg.data, seed=1).splits["train"]
    assert len(make_batches(train_split, cfg.data.max_tokens, shuffle=True, seed=1, epoch=1)) % 2 == 0
    single_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, update_freq=2))
    single = train(single_cfg, tmp_path / "single")["losses"]
    out = str(tmp_path / "ddp_losses")
    mp.spawn(_ddp_worker, args=(cfg, str(tmp_path / "ddp"), free_port(), out), nprocs=2, join=True)
    ddp = torch.load(f"{out}.0")
    assert ddp == pytest.approx(single, rel=1e-4)
    assert torch.load(f"{out}.1") == pytest.approx(ddp, rel=1e-6)  # every rank sees the global loss


TINY_OVERRIDES = [
    "model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=32", "model.ffn_dim=64",
    "data.toy_train_size=400", "data.toy_valid_size=16", "train.valid_max_sentences=8", "train.progress=false",
    "train.threads=1", "data.max_tokens=512",
]  # fmt: skip


@pytest.mark.slow
def test_sigterm_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tfx.train", f"hydra.run.dir={run_dir}", f"data.cache_dir={tmp_path / 'cache'}",
           "train.max_updates=1000000", "train.validate_every_updates=0", *TINY_OVERRIDES]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not list((run_dir / "tb").glob("events.*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    time.sleep(3.0)  # well inside the training loop
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert "stopped by SIGTERM" in output
    ckpt = load_checkpoint(run_dir / "checkpoints" / "checkpoint_last.pt")
    assert ckpt["step"] > 0 and ckpt["train_state"]["step"] == ckpt["step"]


@pytest.mark.slow
def test_cli_rejects_bad_config_with_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tfx.train", f"hydra.run.dir={tmp_path}", "model.norm=post"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "init.name=tfixup needs model.norm=none" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_iwslt_experiment_runs_on_local_files_in_hub_format(tmp_path: Path) -> None:
    """The real `+experiment=iwslt` path (datasets parquet loader, nested `translation` rows), offline."""
    from tests.data.helpers import PAIRS, write_hub_parquet

    files = {split: write_hub_parquet(tmp_path / f"{split}.parquet", PAIRS * n, nested=True)
             for split, n in (("train", 40), ("valid", 2), ("test", 2))}  # fmt: skip
    data_files = "{" + ",".join(f"{split}:{path}" for split, path in files.items()) + "}"
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tfx.train", "+experiment=iwslt", f"data.hub_data_files={data_files}",
           f"hydra.run.dir={run_dir}", f"data.cache_dir={tmp_path / 'cache'}", "train.max_updates=3",
           "train.valid_beam=2", *TINY_OVERRIDES]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ckpt = load_checkpoint(run_dir / "checkpoints" / "checkpoint_last.pt")
    assert ckpt["step"] == 3 and ckpt["config"]["experiment"] == "iwslt"
    assert ckpt["config"]["model"]["norm"] == "none" and ckpt["config"]["init"]["name"] == "tfixup"


@pytest.mark.slow
def test_multirun_sweep_makes_self_describing_folders(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tfx.train", "-m", "model.encoder_layers=1,2", "train.max_updates=2",
           f"hydra.sweep.dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}", *TINY_OVERRIDES[1:]]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "checkpoints" / "checkpoint_last.pt").exists())
    assert len(runs) == 2
    for n, name in zip((1, 2), runs, strict=True):
        assert f",model.encoder_layers={n}," in name and "train.max_updates=2" in name
