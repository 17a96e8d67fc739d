"""``<run>/metrics.jsonl``: each update's train metrics, each validation and how the run ended, a JSON object a line.

TensorBoard keeps scalars every ``train.log_every_updates`` and needs its event parser to read them back;
this file is the run's own plain record, for scripts (``scripts/studies/depth_study.py``) and users alike:

    {"event": "update", "step": 1, "epoch": 1, "train/loss": 8.1, "train/lr": 0.0005, ...}
    {"event": "valid", "step": 200, "valid/loss": 3.2, "valid/bleu": 41.0, ...}
    {"event": "end", "step": 200, "status": "completed", "train_seconds": 95.1}

``status`` is ``completed``, ``diverged`` (stopped on non-finite steps) or ``stopped by SIGTERM``/``SIGINT``.
A non-finite value is written as JSON's extension ``NaN``/``Infinity`` (Python's ``json`` reads it). Each
record is one ``write`` of a whole line, flushed, so a killed run leaves at most one partial last line,
which ``read_metrics`` skips. On resume from update S the file is rewritten (atomically) to the records of
updates <= S without their ``end``: it then describes exactly the trajectory the checkpoint continues.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfx.checkpoints.load import CheckpointError
from tfx.files.atomic import atomic_open

FILENAME = "metrics.jsonl"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file, in order; a truncated last line (a killed writer) is skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class MetricsLog:
    """Rank 0's ``metrics.jsonl`` writer; with ``run_dir=None`` (other ranks) every call is a no-op."""

    def __init__(self, run_dir: Path | None, resumed_step: int) -> None:
        self.path = run_dir / FILENAME if run_dir is not None else None
        self._file = None
        if self.path is None:
            return
        keep = []
        if self.path.is_file():
            keep = [r for r in read_metrics(self.path) if r.get("step", 0) <= resumed_step and r["event"] != "end"]
        try:
            with atomic_open(self.path, "w") as f:
                f.write("".join(_line(r) for r in keep))
            self._file = self.path.open("a")
        except OSError as e:
            raise CheckpointError(f"cannot write {self.path}: {e.strerror}; check the run folder") from e

    def write(self, event: str, step: int, values: Mapping[str, Any]) -> None:
        """Append one record; per-layer statistics (``layers/*``) stay in TensorBoard."""
        if self._file is None:
            return
        record = {"event": event, "step": step, **{k: v for k, v in values.items() if not k.startswith("layers/")}}
        try:
            self._file.write(_line(record))
            self._file.flush()
        except OSError as e:
            raise CheckpointError(f"cannot write {self.path}: {e.strerror}") from e

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _line(record: Mapping[str, Any]) -> str:
    return json.dumps(record) + "\n"
