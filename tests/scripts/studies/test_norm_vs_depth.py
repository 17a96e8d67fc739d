"""scripts/studies/norm_vs_depth.py reproduces the published linearized-block table exactly."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

PUBLISHED = {  # (scheme, N) -> "%.4e" of mean row norm out / in
    ("xavier", 6): "1.5594e+01",
    ("xavier", 12): "2.9281e+02",
    ("xavier", 200): "nan",
    ("tfixup", 6): "1.1502e+00",
    ("tfixup", 12): "1.1698e+00",
    ("tfixup", 200): "1.1337e+00",
}


@pytest.fixture(scope="module")
def nvd() -> ModuleType:
    return load_script("studies/norm_vs_depth")


@pytest.mark.parametrize(("scheme", "n"), list(PUBLISHED))
def test_linearized_matches_published(nvd: ModuleType, scheme: str, n: int) -> None:
    assert f"{nvd.linearized_ratio(n, scheme):.4e}" == PUBLISHED[scheme, n]


def test_real_encoder_tfixup_stays_near_one_xavier_grows(nvd: ModuleType) -> None:
    assert nvd.encoder_ratio(12, "tfixup") < 1.5
    assert nvd.encoder_ratio(12, "xavier") > 10


def test_main_prints_both_tables(nvd: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert nvd.main(["--depths", "6", "12"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "     6  1.5594e+01  1.1502e+00" in lines
    assert "    12  2.9281e+02  1.1698e+00" in lines
    assert sum(line.startswith("2. tfx EncoderLayer") for line in lines) == 1


def test_plot_writes_png(nvd: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "ratio.png"
    nvd.main(["--depths", "2", "6", "--plot", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("method", ["rezero", "fixup"])
@pytest.mark.parametrize("n", [6, 12, 200])
def test_rezero_and_fixup_stacks_start_as_the_identity(nvd: ModuleType, method: str, n: int) -> None:
    """resweight 0 / zeroed branch ends: the encoder stack's output is its input at any depth (fp32, CPU)."""
    assert nvd.method_ratio(n, method) == 1.0


def test_dyt_stack_grows_additively_not_exponentially(nvd: ModuleType) -> None:
    """tanh bounds every branch input, so 200 DyT layers stay finite and far below Xavier's 12-layer 193x."""
    ratios = [nvd.method_ratio(n, "dyt") for n in (6, 12, 200)]
    assert 1.0 < ratios[0] < ratios[1] < ratios[2] < 50


def test_main_prints_the_normalization_free_table(nvd: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    nvd.main(["--depths", "6"])
    lines = capsys.readouterr().out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("3. tfx EncoderLayer stack per")))
    assert lines[header + 1].split() == ["N", "dyt", "rezero", "fixup"]
    assert lines[header + 2].split()[2:] == ["1.0000e+00", "1.0000e+00"]
