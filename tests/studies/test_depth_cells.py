"""tfx.studies.depth_cells and peak_memory: the depth map's settings, outcome rule on recorded metrics, stage-2 choice,
and the memory wrapper. No model is built (no precision, no device) but in the last test's child, which is plain
Python."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfx.studies import depth_cells as dc
from tfx.studies.peak_memory import run_measured, sessions

SHARED = ["+experiment=multi30k", "model.d_model=128"]


def write_run(
    run: Path,
    bleus: list[float],
    status: str = "completed",
    last_loss: float = 5.0,
    valid_losses: list[float] | None = None,
) -> Path:
    """A run folder whose metrics.jsonl holds 3 updates per epoch, a validation per epoch (valid loss 6.0 unless
    given) and the end record."""
    run.mkdir(parents=True, exist_ok=True)
    records, step = [], 0
    for epoch, (bleu, loss) in enumerate(zip(bleus, valid_losses or [6.0] * len(bleus), strict=True), 1):
        for _ in range(3):
            step += 1
            records.append({"event": "update", "step": step, "epoch": epoch, "train/loss": 8.0})
        records.append({"event": "valid", "step": step, "valid/loss": loss, "valid/bleu": bleu})
    updates = [r for r in records if r["event"] == "update"]
    if updates:
        updates[-1]["train/loss"] = last_loss
    records.append({"event": "end", "step": step, "status": status, "train_seconds": 2.0 * step})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_chosen_settings_come_from_the_multi30k_tuned_block_and_retries_change_only_lr_and_warmup() -> None:
    """Each cell is `method=NAME` at its tuned row; a method without one takes the oc.select defaults; a retry changes
    lr (and warmup where the 12+12 probes say) and nothing else, explicitly."""
    assert dc.cell_setting(dc.Cell(6, "postln")) == (1e-3, 0.1, 400)
    assert dc.cell_setting(dc.Cell(6, "tfixup")) == (5e-4, 0.3, 0)
    assert dc.cell_setting(dc.Cell(6, "tfixup", retry=True)) == (2.5e-4, 0.3, 0)
    assert dc.cell_setting(dc.Cell(6, "postln", retry=True)) == (5e-4, 0.1, 1000)
    assert dc.cell_setting(dc.Cell(6, "admin", retry=True)) == (5e-4, 0.3, 1000)
    assert dc.cell_setting(dc.Cell(6, "dyt", retry=True)) == (5e-4, 0.3, 0)  # DyT: half its tuned 1e-3
    assert dc.cell_setting(dc.Cell(6, "xavier_noln")) == (5e-4, 0.3, 0)  # no row, no warmup in its YAML
    assert dc.chosen_setting("xavier_noln")[3] is False and dc.chosen_setting("rezero")[3] is True
    chosen = dc.cell_overrides(dc.Cell(24, "postln"), SHARED)
    assert chosen == [*SHARED, "method=postln", "model.encoder_layers=24", "model.decoder_layers=24"]
    retry = dc.cell_overrides(dc.Cell(24, "postln", retry=True), SHARED)
    assert retry[len(chosen) :] == ["optim.lr=0.0005", "optim.warmup_updates=1000"]
    deep = dc.cell_overrides(dc.Cell(dc.CHECKPOINT_FROM, "tfixup"), SHARED)
    assert "model.checkpoint_activations=true" in deep
    assert "model.checkpoint_activations=true" not in dc.cell_overrides(dc.Cell(48, "tfixup"), SHARED)
    assert dc.Cell(48, "dyt", retry=True).name == "dyt_N48_retry"


def test_study_methods_takes_derf_only_when_its_yaml_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dc, "METHODS", {m: Path(m) for m in ["tfixup", "postln", "dyt", "fixup"]})
    assert dc.study_methods() == ["tfixup", "postln", "dyt", "fixup"]
    monkeypatch.setitem(dc.METHODS, "derf", Path("derf"))
    assert dc.study_methods() == ["tfixup", "postln", "dyt", "derf", "fixup"]
    with pytest.raises(ValueError, match="unknown method nosuch"):
        dc.study_methods(["tfixup", "nosuch"])


def test_outcome_rule_on_recorded_metrics(tmp_path: Path) -> None:
    """diverged (the trainer's end status, or a non-finite last loss), stuck (best valid BLEU below 5, valid loss
    down less than 0.5 bits over the last epoch), slow (below 5, the loss still falling 0.5 bits or more), trained,
    unfinished (stopped by a signal or no end yet), each from a metrics.jsonl fixture."""
    trained = dc.summarize(write_run(tmp_path / "trained", [2.0, 7.5]))
    assert (trained["outcome"], trained["valid_bleu"], trained["best_valid"]) == ("trained", [2.0, 7.5], 7.5)
    assert (trained["updates"], trained["s_per_update"]) == (6, 2.0)
    assert math.isnan(trained["test_bleu"]) and math.isnan(trained["peak_mb"])  # not decoded, no session record
    assert dc.summarize(write_run(tmp_path / "stuck", [0.3, 4.9]))["outcome"] == "stuck"
    # Post-LN at N = 6 with its 400-update warmup in 474 updates (the depth map, 2026-12-07): leaving the plateau
    assert dc.summarize(write_run(tmp_path / "slow", [1.43, 3.30], valid_losses=[8.23, 7.26]))["outcome"] == "slow"
    assert dc.summarize(write_run(tmp_path / "flat", [1.43, 3.30], valid_losses=[7.62, 7.25]))["outcome"] == "stuck"
    # a resumed run repeats its last validation: each update's first record counts, so this one fell 0.97 bits
    resumed = write_run(tmp_path / "resumed", [1.43, 3.30], valid_losses=[8.23, 7.26])
    with (resumed / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"event": "valid", "step": 6, "valid/loss": 7.26, "valid/bleu": 3.30}) + "\n")
    assert dc.summarize(resumed)["outcome"] == "slow"
    assert dc.summarize(write_run(tmp_path / "one", [3.0], valid_losses=[7.0]))["outcome"] == "stuck"  # no trend
    assert dc.summarize(write_run(tmp_path / "collapsed", [6.0, 0.7]))["outcome"] == "trained"  # best counts
    assert dc.summarize(write_run(tmp_path / "div", [], status="diverged"))["outcome"] == "diverged"
    assert dc.summarize(write_run(tmp_path / "nan", [9.0, 9.0], last_loss=math.nan))["outcome"] == "diverged"
    assert dc.summarize(write_run(tmp_path / "stop", [9.0], status="stopped by SIGTERM"))["outcome"] == "unfinished"
    assert dc.summarize(tmp_path / "never")["outcome"] == "unfinished"
    assert [dc.failed(o) for o in dc.OUTCOMES] == [False, False, True, True, False]  # slow: no retry


def test_stage2_takes_tfixup_and_the_best_trained_at_the_deepest_depth(tmp_path: Path) -> None:
    """The choice reads the recorded N = 48 cells: a failed cell speaks through its retry, only `trained` ranks,
    T-Fixup goes on whatever its outcome, ties fall to the table's order."""
    methods = ["tfixup", "postln", "preln", "admin", "dyt", "rezero"]
    write_run(dc.Cell(48, "tfixup").run(tmp_path), [0.5, 1.0])  # stuck, and no retry yet: still T-Fixup goes on
    write_run(dc.Cell(48, "postln").run(tmp_path), [0.1, 0.2])  # stuck ...
    write_run(dc.Cell(48, "postln", retry=True).run(tmp_path), [5.0, 30.0])  # ... its retry trained best
    write_run(dc.Cell(48, "preln").run(tmp_path), [10.0, 20.0])
    write_run(dc.Cell(48, "admin").run(tmp_path), [5.0, 20.0])  # ties with preln: the table's order
    write_run(dc.Cell(48, "dyt").run(tmp_path), [], status="diverged")
    write_run(dc.Cell(48, "rezero").run(tmp_path), [25.0, 40.0], status="stopped by SIGTERM")  # not ended: no rank
    assert dc.stage2_methods(tmp_path, methods, 48, 3) == ["tfixup", "postln", "preln", "admin"]
    assert dc.stage2_methods(tmp_path, methods, 48, 1) == ["tfixup", "postln"]
    assert dc.stage2_methods(tmp_path, ["preln", "dyt"], 48, 3) == ["preln"]  # no T-Fixup in the study
    assert [dc.settled(tmp_path, m, 48) for m in methods] == [False, True, True, True, False, False]
    assert dc.stage1_cells(["b", "a"], [24, 6]) == [dc.Cell(6, "b"), dc.Cell(6, "a"), dc.Cell(24, "b"),
                                                     dc.Cell(24, "a")]  # fmt: skip


