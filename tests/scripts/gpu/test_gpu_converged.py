"""scripts/gpu/gpu_converged.sh on CPU (--cpu-dry-run, a tiny model on 400 Multi30k sentences, fp32): both studies
start, are stopped at the end of the box, and the report and the records without checkpoints come back."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu" / "gpu_converged.sh"


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.fixed_precision
def test_a_box_that_ends_stops_both_studies_and_returns_their_reports_and_records(shared_data: Path,
                                                                                 tmp_path: Path) -> None:  # fmt: skip
    out, studies = tmp_path / "out", tmp_path / "studies"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "T_STUDY": "25", "STUDY_DIR": str(studies),
           "DATA_DIR": str(shared_data / "multi30k")}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", str(out)], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    report = (out / "report.md").read_text()
    assert proc.returncode == 1, proc.stderr[-2000:] + report  # stopped by the box: the same command resumes
    assert "box of 25 s ended: stopping the studies" in proc.stderr
    for depth, layers in (("3", "3+3"), ("12", "2+2")):  # the deeper table runs tiny (2+2) in a dry run
        # this depth's section alone: the rest of the report is the other study's, whose runs validate on their own
        # clock (CI, 2026-12-07: converged_12's Post-LN had validated, converged_3's had not)
        section = report.split(f"## converged_{depth}\n")[1].split("\n## converged_")[0]
        assert f"# Converged comparison: Multi30k de-en, {layers} layers" in section
        assert "tuned elsewhere, a grid of one setting: tfixup lr0.0005_d0.3_w0, postln lr0.001_d0.1_w400" in section
        table = section.split("Finalists (seed 1")[0]  # the arms' table, before the finalists'
        # "- ARM_SETTING/seedN: CURVE [STATUS]": a tuned arm's row is there once a run has a validation (once it
        # trains), not once its seeds end. A run listed with an empty curve has not validated yet (a loaded CPU).
        listed = [line for line in section.splitlines() if line.startswith("- ")]
        validated = [line for line in listed if not line.split(": ", 1)[1].lstrip().startswith("[")]
        for arm in {line[2:].split("_lr")[0] for line in validated}:
            assert f"| {arm} | " in table
        with tarfile.open(out / f"converged_{depth}.tar.gz") as tar:
            names = tar.getnames()
        assert "./study.json" in names and "./converged_study.md" in names
        assert any(n.endswith("metrics.jsonl") for n in names)
        assert not any(n.endswith(".pt") for n in names)  # records, not checkpoints
        assert any(p.suffix == ".pt" for p in (studies / f"converged_{depth}").rglob("*.pt"))  # kept to resume
    # none ended. On a loaded CPU the 25 s box can end while both studies are still in their grid (CI, 2026-12-07:
    # no converged run had started), so the list may be empty; the checkpoints above are what the stop kept.
    runs = [line for line in report.splitlines() if line.startswith("- ")]
    assert all(line.endswith(("[...]", "[stopped by SIGTERM]")) for line in runs), report
    assert not any(p.name.startswith("replot_") for p in out.iterdir())


def test_without_a_gpu_or_an_out_dir_it_says_so_in_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    """The arguments and the CUDA check of scripts/gpu/device_prelude.sh, which gpu_check.sh shares (CPU only)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the script would start the studies")
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert (usage.returncode, usage.stderr) == (2, "usage: gpu_converged.sh [--cpu-dry-run] OUT_DIR\n")
    no_gpu = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert no_gpu.returncode == 1
    assert no_gpu.stderr == ("error: no CUDA device here; run scripts/gpu/gpu_converged.sh --cpu-dry-run OUT_DIR to "
                             "check the script on CPU\n")  # fmt: skip
    assert not (tmp_path / "out" / "report.md").exists()


def _start_mps(tmp_path: Path, daemon_starts: bool, client_works: bool | None) -> tuple[subprocess.CompletedProcess,
                                                                                      str]:  # fmt: skip
    """device_prelude.sh's start_mps with a fake nvidia-cuda-mps-control (and, unless None, a fake Python client):
    (the shell's result, what the fake daemon was told)."""
    bin_dir, told = tmp_path / "bin", tmp_path / "told.txt"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(f"""#!/usr/bin/env bash
if [[ "${{1:-}}" == -d ]]; then echo daemon >> {told}; exit {0 if daemon_starts else 1}; fi
while read -r line; do echo "${{line}}" >> {told}; [[ "${{line}}" == get_server_list ]] && echo 4242; done
""")  # fmt: skip
    fake.chmod(0o755)
    python = "python"  # the real one: on a machine without CUDA its client check fails
    if client_works is not None:
        python = str(bin_dir / "fake_python")
        Path(python).write_text(f"#!/usr/bin/env bash\nexit {0 if client_works else 1}\n")
        Path(python).chmod(0o755)
    pipe = "${CUDA_MPS_PIPE_DIRECTORY:-unset}"
    script = (f"source scripts/gpu/device_prelude.sh --cpu-dry-run {tmp_path / 'out'}; start_mps {tmp_path / 'mps'}; "
              f'echo "rc=$? pipe={pipe}"; stop_mps; echo "after={pipe}"')  # fmt: skip
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": python}
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, env=env, timeout=180)
    return proc, told.read_text() if told.exists() else ""


def test_mps_that_does_not_start_is_stopped_and_left_off_in_one_line(tmp_path: Path) -> None:
    """A daemon that fails to start, or a CUDA client that fails under it: one line, the daemon told to quit, no MPS
    variables left for the training processes (they time-slice the GPU). Shell logic only: CPU, fake daemon."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the real Python client would succeed")
    for daemon_starts, why in ((False, "the daemon did not start"), (True, "a CUDA client failed under it")):
        proc, told = _start_mps(tmp_path / why.replace(" ", "_"), daemon_starts, client_works=None)
        assert proc.stdout.splitlines() == ["rc=1 pipe=unset", "after=unset"], proc.stderr
        assert proc.stderr.splitlines() == [f"== MPS: off ({why}; logs in {tmp_path / why.replace(' ', '_')}/mps/log): "
                                            "the processes time-slice the GPU"]  # fmt: skip
        assert told.splitlines()[0] == "daemon" and "quit" in told.splitlines()


def test_mps_that_serves_a_client_stays_on_until_stopped(tmp_path: Path) -> None:
    """The daemon starts and a client runs under it: on, the pipe folder exported for the training processes, the
    server named; stop_mps tells it to quit and unsets the variables (fake daemon and client, CPU)."""
    proc, told = _start_mps(tmp_path, daemon_starts=True, client_works=True)
    assert proc.stdout.splitlines() == [f"rc=0 pipe={tmp_path}/mps/pipe", "after=unset"], proc.stderr
    assert proc.stderr.splitlines() == ["== MPS: on (server 4242 )"]
    assert told.splitlines() == ["daemon", "get_server_list", "quit"]
