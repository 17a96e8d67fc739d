"""The soak script's short version: three random SIGKILL/SIGTERM/SIGINT interruptions of a tiny toy run, each
relaunched by the identical command, end bit for bit where the uninterrupted run ends (CPU, fp32, one thread)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# fp32 pinned (the soak's command line): CI runs it in its first pass only (docs/testing.md)
pytestmark = pytest.mark.fixed_precision

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.long
def test_three_interruptions_end_identical_to_the_uninterrupted_run(tmp_path: Path) -> None:
    script = REPO / "scripts" / "audit" / "preemption_soak.py"
    cmd = [sys.executable, str(script), str(tmp_path), "--interruptions", "3", "--max-updates", "120", "--seed", "2"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "identical to the uninterrupted run" in done.stdout
    assert done.stdout.count("interruption ") == 3
