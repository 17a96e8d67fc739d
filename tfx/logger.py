"""TensorBoard logging under ``<run>/tb``: scalars, per-layer stats, sample translations, hparams.

Only rank 0 creates a writer; on other ranks every call is a no-op, so the loop
never branches on rank to log.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams


class RunLogger:
    def __init__(self, run_dir: Path | None) -> None:
        self.writer = SummaryWriter(str(run_dir / "tb")) if run_dir is not None else None

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def translations(self, tag: str, rows: list[tuple[str, str, str]], step: int) -> None:
        """A markdown table of (source, reference, hypothesis) rows."""
        if self.writer is None or not rows:
            return
        lines = ["| source | reference | hypothesis |", "|---|---|---|"]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
        self.writer.add_text(tag, "\n".join(lines), step)

    def hparams(self, params: Mapping[str, float | int | str | bool], metrics: Mapping[str, float]) -> None:
        """Write the HParams-tab entry into this run's own event file (not a sub-run)."""
        if self.writer is None:
            return
        experiment, session_start, session_end = hparams(dict(params), dict(metrics))
        file_writer = self.writer._get_file_writer()  # public API writes hparams to a sub-run
        for summary in (experiment, session_start, session_end):
            file_writer.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
