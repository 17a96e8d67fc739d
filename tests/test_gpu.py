"""The CUDA path: bf16 and fp16 steps, resume equal to an uninterrupted run, translate, 1-GPU torchrun.

Marked ``gpu``: skipped without CUDA (tests/conftest.py), run with ``pytest -m gpu`` or
``scripts/gpu/gpu_check.sh``. ``TFX_GPU_TEST_DEVICE=cpu`` runs the same tests on CPU, which checks the
tests themselves on a machine without a GPU (fp16 autocast and GradScaler exist on CPU too).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tfx.training.step as step_mod
from tests.conftest import GPU_TEST_DEVICE, REPO
from tests.test_train import TINY_OVERRIDES, tiny_cfg
from tfx.checkpoints.load import build_from_checkpoint, load_checkpoint
from tfx.data import prepare_data
from tfx.evaluation.decode import translate_sentences
from tfx.train import train

pytestmark = pytest.mark.gpu
DEVICE = GPU_TEST_DEVICE


def _falls(losses: list[float]) -> bool:
    return all(math.isfinite(x) for x in losses) and sum(losses[-4:]) < sum(losses[:4])


def test_bf16_training(tmp_path: Path) -> None:
    summary = train(tiny_cfg(tmp_path, device=DEVICE, precision="bf16", max_updates=20), tmp_path / "run")
    assert summary["step"] == 20 and _falls(summary["losses"])


def test_fp16_training_with_loss_scaling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two injected overflows are skipped (scale 65536 -> 16384), not counted as divergence; the run still learns."""
    real, calls = step_mod.label_smoothed_loss, [0]

    def overflow_twice(*args, **kwargs):
        calls[0] += 1
        loss, nll = real(*args, **kwargs)
        return (loss * 1e6 if calls[0] <= 2 else loss), nll  # finite in fp32, inf once fp16 gradients

    monkeypatch.setattr(step_mod, "label_smoothed_loss", overflow_twice)
    cfg = tiny_cfg(tmp_path, device=DEVICE, precision="fp16", max_updates=20, max_bad_steps=1)
    summary = train(cfg, tmp_path / "run")
    assert summary["step"] == 20 and _falls(summary["losses"][2:])
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    state = ckpt["train_state"]
    assert state["overflow_steps"] >= 2 and state["skipped_steps"] == 0  # >= : the device may overflow on its own
    assert ckpt["scaler"]["scale"] == 2.0 ** (16 - state["overflow_steps"])  # halved once per overflow


def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    """Dropout on, bf16: the resumed run continues the same loss curve (GPU kernels may differ in the last bits)."""
    cfg = lambda n: tiny_cfg(tmp_path, device=DEVICE, precision="bf16", max_updates=n)  # noqa: E731
    full = train(cfg(16), tmp_path / "a")["losses"]
    first = train(cfg(9), tmp_path / "b")["losses"]
    second = train(cfg(16), tmp_path / "b")["losses"]
    assert len(first) == 9 and len(second) == 7
    assert first + second == pytest.approx(full, rel=1e-3)


def test_deterministic_runs_repeat_bitwise_on_the_device(tmp_path: Path) -> None:
    """train.deterministic=true on the device, bf16, dropout on, with validation: no op on tfx's path lacks a
    deterministic kernel (strict mode would raise), and two runs give the same losses to the last bit."""
    try:
        runs = [train(tiny_cfg(tmp_path, device=DEVICE, precision="bf16", max_updates=16, validate_every_updates=8,
                               deterministic=True), tmp_path / name)["losses"] for name in ("a", "b")]  # fmt: skip
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True
    assert len(runs[0]) == 16 and runs[0] == runs[1]


def test_checkpoint_translates_on_the_device(tmp_path: Path) -> None:
    """A checkpoint written by a run on the device -> ``python -m tfx.translate --device`` = in-process CPU decoding."""
    cfg = tiny_cfg(tmp_path, device=DEVICE, max_updates=30)
    train(cfg, tmp_path / "run")
    ckpt_path = tmp_path / "run" / "checkpoints" / "checkpoint_last.pt"
    sources = prepare_data(cfg.data, seed=cfg.train.seed).splits["valid"].src_text[:8]
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "tfx.translate", str(ckpt_path), "--input", str(tmp_path / "in.txt"),
           "--output", str(tmp_path / "out.txt"), "--device", DEVICE, "--beam", "2", "--quiet"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    on_device = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    model, tokenizer, _ = build_from_checkpoint(load_checkpoint(ckpt_path))
    on_cpu = translate_sentences(model, tokenizer, sources, beam=2)
    assert len(on_device) == len(sources) and any(on_device)
    assert sum(a == b for a, b in zip(on_device, on_cpu, strict=True)) >= len(sources) - 1  # a near-tie may flip


def test_one_device_torchrun(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "tfx.train",
           f"hydra.run.dir={run_dir}", f"data.cache_dir={tmp_path / 'cache'}", f"train.device={DEVICE}",
           "train.max_updates=4", *TINY_OVERRIDES]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ckpt = load_checkpoint(run_dir / "checkpoints" / "checkpoint_last.pt")
    assert ckpt["step"] == 4 and torch.isfinite(ckpt["model"]["encoder.embedding.embed.weight"]).all()


@pytest.mark.parametrize("packed", [False, True])
def test_an_update_makes_no_host_sync(packed: bool) -> None:
    """``Stepper.update`` (bf16, fused AdamW, clip) under ``torch.cuda.set_sync_debug_mode("error")``, which
    raises on any call that waits for the GPU; packed batches too. On CPU the same step just runs
    (tests/training/test_step.py guards it there)."""
    import numpy as np

    from tests.conftest import tiny_model
    from tests.model.test_packing import random_split
    from tfx.config import OptimConfig
    from tfx.data import collate
    from tfx.data.packing import collate_packed, pack_first_fit
    from tfx.optim.optimizers import build_optimizer
    from tfx.runtime.precision import Precision
    from tfx.training.step import Stepper, read

    device = torch.device(DEVICE)
    split = random_split(16)
    if packed:
        batches = [collate_packed(split, pack_first_fit(np.arange(16), split, 24, 24), 8, 24, 24)]
    else:
        batches = [collate(split, list(range(16)))]
    batches = [b.pin_memory() if device.type == "cuda" else b for b in batches]
    model = tiny_model(dropout=0.1).to(device)
    opt = OptimConfig(clip_norm=1.0)
    stepper = Stepper(model, model, build_optimizer(model, opt, device), Precision("bf16", device), opt, device, 1)
    stepper.update(batches, lr=1e-3)  # first: allocations, lazy CUDA init
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("error")
    try:
        pending = [stepper.update(batches, lr=1e-3) for _ in range(3)]
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert all(r["applied"] == 1.0 and math.isfinite(r["loss"]) for r in read(pending))