def test_peak_memory_records_each_session_and_passes_sigterm_on(tmp_path: Path) -> None:
    """A child that holds ~60 MB reports at least that; SIGTERM to the wrapper reaches the child, whose status the
    wrapper returns and records. Plain Python children (no torch: no precision or device)."""
    record = tmp_path / "run" / "sessions.jsonl"
    assert (
        run_measured(record, [sys.executable, "-c", "b = bytearray(60 << 20); b[::4096] = b'x' * len(b[::4096])"]) == 0
    )
    assert run_measured(record, [sys.executable, "-c", "raise SystemExit(4)"]) == 4
    first, second = sessions(record)
    assert first["max_rss_mb"] >= 60 and first["wall_seconds"] > 0 and second["returncode"] == 4
    ready = tmp_path / "ready"
    child = (f"import pathlib, signal, time; signal.signal(signal.SIGTERM, lambda *a: exit(3)); "
             f"pathlib.Path({str(ready)!r}).touch(); time.sleep(30)")  # fmt: skip
    cmd = [sys.executable, "-m", "tfx.studies.peak_memory", str(record), "--", sys.executable, "-c", child]
    wrapper = subprocess.Popen(cmd)
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=20) == 3
    assert sessions(record)[-1]["returncode"] == 3
    bad = subprocess.run([sys.executable, "-m", "tfx.studies.peak_memory", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "usage" in bad.stderr
