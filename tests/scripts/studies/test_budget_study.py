"""scripts/studies/budget_study.py: every arm is the run it claims on the Multi30k budget, rows from the run folders."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script
from tests.data.helpers import write_text_corpus
from tfx.config import compose_config
from tfx.studies.arms import write_arms


@pytest.fixture(scope="module")
def bs() -> ModuleType:
    return load_script("studies/budget_study")


# arm -> (model.norm, init.name, warmup updates, offset decay after the warmup)
EXPECTED = {
    "tfixup": ("none", "tfixup", 0, False),
    "postln": ("post", "xavier", 100, False),
    "postln_tfixup_lr": ("post", "xavier", 100, True),
    "preln": ("pre", "xavier", 0, False),
    "deepnorm": ("deepnorm", "deepnorm", 100, False),
    "admin": ("admin", "admin", 100, False),
    "xavier_noln": ("none", "xavier", 0, False),
    "dyt": ("dyt", "xavier", 100, False),
    "rezero": ("rezero", "xavier", 0, False),
    "fixup": ("fixup", "fixup", 100, False),
}


def test_every_arm_is_its_method_on_the_multi30k_budget(bs: ModuleType, tmp_path: Path) -> None:
    assert list(EXPECTED) == bs.DEFAULT_ARMS
    args = bs.parse_args(["--out", str(tmp_path)])
    write_arms(tmp_path / "arms", bs.DEFAULT_ARMS)  # what multirun writes first
    overrides = bs.run_overrides(args)
    for arm, (norm, init, warmup, offset_decay) in EXPECTED.items():
        search = f"hydra.searchpath=[file://{tmp_path / 'arms'}]"
        cfg = compose_config([search, overrides[0], f"+arm={arm}", *overrides[1:]])
        assert (cfg.model.norm, cfg.init.name, cfg.optim.warmup_updates, cfg.optim.offset_decay) == (
            norm, init, warmup, offset_decay,
        )  # fmt: skip
        assert (cfg.data.name, cfg.data.local_dir, cfg.data.max_tokens) == ("multi30k", str(args.data_dir), 2048)
        assert (cfg.model.encoder_layers, cfg.model.decoder_layers, cfg.model.d_model) == (3, 3, 256)
        assert (cfg.optim.name, cfg.optim.lr, cfg.train.precision, cfg.train.threads) == ("adam", 5e-4, "fp32", 1)
        assert (cfg.train.max_minutes, cfg.train.validate_every_minutes) == (30.0, 10.0)


def valid(minutes: float, bleu: float) -> dict:
    return {"event": "valid", "step": 1, "valid/train_minutes": minutes, "valid/bleu": bleu}


def test_row_from_metrics_and_test_reports(bs: ModuleType, tmp_path: Path) -> None:
    run = tmp_path / "tfixup"
    (run / "test").mkdir(parents=True)
    records = [{"event": "update", "step": i, "train/loss": float(i)} for i in range(1, 31)]
    # epoch-end validations at 9.4 and 10.7 minutes; the minute schedule's at 10.02, 20.03 and the end, 30.01
    records += [valid(9.4, 5.0), valid(10.02, 6.0), valid(10.7, 7.0), valid(20.03, 8.0), valid(30.01, 9.0)]
    records.append({"event": "end", "step": 30, "status": "completed", "train_seconds": 1800.6})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = {"scores": [{"name": "BLEU", "score": 33.5}, {"name": "chrF2", "score": 60.0}]}
    (run / "test" / "test_2017_flickr.bleu.json").write_text(json.dumps(report))
    row = bs.summarize(run, minutes=30.0)
    assert (row["updates"], row["status"], row["final"]) == (30, "completed", 20.5)  # mean of updates 11..30
    assert row["valid_at"] == [6.0, 8.0, 9.0]
    assert math.isnan(row["test"][0]) and row["test"][1] == 33.5 and math.isnan(row["test"][2])


def test_decodes_only_finished_runs_not_yet_scored(bs: ModuleType, tmp_path: Path) -> None:
    for arm in ("tfixup", "postln"):
        (tmp_path / "runs" / arm / "test").mkdir(parents=True)
    (tmp_path / "runs" / "tfixup" / "checkpoints").mkdir()
    (tmp_path / "runs" / "tfixup" / "checkpoints" / "checkpoint_last.pt").write_bytes(b"x")
    (tmp_path / "runs" / "tfixup" / "test" / "test.bleu.json").write_text("{}")
    cmds = bs.decode_jobs(tmp_path, ["tfixup", "postln"], Path("/data"))
    assert [Path(c[-1]).name for c in cmds] == ["test_2017_flickr.hyp", "test_2018_flickr.hyp"]
    assert cmds[0][cmds[0].index("--src") + 1] == "/data/test_2017_flickr.de"
    assert cmds[0][cmds[0].index("--beam") + 1] == "5"


def test_missing_corpus_is_one_line(bs: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_text_corpus(tmp_path, {"train": [("a", "b")], "valid": [("a", "b")], "test": [("a", "b")]})
    assert bs.main(["--out", str(tmp_path / "out"), "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "test_2017_flickr.de" in err and "--data-dir" in err
    assert not (tmp_path / "out").exists()


def small_corpus(folder: Path) -> Path:
    """Multi30k's file names, a few hundred made-up sentence pairs."""
    who = [("Ein Hund", "A dog"), ("Eine Frau", "A woman"), ("Ein Mann", "A man"), ("Ein Kind", "A child")]
    does = [("läuft", "runs"), ("sitzt", "sits"), ("spielt", "plays"), ("schläft", "sleeps")]
    where = [("im Park", "in the park"), ("am Strand", "on the beach"), ("im Haus", "in the house")]
    pairs = [(f"{a} {b} {c}.", f"{x} {y} {z}.") for (a, x), (b, y), (c, z) in itertools.product(who, does, where)]
    tests = {name: pairs[6:10] for name in ("test", "test_2017_flickr", "test_2018_flickr")}
    splits = {"train": pairs * 4, "valid": pairs[:6], **tests}
    return write_text_corpus(folder, splits)


@pytest.mark.slow
@pytest.mark.fixed_precision
def test_micro_study_trains_decodes_and_replots(
    bs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, data = tmp_path / "study", small_corpus(tmp_path / "data")
    monkeypatch.setattr(bs, "TEST_SETS", bs.TEST_SETS[:1])  # every test set decodes alike; CI's time
    tiny = ["model.d_model=16", "model.ffn_dim=32", "model.heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
            "data.vocab_size=60", "data.max_tokens=256", f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    argv = ["--out", str(out), "--methods", "tfixup", "postln_tfixup_lr", "--data-dir", str(data), "--minutes", "0.03"]
    assert bs.main([*argv, *tiny]) == 0
    for arm in ("tfixup", "postln_tfixup_lr"):
        run = out / "runs" / arm
        assert any((run / "tb").iterdir()) and (run / "checkpoints" / "checkpoint_last.pt").exists()
        for name in bs.TEST_SETS:  # beam-5 hypotheses of the final weights, one per source line, and their score
            assert len((run / "test" / f"{name}.hyp").read_text().splitlines()) == 4
            assert math.isfinite(bs.test_bleu(run / "test" / f"{name}.bleu.json"))
    md = (out / "budget_study.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2:] for line in md.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"tfixup", "postln_tfixup_lr"}
    assert all(int(r[0]) >= 1 and r[1].strip() == "completed" for arm, r in rows.items() if arm != "arm")
    assert (out / "budget_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (out / "budget_study.md").unlink()
    assert bs.main(["--out", str(out), "--replot"]) == 0
    assert (out / "budget_study.md").read_text() == md
