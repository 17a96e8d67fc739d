"""scripts/figures/plot_headline.py: the README's figure is drawn from the budget-study table as committed in docs/."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO, load_script


@pytest.fixture(scope="module")
def ph() -> ModuleType:
    return load_script("figures/plot_headline")


def test_the_numbers_are_the_committed_table(ph: ModuleType) -> None:
    rows = ph.budget_table()
    assert list(rows) == ["tfixup", "preln", "admin", "deepnorm", "postln_tfixup_lr", "postln", "xavier_noln"]
    assert rows["tfixup"] == [12.09, 21.05, 26.42] and rows["postln"] == [2.97, 5.65, 6.90]


def test_draws_a_small_png_and_refuses_a_page_without_the_table(
    ph: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert ph.main(["--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 10_000 < (tmp_path / "f.png").stat().st_size < 100_000
    (tmp_path / "page.md").write_text("# no table here\n")
    assert ph.main(["--table", str(tmp_path / "page.md"), "--out", str(tmp_path / "g.png")]) == 2
    assert "no budget-study table" in capsys.readouterr().err and not (tmp_path / "g.png").exists()


def test_the_committed_figure_is_small() -> None:
    assert 10_000 < (REPO / "docs" / "figures" / "budget_valid_bleu.png").stat().st_size < 100_000
