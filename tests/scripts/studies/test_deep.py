"""200+200 layers on CPU: T-Fixup updates stay finite and lower the loss; checkpointing changes nothing numerically."""

from __future__ import annotations

import math
import os
import subprocess
from types import ModuleType

import pytest
import torch

from tests.conftest import REPO, load_script
from tfx.checkpoints.load import load_checkpoint
from tfx.config import OptimConfig
from tfx.init import apply_init
from tfx.model import ModelConfig, Transformer
from tfx.optim.loss import label_smoothed_loss
from tfx.optim.optimizers import build_optimizer, lr_at, set_lr

VOCAB, PAD, DEPTH = 50, 0, 200


def deep_model(checkpoint: bool, d: int = 16) -> Transformer:
    """The deep experiment's shape (200+200, norm none, T-Fixup) at a tiny width, dropout off."""
    model = Transformer(
        ModelConfig(
            encoder_layers=DEPTH,
            decoder_layers=DEPTH,
            d_model=d,
            ffn_dim=2 * d,
            heads=4,
            norm="none",
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            checkpoint_activations=checkpoint,
        ),
        VOCAB,
        PAD,
    )
    apply_init(model, "tfixup", seed=1)
    return model


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, prev_output_tokens, target): 4 sentences of 8 ids, no padding."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (4, 8), generator=g)
    target = torch.randint(4, VOCAB, (4, 8), generator=g)
    prev = torch.cat([torch.full((4, 1), 2), target[:, :-1]], dim=1)  # BOS-shifted, as collate does
    return src, prev, target


def loss_per_token(model: Transformer, batch: tuple[torch.Tensor, ...], eps: float) -> torch.Tensor:
    src, prev, target = batch
    loss, _ = label_smoothed_loss(model(src, prev), target, eps, PAD)
    return loss / target.numel()


@pytest.mark.slow
def test_200_layers_ten_tfixup_updates_finite_and_falling() -> None:
    """The real loss, optimizer and no-warmup schedule (lr 5e-4), checkpointing on as in +experiment=deep."""
    torch.manual_seed(0)
    model = deep_model(checkpoint=True)
    cfg = OptimConfig()  # T-Fixup reference: Adam(0.9, 0.98), lr 5e-4, no warmup
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    batch = fixed_batch()
    losses = []
    for step in range(10):
        set_lr(optimizer, lr_at(step, cfg))
        loss = loss_per_token(model, batch, cfg.label_smoothing)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        assert torch.isfinite(grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses  # every update helps
    assert losses[-1] < losses[0] - 0.1, losses


def test_checkpointing_gives_the_same_loss_and_gradients_at_200_layers() -> None:
    batch = fixed_batch()
    grads = []
    for checkpoint in (False, True):
        model = deep_model(checkpoint, d=8)
        loss = loss_per_token(model, batch, 0.1)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_off, grads_off), (loss_on, grads_on) = grads
    torch.testing.assert_close(loss_on, loss_off)
    for g_on, g_off in zip(grads_on, grads_off, strict=True):
        torch.testing.assert_close(g_on, g_off)


@pytest.fixture(scope="module")
def deep_memory() -> ModuleType:
    return load_script("studies/deep_memory")


def test_deep_memory_measures_and_tabulates(deep_memory: ModuleType) -> None:
    """One in-process measurement (the script runs each in a fresh process; RSS here is only a smoke check)."""
    args = deep_memory.parse_args(
        ["--measure", "--layers", "3", "--d-model", "16", "--vocab", "60", "--sentences", "2", "--length", "5",
         "--device", "cpu", "--checkpoint"]
    )  # fmt: skip
    row = deep_memory.measure(args)
    assert row["layers"] == 3 and row["checkpoint"] is True
    assert row["peak_mb"] >= row["built_mb"] > 0 and row["params_mb"] > 0 and row["s_per_step"] > 0
    table = deep_memory.memory_table([row]).splitlines()
    assert table[0].startswith("| layers/side | ckpt |") and table[2].startswith("| 3 | on |")


@pytest.mark.slow
def test_deep_check_script_trains_the_deep_experiment(tmp_path) -> None:
    """``scripts/gpu/deep_check.sh`` at a tiny width on CPU: the real ``+experiment=deep`` run, 3 updates."""
    env = {**os.environ, "DEVICE": "cpu", "D_MODEL": "16", "UPDATES": "3", "MAX_TOKENS": "64", "MEMORY": "0",
           "THREADS": "1"}  # fmt: skip
    script = REPO / "scripts" / "gpu" / "deep_check.sh"
    result = subprocess.run(["bash", str(script), "out"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "deep run:" in result.stdout
    ckpt = load_checkpoint(tmp_path / "out" / "deep" / "checkpoints" / "checkpoint_last.pt")
    model_cfg = ckpt["config"]["model"]
    assert ckpt["step"] == 3 and ckpt["config"]["experiment"] == "deep" and ckpt["config"]["init"]["name"] == "tfixup"
    assert (model_cfg["encoder_layers"], model_cfg["decoder_layers"], model_cfg["d_model"]) == (200, 200, 16)
    assert model_cfg["norm"] == "none" and model_cfg["checkpoint_activations"] is True
    assert list((tmp_path / "out" / "deep" / "tb").glob("events.out.tfevents.*"))


def test_deep_check_script_needs_an_output_folder() -> None:
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "deep_check.sh")], capture_output=True, text=True)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_memory_script_missing_device_is_one_line(deep_memory: ModuleType) -> None:
    with pytest.raises(SystemExit, match=r"error: --device=tpu: no such device on this machine"):
        deep_memory.main(["--device", "tpu"])
