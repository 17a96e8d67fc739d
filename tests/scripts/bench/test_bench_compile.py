"""scripts/bench/bench_compile.py: one fresh process per row; per-layer compile traces two graphs at any depth, the
whole model one. CPU, fp32, the aot_eager backend (forward and backward traced, no code generation)."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.fixed_precision
def test_rows_count_the_graphs_each_scope_compiles(capsys: pytest.CaptureFixture) -> None:
    bench = load_script("bench/bench_compile")
    argv = ["--depths", "1", "3", "--scopes", "layers", "model", "--d-model", "16", "--steps", "1", "--backend",
            "aot_eager"]  # fmt: skip
    assert bench.main(argv) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    frames = {(r[0].strip(), int(r[1])): int(r[4]) for r in rows}
    assert frames == {("layers", 1): 2, ("model", 1): 1, ("layers", 3): 2, ("model", 3): 1}
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
