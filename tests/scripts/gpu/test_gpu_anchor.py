"""scripts/gpu/gpu_anchor.sh on CPU (--cpu-dry-run: a tiny model on 400 pretokenized Multi30k sentences, fp32): the
first runs start at once, T-Fixup's later seed follows at the lr best on valid, every run is scored on the five
sets, and the same command again resumes what a box stopped and trains nothing that ended."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tfx.studies.anchor_report import HEADER, best_lr

SCRIPT = REPO / "scripts" / "gpu" / "gpu_anchor.sh"
# Fewer runs than the GPU window's 7 + 2 (the same code paths at a third of CI's cost: 146 s for all nine,
# 2026-12-07): Post-LN one seed, T-Fixup's probe at two lrs, then its later seed at the one better on valid.
SUBSET = {"POSTLN_SEEDS": "1", "TFIXUP_LRS": "5e-4 5e-3", "TFIXUP_SEEDS": "2"}
FIRST = ["postln_lr0.005_seed1", "tfixup_lr0.0005_seed1", "tfixup_lr0.005_seed1"]


def _dry_run(out: Path, study: Path, data: Path, box: int) -> subprocess.CompletedProcess:
    env = {**os.environ, **SUBSET, "OMP_NUM_THREADS": "1", "T_BOX": str(box), "STUDY_DIR": str(study),
           "DATA_DIR": str(data)}  # fmt: skip
    return subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", str(out)], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip


def _rows(report: str) -> dict[str, list[str]]:
    return {cells[0]: cells for line in report.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}  # fmt: skip


def _status(study: Path, name: str) -> str:
    ends = [line for line in (study / "runs" / name / "metrics.jsonl").read_text().splitlines() if '"end"' in line]
    return ends[-1] if ends else ""


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.fixed_precision
def test_a_stopped_box_resumes_and_the_table_fills_with_every_run_scored(shared_data: Path, tmp_path: Path) -> None:
    out, study, data = tmp_path / "out", tmp_path / "study", shared_data / "multi30k"
    if not (data / "train.de").is_file():
        pytest.skip("../shared/data/multi30k is not present on this machine")
    # a short box: the runs still training get SIGTERM (how many have ended by then depends on the machine's load)
    first = _dry_run(out, study, data, box=25)
    assert first.returncode in (0, 1), first.stderr[-3000:]
    assert HEADER in (out / "report.md").read_text()
    runs = [p.name for p in (study / "runs").iterdir()]  # with T-Fixup's later seeds where they started
    stopped = [n for n in runs if "stopped by SIGTERM" in _status(study, n)] if first.returncode else []
    ended_first = {n: (study / "runs" / n / "metrics.jsonl").stat().st_mtime for n in FIRST
                   if _status(study, n) and "stopped" not in _status(study, n)}  # fmt: skip

    second = _dry_run(out, study, data, box=240)  # the same command: what the box stopped goes on
    report = (out / "report.md").read_text()
    assert second.returncode == 0, second.stderr[-3000:] + report
    assert "Ended after" in report and "every run ended and is scored." in report
    paired = [line for line in report.splitlines() if line.startswith("- tfixup_lr")]  # each against Post-LN seed 1
    assert sorted(line.split(" against ")[0][2:] for line in paired) == sorted(n for n in FIRST if "tfixup" in n)
    assert all(line.count("p = ") == 4 for line in paired), paired  # test2016, 2017, 2018, MSCOCO
    lr, why = best_lr(study, "tfixup")
    assert lr is not None, why
    later = [f"tfixup_lr{lr:g}_seed2"]
    rows = _rows(report)
    assert list(rows)[:2] == ["run", "anchor: Wu et al. 2021 (fairseq, 2 GPUs)"]  # the header, the anchor
    assert sorted(list(rows)[2:]) == sorted([*FIRST, *later])
    for name in [*FIRST, *later]:
        cells = rows[name]
        assert cells[4] == "90" and cells[5] == "completed", cells  # updates, stop status
        assert all(cells[i] for i in (6, 7, 11, 12, 13)), cells  # valid, test2016, test2017, test2018, MSCOCO
        assert cells[8].count("/") == 3 and float(cells[9]) >= 0, cells  # test2016's precisions and BP
    for name in stopped:  # resumed from its checkpoint, not trained from the start
        assert "resumed from" in (out / "logs" / f"{name}.train.log").read_text(), name
    for name, mtime in ended_first.items():  # an ended run is not trained again
        assert (study / "runs" / name / "metrics.jsonl").stat().st_mtime == mtime, name
    assert not any(p.suffix == ".pt" for p in out.rglob("*"))  # records come back, checkpoints stay in the study

    third = _dry_run(out, study, data, box=240)  # everything ended: nothing trains, nothing is scored again
    assert third.returncode == 0, third.stderr[-3000:]
    for name in [*FIRST, *later]:
        assert f"== {name}: ended before, not trained again" in third.stderr
    assert "evaluating" not in third.stderr
    assert _rows((out / "report.md").read_text()) == rows
