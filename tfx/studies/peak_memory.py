"""``python -m tfx.studies.peak_memory RECORD -- CMD ...``: run CMD, append its peak memory and wall time to RECORD.

``tfx.train`` reports no memory on CPU, and a study's runs share one process tree, so the study cannot ask the
kernel afterwards (``RUSAGE_CHILDREN`` is the largest of all children, not of one run). This wrapper is each
run's parent: ``os.wait4`` gives CMD's own ``ru_maxrss``, the high-water mark of its resident memory (KiB on
Linux). A run resumed from its checkpoint is several sessions, each one JSON line of RECORD; ``sessions``
reads them back. SIGTERM and SIGINT go on to CMD (``tfx.train`` then saves ``checkpoint_last.pt`` and exits),
and the wrapper exits with CMD's status (128 + N for a signal N, as a shell does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from tfx.reporting.metrics_log import read_metrics


def run_measured(record: Path, cmd: Sequence[str]) -> int:
    """Run ``cmd`` to its end, append ``{"max_rss_mb", "wall_seconds", "returncode"}`` to ``record``; its exit code."""
    tic = time.perf_counter()
    proc = subprocess.Popen(list(cmd))

    def forward(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _, status, usage = os.wait4(proc.pid, 0)  # retried by Python when a forwarded signal interrupts it
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here: Popen must not wait for it again
    session = {"max_rss_mb": usage.ru_maxrss / 1024, "wall_seconds": time.perf_counter() - tic, "returncode": code}
    record.parent.mkdir(parents=True, exist_ok=True)
    with record.open("a") as f:
        f.write(json.dumps(session) + "\n")
    return 128 - code if code < 0 else code


def sessions(record: Path) -> list[dict[str, Any]]:
    """The sessions ``record`` holds, in order (none when it does not exist; a torn last line is skipped)."""
    return read_metrics(record) if record.is_file() else []


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m tfx.studies.peak_memory RECORD -- CMD [ARG ...]", file=sys.stderr)
        return 2
    return run_measured(Path(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
