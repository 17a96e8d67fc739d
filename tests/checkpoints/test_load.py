"""Checkpoint loads: the resume state a weights-only copy drops, one-line errors for foreign files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tfx.checkpoints.load import CheckpointError, load_checkpoint, weights_only_payload


def test_weights_only_payload_drops_exactly_the_resume_state() -> None:
    payload = {"model": {}, "config": {}, "step": 3, "optimizer": {}, "rng": {}, "train_state": {}, "metrics": {}}
    payload["scaler"] = {"scale": 8192.0}
    assert set(weights_only_payload(payload)) == {"model", "config", "step", "metrics"}


def test_missing_or_foreign_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"weights": torch.ones(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a tfx checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


class NotATensor:
    """A pickled object a weights-only load refuses (a file from elsewhere renamed .pt)."""


def test_an_unreadable_checkpoint_says_why_in_a_few_words_not_torchs_advice(tmp_path: Path) -> None:
    """torch.load's weights-only refusal is a paragraph of advice with terminal colours; the first 160 characters
    of it ended mid-word ("Re-running `torch.)"). The error keeps the file and the reason, in one line."""
    foreign, image = tmp_path / "foreign.pt", tmp_path / "picture.pt"
    torch.save({"model": NotATensor(), "config": {}}, foreign)
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    for path, why in [
        (foreign, f"it holds a {__name__}.NotATensor object, which a weights-only load refuses"),
        (image, "not a pickle of tensors that a weights-only load reads"),
    ]:
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        message = str(info.value)
        assert message == f"checkpoint {path} is unreadable ({why}): it is truncated, corrupt or not a checkpoint"
