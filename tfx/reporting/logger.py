"""TensorBoard logging under ``<run>/tb``: scalars, images, the custom-scalars layout, translations, hparams.

Only rank 0 creates a writer; on other ranks every call is a no-op, so the loop
never branches on rank to log.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
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
        """An (H, W, 3) uint8 picture (the per-layer heatmaps of ``tfx.reporting.dashboard``)."""
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
        self, params: Mapping[str, float | int | str | bool], metrics: Mapping[str, str], shown: Collection[str] = ()
    ) -> None:
        """Write the HParams-tab entry into this run's own event file (not a sub-run).

        ``metrics``: scalar tags the run already logs -> their column names; TensorBoard shows each tag's last
        value, so no extra single-point scalar is written (it would be an empty chart on the Time Series page).
        ``shown``: the columns the table displays before anyone ticks a box (at most five; see ``_label``).
        """
        if self.writer is None:
            return
        # TensorBoard prints every number with five significant digits (2 layers as "2.0000"): integers go as text
        shown_params = {k: str(v) if type(v) is int else v for k, v in params.items()}
        experiment, session_start, session_end = hparams(shown_params, dict.fromkeys(metrics, 0.0))
        _label(experiment, set(shown), metrics)
        file_writer = self.writer._get_file_writer()  # public API writes hparams to a sub-run
        for summary in (experiment, session_start, session_end):
            file_writer.add_summary(summary)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _label(experiment: Any, shown: set[str], metric_names: Mapping[str, str]) -> None:
    """Mark ``shown`` columns of an HParams experiment summary as ``differs`` and name the metric columns, in place.

    TensorBoard's table displays the first five columns after sorting those that differ between runs
    first, then by name; it computes ``differs`` only when no run wrote an experiment summary, and we
    write one (it fixes the metric columns). So without this the five are simply the first by name
    (d_model, data, decoder_layers, ...), and ``method`` stays hidden. Short metric names keep the columns
    on screen (a tag such as ``valid/best_bleu`` was cut off).
    """
    for value in experiment.value:
        data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
        for info in data.experiment.hparam_infos:
            info.differs = info.name in shown
        for metric in data.experiment.metric_infos:
            metric.display_name = metric_names.get(metric.name.tag, metric.name.tag)
        value.metadata.plugin_data.content = data.SerializeToString()


@dataclass(frozen=True)
class Budget:
    """How far a run goes, for the progress line: max_updates, max_epochs and max_minutes (as training seconds);
    None where no limit is set."""

    updates: int | None = None
    epochs: int | None = None
    seconds: float | None = None


SETTLE_UPDATES = 5  # updates before a rate is shown: the first ones carry start-up costs (allocation, compile)


class Progress:
    """A tqdm bar on a terminal (log lines print above it); a plain log line every ``every`` updates when output
    is redirected (tqdm redraws with carriage returns, which turn a redirected log into hundreds of fragments).

    Both say the same: update of total, loss in bits per token, lr, epoch, and once the rate has settled, updates
    per training second and the training time left (validation time excluded: it is what the budget counts).
    """

    def __init__(self, enabled: bool, budget: Budget, initial: int, every: int) -> None:
        self.enabled, self.budget, self.every = enabled, budget, max(every, 1)
        self._initial = initial
        self._settled: tuple[int, float] | None = None  # (step, train seconds) where the rate starts counting
        self.total = (
            budget.updates
        )  # the update the run ends at, as far as known (max_epochs: once an epoch is planned)
        self.bar = None

    @contextlib.contextmanager
    def shown(self) -> Iterator[None]:
        """The bar for the loop's duration (on a terminal), with log records printed above it instead of being
        glued to its end."""
        if not (self.enabled and sys.stdout.isatty() and sys.stderr.isatty()):
            yield
            return
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.bar = tqdm(total=self.total, initial=self._initial, desc="train", mininterval=1.0,
                        dynamic_ncols=True, bar_format=_bar_format(self.total is not None))  # fmt: skip
        try:
            with logging_redirect_tqdm(tqdm_class=tqdm):
                yield
        finally:
            self.bar.close()
            self.bar = None

    def epoch_planned(self, step: int, epoch: int, updates_per_epoch: int) -> None:
        """With max_epochs, the total follows from the epoch's size (packed epochs may differ by a batch or two)."""
        if self.budget.epochs:
            by_epochs = step + (self.budget.epochs - epoch + 1) * updates_per_epoch
            self.total = min(by_epochs, self.budget.updates or by_epochs)

    def update(self, step: int, epoch: int, metrics: Mapping[str, float], train_seconds: float) -> None:
        if self._settled is None and step - self._initial >= SETTLE_UPDATES:
            self._settled = (step, train_seconds)
        text = self.status(step, epoch, metrics, train_seconds)
        if self.bar is not None:
            total = self._time_bound_total(step, train_seconds) or self.total  # a time budget may end it sooner
            if total is not None and total != self.bar.total:
                self.bar.total, self.bar.bar_format = total, _bar_format(bounded=True)
            self.bar.update(1)
            self.bar.set_postfix_str(text, refresh=False)
        elif self.enabled and step % self.every == 0:
            of = f"/{self.total}" if self.total else ""
            log.info("update %d%s | %s", step, of, text)

    def status(self, step: int, epoch: int, metrics: Mapping[str, float], train_seconds: float) -> str:
        """``loss 4.123 bits/tok | lr 5.00e-04 | epoch 2 | 1.92 upd/s | 12:31 left``."""
        parts = [f"loss {metrics['train/loss']:.3f} bits/tok", f"lr {metrics['train/lr']:.2e}", f"epoch {epoch}"]
        rate = self.rate(step, train_seconds)
        if rate is not None:
            parts.append(f"{rate:.2f} upd/s")
        left = self.seconds_left(step, train_seconds, rate)
        if left is not None:
            parts.append(f"{_clock(left)} left")
        return " | ".join(parts)

    def rate(self, step: int, train_seconds: float) -> float | None:
        """Updates per training second since the rate settled; None before."""
        if self._settled is None or step <= self._settled[0] or train_seconds <= self._settled[1]:
            return None
        return (step - self._settled[0]) / (train_seconds - self._settled[1])

    def _time_bound_total(self, step: int, train_seconds: float) -> int | None:
        """The update the time budget will end at, at the current rate, when that comes before the update limit."""
        rate = self.rate(step, train_seconds)
        if not (self.budget.seconds and rate):
            return None
        estimate = step + round(rate * max(self.budget.seconds - train_seconds, 0.0))
        return estimate if self.total is None or estimate < self.total else None

    def seconds_left(self, step: int, train_seconds: float, rate: float | None) -> float | None:
        """Training seconds to the nearest limit: the time budget, or the updates left at the current rate."""
        lefts = []
        if self.budget.seconds:
            lefts.append(self.budget.seconds - train_seconds)
        if self.total and rate:
            lefts.append((self.total - step) / rate)
        return max(min(lefts), 0.0) if lefts else None


def _bar_format(bounded: bool) -> str:
    """tqdm's line without its own rate (ours settles first): with a total, the bar and ``n/total``."""
    counts = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}" if bounded else "{n_fmt}"
    return "{desc} " + counts + " updates [{elapsed} wall{postfix}]"


def _clock(seconds: float) -> str:
    """``1:02:03`` or ``12:31``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
