"""TensorBoard logging under ``<run>/tb``: scalars, images, the custom-scalars layout, translations, hparams.

Only rank 0 creates a writer; on other ranks every call is a no-op, so the loop
never branches on rank to log.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

log = logging.getLogger("tfx.train")


class RunLogger:
    def __init__(self, run_dir: Path | None) -> None:
        self.writer = SummaryWriter(str(run_dir / "tb")) if run_dir is not None else None

    @property
    def enabled(self) -> bool:
        """False on ranks other than 0: callers can skip work whose only use is a picture."""
        return self.writer is not None

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def image(self, tag: str, rgb: np.ndarray, step: int) -> None:
        """An (H, W, 3) uint8 picture (the per-layer heatmaps of ``tfx.dashboard``)."""
        if self.writer is not None:
            self.writer.add_image(tag, rgb, step, dataformats="HWC")

    def layout(self, layout: dict[str, dict[str, list[Any]]]) -> None:
        """The Custom Scalars tab: ``{category: {chart: ["Multiline", [tag regex, ...]]}}``, in order."""
        if self.writer is not None:
            self.writer.add_custom_scalars(layout)

    def translations(self, tag: str, rows: list[tuple[str, str, str]], step: int) -> None:
        """A markdown table of (source, reference, hypothesis) rows."""
        if self.writer is None or not rows:
            return
        lines = ["| source | reference | hypothesis |", "|---|---|---|"]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
        self.writer.add_text(tag, "\n".join(lines), step)

    def hparams(
        self, params: Mapping[str, float | int | str | bool], metrics: Mapping[str, float], shown: Collection[str] = ()
    ) -> None:
        """Write the HParams-tab entry into this run's own event file (not a sub-run).

        ``shown``: the columns the table displays before anyone ticks a box (at most five; see ``_show``).
        """
        if self.writer is None:
            return
        experiment, session_start, session_end = hparams(dict(params), dict(metrics))
        _show(experiment, set(shown))
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


def _show(experiment: Any, shown: set[str]) -> None:
    """Mark ``shown`` columns of an HParams experiment summary as ``differs``, in place.

    TensorBoard's table displays the first five columns after sorting those that differ between runs
    first, then by name; it computes ``differs`` only when no run wrote an experiment summary, and we
    write one (it fixes the metric columns). So without this the five are simply the first by name
    (d_model, data, decoder_layers, ...), and ``method`` stays hidden.
    """
    for value in experiment.value:
        data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
        for info in data.experiment.hparam_infos:
            info.differs = info.name in shown
        value.metadata.plugin_data.content = data.SerializeToString()


class Progress:
    """A tqdm bar on a terminal; a plain log line every ``every`` updates when output is redirected.

    tqdm redraws with carriage returns, which turn a redirected log into hundreds of fragments.
    """

    def __init__(self, enabled: bool, total: int | None, initial: int, every: int) -> None:
        self.enabled, self.total, self.every = enabled, total, max(every, 1)
        self.bar = None
        if enabled and sys.stdout.isatty() and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="upd", mininterval=1.0, dynamic_ncols=True)

    def update(self, step: int, epoch: int, metrics: Mapping[str, float]) -> None:
        loss, lr = metrics["train/loss"], metrics["train/lr"]
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", ep=epoch)
        elif self.enabled and step % self.every == 0:
            of = f"/{self.total}" if self.total else ""
            log.info("update %d%s | epoch %d | loss %.3f | lr %.2e", step, of, epoch, loss, lr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
