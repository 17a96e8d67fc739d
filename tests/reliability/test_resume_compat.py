"""Resuming checks every setting that defines the trajectory; ``train.resume_mode=force`` overrides.

Each compared item has its own case, changed alone, so deleting any one check fails its case.
The base run reads local text files, so the data-files case can point at an identical copy
(same sentencepiece model) and only ``data.local_dir`` differs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from tests.reliability.helpers import tiny_cfg, with_changes
from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.config import Config, DataConfig, TrainConfig
from tfx.data import prepare_data
from tfx.data.sources import toy_split
from tfx.train import train

BASE_UPDATES = 2


def write_corpus(folder: Path, cfg: DataConfig) -> Path:
    folder.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        for lang, lines in zip(("de", "en"), toy_split(cfg, split, seed=1), strict=True):
            (folder / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines))
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path]:
    """A local-files run stopped after BASE_UPDATES updates; tests resume copies of it."""
    root = tmp_path_factory.mktemp("base")
    cfg = tiny_cfg(root, max_updates=BASE_UPDATES, layer_stats_every_updates=0)
    corpus = write_corpus(root / "corpus", cfg.data)
    cfg = with_changes(cfg, data={"source": "local", "name": "toytext", "local_dir": str(corpus)})
    train(cfg, root / "run")
    return cfg, root / "run"


def copy_run(base_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base_run, tmp_path / "run"))


def tamper(run: Path, **entries) -> None:
    """Rewrite checkpoint_last.pt with some entries replaced (what another version or run would have saved)."""
    path = run / "checkpoints" / "checkpoint_last.pt"
    ckpt = load_checkpoint(path)
    ckpt.update(entries)
    torch.save(ckpt, path)


def resume_error(cfg: Config, run: Path) -> str:
    cfg = with_changes(cfg, train={"max_updates": BASE_UPDATES + 2})
    with pytest.raises(CheckpointError) as info:
        train(cfg, run)
    message = str(info.value)
    assert "\n" not in message and "train.resume_mode=force" in message
    return message


CONFIG_CHANGES = {
    "model": ({"model": {"ffn_dim": 32}}, "model.ffn_dim (64 -> 32)"),
    "betas": ({"optim": {"betas": (0.9, 0.99)}}, "optim.betas ((0.9, 0.98) -> (0.9, 0.99))"),
    "eps": ({"optim": {"eps": 1e-6}}, "optim.eps (1e-08 -> 1e-06)"),
    "weight_decay": ({"optim": {"weight_decay": 0.0}}, "optim.weight_decay (0.0001 -> 0.0)"),
    "max_tokens": ({"data": {"max_tokens": 200}}, "data.max_tokens (300 -> 200)"),
    "update_freq": ({"train": {"update_freq": 2}}, "train.update_freq (1 -> 2)"),
    "seed": ({"train": {"seed": 2}}, "train.seed (1 -> 2)"),
}


@pytest.mark.parametrize("change", CONFIG_CHANGES, ids=str)
def test_a_changed_setting_is_refused_naming_it(base, tmp_path: Path, change: str) -> None:
    cfg, base_run = base
    sections, expected = CONFIG_CHANGES[change]
    message = resume_error(with_changes(cfg, **sections), copy_run(base_run, tmp_path))
    assert expected in message, message


def test_other_data_files_are_refused(base, tmp_path: Path) -> None:
    """An identical copy of the corpus elsewhere: the sentencepiece model is the same, the files are not."""
    cfg, base_run = base
    other = shutil.copytree(cfg.data.local_dir, tmp_path / "other_corpus")
    message = resume_error(with_changes(cfg, data={"local_dir": str(other)}), copy_run(base_run, tmp_path))
    assert "data.local_dir" in message and "sentencepiece" not in message, message


def test_another_sentencepiece_model_of_the_same_size_is_refused(base, tmp_path: Path) -> None:
    cfg, base_run = base
    run = copy_run(base_run, tmp_path)
    ours = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")
    toy = with_changes(cfg, data={"source": "toy", "cache_dir": str(tmp_path / "cache")}).data
    other = prepare_data(toy, seed=7, splits=("valid",)).tokenizer  # another corpus, the same vocabulary size
    assert other.vocab_size == ours["vocab_size"] and other.model_bytes != ours["spm_model"]
    tamper(run, spm_model=other.model_bytes)
    message = resume_error(cfg, run)
    assert "sentencepiece model" in message and "vocab size" not in message, message


@pytest.mark.parametrize(
    ("entries", "expected"),
    [({"vocab_size": 65}, "vocab size (65 ->"), ({"world_size": 2}, "world size (2 -> 1)"),
     ({"optimizer_name": "SGD"}, "optimizer ('SGD' -> 'AdamW')")],
    ids=["vocab_size", "world_size", "optimizer_name"],
)  # fmt: skip
def test_a_checkpoint_from_another_setup_is_refused(base, tmp_path: Path, entries: dict, expected: str) -> None:
    cfg, base_run = base
    run = copy_run(base_run, tmp_path)
    tamper(run, **entries)
    assert expected in resume_error(cfg, run)


def test_force_resumes_logs_the_changes_and_applies_the_new_optimizer_settings(
    base, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, base_run = base
    run = copy_run(base_run, tmp_path)
    new = {"betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.0}
    cfg = with_changes(cfg, optim=new, train={"max_updates": BASE_UPDATES + 2, "resume_mode": "force"})
    with caplog.at_level(logging.WARNING, logger="tfx.train"):
        summary = train(cfg, run)
    assert summary["step"] == BASE_UPDATES + 2
    assert "resume_mode=force" in caplog.text and "optim.eps (1e-08 -> 1e-06)" in caplog.text
    groups = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")["optimizer"]["param_groups"]
    assert all(tuple(g["betas"]) == (0.8, 0.9) and g["eps"] == 1e-6 and g["weight_decay"] == 0.0 for g in groups)


def test_resume_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="train.resume_mode"):
        TrainConfig(resume_mode="sometimes")
