"""Checkpoints for CLI tests: a random tiny model plus a real sentencepiece model, in tfx's format."""

from __future__ import annotations

import dataclasses
import functools
import io
import random
from pathlib import Path

import sentencepiece as spm
import torch

from tfx.config import Config, DataConfig, ModelConfig
from tfx.data import PAD, Tokenizer
from tfx.files.atomic import atomic_save
from tfx.model import build_model

REPO = Path(__file__).resolve().parents[1]
WORDS = ["ein", "hund", "katze", "läuft", "schnell", "über", "die", "wiese", "und", "a", "dog", "cat", "runs", "fast"]


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
    """A checkpoint with the keys tfx.checkpoints.load documents, holding a random tiny model."""
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
