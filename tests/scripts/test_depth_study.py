"""scripts/depth_study.py: the output-change probe is exact and harmless, and a micro study writes its table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from tests.conftest import load_script
from tfx.config import DataConfig
from tfx.train import Trainer


@pytest.fixture(scope="module")
def ds() -> ModuleType:
    return load_script("depth_study")


def micro_settings(ds: ModuleType, out: Path) -> object:
    data = DataConfig(
        source="toy", name="toy", toy_train_size=300, toy_valid_size=12, toy_test_size=4, vocab_size=64,
        cache_dir=str(out / "cache"), max_tokens=120,
    )  # fmt: skip
    return ds.StudySettings(
        out=out, data=data, depths=[1, 3], configs=["tfixup", "xavier"], updates=6, d_model=16, ffn_dim=32,
        heads=4, jobs=1, threads=1, probe_updates=4, probe_sentences=4, valid_max_sentences=2, device="cpu",
    )  # fmt: skip


def test_rms_change_ignores_padding(ds: ModuleType) -> None:
    old = torch.zeros(2, 3, 5)
    new = torch.full((2, 3, 5), 0.5)
    new[1, 2] = 1e6  # a padded position: must not count
    keep = torch.tensor([[True, True, True], [True, True, False]])
    assert ds.rms_change(new, old, keep) == pytest.approx(0.5)


def test_divergence_labels(ds: ModuleType) -> None:
    def result(losses: list[float], stopped: bool = False) -> object:
        return ds.RunResult("r", "tfixup", 6, losses, [0.1], [0.1], stopped, 0, 1.0, 1.0, 1.0)

    assert result([8.0] + [5.0] * 12).diverged == "no"
    assert result([5.0] + [6.0] * 12).diverged == "loss rose"
    assert result([8.0, math.nan]).diverged == "non-finite"
    assert result([8.0, 7.0], stopped=True).diverged == "non-finite"
    assert result([8.0] * 12).final_loss == 8.0
    assert math.isnan(ds.finite_max([0.1, math.inf])) and ds.finite_max([0.1, 0.3]) == 0.3


def test_initial_model_is_the_trainers(ds: ModuleType, tmp_path: Path) -> None:
    """The probe's θ_0 comes from a replica; it must equal the weights the trainer starts from."""
    settings = micro_settings(ds, tmp_path)
    cfg = ds.build_config(settings, "tfixup", 3)
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        replica = ds.initial_model(cfg, trainer.corpus.tokenizer.vocab_size)
        theirs = trainer.model.state_dict()
        for name, value in replica.state_dict().items():
            torch.testing.assert_close(value, theirs[name], rtol=0, atol=0, msg=name)
    finally:
        trainer.logger.close()


def test_probe_skips_steps_that_did_not_update(ds: ModuleType) -> None:
    """A skipped (non-finite) step leaves θ and the step counter alone: no loss, no Δf recorded."""
    model = torch.nn.Linear(2, 2)  # stands in for the Transformer: called as model(src, prev)
    model.forward = lambda src, prev: src.float()[..., None].expand(-1, -1, 3) * prev.float()[..., None]
    batch = SimpleNamespace(
        src_tokens=torch.ones(1, 2), prev_output_tokens=torch.ones(1, 2), target=torch.tensor([[5, 1]]),
    )  # fmt: skip
    batch.to = lambda device: batch
    logged = []
    trainer = SimpleNamespace(
        model=model, device=torch.device("cpu"), state=SimpleNamespace(step=0),
        logger=SimpleNamespace(scalars=lambda values, step: logged.append(step)),
    )  # fmt: skip
    probe = ds.OutputProbe(batch, torch.zeros(1, 2, 3), max_updates=5)
    trainer.state.step = 1
    probe(trainer, {"train/loss": 7.0})
    probe(trainer, {"train/loss": math.nan})  # skipped: step still 1
    assert probe.losses == [7.0] and probe.skipped == 1 and logged == [1]
    assert probe.output_change == [pytest.approx(1.0)]
    assert model.training  # the probe restores the mode it found


def test_micro_study_writes_table_plot_and_json(ds: ModuleType, tmp_path: Path) -> None:
    settings = micro_settings(ds, tmp_path / "study")
    results = ds.run_study(settings)
    assert len(results) == 4
    md = (tmp_path / "study" / "depth_study.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| tfixup") or line.startswith("| xavier")]
    assert [row.split("|")[1:3] for row in rows] == [
        [" tfixup ", " 1 "], [" tfixup ", " 3 "], [" xavier ", " 1 "], [" xavier ", " 3 "],
    ]  # fmt: skip
    tfixup = {r.depth: r for r in results if r.config == "tfixup"}
    for r in tfixup.values():
        assert len(r.losses) == 6 and len(r.output_change) == 4 and r.diverged == "no"
        assert 0 < r.max_output_change < 10 and math.isfinite(r.valid_loss)
    assert (tmp_path / "study" / "depth_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ds.main(["--out", str(tmp_path / "study"), "--replot"]) == 0  # from the JSON alone
    assert (tmp_path / "study" / "depth_study.md").read_text() == md
    saved = json.loads((tmp_path / "study" / "depth_study.json").read_text())
    assert {r["name"] for r in saved["runs"]} == {"tfixup_N1", "tfixup_N3", "xavier_N1", "xavier_N3"}
    runs = tmp_path / "study" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["tfixup_N1", "tfixup_N3", "xavier_N1", "xavier_N3"]
    assert all(not (p / "checkpoints").exists() and any((p / "tb").iterdir()) for p in runs.iterdir())


def test_no_run_starts_after_an_interrupt(ds: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that saw SIGINT/SIGTERM refuses queued runs instead of training them."""
    settings = micro_settings(ds, tmp_path)
    spec = ds.plan_runs(settings)[0]
    monkeypatch.setattr(ds, "_interrupted", True)
    with pytest.raises(ds.StudyInterrupted, match="not started"):
        ds.run_one(spec)
    assert not spec.run_dir.exists()
