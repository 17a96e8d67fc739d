"""Checkpoint averaging: the mean of the parameters, refusal of different models, "last N" by step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.checkpoint_helpers import spm_model_bytes, synthetic_text, tiny_config, write_checkpoint
from tfx.checkpoints.load import CheckpointError, build_from_checkpoint, load_checkpoint
from tfx.checkpoints.numbered import last_checkpoints
from tfx.config import DataConfig
from tfx.evaluation import average
from tfx.evaluation.average import average_checkpoints, best_window


def test_average_is_the_mean_and_drops_optimizer_state(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.pt", seed=0, step=100)
    b = write_checkpoint(tmp_path / "b.pt", seed=1, step=200)
    avg = average_checkpoints([a, b])
    ma, mb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert avg["model"].keys() == ma.keys()
    for key, value in avg["model"].items():
        torch.testing.assert_close(value, (ma[key].double() + mb[key].double()).div(2).to(value.dtype))
        assert value.dtype == ma[key].dtype
    assert "optimizer" not in avg and avg["step"] == 200
    assert avg["config"] == load_checkpoint(a)["config"] and avg["spm_model"] == load_checkpoint(a)["spm_model"]
    build_from_checkpoint(avg)  # loadable as a model


def test_cli_writes_a_loadable_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = [str(write_checkpoint(tmp_path / f"{i}.pt", seed=i)) for i in range(3)]
    out = tmp_path / "avg.pt"
    assert average.main(["--inputs", *paths, "--output", str(out)]) == 0
    assert "averaged 3 checkpoints" in capsys.readouterr().out
    assert len(load_checkpoint(out)["averaged_from"]) == 3


def spm_of_other_text() -> bytes:
    import io

    import sentencepiece as spm

    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(synthetic_text(300, seed=7)[::-1] + ["zzz qqq"]), model_writer=writer,
        vocab_size=100, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2, num_threads=1,
    )  # fmt: skip
    return writer.getvalue()


@pytest.mark.parametrize("difference", ["model config", "sentencepiece model"])
def test_refuses_different_models(difference: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = write_checkpoint(tmp_path / "a.pt")
    if difference == "model config":
        b = write_checkpoint(tmp_path / "b.pt", config=tiny_config(d_model=16))
    else:
        other = spm_of_other_text()
        assert other != spm_model_bytes()
        b = write_checkpoint(tmp_path / "b.pt", spm_bytes=other)
    with pytest.raises(CheckpointError, match=r"a\.pt and .*b\.pt"):
        average_checkpoints([a, b])
    assert average.main(["--inputs", str(a), str(b), "--output", str(tmp_path / "avg.pt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot average") and err.count("\n") == 1
    assert not (tmp_path / "avg.pt").exists()


def make_run(tmp_path: Path) -> Path:
    """A run folder whose numbered checkpoints sort differently by name and by step (epochs of 100 updates)."""
    ckpts = tmp_path / "run" / "checkpoints"
    for i, (epoch, step) in enumerate([(2, 200), (10, 1000), (9, 900), (1, 100)]):
        write_checkpoint(ckpts / f"checkpoint_{epoch}_{step}.pt", seed=i, step=step)
    write_checkpoint(ckpts / "checkpoint_last.pt", seed=1, step=1000)
    write_checkpoint(ckpts / "checkpoint_best.pt", seed=2, step=900)
    return tmp_path / "run"


def test_last_n_means_highest_steps(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    assert [p.name for p in last_checkpoints(run, 2)] == ["checkpoint_9_900.pt", "checkpoint_10_1000.pt"]
    assert [p.name for p in last_checkpoints(run / "checkpoints", 1)] == ["checkpoint_10_1000.pt"]
    assert len(last_checkpoints(run, 5)) == 4  # fewer than asked: all there are (tests/evaluation/test_average_cli.py)
    out = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(run), "--last", "3", "--output", str(out)]) == 0
    assert [Path(p).name for p in load_checkpoint(out)["averaged_from"]] == [
        "checkpoint_2_200.pt",
        "checkpoint_9_900.pt",
        "checkpoint_10_1000.pt",
    ]


def numbered_run(tmp_path: Path, n: int, config: dict | None = None) -> list[Path]:
    ckpts = tmp_path / "run" / "checkpoints"
    return [
        write_checkpoint(ckpts / f"checkpoint_{e}_{100 * e}.pt", seed=e, step=100 * e, config=config)
        for e in range(1, n + 1)
    ]


KEY = "encoder.embedding.embed.weight"


def test_best_window_picks_the_highest_scoring_average(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = numbered_run(tmp_path, 6)

    def score(ckpt: dict) -> float:
        return float(ckpt["model"][KEY].sum())

    expected = {i: score(average_checkpoints(paths[i : i + 3])) for i in range(4)}
    loads = []
    real_load = average.load_checkpoint
    monkeypatch.setattr(average, "load_checkpoint", lambda p: loads.append(Path(p).name) or real_load(p))
    best, results = best_window(paths, 3, score)
    assert sorted(loads) == sorted(p.name for p in paths)  # each checkpoint read once
    assert [w for w, _ in results] == [paths[i : i + 3] for i in range(4)]
    assert [v for _, v in results] == pytest.approx(list(expected.values()))
    top = max(expected, key=expected.get)
    assert [Path(p) for p in best["averaged_from"]] == paths[top : top + 3]
    torch.testing.assert_close(best["model"][KEY], average_checkpoints(paths[top : top + 3])["model"][KEY])
    assert len(best["window_scores"]) == 4
    # --candidates 2: only the windows ending in the last two checkpoints; ties go to the earlier window
    best, results = best_window(paths, 3, lambda c: 1.0, candidates=2)
    assert [w for w, _ in results] == [paths[2:5], paths[3:6]]
    assert [Path(p) for p in best["averaged_from"]] == paths[2:5]
    with pytest.raises(CheckpointError, match="6 checkpoints to average"):
        best_window(paths, 7, score)


@pytest.mark.slow
def test_best_window_cli_decodes_the_valid_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """End to end on CPU: every window's average translates the run's (toy) valid split and is scored."""
    data = DataConfig(
        source="toy", toy_train_size=50, toy_test_size=4, toy_valid_size=4, cache_dir=str(tmp_path / "cache")
    )
    numbered_run(tmp_path, 3, config=tiny_config(data))
    out = tmp_path / "avg.pt"
    args = ["--run-dir", str(tmp_path / "run"), "--best-window", "2", "--output", str(out), "--beam", "1"]
    assert average.main([*args, "--device", "cpu", "--tok-bleu"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("valid score") == 2 and "averaged 2 checkpoints" in captured.out
    saved = load_checkpoint(out)
    assert len(saved["window_scores"]) == 2 and len(saved["averaged_from"]) == 2
    assert average.main(["--run-dir", str(tmp_path / "run"), "--best-window", "4", "--output", str(out)]) == 1
    assert capsys.readouterr().err.startswith("error: 3 checkpoints to average: cannot choose a window of 4")
