"""tfx/reporting/metrics_log.py: a JSON record a line, a partial last line skipped, resume keeps the
continued trajectory."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tfx.checkpoints.load import CheckpointError
from tfx.reporting.metrics_log import FILENAME, MetricsLog, read_metrics


def test_records_round_trip_without_layer_stats(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, resumed_step=0)
    log.write("update", 1, {"train/loss": 8.5, "layers/enc/act_rms/000": 1.0})
    log.write("skipped", 1, {"train/loss": math.nan})
    log.write("end", 1, {"status": "completed"})
    log.close()
    records = read_metrics(tmp_path / FILENAME)
    assert records[0] == {"event": "update", "step": 1, "train/loss": 8.5}  # per-layer stats stay in TensorBoard
    assert math.isnan(records[1]["train/loss"]) and records[2]["status"] == "completed"


def test_a_partial_last_line_is_skipped(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_text('{"event": "update", "step": 1}\n{"event": "upd')
    assert read_metrics(tmp_path / FILENAME) == [{"event": "update", "step": 1}]


def test_resume_keeps_the_records_the_checkpoint_continues(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, resumed_step=0)
    for step in (1, 2, 3):
        log.write("update", step, {})
    log.write("valid", 2, {})
    log.write("end", 3, {"status": "stopped by SIGTERM"})
    log.close()
    (tmp_path / FILENAME).write_text((tmp_path / FILENAME).read_text() + '{"event": "up')  # killed mid-line
    log = MetricsLog(tmp_path, resumed_step=2)  # the checkpoint holds update 2: 3 is redone, the end is not one
    log.write("update", 3, {"x": 1})
    log.close()
    events = [(r["event"], r["step"]) for r in read_metrics(tmp_path / FILENAME)]
    assert events == [("update", 1), ("update", 2), ("valid", 2), ("update", 3)]
    assert not list(tmp_path.glob(".*.tmp"))
    MetricsLog(tmp_path, resumed_step=0).close()  # a fresh run in the folder starts a fresh file
    assert read_metrics(tmp_path / FILENAME) == []


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    log = MetricsLog(None, resumed_step=0)
    log.write("update", 1, {"train/loss": 1.0})
    log.close()
    assert not list(tmp_path.iterdir())


def test_an_unwritable_folder_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / FILENAME).mkdir()  # os.replace cannot put a file there
    with pytest.raises(CheckpointError, match=f"cannot write .*{FILENAME}"):
        MetricsLog(tmp_path, resumed_step=0)
