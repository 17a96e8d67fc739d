"""tfx.studies.converged_runs: what a study's run records read back as. CPU, no training."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tfx.studies import converged_runs


@pytest.fixture(scope="module")
def runs() -> ModuleType:
    return converged_runs


def test_the_valid_curve_has_one_point_per_update(runs: ModuleType, tmp_path: Path) -> None:
    """A run resumed after its last validation (before the fix in tfx.train) holds that validation twice."""
    records = [{"event": "valid", "step": s, "valid/bleu": b} for s, b in [(5, 1.0), (10, 3.0), (10, 3.0)]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*records, {"event": "end"}]))
    assert runs.valid_curve(tmp_path) == [1.0, 3.0] and runs.best_valid(tmp_path) == (3.0, 2)
