"""Where a converged study (``scripts/studies/converged_study.py``) keeps its runs and decodes, and what they hold:
the layout of ``--out``, each run's valid-BLEU curve and how it ended, each decode's test scores. The study writes
this layout; the study and its report (``tfx.studies.converged_report``) read it back, so a study copied without its
checkpoints (results/README.md) still reports."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.studies.arms import ARMS, warmup_free

Setting = tuple[float, float, int]  # (peak lr, dropout, warmup updates)
TEST_SETS = {"test": "test2016", "test_2017_flickr": "test2017 flickr", "test_2018_flickr": "test2018 flickr"}
KINDS = {"best": "checkpoints/checkpoint_best.pt", "avg": "average.pt"}  # what is decoded, per run folder
WINDOW = 5  # numbered checkpoints averaged, at most (the window is chosen on valid)


def setting_name(lr: float, dropout: float, warmup: int) -> str:  # a grid run's folder
    return f"lr{lr:g}_d{dropout:g}_w{warmup}"


def grid_settings(arm: str, args: argparse.Namespace) -> list[Setting]:
    """An arm's grid: its ``--tuned`` setting alone, or lr x dropout x warmup (warmup 0 for a method whose YAML
    says ``warmup_free: true``)."""
    if tuned := args.tuned.get(arm):
        return [tuple(tuned)]
    warmups = [0] if warmup_free(ARMS[arm][0]) else args.warmups
    return [(lr, d, w) for lr in args.lrs for d in args.dropouts for w in warmups]


def lr_dropouts(arm: str, args: argparse.Namespace) -> list[tuple[float, float]]:
    """The (peak lr, dropout) pairs of an arm's grid, in grid order: one finalist each."""
    return list(dict.fromkeys(s[:2] for s in grid_settings(arm, args)))


def grid_run(out: Path, arm: str, setting: Setting) -> Path:
    return out / "runs" / "grid" / arm / setting_name(*setting)


def finalist_name(arm: str, lr: float, dropout: float) -> str:
    return f"{arm}_lr{lr:g}_d{dropout:g}"


def final_runs(out: Path, name: str, seeds: list[int]) -> dict[int, Path]:
    """The converged runs of a finalist (``finalist_name``), by seed."""
    return {seed: out / "runs" / "final" / name / f"seed{seed}" for seed in seeds}


def score_path(run: Path, kind: str, test: str) -> Path:
    return run / "test" / f"{kind}_{test}.bleu.json"


def hyp_path(run: Path, kind: str, test: str) -> Path:
    return run / "test" / f"{kind}_{test}.hyp"


def end_status(run: Path) -> str | None:
    """How a run's metrics end: ``completed``, ``early stop: ...``, ``diverged``, ``stopped by ...``; None before
    its first end."""
    ends = [r for r in read_metrics(run / FILENAME) if r["event"] == "end"] if (run / FILENAME).exists() else []
    return ends[-1]["status"] if ends else None


def finished(run: Path) -> bool:
    """A run that completed or stopped early: what is chosen among and decoded."""
    return not (end_status(run) or "stopped").startswith(("stopped", "diverged"))


def ended(run: Path) -> bool:
    """A run that does not train again: finished, or diverged (resuming would diverge again); one read."""
    return not (end_status(run) or "stopped").startswith("stopped")


def valid_curve(run: Path) -> list[float]:
    """Greedy valid BLEU per validation (per epoch in this study); one per update, the first: before the fix
    of 2026-12-02 a run resumed after its last validation validated that update again."""
    records = read_metrics(run / FILENAME) if (run / FILENAME).exists() else []
    by_step: dict[int, float] = {}
    for record in records:
        if record["event"] == "valid":
            by_step.setdefault(record["step"], record["valid/bleu"])
    return [by_step[step] for step in sorted(by_step)]


def best_valid(run: Path) -> tuple[float, int]:
    """(best greedy valid BLEU, the epoch it came at) of a run; (nan, 0) without validations."""
    return best_of(valid_curve(run))


def best_of(curve: list[float]) -> tuple[float, int]:
    """(the best of a valid-BLEU curve, its epoch; the first of equals); (nan, 0) for no validations."""
    if not curve:
        return math.nan, 0
    best = max(range(len(curve)), key=curve.__getitem__)
    return curve[best], best + 1


def test_scores(run: Path, kind: str, test: str) -> tuple[float, float]:
    """(sacreBLEU, lowercased tokenized BLEU) of one decode; nan where it is not scored."""
    path = score_path(run, kind, test)
    if not path.exists():
        return math.nan, math.nan
    scores = json.loads(path.read_text())["scores"]
    return scores[0]["score"], (scores[1]["score"] if len(scores) > 1 else math.nan)
