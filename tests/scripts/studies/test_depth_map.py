"""scripts/studies/depth_map.py: the plan it prints, a study end to end on a stand-in trainer (retries, stage 2 from the
recorded stage 1, resume, --replot), and one real tiny run on toy data (slow). Only the slow test builds a model (fp32,
CPU, one thread); the others run a stand-in or nothing, so no precision or device is involved."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script
from tfx.studies import depth_map
from tfx.studies.depth_cells import Cell, summarize

# The stand-in for tfx.train: reads its overrides, writes the metrics a run of that fate would, and logs the call.
# BLEU: tfixup 20, postln 10, preln 15, minus depth / 10; postln stuck at N = 48 at its chosen setting (its retry
# trains); preln diverges at N = 24 both times; a file named STOP in the out folder makes one run stop unfinished.
FAKE_TRAIN = r"""
import json, sys
from pathlib import Path
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
run = Path(args["hydra.run.dir"]); method = args["method"]; depth = int(args["model.encoder_layers"])
retry = "optim.lr" in args
out = run.parent.parent
with open(out / "calls.log", "a") as f:
    f.write(run.name + "\n")
run.mkdir(parents=True, exist_ok=True)
bleu = {"tfixup": 20.0, "postln": 10.0, "preln": 15.0}[method] - depth / 10
status, valids = "completed", [bleu / 2, bleu]
if method == "postln" and depth == 48 and not retry:
    valids = [0.1, 0.2]
if method == "preln" and depth == 24:
    status, valids = "diverged", []
try:
    (out / "STOP").unlink()  # one of the two runs at once takes it
    status, valids = "stopped by SIGTERM", valids[:1]
except FileNotFoundError:
    pass
