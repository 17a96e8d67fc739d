"""scripts/studies/encoder_only.py: a tiny study end to end, then ``--replot`` from its records alone; bad
arguments are refused in one line. fp32, CPU, one thread per run, seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_script

TINY = ["--depths", "2", "--lrs", "1e-3", "--seeds", "1", "--steps", "10", "--batch", "8", "--d-model", "32"]


def test_a_tiny_study_then_a_replot_that_trains_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = load_script("studies/encoder_only")
    out = tmp_path / "study"
    assert script.main([*TINY, "--arms", "tfixup", "postln", "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert "0 runs recorded, 2 to train" in first and "| 2 | tfixup | 0.001 | 1 | 0 |" in first
    assert script.main([*TINY, "--out", str(out), "--replot", "--figure", str(tmp_path / "fig.png")]) == 0
    replot = capsys.readouterr().out
    assert "to train" not in replot and "| 2 | postln | 0.001 | 1 | 0 |" in replot
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("bad", [["--jobs", "0"], ["--arms", "layernorm"], ["--d-model", "30"]])
def test_bad_arguments_are_refused(bad: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stop:
        load_script("studies/encoder_only").main([*bad, "--out", str(tmp_path)])
    assert stop.value.code == 2
