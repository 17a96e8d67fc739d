"""tfx.studies.converged_report: mean +- std over seeds from known per-seed values, each arm's grid as a table and
a heatmap, the figure of an arm still choosing, the paired bootstrap against T-Fixup seed by seed, T-Fixup first:
all from scripted run records, no training. CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script
from tests.scripts.studies.test_converged_study import _one_line_corpus, _RecordingQueue, _valid_run
from tfx.evaluation.bleu import corpus_bleu
from tfx.studies import converged_report


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return converged_report


@pytest.fixture(scope="module")
def cs() -> ModuleType:  # the study's arguments, as a report reads them back from study.json
    return load_script("studies/converged_study")


def test_mean_std_from_known_seed_values(report: ModuleType) -> None:
    assert report.mean_std([30.0, 32.0, 34.0]) == "32.00 ± 2.00 (30.00 / 32.00 / 34.00)"
    assert report.mean_std([31.5, float("nan")]) == "31.50"  # an unscored seed is left out, and said so by its absence
    assert report.mean_std([]) == "—"
    assert report.mean_std([19.0], digits=0) == "19"  # epochs to best: whole epochs, their mean to a tenth
    assert report.mean_std([19.0, 22.0], digits=0) == "20.5 ± 2.1 (19 / 22)"


def test_the_report_shows_each_arms_grid_as_a_table_and_a_heatmap_of_its_last_epoch(
    report: ModuleType, cs: ModuleType, tmp_path: Path
) -> None:
    """Scripted grid records (no training): each cell's valid BLEU by epoch, the finalists bold and framed, a run
    still training marked, a warmup-free arm with its one column, one colour scale."""
    argv = ["--out", str(tmp_path), "--lrs", "0.0005", "0.001", "--dropouts", "0.1", "--warmups", "0", "400",
            "--grid-epochs", "2"]  # fmt: skip
    args = cs.parse_args(argv)
    curves = {("postln", 0.0005, 0): [3.0, 9.0], ("postln", 0.0005, 400): [2.0, 11.5],
              ("postln", 0.001, 0): [4.0, 8.0], ("postln", 0.001, 400): [5.0],  # still training
              ("tfixup", 0.0005, 0): [12.0, 21.0], ("tfixup", 0.001, 0): [18.0, 24.5]}  # fmt: skip
    for (arm, lr, warmup), bleus in curves.items():
        run = report.grid_run(tmp_path, arm, (lr, 0.1, warmup))
        _valid_run(run, bleus)
        if len(bleus) == 2:
            with (run / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"event": "end", "step": 20, "status": "completed"}) + "\n")
    finalists = {
        "postln": {"postln_lr0.0005_d0.1": [0.0005, 0.1, 400]},
        "tfixup": {"tfixup_lr0.0005_d0.1": [0.0005, 0.1, 0], "tfixup_lr0.001_d0.1": [0.001, 0.1, 0]},
    }
    study = {"arms": ["postln", "tfixup"], "finalists": finalists}
    lines = report.grid_lines(tmp_path, study, args)
    tables = "\n".join(lines)
    assert tables.index("tfixup's grid") < tables.index("postln's grid")  # T-Fixup first, as in every table
    assert "| 0.0005 | 0.1 | **12.00 / 21.00** |" in lines and "| 0.001 | 0.1 | **18.00 / 24.50** |" in lines
    assert "| lr | dropout | warmup 0 | warmup 400 |" in lines
    assert "| 0.0005 | 0.1 | 3.00 / 9.00 | **2.00 / 11.50** |" in lines
    assert "| 0.001 | 0.1 | 4.00 / 8.00 | 5.00 ... |" in lines
    matrices = report.plot_grid(tmp_path, study, args)
    assert list(matrices) == ["tfixup", "postln"]
    assert matrices["tfixup"] == [[21.0], [24.5]]
    assert matrices["postln"][0] == [9.0, 11.5] and matrices["postln"][1][0] == 8.0
    assert math.isnan(matrices["postln"][1][1])  # not at epoch 2 yet: no colour, no number
    assert (tmp_path / "converged_grid.png").stat().st_size > 10_000
    assert report.grid_lines(tmp_path, {"arms": ["admin"]}, args) == []  # an arm with no grid run yet: no table


def test_the_figure_shows_an_arm_still_choosing_by_its_finalists(
    report: ModuleType, cs: ModuleType, tmp_path: Path
) -> None:
    """A replot during the study: tfixup chose (its line and the other finalist), postln has not (both dashed)."""
    finalists = {
        "tfixup": {"tfixup_lr0.001_d0.1": [1e-3, 0.1, 0], "tfixup_lr0.001_d0.3": [1e-3, 0.3, 0]},
        "postln": {"postln_lr0.001_d0.1": [1e-3, 0.1, 400], "postln_lr0.001_d0.3": [1e-3, 0.3, 100]},
    }
    for names in finalists.values():
        for name in names:
            run = tmp_path / "runs" / "final" / name / "seed1"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(
                "".join(json.dumps({"event": "valid", "step": s, "valid/bleu": 10.0 + s}) + "\n" for s in (1, 2))
            )
    study = {"settings": {"tfixup": [1e-3, 0.3, 0]}, "finalists": finalists}
    labels = report.plot(tmp_path, study, cs.parse_args(["--seeds", "1"]))
    assert labels == [
        "tfixup (lr0.001_d0.3_w0)",
        "tfixup (lr0.001_d0.1_w0, not chosen)",
        "postln (lr0.001_d0.1_w400, converging)",
        "postln (lr0.001_d0.3_w100, converging)",
    ]
    assert (tmp_path / "converged_study.png").is_file()


def test_the_report_tests_each_arm_against_the_first_by_paired_bootstrap_seed_by_seed(
    report: ModuleType, cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 1: postln's best-valid decode is the reference itself, tfixup's drops words; seed 2 the other way
    round. Each seed is tested against T-Fixup's run of the same seed: +gain for seed 1, -gain for seed 2, the
    smallest p; the window average not decoded yet: a dash (CPU, sacrebleu on the files, no model)."""
    monkeypatch.setattr(report, "TEST_SETS", {"test": "test2016"})
    refs = [f"a dog number {i} runs across the green field." for i in range(200)]
    worse = [r.replace(" green", "") if i % 2 else r for i, r in enumerate(refs)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.en").write_text("\n".join(refs) + "\n")
    hyps = {("tfixup", 1): worse, ("postln", 1): refs, ("tfixup", 2): refs, ("postln", 2): worse}
    settings = {"tfixup": [5e-4, 0.3, 0], "postln": [1e-3, 0.1, 400]}
    for (arm, seed), lines in hyps.items():
        test = tmp_path / "runs" / "final" / report.finalist_name(arm, *settings[arm][:2]) / f"seed{seed}" / "test"
        test.mkdir(parents=True)
        (test / "best_test.hyp").write_text("\n".join(lines) + "\n")
        (test / "best_test.bleu.json").write_text("{}")
    args = cs.parse_args(["--seeds", "1", "2", "--data-dir", str(tmp_path / "data")])
    lines = report.significance_lines(tmp_path, {"settings": settings}, args)
    gain = 100 - corpus_bleu(worse, refs).score
    assert lines[-2:] == [f"| postln | 1 | {gain:+.2f} (p 0.001) | — |", f"| postln | 2 | {-gain:+.2f} (p 0.001) | — |"]
    assert gain > 1
    assert report.significance_lines(tmp_path, {"settings": {"tfixup": settings["tfixup"]}}, args) == []
    elsewhere = cs.parse_args(["--seeds", "1", "--data-dir", str(tmp_path / "moved")])  # replotted without data
    assert report.significance_lines(tmp_path, {"settings": settings}, elsewhere)[-1] == "| postln | 1 | — | — |"


def test_a_study_that_added_its_arms_later_reports_t_fixup_first(report: ModuleType) -> None:
    """Pre-LN and Admin trained first, T-Fixup added by a later run of the script: T-Fixup still leads the table
    and is what the paired tests compare against."""
    recorded = {"preln": [1e-3, 0.1, 0], "admin": [5e-4, 0.1, 400], "tfixup": [5e-4, 0.3, 0]}
    assert list(report.in_arm_order(recorded)) == ["tfixup", "preln", "admin"]


def test_the_table_averages_the_seeds_that_ended_and_says_how_many_have_not(
    report: ModuleType, cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replot mid-study: T-Fixup's seed 1 converged (valid 30, 31) and its seed 2 stands at epoch 1 (5.0); both
    Pre-LN seeds are still training. The mean is over converged seeds only (31.00, not 18.00 ± 18.38), the rest
    counted; an arm with none ended shows each seed where it stands, no mean (CPU, the queue stubbed)."""
    data = _one_line_corpus(cs, tmp_path / "data")
    monkeypatch.setattr(cs, "RunQueue", lambda *a: _RecordingQueue())
    out = tmp_path / "study"
    argv = ["--out", str(out), "--data-dir", str(data), "--arms", "tfixup", "preln", "--seeds", "1", "2",
            "--tuned", "tfixup=5e-4,0.3,0", "preln=5e-4,0.3,0"]  # fmt: skip
    cs.run_study(cs.parse_args(argv))  # every run "converges" at 30, 31
    runs = {(arm, seed): report.final_runs(out, report.finalist_name(arm, 5e-4, 0.3), [seed])[seed]
            for arm in ("tfixup", "preln") for seed in (1, 2)}  # fmt: skip
    _valid_run(runs["tfixup", 2], [5.0])  # no end record: still training
    _valid_run(runs["preln", 1], [20.0, 26.0])
    _valid_run(runs["preln", 2], [4.0])
    rows: dict[str, list[str]] = {}
    for line in report.write_report(out).splitlines():
        if line.startswith(("| tfixup | lr", "| preln | lr")):  # the first table's rows (the finalists' follow)
            rows.setdefault(line.split(" | ")[0][2:], line.split(" | "))
    assert rows["tfixup"][2:4] == ["2 [+1 not ended]", "31.00 [+1 not ended]"]
    assert rows["preln"][2:4] == ["2 / 1 [none ended]", "26.00 / 4.00 [none ended]"]


def test_each_heatmap_panel_labels_its_rows_unless_the_panel_to_its_left_has_the_same(report: ModuleType) -> None:
    """T-Fixup's grid of one (tuned elsewhere) left of ReZero's four rows: ReZero's panel labels its own rows (it
    had none, reading T-Fixup's one label as its own); two full grids side by side share the left one's."""
    full = [(0.0005, 0.1), (0.0005, 0.3), (0.001, 0.1), (0.001, 0.3)]
    assert report.row_labels([(0.0005, 0.3)], []) == ["0.0005 / 0.3"]
    assert report.row_labels(full, [(0.0005, 0.3)]) == ["0.0005 / 0.1", "0.0005 / 0.3", "0.001 / 0.1", "0.001 / 0.3"]
    assert report.row_labels(full, full) == []
