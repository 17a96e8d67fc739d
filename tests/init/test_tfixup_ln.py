"""T-Fixup with LayerNorm kept (init.name=tfixup_ln; methods tfixup_postln and tfixup_preln; T-Fixup#7).

fp32 on CPU. The weights are compared exactly (rtol 0, atol 0) with ``tfixup``'s on the LayerNorm-free model of the
same shape and seed. The toy runs: the toy task, 2+2 layers at d 32, 30 updates on one CPU thread (seconds each)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import tiny_model
from tfx.config import Config, compose_config
from tfx.init import apply_init, init_tfixup_ln
from tfx.optim.optimizers import lr_at
from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.train import train

METHODS = {"tfixup_postln": "post", "tfixup_preln": "pre"}  # method -> the residual kind it keeps


def layer_norm_keys(model: nn.Module) -> set[str]:
    return {f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, nn.LayerNorm) for p in ("weight", "bias")}


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize(("n_enc", "n_dec", "kw"), [(3, 4, {"share_decoder_embeddings": False}),
                                                    (2, 2, {"share_all_embeddings": True})])  # fmt: skip
def test_every_shared_parameter_is_tfixups_and_every_layer_norm_starts_at_one_and_zero(
    norm: str, n_enc: int, n_dec: int, kw: dict[str, bool]
) -> None:
    """Unequal depths (encoder and decoder factors differ) and untied, then all-shared, embeddings. The LayerNorms
    are disturbed first, so the scheme must set them itself."""
    reference, model = tiny_model("none", n_enc, n_dec, **kw), tiny_model(norm, n_enc, n_dec, **kw)
    apply_init(reference, "tfixup", seed=5)
    with torch.no_grad():
        for module in (m for m in model.modules() if isinstance(m, nn.LayerNorm)):
            module.weight.fill_(0.5), module.bias.fill_(0.25)
    apply_init(model, "tfixup_ln", seed=5)
    expected, got, norms = reference.state_dict(), model.state_dict(), layer_norm_keys(model)
    final_norms = 2 if norm == "pre" else 0  # Pre-LN ends each stack with one
    assert len(norms) == 2 * (2 * n_enc + 3 * n_dec + final_norms)
    assert set(got) - norms == set(expected)  # the two models share every parameter but the LayerNorms
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)
    for name in norms:
        assert torch.equal(got[name], torch.full_like(got[name], 1.0 if name.endswith("weight") else 0.0)), name


@pytest.mark.parametrize("norm", ["none", "deepnorm", "admin"])
def test_refuses_a_model_without_post_or_pre_layer_norm(norm: str) -> None:
    with pytest.raises(ValueError, match=r"init.name=tfixup_ln needs model.norm=post or pre \(got"):
        apply_init(tiny_model(norm), "tfixup_ln")
    with pytest.raises(ValueError, match="a LayerNorm-free model takes init.name=tfixup"):
        init_tfixup_ln(tiny_model(norm))  # called directly, past apply_init's check


def toy_run(tmp_path: Path, method: str) -> Config:
    """``python -m tfx.train method=METHOD`` on a smaller toy task, fp32 on one CPU thread, every update logged."""
    return compose_config([
        f"method={method}", f"data.cache_dir={tmp_path / 'cache'}", "data.toy_train_size=400", "data.max_tokens=300",
        "data.toy_valid_size=8", "data.toy_test_size=8", "model.d_model=32", "model.ffn_dim=64",
        "train.device=cpu", "train.precision=fp32", "train.threads=1", "train.progress=false",
        "train.max_updates=30", "train.validate_every_updates=0", "train.valid_max_sentences=4",
        "train.save_every_epochs=0", "train.log_every_updates=1",
    ])  # fmt: skip


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_method_composes_and_trains_without_warmup(tmp_path: Path, method: str) -> None:
    """The composed run is T-Fixup's init on the kept LayerNorms with no warmup: update 1 runs at the configured lr
    (a warmup would start near 1e-7), every update at T-Fixup's decay, and the loss is finite and falls."""
    cfg = toy_run(tmp_path, method)
    assert (cfg.model.norm, cfg.init.name, cfg.optim.warmup_updates) == (METHODS[method], "tfixup_ln", 0)
    assert (cfg.method, cfg.warmup_free) == (method, True)
    losses = train(cfg, tmp_path / "run")["losses"]
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    updates = [r for r in read_metrics(tmp_path / "run" / FILENAME) if r["event"] == "update"]
    assert updates[0]["step"] == 1 and updates[0]["train/lr"] == cfg.optim.lr
    assert [r["train/lr"] for r in updates] == pytest.approx([lr_at(r["step"] - 1, cfg.optim) for r in updates])


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_config_refuses_the_method_on_a_model_without_layer_norm(method: str) -> None:
    with pytest.raises(ValueError, match="init.name=tfixup_ln needs model.norm=post or pre"):
        compose_config([f"method={method}", "model.norm=none"])
