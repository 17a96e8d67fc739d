"""Checkpoint averaging: the mean of the parameters, refusal of different models, "last N" by step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.checkpoint_helpers import spm_model_bytes, synthetic_text, tiny_config, write_checkpoint
from tfx import average
from tfx.average import average_checkpoints, last_checkpoints
from tfx.checkpoint import CheckpointError, build_from_checkpoint, load_checkpoint


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
    """A run folder whose numbered checkpoints sort differently by name and by step."""
    ckpts = tmp_path / "run" / "checkpoints"
    for i, (epoch, step) in enumerate([(2, 900), (10, 1800), (9, 1700), (1, 450)]):
        write_checkpoint(ckpts / f"checkpoint_{epoch}_{step}.pt", seed=i, step=step)
    write_checkpoint(ckpts / "checkpoint_last.pt", seed=1, step=1800)
    write_checkpoint(ckpts / "checkpoint_best.pt", seed=2, step=1700)
    return tmp_path / "run"


def test_last_n_means_highest_steps(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    assert [p.name for p in last_checkpoints(run, 2)] == ["checkpoint_9_1700.pt", "checkpoint_10_1800.pt"]
    assert [p.name for p in last_checkpoints(run / "checkpoints", 1)] == ["checkpoint_10_1800.pt"]
    with pytest.raises(CheckpointError, match="has 4 numbered"):
        last_checkpoints(run, 5)
    out = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(run), "--last", "3", "--output", str(out)]) == 0
    assert [Path(p).name for p in load_checkpoint(out)["averaged_from"]] == [
        "checkpoint_2_900.pt",
        "checkpoint_9_1700.pt",
        "checkpoint_10_1800.pt",
    ]
