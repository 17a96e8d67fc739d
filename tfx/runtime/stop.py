"""A stop request (SIGTERM, SIGINT, or a signal named in ``train.stop_signals``) honoured wherever the run is.

Kubernetes and SLURM send SIGKILL a grace period (30 s by default in Kubernetes) after SIGTERM. The handler
only sets a flag, so the loop stops between updates; a long phase inside an update's due work (validation:
its loss pass and its decode) calls ``check()`` once per batch, which raises ``StopRequested`` and unwinds to
the loop. The loop then saves the state of the last completed update and exits, so the bound is one update
or one validation batch, not one validation (docs/training.md, "Stopping and resuming").

Outside a ``StopSignal`` block (``tfx.translate``, ``tfx.evaluate``, data preparation before the first update)
``check()`` does nothing and the default handlers apply: SIGTERM ends the process at once, and every file
those write is written atomically, so nothing partial is left.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any


class StopRequested(Exception):  # noqa: N818 (a request, not an error)
    """Raised by ``check()`` inside a long phase once a stop signal has arrived."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stop requested by {signal_name}")
        self.signal_name = signal_name


class StopSignal:
    """Within the block, the stop signals set ``received`` (their name) instead of ending the process."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = signals
        self.received: str | None = None
        self._previous: dict[int, Any] = {}
        self._outer: StopSignal | None = None

    def __enter__(self) -> StopSignal:
        global _active
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._outer, _active = _active, self
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        _active = self._outer

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name

    def request(self, name: str) -> None:
        """Ask for a stop as a signal would (tests, and a caller's own stop rule)."""
        self.received = name


_active: StopSignal | None = None  # the innermost StopSignal block, if any


def requested() -> str | None:
    """The name of the stop signal received inside the active block, or None."""
    return _active.received if _active is not None else None


def check() -> None:
    """Raise ``StopRequested`` if a stop signal has arrived; a no-op outside a ``StopSignal`` block."""
    if (name := requested()) is not None:
        raise StopRequested(name)
