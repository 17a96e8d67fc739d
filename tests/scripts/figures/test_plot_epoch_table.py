"""scripts/figures/plot_epoch_table.py: the valid-BLEU-per-epoch table under a heading of a docs page, read and drawn;
a page without it, or with a row that holds no numbers, is refused in one line. CPU, no tensors."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

PAGE = """# Methods
### A section (2026-12-04)
| run | valid BLEU per epoch | how it ended |
|---|---|---|
| tfixup lr 5e-4 (chosen) | 10.33 18.04 **25.49** 25.00 | patience |
| tfixup lr 3e-4 | 6.24 12.78 | stopped |
| preln (chosen) | 5.88 11.97 19.80 | patience |

| run | valid BLEU per epoch |
|---|---|
| not this table | 1.0 |
### The next section
| run | valid BLEU per epoch |
|---|---|
| nor this one | 2.0 |
"""


@pytest.fixture(scope="module")
def pe() -> ModuleType:
    return load_script("figures/plot_epoch_table")


def test_reads_the_first_table_under_the_heading_only(pe: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text(PAGE)
    rows = pe.epoch_table(tmp_path / "page.md", "A section")
    assert rows == {"tfixup lr 5e-4 (chosen)": [10.33, 18.04, 25.49, 25.0], "tfixup lr 3e-4": [6.24, 12.78],
                    "preln (chosen)": [5.88, 11.97, 19.8]}  # fmt: skip


def test_draws_a_png_and_refuses_what_it_cannot_read(
    pe: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    assert pe.main(["--page", str(page), "--section", "A section", "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pe.main(["--page", str(page), "--section", "Absent", "--out", str(tmp_path / "g.png")]) == 2
    assert "no heading containing 'Absent'" in capsys.readouterr().err and not (tmp_path / "g.png").exists()
    page.write_text(PAGE.replace("6.24 12.78", "n/a"))
    assert pe.main(["--page", str(page), "--section", "A section", "--out", str(tmp_path / "h.png")]) == 2
    err = capsys.readouterr().err
    assert "row 'tfixup lr 3e-4' has no numbers" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "h.png").exists()
