"""tfx.studies.encoder_only: the arms build as described, each trains, finished runs are not redone, the report
regenerates from the records. Every test runs in fp32 on CPU, one thread, in seconds."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from tfx.conversion import RemovedNorm
from tfx.init.tfixup import tfixup_encoder_scale
from tfx.studies.encoder_only import (
    ARMS,
    RunSpec,
    StudyConfig,
    build_model,
    build_optimizer,
    load_records,
    planned_runs,
    record_path,
    run_study,
    sort_batch,
    spread,
    train_run,
    warmup_factor,
    write_report,
)

TINY = StudyConfig(depths=(2,), lrs=(1e-3,), seeds=(1,), steps=40, batch=16, warmup=10, d_model=32, symbols=8,
                   length=6, held_out=64, log_every=10)  # fmt: skip


def layer_norms(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)]


def test_the_task_sorts_each_sequence() -> None:
    """fp32 CPU: targets are the inputs sorted, position by position."""
    x, y = sort_batch(5, 7, 4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 7)
    assert torch.equal(y, x.sort(dim=1).values) and not torch.equal(x, y)


def test_the_tfixup_arm_has_no_layernorm_and_tfixups_factors() -> None:
    """fp32 CPU: the converted model keeps no LayerNorm anywhere, and its FFN weights carry 0.67 N^-1/4 over the
    Post-LN model's Xavier bound."""
    depth = 4
    model = build_model(ARMS["tfixup"], depth, TINY, seed=1)
    assert layer_norms(model) == []
    assert all(isinstance(layer.norm1, RemovedNorm) for layer in model.encoder.layers)
    assert model.encoder.norm is None
    w = model.encoder.layers[0].linear1.weight
    bound = math.sqrt(6 / sum(w.shape)) * tfixup_encoder_scale(depth)  # Xavier-uniform's bound, scaled
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound


def test_the_layernorm_arms_keep_their_norms_where_they_say() -> None:
    """fp32 CPU: Pre-LN normalises first and ends with a final LayerNorm; both Post-LN arms normalise after the
    residual sum and end with none."""
    preln = build_model(ARMS["preln"], 3, TINY, seed=1)
    assert all(layer.norm_first for layer in preln.encoder.layers)
    assert isinstance(preln.encoder.norm, nn.LayerNorm) and len(layer_norms(preln)) == 2 * 3 + 1
    for name in ("postln", "postln_nowarmup"):
        postln = build_model(ARMS[name], 3, TINY, seed=1)
        assert not any(layer.norm_first for layer in postln.encoder.layers)
        assert postln.encoder.norm is None and len(layer_norms(postln)) == 2 * 3


def test_postln_starts_at_the_warmup_scaled_lr_and_the_others_at_the_full_lr() -> None:
    """fp32 CPU: the lr update 1 trains at is lr/warmup for postln and lr for the rest; postln reaches lr at the
    end of its warmup and stays there."""
    lr = 1e-3
    for name, arm in ARMS.items():
        scheduler = build_optimizer(build_model(arm, 2, TINY, seed=1), arm, lr, TINY)
        first = scheduler.optimizer.param_groups[0]["lr"]
        assert first == pytest.approx(lr / TINY.warmup if name == "postln" else lr), name
        for _ in range(TINY.warmup):
            scheduler.optimizer.step()  # no gradients: changes nothing, keeps torch's order (optimizer, then lr)
            scheduler.step()
        assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(lr), name
    assert [warmup_factor(s, 4) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0] and warmup_factor(1, 0) == 1.0


@pytest.mark.parametrize("arm", list(ARMS))
def test_a_tiny_run_of_each_arm_lowers_the_loss(arm: str, tmp_path: Path) -> None:
    """fp32 CPU, 40 updates of a 2-layer d 32 model: the last window's train loss is below the first's, the
    held-out loss below chance (ln 8), and a TensorBoard log is written."""
    record = train_run(RunSpec(arm, 2, 1e-3, 1), TINY, tmp_path)
    losses = record["curve"]["loss"]
    assert record["diverged_at"] is None and record["curve"]["steps"] == [10, 20, 30, 40]
    assert losses[-1] < losses[0] - 0.05, losses
    assert record["held_out"]["loss"] < math.log(TINY.symbols)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_recorded_runs_are_skipped_and_a_missing_one_is_trained_again(tmp_path: Path) -> None:
    """fp32 CPU: a second call trains nothing and leaves every record as it was; a removed record is retrained."""
    cfg = replace(TINY, arms=("tfixup", "postln"), steps=10)
    assert len(run_study(cfg, tmp_path, log=lambda _: None)) == 2
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/record.json")}
    assert len(stamps) == 2
    assert run_study(cfg, tmp_path, log=lambda _: None) == []
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    gone = record_path(tmp_path, planned_runs(cfg)[1])
    gone.unlink()
    assert run_study(cfg, tmp_path, log=lambda _: None) == [planned_runs(cfg)[1]]
    assert gone.is_file()
    assert json.loads((tmp_path / "study.json").read_text())["wall_seconds"] > 0


def test_the_table_and_figure_regenerate_from_the_records(tmp_path: Path) -> None:
    """fp32 CPU: the report comes from the records alone, rewritten when removed; a diverged seed is counted and
    left out of the means."""
    pytest.importorskip("matplotlib")
    cfg = replace(TINY, arms=("tfixup", "postln_nowarmup"), seeds=(1, 2), steps=10)
    run_study(cfg, tmp_path, log=lambda _: None)
    diverged = record_path(tmp_path, RunSpec("postln_nowarmup", 2, 1e-3, 2))
    record = json.loads(diverged.read_text())
    diverged.write_text(json.dumps({**record, "diverged_at": 7, "held_out": {}}))
    text = write_report(tmp_path, figure=tmp_path / "docs" / "fig.png")
    for path in (tmp_path / "encoder_only.md", tmp_path / "encoder_only.png", tmp_path / "docs" / "fig.png"):
        assert path.is_file()
    (tmp_path / "encoder_only.md").unlink()
    (tmp_path / "encoder_only.png").unlink()
    assert write_report(tmp_path) == text and (tmp_path / "encoder_only.png").read_bytes()[:4] == b"\x89PNG"
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| 2 |")}
    assert set(rows) == {"tfixup", "postln_nowarmup"}
    kept = [r["held_out"]["exact_acc"] for r in load_records(tmp_path)
            if r["run"]["arm"] == "postln_nowarmup" and r["diverged_at"] is None]  # fmt: skip
    assert len(kept) == 1
    assert "| 2 | 1 |" in rows["postln_nowarmup"] and f"{kept[0]:.3f} ± 0.000" in rows["postln_nowarmup"]
    assert "| 2 | 0 |" in rows["tfixup"]


def test_the_spread_is_the_mean_and_half_the_range_over_seeds() -> None:
    """fp32 CPU (nothing runs): two seeds at 0.5 and 0.7 read 0.600 ± 0.100; one seed has no spread."""
    assert spread([0.5, 0.7]) == "0.600 ± 0.100" and spread([0.25]) == "0.250 ± 0.000"


def test_the_config_refuses_what_it_cannot_run() -> None:
    """fp32 CPU (nothing runs): an unknown arm, a width the heads do not divide, a zero budget."""
    for bad in ({"arms": ("layernorm",)}, {"d_model": 30}, {"steps": 0}):
        with pytest.raises(ValueError):
            StudyConfig(**bad)
    assert len(planned_runs(StudyConfig())) == len(ARMS) * 2 * 2 * 2
