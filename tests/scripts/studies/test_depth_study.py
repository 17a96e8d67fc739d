"""scripts/studies/depth_study.py: every arm is the run it claims, rows come from metrics.jsonl, a micro study end to
end."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script
from tfx.config import compose_config
from tfx.studies.arms import write_arms

TINY = [
    "data.toy_train_size=300",
    "data.toy_valid_size=12",
    "data.toy_test_size=4",
    "data.vocab_size=64",
    "train.valid_max_sentences=2",
]


@pytest.fixture(scope="module")
def ds() -> ModuleType:
    return load_script("studies/depth_study")


# arm -> (model.norm, init.name, optim.name, warmup over 200 updates)
EXPECTED = {
    "tfixup": ("none", "tfixup", "adam", 0),
    "tfixup_radam": ("none", "tfixup", "radam", 0),
    "postln": ("post", "xavier", "adam", 50),
    "postln_nowarmup": ("post", "xavier", "adam", 0),
    "preln": ("pre", "xavier", "adam", 0),
    "deepnorm": ("deepnorm", "deepnorm", "adam", 50),
    "admin": ("admin", "admin", "adam", 50),
    "xavier_noln": ("none", "xavier", "adam", 0),
    "postln_tfixup_lr": ("post", "xavier", "adam", 50),  # + T-Fixup's decay after the warmup (budget_study.py)
    "tfixup_32k": ("none", "tfixup", "adam", 0),  # 32k-token batches; the study's max_tokens wins here
    "dyt": ("dyt", "xavier", "adam", 50),  # the normalization-free methods of issue 51 (docs/methods.md)
    "rezero": ("rezero", "xavier", "adam", 0),
    "fixup": ("fixup", "fixup", "adam", 50),
}


def test_every_arm_composes_to_its_method_on_the_shared_budget(ds: ModuleType, tmp_path: Path) -> None:
    """The arm files the multirun sweeps (+arm=NAME on Hydra's search path) are the runs the table names."""
    assert set(EXPECTED) <= set(ds.ARMS)  # every method is an arm (tfx.studies.arms), these at least
    assert set(EXPECTED) - {"postln_tfixup_lr", "tfixup_32k"} <= set(ds.parse_args([]).methods)
    args = ds.parse_args(["--out", str(tmp_path)])
    write_arms(tmp_path / "arms", list(EXPECTED))
    for arm, (norm, init, optim, warmup) in EXPECTED.items():
        search = f"hydra.searchpath=[file://{tmp_path / 'arms'}]"
        cfg = compose_config([search, f"+arm={arm}", "model.encoder_layers=24", *ds.run_overrides(args)])
        assert (cfg.model.norm, cfg.init.name, cfg.optim.name, cfg.optim.warmup_updates) == (norm, init, optim, warmup)
        assert (cfg.model.d_model, cfg.model.ffn_dim, cfg.model.dropout, cfg.data.max_tokens) == (32, 64, 0.0, 256)
        assert (cfg.optim.lr, cfg.optim.clip_norm, cfg.train.max_updates, cfg.train.threads) == (5e-4, 0.0, 200, 1)
        assert (cfg.train.probe_updates, cfg.train.precision, cfg.data.name) == (100, "fp32", "toy")


def update(step: int, loss: float, probe: float | None = None) -> dict:
    record = {"event": "update", "step": step, "train/loss": loss}
    return record if probe is None else {**record, "probe/output_change": probe}


def test_rows_and_divergence_labels_from_metrics_records(ds: ModuleType) -> None:
    end = {"event": "end", "step": 12, "status": "completed", "train_seconds": 3.0}
    ok = [update(1, 8.0, 0.2), update(2, 7.0, 0.1), update(3, 6.0, 0.4)] + [update(i, 5.0) for i in range(4, 13)]
    row = ds.summarize([*ok, {"event": "valid", "step": 12, "valid/loss": 4.5}, end])
    assert (row["first"], row["max"], row["final"], row["valid"], row["diverged"]) == (8.0, 8.0, 5.1, 4.5, "no")
    assert (row["max_df"], row["median_df"], row["skipped"], row["seconds"]) == (0.4, 0.2, 0, 3.0)
    assert ds.summarize([update(1, 5.0), *[update(i, 6.0) for i in range(2, 13)], end])["diverged"] == "loss rose"
    diverged = ds.summarize([update(1, 8.0, math.inf), {"event": "skipped", "step": 1, "train/loss": math.nan},
                             {**end, "status": "diverged"}])  # fmt: skip
    assert (diverged["diverged"], diverged["skipped"], math.isnan(diverged["max_df"])) == ("non-finite", 1, True)
    assert math.isnan(diverged["valid"])
    assert ds.summarize([update(1, 8.0), update(2, math.nan), end])["diverged"] == "non-finite"
    assert ds.summarize(ok)["diverged"] == "unfinished"
    assert ds.summarize([*ok, {**end, "status": "stopped by SIGTERM"}])["diverged"] == "stopped by SIGTERM"


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_micro_study_trains_through_hydra_multirun_and_replots(ds: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "study"
    argv = ["--out", str(out), "--methods", "tfixup", "xavier_noln", "--depths", "1", "2", "--updates", "3",
            "--d-model", "16", *TINY, f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    assert ds.main(argv) == 0
    runs = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    assert runs == ["tfixup_N1", "tfixup_N2", "xavier_noln_N1", "xavier_noln_N2"]
    for run in runs:  # one TensorBoard folder (runs/), each run's own metrics file, checkpoints removed
        assert any((out / "runs" / run / "tb").iterdir()) and not (out / "runs" / run / "checkpoints").exists()
    md = (out / "depth_study.md").read_text()
    rows = [line.split("|")[1:8] for line in md.splitlines() if line.startswith(("| tfixup", "| xavier"))]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("tfixup", "1"), ("tfixup", "2"), ("xavier_noln", "1"),
                                                            ("xavier_noln", "2")]  # fmt: skip
    assert all(r[6].strip() in ("no", "loss rose") for r in rows)  # completed, finite (3 updates may not help)
    assert all(math.isfinite(float(r[5])) for r in rows)  # the end-of-run valid loss
    assert all(float(r[3]) >= float(r[2]) for r in rows)  # the highest loss is at least the first
    assert re.search(r"wall \d+\.\d min \(2 jobs\)", md)
    assert (out / "depth_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    study = json.loads((out / "study.json").read_text())
    assert study["arms"] == ["tfixup", "xavier_noln"] and study["depths"] == [1, 2]
    (out / "depth_study.md").unlink()
    assert ds.main(["--out", str(out), "--replot"]) == 0  # from study.json and the metrics files alone
    assert (out / "depth_study.md").read_text() == md


def test_replot_without_a_study_is_one_line(ds: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert ds.main(["--out", str(tmp_path), "--replot"]) == 2
    assert "study.json not found" in capsys.readouterr().err
