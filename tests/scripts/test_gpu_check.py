"""scripts/gpu_check.sh: every step at tiny sizes on CPU (--cpu-dry-run), so the GPU run is known to work."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = ("gpu_tests", "throughput_4k", "throughput_32k", "deep_bench", "deep_width_fp32", "deep_memory", "decode")


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_cpu_dry_run_runs_every_step_and_writes_the_report(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", str(tmp_path / "out")], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    report = (tmp_path / "out" / "report.md").read_text()
    assert proc.returncode == 0, proc.stderr[-2000:] + report
    lines = report.splitlines()
    for step in STEPS:
        assert any(line.startswith(f"| {step} | ok | ") for line in lines), step
    assert "| off | 0.0 |" in report and "| on | 0.0 |" in report  # throughput: compile off and on
    assert "| matmul |" in report  # the profile
    assert "packed batches (synthetic, lengths [8]; rows x src/tgt: 32x8/8; compile would be static)" in report
    peer = report.split("| tfx / peer |")[1].splitlines()  # the torch peer's table: compile off and on
    assert peer[2].startswith("| off |") and peer[3].startswith("| on |")
    assert "rows x src/tgt: 128x8/8" in report  # the bigger batches (32k tokens on a GPU)
    assert "deep: 2+2 layers" in report  # +experiment=deep's bench row
    assert "| 2 | off |" in report and "| 2 | on |" in report  # memory: checkpointing off and on
    assert "| adam_3e-5 | 1 |" in report  # deep at width: the deep recipe's table
    assert "beam 1, device cpu" in report and "beam 5, device cpu" in report  # decoding: greedy and beam 5
    deep = report.split("## 4.")[1].split("## 5.")[0]
    assert "| off |" in deep and "| on |" in deep  # the deep bench compiles too (per layer)
    losses = (tmp_path / "out" / "logs" / "deep_width_fp32_train.log").read_text()
    assert "update 1/2 " in losses and "update 2/2 " in losses  # and its per-update losses, kept


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_a_step_over_its_time_box_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    boxes = ("T_TESTS", "T_BENCH", "T_BENCH_32K", "T_DEEP_BENCH", "T_MEMORY", "T_DEEP", "T_DECODE")
    env = {**os.environ, **dict.fromkeys(boxes, "1"), "DEEP_AT_WIDTH": "0"}  # deep at width: off, as on a GPU
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", str(tmp_path / "out")], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 1
    report = (tmp_path / "out" / "report.md").read_text()
    for step in STEPS:
        if step.startswith("deep_width"):
            assert "| deep_width | skipped (DEEP_AT_WIDTH=1 runs it) |" in report and f"| {step} |" not in report
        else:
            assert f"| {step} | timed out after 1 s |" in report, step


def test_usage() -> None:
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_cuda_it_says_to_dry_run(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--cpu-dry-run" in proc.stderr
