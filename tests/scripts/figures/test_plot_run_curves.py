"""scripts/figures/plot_run_curves.py: LABEL=RUN arguments, and a one-line refusal of a folder with no run record."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_script
from tests.studies.test_run_curves import write_run


def test_it_draws_the_named_runs_and_refuses_a_folder_without_a_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    script = load_script("figures/plot_run_curves")
    run = write_run(tmp_path / "rezero", [9.0, 8.0], {2: 1.0})
    assert script.main([f"rezero={run}", "--out", str(tmp_path / "c.png"), "--window", "1"]) == 0
    assert (tmp_path / "c.png").is_file()
    assert script.main([f"fixup={tmp_path / 'none'}", "--out", str(tmp_path / "d.png")]) == 2
    assert f"no run record: {tmp_path / 'none' / 'metrics.jsonl'}" in capsys.readouterr().err
    assert not (tmp_path / "d.png").exists()
    with pytest.raises(SystemExit):
        script.main(["no-label", "--out", str(tmp_path / "e.png")])
    assert "want LABEL=RUN_FOLDER" in capsys.readouterr().err
