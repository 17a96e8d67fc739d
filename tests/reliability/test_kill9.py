"""kill -9 at random moments of checkpoint writes never leaves an unloadable checkpoint_last.pt,
temp files do not outlive the next start, and the resumed run finishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO

KILLS = 12


@pytest.mark.slow
def test_kill_9_during_checkpoint_writes(tmp_path: Path) -> None:
    harness = "tests.reliability.kill_harness"
    cmd = [sys.executable, "-m", harness, str(tmp_path / "run"), str(tmp_path), str(KILLS), "1"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["kills"]) == KILLS
    steps = [s for s in report["steps"] if s is not None]  # each loaded with weights_only=True in the harness
    assert len(steps) >= KILLS - 1 and steps == sorted(steps)  # progress is never lost
    assert sum(bool(k["temps_after_kill"]) for k in report["kills"]) >= 1  # some kills did land mid-write
    assert all(not k["old_temps_left"] for k in report["kills"])  # each start removed the previous leftovers
    assert report["temps_at_end"] == [] and report["final_step"] == report["resumed_from"] + 3
