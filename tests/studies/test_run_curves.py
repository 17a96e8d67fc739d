"""tfx.studies.run_curves: the moving mean of the train loss and the validations, read from a run's metrics.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tfx.studies.run_curves import loss_curve, plot_run_curves, valid_points


def write_run(run: Path, losses: list[float], valid: dict[int, float]) -> Path:
    run.mkdir(parents=True)
    records = [{"event": "update", "step": i + 1, "epoch": 1, "train/loss": v} for i, v in enumerate(losses)]
    records += [{"event": "valid", "step": s, "valid/bleu": b} for s, b in valid.items()]
    records.append({"event": "end", "step": len(losses), "status": "completed"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"event": "upd')
    return run


def test_the_loss_curve_is_the_mean_of_the_last_window_updates_and_skips_what_is_not_finite(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [8.0, 6.0, math.nan, 4.0, 2.0], {3: 1.5, 5: 7.25})
    steps, means = loss_curve(run, window=2)
    assert steps == [1, 2, 3, 4, 5]
    assert means == [8.0, 7.0, 6.0, 4.0, 3.0]  # update 3: (6, nan) -> 6; update 4: (nan, 4) -> 4
    assert loss_curve(run, window=10)[1][-1] == pytest.approx(5.0)
    assert valid_points(run) == ([3, 5], [1.5, 7.25])  # the truncated last line is skipped


def test_the_figure_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = {"a": write_run(tmp_path / "a", [9.0, 8.0, 7.0], {3: 2.0}), "b": write_run(tmp_path / "b", [9.0] * 3, {})}
    plot_run_curves(runs, tmp_path / "figs" / "curves.png", "title", window=2)
    assert (tmp_path / "figs" / "curves.png").read_bytes()[:4] == b"\x89PNG"
