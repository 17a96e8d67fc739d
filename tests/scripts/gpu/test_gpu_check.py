"""scripts/gpu/gpu_check.sh: every step at tiny sizes on CPU (--cpu-dry-run), so the GPU run is known to work."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu" / "gpu_check.sh"
STEPS = ("throughput_4k", "throughput_32k", "deep_bench", "deep_width_fp32", "deep_memory", "gpu_tests", "decode")


@pytest.mark.slow
@pytest.mark.long
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
    sections = [line for line in lines if line.startswith("## ")]  # in the order they ran, the 4096-token one first
    assert [s.split(" ")[1] for s in sections] == ["1.", "2.", "3.", "4.", "5.", "6.", "7.", "Every"]
    assert sections[0].startswith("## 1. Throughput, iwslt sizes, packed 256-token batches: compile on/off")
    assert "| off | 0.0 |" in report and "| on | 0.0 |" in report  # throughput: compile off and on
    assert "| matmul |" in report  # the profile
    assert "packed batches (synthetic, lengths [8]; rows x src/tgt: 32x8/8; compile would be static)" in report
    peer = report.split("| tfx / peer |")[1].splitlines()  # the torch peer's table: compile on, then off
    assert peer[2].startswith("| on |") and peer[3].startswith("| off |")
    assert "torch peer (scripts/bench/torch_peer.py, fp32) on the same batches" in report  # tfx's precision
    assert "rows x src/tgt: 128x8/8" in report  # the bigger batches (32k tokens on a GPU)
    assert "deep: 2+2 layers" in report  # +experiment=deep's bench row
    assert "| 2 | off |" in report and "| 2 | on |" in report  # memory: checkpointing off and on
    assert "| adam_3e-5 | 1 |" in report  # deep at width: the deep recipe's table
    assert "beam 1, device cpu" in report and "beam 5, device cpu" in report  # decoding: greedy and beam 5
    deep = report.split("## 3.")[1].split("## 4.")[0]
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


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_a_run_stopped_after_its_first_step_has_that_step_in_the_report(tmp_path: Path) -> None:
    """A GPU window cut short (the device's command limit kills the script) still returns what ran: the dry run is
    killed, whole process group, as soon as the second step starts; report.md then holds the header and the first
    step's section (the 4096-token throughput: its status row and the bench's rows), and nothing of later steps."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:
        cmd = ["bash", str(SCRIPT), "--cpu-dry-run", str(tmp_path / "out")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while "== throughput_32k" not in stderr.read_text() and proc.poll() is None:
                assert time.monotonic() < deadline, stderr.read_text()
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("# tfx GPU check (CPU dry run")
    assert "## 1. Throughput, iwslt sizes, packed 256-token batches" in report
    assert "| throughput_4k | ok |" in report and "| on | 0.0 |" in report and "| off | 0.0 |" in report
    assert "| tfx / peer |" in report  # the peer's rows too
    assert "## 2." not in report and "throughput_32k" not in report and "## Every step" not in report


def test_usage() -> None:
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_cuda_it_says_to_dry_run(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--cpu-dry-run" in proc.stderr