records = [{"event": "update", "step": 1, "epoch": 1, "train/loss": 8.0}]
records += [{"event": "valid", "step": i + 1, "valid/loss": 6.0, "valid/bleu": b} for i, b in enumerate(valids)]
records.append({"event": "end", "step": 1, "status": status, "train_seconds": 1.5})
(run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
(run / "checkpoints").mkdir(exist_ok=True)
(run / "checkpoints" / "checkpoint_best.pt").write_text("weights")
"""
FAKE_DECODE = r"""
import json, sys
from pathlib import Path
hyp = Path(sys.argv[sys.argv.index("--output") + 1])
hyp.parent.mkdir(parents=True, exist_ok=True)
hyp.with_name("best_test.bleu.json").write_text(json.dumps({"scores": [{"score": 12.5}]}))
"""


@pytest.fixture(scope="module")
def dm() -> ModuleType:
    return load_script("studies/depth_map")


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """tfx.train and tfx.evaluate replaced by FAKE_TRAIN / FAKE_DECODE, still under tfx.studies.peak_memory."""
    real = depth_map.train_command

    def train_command(out: Path, cell: Cell, shared: list[str]) -> list[str]:
        cmd = real(out, cell, shared)
        at = cmd.index("tfx.train")
        return [*cmd[: at - 1], "-c", FAKE_TRAIN, *cmd[at + 1 :]]

    monkeypatch.setattr(depth_map, "train_command", train_command)

    def decode_command(run: Path, beam: int) -> list[str]:
        return [sys.executable, "-c", FAKE_DECODE, "--output", str(run / "test" / "x.hyp")]

    monkeypatch.setattr(depth_map, "decode_command", decode_command)


def calls(out: Path) -> list[str]:
    return (out / "calls.log").read_text().split() if (out / "calls.log").exists() else []


def test_dry_run_prints_each_cell_its_retry_and_the_composed_settings(
    dm: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The plan, composed as tfx.train would compose it (no training: no precision or device is used)."""
    assert dm.main(["--out", str(tmp_path), "--dry-run", "--methods", "tfixup", "postln", "--depths", "6", "48"]) == 0
    text = capsys.readouterr().out
    assert "tfixup_N6: method=tfixup model.encoder_layers=6 model.decoder_layers=6 | 0.0005 / 0.3 / 0 (tuned)" in text
    assert "postln_N48_retry: 0.0005 / 0.1 / 1000 (retry): docs/converged.md '12+12 on CPU'" in text
    assert "composed postln_N6_retry: norm=post init=xavier lr=0.0005 dropout=0.1 warmup=1000 d=128 ffn=512" in text
    assert "composed tfixup_N6: norm=none init=tfixup lr=0.0005 dropout=0.3 warmup=0" in text
    assert "4 stage-1 cells" in text and "train.max_epochs=2" in text and "train.precision=fp32" in text
    assert not (tmp_path / "study.json").exists()


def test_bad_arguments_are_one_line_errors(dm: ModuleType, capsys: pytest.CaptureFixture) -> None:
    for argv, message in ((["--methods", "nosuch"], "unknown method nosuch"), (["--epochs", "0"], "--epochs must be")):
        with pytest.raises(SystemExit):
            dm.parse_args(argv)
        assert message in capsys.readouterr().err


def test_a_study_retries_failures_chooses_stage2_from_its_records_resumes_and_replots(
    dm: ModuleType, tmp_path: Path, stand_in: None
) -> None:
    """On the stand-in trainer (no model: no precision or device): stage 1 with retries, stage 2 chosen from the
    recorded N = 48 cells, a second invocation trains only the cell left unfinished, --replot redraws."""
    out = tmp_path / "study"
    argv = ["--out", str(out), "--methods", "tfixup", "postln", "preln", "--depths", "24", "48",
            "--deep-depths", "100", "--others", "1", "--jobs", "2", "data=toy"]  # fmt: skip
    (out).mkdir()
    (out / "STOP").touch()  # the first run stops unfinished, as a SIGTERM leaves it
    assert dm.main(argv) != 0  # a stage-1 cell without its outcome: no stage 2
    first = calls(out)
    assert first[0] in ("tfixup_N24", "postln_N24") and len(first) == 8  # 6 cells, 2 retries
    assert sorted(n for n in first if n.endswith("_retry")) == ["postln_N48_retry", "preln_N24_retry"]
    assert json.loads((out / "study.json").read_text())["stage2"] is None
    stopped = next(n for n in first if summarize(out / "runs" / n)["outcome"] == "unfinished")

    assert dm.main(argv) == 0
    second = calls(out)[len(first) :]
    # the stopped cell again (its retry too, where its fate fails), then stage 2: preln trained best at 48 of the
    # others (15 - 4.8 against postln's retry 10 - 4.8)
    assert second[0] == stopped and set(second[-2:]) == {"tfixup_N100", "preln_N100"}
    assert json.loads((out / "study.json").read_text())["stage2"] == ["tfixup", "preln"]
    row = summarize(out / "runs" / "preln_N100")
    assert (row["outcome"], row["test_bleu"], row["s_per_update"]) == ("trained", 12.5, 1.5)
    assert row["peak_mb"] > 0 and row["wall_seconds"] > 0  # tfx.studies.peak_memory's session record
    assert math.isnan(summarize(out / "runs" / "preln_N24_retry")["test_bleu"])  # diverged: not decoded

    assert dm.main(argv) == 0  # everything ended: nothing trains, nothing decodes
    assert len(calls(out)) == len(first) + len(second)

    table = (out / "depth_map.md").read_text()
    (out / "depth_map.md").unlink()
    (out / "depth_map.png").unlink()
    assert dm.main([*argv, "--replot"]) == 0
    assert (out / "depth_map.md").read_text() == table and (out / "depth_map.png").stat().st_size > 1000
    assert "| preln | D — (retry) | T 10.20 | T 5.00 |" in table  # the map: one cell per depth
    assert "| postln | 48 | 0.0005 / 0.1 / 1000 (retry) | trained | 2.60 5.20 | 5.20 | 12.50 | 1.50 |" in table
    assert "| preln | 24 | 0.0005 / 0.3 / 0 (tuned) | diverged | — | — | — | 1.50 |" in table
    assert "Stage 2 methods: tfixup, preln." in table


def test_replot_without_a_study_is_one_line(dm: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert dm.main(["--out", str(tmp_path), "--replot"]) == 2
    assert "run the study first" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_a_real_tiny_map_on_toy_data(dm: ModuleType, tmp_path: Path) -> None:
    """Two real tfx.train cells (toy data, d 128, N = 1 and 2, 1 epoch of ~10 updates, fp32, CPU, one thread) and
    their greedy test decode: every column of the table comes from the runs themselves."""
    tiny = ["data=toy", "data.toy_train_size=200", "data.toy_valid_size=8", "data.toy_test_size=8",
            "data.vocab_size=64", "data.max_tokens=512", "train.device=cpu"]  # fmt: skip
    out = tmp_path / "map"
    argv = ["--out", str(out), "--methods", "tfixup", "--depths", "1", "2", "--deep-depths", "3", "--until",
            "stage1", "--epochs", "1", *tiny]  # fmt: skip
    assert dm.main(argv) == 0
    for n in (1, 2):
        row = summarize(out / "runs" / f"tfixup_N{n}")
        assert row["outcome"] in ("trained", "stuck") and len(row["valid_bleu"]) == 1 and row["updates"] > 0
        assert row["s_per_update"] > 0 and row["peak_mb"] > 100
        assert (out / "runs" / f"tfixup_N{n}" / "tb").is_dir()
    assert (out / "depth_map.png").exists() and "| tfixup | 1 |" in (out / "depth_map.md").read_text()
