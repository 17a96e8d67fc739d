"""The loop's smaller promises: one checkpoint_last.pt write per update, numbered epoch checkpoints
named after the epoch that finished, no progress bar in redirected output, Multi30k from the hub."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest

import tfx.data.sources as sources
from tests.reliability.helpers import tiny_cfg, with_changes
from tests.reliability.test_resume_compat import write_corpus
from tests.test_config import load
from tfx.checkpoints.load import load_checkpoint
from tfx.data import DataError, prepare_data
from tfx.evaluation.run_splits import data_config
from tfx.train import train


def test_save_and_validation_on_one_update_write_checkpoint_last_once(tmp_path: Path, monkeypatch) -> None:
    writes: list[str] = []
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        writes.append(Path(dst).name)
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    train(tiny_cfg(tmp_path, max_updates=4, save_every_updates=2, validate_every_updates=2), tmp_path / "run")
    assert writes.count("checkpoint_last.pt") == 2  # updates 2 and 4, each written once


def test_a_final_validation_after_the_last_save_still_reaches_checkpoint_last(tmp_path: Path) -> None:
    """Writing once per update must not skip a write that records a new best BLEU (resume compares against it)."""
    summary = train(tiny_cfg(tmp_path, max_updates=4, save_every_updates=4), tmp_path / "run")
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    assert last["train_state"]["best_bleu"] == summary["best_bleu"] >= 0


def test_numbered_epoch_checkpoints_carry_the_epoch_that_finished(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, max_updates=0, max_epochs=2, save_every_epochs=1, layer_stats_every_updates=0)
    cfg = with_changes(cfg, data={"toy_train_size": 60})
    summary = train(cfg, tmp_path / "run")
    numbered = sorted((tmp_path / "run" / "checkpoints").glob("checkpoint_*_*.pt"))
    epochs = sorted(int(p.stem.split("_")[1]) for p in numbered)
    assert epochs == [1, 2] and summary["epoch"] == 3  # the state points at the next epoch, the names do not


def test_redirected_output_gets_progress_lines_not_a_bar(tmp_path: Path, capsys, caplog) -> None:
    cfg = tiny_cfg(tmp_path, max_updates=4, progress=True, log_every_updates=2)
    with caplog.at_level(logging.INFO, logger="tfx.train"):
        train(cfg, tmp_path / "run")
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err
    assert "update 2/4 | loss " in caplog.text and " bits/tok | lr " in caplog.text and "update 4/4" in caplog.text


@pytest.mark.parametrize("name", ["multi30k", "multi30k_postln"])
def test_multi30k_experiments_default_to_the_hub(name: str) -> None:
    data = load([f"+experiment={name}"]).data
    assert data.source == "hub" and data.hub_name == "bentrevett/multi30k" and data.local_dir is None


def test_multi30k_offline_says_how_to_use_local_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "hub_reachable", lambda timeout: False)
    data = dataclasses.replace(load(["+experiment=multi30k"]).data, hub_cache_dir=str(tmp_path / "hf"))
    with pytest.raises(DataError, match=r"cannot reach the Hugging Face hub for bentrevett/multi30k.*local_dir=DIR"):
        prepare_data(data, splits=("valid",))


def test_multi30k_reads_data_local_dir_instead_of_the_hub(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "hub_sides", lambda *a: pytest.fail("the hub was asked"))
    corpus = write_corpus(tmp_path / "corpus", tiny_cfg(tmp_path).data)
    overrides = ["+experiment=multi30k", f"data.local_dir={corpus}", f"data.cache_dir={tmp_path}", "data.vocab_size=64"]
    prepared = prepare_data(load(overrides).data, splits=("train", "valid"))
    assert prepared.splits["valid"].src_text == (corpus / "valid.de").read_text().splitlines()


def test_a_hub_run_trained_on_local_files_evaluates_with_data_dir(tmp_path: Path) -> None:
    """The checkpoint records what was read (source=local), so tfx.evaluate --data-dir accepts the run."""
    corpus = write_corpus(tmp_path / "corpus", tiny_cfg(tmp_path).data)
    data = load(["+experiment=multi30k", f"data.local_dir={corpus}"]).data
    assert data.source == "local"
    moved = data_config({"data": dataclasses.asdict(data)}, tmp_path / "moved")
    assert moved.source == "local" and moved.local_dir == str(tmp_path / "moved")
