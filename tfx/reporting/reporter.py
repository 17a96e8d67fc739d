"""Where the loop's numbers go: ``metrics.jsonl``, TensorBoard and the log, so the loop says *what*, not *how*.

- every update (and skipped step) -> one ``metrics.jsonl`` record (``tfx.reporting.metrics_log``; no per-layer values);
- every ``train.log_every_updates`` -> TensorBoard scalars, with the tokens/s of the window since the last;
- per-layer statistics (``layers/*``, every ``train.layer_stats_every_updates``) -> one heatmap image per
  stack and statistic (``tfx.reporting.dashboard``), not one scalar per layer;
- validations -> scalars, a ``valid`` record, sample translations and a log line; the end -> HParams.

Only rank 0 writes (``run_dir=None`` elsewhere): the sinks are no-ops on the other ranks.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tfx.checkpoints.numbered import window_checkpoints
from tfx.config import Config
from tfx.evaluation.validate import ValidResult
from tfx.reporting.dashboard import HPARAMS_METRICS, HPARAMS_SHOWN, LAYOUT, LayerHistory, hparams, split_layer_stats
from tfx.reporting.logger import RunLogger
from tfx.reporting.metrics_log import MetricsLog

if TYPE_CHECKING:
    import torch

    from tfx.checkpoints.train_state import TrainState

log = logging.getLogger("tfx.train")
EVAL_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "eval_bleu.sh"  # in a checkout, not in a wheel
AVERAGED = 5  # numbered checkpoints the summary's evaluation command averages (the README's --avg 5)


class Reporter:
    """Rank 0's TensorBoard writer, metrics file and throughput window, behind one call per event."""

    def __init__(self, run_dir: Path | None, resumed_step: int, log_every_updates: int) -> None:
        self.tb = RunLogger(run_dir)
        try:
            self.jsonl = MetricsLog(run_dir, resumed_step)
        except BaseException:  # an unwritable run folder: still close the event file
            self.tb.close()
            raise
        self.layers = LayerHistory()
        self.precision: str | None = None  # what train.precision resolved to (``start``): an HParams column
        self.log_every_updates = log_every_updates
        self.tb.layout(LAYOUT)
        self.restart_window()

    def restart_window(self) -> None:
        """Start a new throughput window (after validation: its time is not training throughput)."""
        self._window = (0.0, time.perf_counter())  # tokens and start time

    def start(
        self, run_dir: Path, cfg: Config, n_params: int, device: torch.device, precision: str, world_size: int
    ) -> None:
        """The run's first log line: where, what, how big, on what."""
        self.precision = precision
        log.info(
            "run folder %s | %s | %.2fM params | device %s %s | %d rank(s)",
            run_dir, describe(cfg), n_params / 1e6, device, precision, world_size,
        )  # fmt: skip

    def update(self, event: str, step: int, epoch: int, metrics: dict[str, float]) -> None:
        """``metrics.jsonl``'s record of one update (``event="update"``) or non-finite step (``"skipped"``)."""
        self.jsonl.write(event, step, {"epoch": epoch, **metrics})

    def scalars(self, step: int, epoch: int, metrics: dict[str, float], force: bool) -> None:
        """TensorBoard every ``log_every_updates`` (and whenever layer stats came), with tokens/s.

        ``train/tokens_per_s`` is added to ``metrics`` itself, as the loop always did.
        """
        tokens, start = self._window
        tokens += metrics["train/ntokens"]
        self._window = (tokens, start)
        if step % self.log_every_updates == 0 or force:
            metrics["train/tokens_per_s"] = tokens / max(time.perf_counter() - start, 1e-9)
            self.restart_window()
            per_layer, scalars = split_layer_stats(metrics)
            self.tb.scalars({**scalars, "train/epoch": epoch}, step)
            if per_layer and self.tb.enabled:  # rank 0 alone draws
                self.layers.add(step, per_layer)
                for tag, rgb in self.layers.images().items():
                    self.tb.image(tag, rgb, step)

    def valid(self, step: int, result: ValidResult, best_bleu: float, train_minutes: float) -> None:
        """A validation's scalars, its ``metrics.jsonl`` record, sample translations and log line."""
        metrics = {**result.metrics, "valid/best_bleu": best_bleu, "valid/train_minutes": train_minutes}
        self.tb.scalars(metrics, step)
        self.jsonl.write("valid", step, metrics)
        self.tb.translations("valid/samples", result.samples, step)
        log.info(
            "validation at update %d (%.1f train min): loss %.3f bits/tok | BLEU %.2f (best %.2f) | %s",
            step, train_minutes, result.metrics["valid/loss"], result.bleu, best_bleu, result.signature,
        )  # fmt: skip

    def stopped(self, signal: str, step: int, last: Path, command: str | None = None) -> None:
        """The stop's one line, from rank 0 alone (it is the one that wrote ``last``): how to go on."""
        if self.jsonl.path is None:  # not rank 0
            return
        again = f"run the same command to resume: {command}" if command else "train into the same folder to resume"
        log.warning("stopped by %s at update %d; wrote %s; %s", signal, step, last, again)

    def end(self, step: int, status: str, train_seconds: float) -> None:
        """``metrics.jsonl``'s last record: completed, early stop, diverged or stopped by a signal."""
        self.jsonl.write("end", step, {"status": status, "train_seconds": train_seconds})
        if status.startswith("early stop"):
            log.info("%s at update %d", status, step)

    def final(self, cfg: Config) -> None:
        """The HParams-tab row of this run."""
        self.tb.hparams(hparams(cfg, self.precision), HPARAMS_METRICS, HPARAMS_SHOWN)

    def summary(self, state: TrainState, epochs: float, wall_seconds: float, ckpt_dir: Path, status: str) -> None:
        """The run's last lines: how far it went, its best checkpoint, and the commands that evaluate and use it."""
        if self.jsonl.path is None:  # not rank 0
            return
        run_dir = ckpt_dir.parent
        log.info(
            "done (%s): %d updates, %.2f epochs, %.1f train min, %.1f min wall", status, state.step, epochs,
            state.train_seconds / 60, wall_seconds / 60,
        )  # fmt: skip
        if state.best_bleu < 0:
            log.info("no validation ran: checkpoints in %s", _shown(ckpt_dir))
            return
        best = ckpt_dir / "checkpoint_best.pt"
        at = f" at update {state.best_step}" if state.best_step >= 0 else ""  # (resumed from a checkpoint without it)
        log.info("best valid BLEU %.2f%s: %s", state.best_bleu, at, _shown(best))
        # the README's --avg 5 once there are 5 epochs to average; a shorter run's average takes in its first epochs,
        # far from where it ended (a 5-minute Multi30k run: 20.67 test BLEU averaged, 26.97 best), so its best
        averaged = len(window_checkpoints(ckpt_dir)) >= AVERAGED  # the near-duplicate final save counts once
        evaluate = _shown(EVAL_SCRIPT) if EVAL_SCRIPT.is_file() else "python -m tfx.evaluate"  # a checkout, or a wheel
        log.info("test BLEU:  %s %s%s --beam 5", evaluate, _shown(run_dir), f" --avg {AVERAGED}" if averaged else "")
        log.info("translate:  python -m tfx.translate %s --input FILE --beam 5", _shown(best))
        top = Path(_shown(run_dir)).parts[0] if not Path(_shown(run_dir)).is_absolute() else str(run_dir.parent)
        log.info("curves:     tensorboard --logdir %s, then http://localhost:6006/#custom_scalars", top)

    def close(self) -> None:
        self.tb.close()  # also when training diverged: flush what TensorBoard has
        self.jsonl.close()


def _shown(path: Path) -> str:
    """``path`` as typed from the current folder: relative below it, absolute elsewhere."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def describe(cfg: Config) -> str:
    """``experiment | 6+6 layers d512 norm=none init=tfixup``: the run in one phrase."""
    m = cfg.model
    layers = f"{m.encoder_layers}+{m.decoder_layers} layers d{m.d_model}"
    return f"{cfg.experiment} | {layers} norm={m.norm} init={cfg.init.name}"
