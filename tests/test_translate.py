"""``python -m tfx.translate`` on a real (tiny, untrained) checkpoint with a real sentencepiece model.

``write_checkpoint`` is shared with test_average.py and test_evaluate.py.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from tfx import translate
from tfx.checkpoint import atomic_save, build_from_checkpoint, load_checkpoint
from tfx.config import Config, DataConfig, ModelConfig
from tfx.data import PAD, Tokenizer
from tfx.decode import translate_sentences
from tfx.model import build_model

REPO = Path(__file__).resolve().parents[1]
WORDS = ["ein", "hund", "katze", "läuft", "schnell", "über", "die", "wiese", "und", "a", "dog", "cat", "runs", "fast"]
SENTENCES = ["Ein Hund läuft.", "Die Katze", "", "ein roter Hund läuft schnell über die Wiese und weiter", "x"]


def synthetic_text(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))).capitalize() + "." for _ in range(n)]


@functools.lru_cache(maxsize=1)
def spm_model_bytes() -> bytes:
    """A ~100-piece BPE model with tfx's special ids, trained once per test session."""
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(synthetic_text(300)), model_writer=writer, vocab_size=100, model_type="bpe",
        hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2, num_threads=1,
    )  # fmt: skip
    return writer.getvalue()


def tiny_config(data: DataConfig | None = None, d_model: int = 32) -> dict:
    model = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=d_model, ffn_dim=2 * d_model, heads=4, dropout=0.0)
    return dataclasses.asdict(Config(data=data or DataConfig(), model=model))


def write_checkpoint(
    path: Path, seed: int = 0, config: dict | None = None, step: int = 100, spm_bytes: bytes | None = None
) -> Path:
    """A checkpoint with the keys tfx.checkpoint documents, holding a random tiny model."""
    config = config or tiny_config()
    tokenizer = Tokenizer.from_bytes(spm_bytes or spm_model_bytes())
    torch.manual_seed(seed)
    model = build_model(config["model"], tokenizer.vocab_size, PAD)
    ckpt = {
        "model": model.state_dict(),
        "optimizer": {"state": {}, "param_groups": []},
        "step": step,
        "epoch": 1,
        "config": config,
        "spm_model": tokenizer.model_bytes,
        "vocab_size": tokenizer.vocab_size,
    }
    atomic_save(ckpt, path)
    return path


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tfx.translate", *args], input=stdin, capture_output=True, text=True, env=env
    )


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "ckpt.pt")


def reference_translations(checkpoint: Path, sentences: list[str], beam: int) -> list[str]:
    model, tokenizer, _ = build_from_checkpoint(load_checkpoint(checkpoint))
    return [translate_sentences(model, tokenizer, [s], beam=beam)[0] for s in sentences]


def test_file_to_file_one_line_per_input_in_order(checkpoint: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "hyp.txt"
    assert translate.main([str(checkpoint), "--input", str(src), "--output", str(out), "--beam", "3", "--quiet"]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(SENTENCES)
    assert lines[:-1] == reference_translations(checkpoint, SENTENCES, beam=3)
    assert [p.name for p in out.parent.iterdir()] == ["hyp.txt"]  # no temp file left behind


def test_stdin_to_stdout(checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(SENTENCES[:2]) + "\n"))
    assert translate.main([str(checkpoint), "--beam", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == reference_translations(checkpoint, SENTENCES[:2], beam=1)


def test_corrupt_checkpoint_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    result = run_cli(str(bad), stdin="Hallo\n")
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error:") and "bad.pt" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("problem", ["missing checkpoint", "missing input", "vocabulary mismatch", "not tfx"])
def test_errors_are_one_line(problem: str, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = [str(checkpoint), "--input", str(tmp_path / "nowhere.txt")]
    if problem == "missing checkpoint":
        args[0] = str(tmp_path / "nowhere.pt")
    elif problem == "vocabulary mismatch":
        ckpt = load_checkpoint(checkpoint)
        ckpt["vocab_size"] += 1
        atomic_save(ckpt, checkpoint)
    elif problem == "not tfx":
        atomic_save({"model": {}, "config": {"model": {"no_such_field": 1}}}, checkpoint)
    assert translate.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
