"""Checkpoint loads: the resume state a weights-only copy drops, one-line errors for foreign files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tfx.checkpoint import CheckpointError, load_checkpoint, weights_only_payload


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
