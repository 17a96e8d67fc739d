"""A checkpoint written before ``Transformer`` took its ``ModelConfig`` (issue 54) still loads and resumes.

The fixture (``tests/fixtures/old_checkpoints/``, made by ``make_fixtures.py`` there with tfx at b2b46ef)
is a 2+2-layer d16 ReZero run on the toy task after 2 updates, with what that code computed from it:
its logits and greedy translations, and the losses and weights of resuming it to update 4.

fp32 on the CPU. The fixture was made on an AVX2 CPU; another CPU kind's kernels (AVX-512 on an Intel Xeon,
2026-12-07) round a few sums differently: logits within 2.4e-7, the weights after two Adam updates within 6e-6,
the losses equal. So logits are compared to 1e-6 and weights to 5e-5, an order above that and far below any
change of the computation (a wrong scale or a missing parameter moves them by 1e-2 and more).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tfx.checkpoints.load import build_from_checkpoint, load_checkpoint
from tfx.config import Config
from tfx.evaluation.decode import translate_sentences
from tfx.evaluation.translate import load_model
from tfx.train import train

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "old_checkpoints" / "rezero"
LAST = FIXTURE / "checkpoints" / "checkpoint_last.pt"
SENTENCES = ["w1 w2 w3", "w7 w3 w9 w11", "w20 w5"]  # make_fixtures.py's
LOGITS_TOL = {"rtol": 0.0, "atol": 1e-6}  # across CPU kinds (module docstring)
WEIGHTS_TOL = {"rtol": 0.0, "atol": 5e-5}
BATCH = (torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]]), torch.tensor([[2, 10, 11, 12], [2, 13, 14, 0]]))


def expected() -> dict:
    return torch.load(FIXTURE / "expected.pt", weights_only=True)


def saved_config(cache: Path, max_updates: int) -> Config:
    """The run's typed config as the checkpoint recorded it, with its data cached under ``cache``."""
    saved = load_checkpoint(LAST)["config"]
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), saved))
    train_cfg = dataclasses.replace(cfg.train, max_updates=max_updates)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache_dir=str(cache)), train=train_cfg)


def test_an_old_checkpoint_translates_as_the_old_code_did() -> None:
    model, tokenizer, _ = load_model(LAST, torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(model(*BATCH), expected()["logits"], **LOGITS_TOL)
    assert translate_sentences(model, tokenizer, SENTENCES, beam=1) == expected()["translations"]


def test_an_old_config_without_the_kinds_options_rebuilds_the_same_model() -> None:
    """Checkpoints older still have no ``dyt_alpha``/``rezero_shared``: their defaults rebuild the model they had."""
    ckpt = load_checkpoint(LAST)
    for option in ("dyt_alpha", "rezero_shared"):
        del ckpt["config"]["model"][option]
    model, _, _ = build_from_checkpoint(ckpt)
    layer = model.encoder.layers[0]
    assert layer.self_attn_block.resweight is layer.ffn_block.resweight  # rezero_shared's default: one per layer
    assert model.state_dict().keys() == load_checkpoint(LAST)["model"].keys()
    with torch.no_grad():
        torch.testing.assert_close(model(*BATCH), expected()["logits"], **LOGITS_TOL)


def test_an_old_checkpoint_resumes_to_the_old_codes_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "checkpoints", run / "checkpoints")
    summary = train(saved_config(tmp_path / "cache", max_updates=4), run)
    assert summary["step"] == 4 and summary["losses"] == expected()["losses"]
    weights = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")["model"]
    assert weights.keys() == expected()["weights"].keys()
    for name, value in expected()["weights"].items():
        torch.testing.assert_close(weights[name], value, **WEIGHTS_TOL, msg=name)
