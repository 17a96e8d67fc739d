"""``prepare_data``: raw text -> joint sentencepiece vocabulary -> cached id arrays -> filtered splits.

Everything expensive is cached under ``cfg.cache_dir`` by a hash of its inputs: the sentencepiece
model by the training texts and settings, each encoded (split, language) by the model and texts.
A warm start therefore only reads and hashes the text.
"""

from __future__ import annotations

import io
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tfx.config import DataConfig
from tfx.data.cache import load_or_build
from tfx.data.errors import DataError
from tfx.data.sources import check_split, load_split
from tfx.data.vocab import EOS, Tokenizer, ensure_cache_dir, text_digest, train_tokenizer

log = logging.getLogger(__name__)


@dataclass
class EncodedSplit:
    """Aligned id sequences (each ending with EOS) and the raw sentences they came from."""

    src: list[np.ndarray]  # int32 piece ids + EOS, one array per sentence
    tgt: list[np.ndarray]
    src_text: list[str]  # raw sentences: references for BLEU, inputs for translation output
    tgt_text: list[str]
    src_sizes: np.ndarray = field(init=False, repr=False)  # len(src[i]), for batching and filtering
    tgt_sizes: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (len(self.src) == len(self.tgt) == len(self.src_text) == len(self.tgt_text)):
            raise ValueError("EncodedSplit: src, tgt, src_text and tgt_text must have equal lengths")
        self.src_sizes = np.array([len(x) for x in self.src], dtype=np.int64)
        self.tgt_sizes = np.array([len(x) for x in self.tgt], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.src)

    def subset(self, keep: np.ndarray) -> EncodedSplit:
        """The examples at positions ``keep`` (an index array), in that order."""
        return EncodedSplit(
            [self.src[i] for i in keep],
            [self.tgt[i] for i in keep],
            [self.src_text[i] for i in keep],
            [self.tgt_text[i] for i in keep],
        )


@dataclass
class Corpus:
    """A tokenizer and the encoded splits that were asked for."""

    tokenizer: Tokenizer
    splits: dict[str, EncodedSplit]
    src_lang: str
    tgt_lang: str


def prepare_data(
    cfg: DataConfig,
    seed: int = 1,
    splits: Sequence[str] = ("train", "valid", "test"),
    tokenizer: Tokenizer | None = None,
) -> Corpus:
    """Load, tokenize (cached) and filter ``splits``; ``seed`` only matters for the toy source.

    Pass the ``tokenizer`` stored in a checkpoint to encode valid/test for decoding without reading
    the training split; otherwise a joint model is trained (or found in the cache) on train.
    Length filtering applies to train only, so BLEU on valid/test covers every sentence.
    """
    for split in splits:
        check_split(split)
    texts = {split: load_split(cfg, split, seed) for split in splits}
    if tokenizer is None and "train" not in texts:
        texts["train"] = load_split(cfg, "train", seed)  # only to train (or find) the vocabulary
    for split, (src_text, _) in texts.items():
        if not src_text:
            raise DataError(f"split {split} of {cfg.name} ({cfg.source}) has no sentences: check its files")
    if cfg.tokenized:
        check_lowercased(texts, cfg.src_lang, cfg.tgt_lang)
    if tokenizer is None:
        train = texts["train"]
        tokenizer = train_tokenizer(
            {cfg.src_lang: train[0], cfg.tgt_lang: train[1]},
            cfg.vocab_size,
            cfg.spm_model_type,
            cfg.spm_character_coverage,
            cfg.cache_dir,
            cfg.name,
            cfg.num_workers,
        )
    encoded = {}
    for split in splits:
        src_text, tgt_text = texts[split]
        data = EncodedSplit(
            encode_cached(tokenizer, src_text, cfg), encode_cached(tokenizer, tgt_text, cfg), src_text, tgt_text
        )
        if split == "train":
            data = filter_train(data, cfg)
            if len(data) == 0:
                raise DataError(
                    f"split train of {cfg.name} is empty after length filtering: check "
                    "data.max_source_positions / data.max_target_positions / data.max_len_ratio"
                )
        log.info(
            "%s %s: %d pairs, %d/%d tokens (%s->%s)",
            cfg.name,
            split,
            len(data),
            data.src_sizes.sum(),
            data.tgt_sizes.sum(),
            cfg.src_lang,
            cfg.tgt_lang,
        )
        encoded[split] = data
    return Corpus(tokenizer, encoded, cfg.src_lang, cfg.tgt_lang)


CASE_CHECK_LINES = 1000  # lines per file that check_lowercased reads: raw text has capitals within a few


def check_lowercased(texts: dict[str, tuple[list[str], list[str]]], src_lang: str, tgt_lang: str) -> None:
    """Refuse raw text under ``data.tokenized``, which promises lowercased, Moses-tokenized files.

    Raw files there train without complaint, and the run then scores cased text as if it were the tokenized
    text published numbers were computed on (``+experiment=multi30k_tiny`` pointed at the raw Multi30k).
    """
    for split, sides in texts.items():
        for lang, lines in zip((src_lang, tgt_lang), sides, strict=True):
            cased = sum(line != line.lower() for line in lines[:CASE_CHECK_LINES])
            if cased:
                raise DataError(
                    f"data.tokenized=true, but split {split} ({lang}) is not lowercased ({cased} of its first "
                    f"{min(len(lines), CASE_CHECK_LINES)} lines have capitals): tokenize it first "
                    "(python -m tfx.data.pretokenize RAW_DIR OUT_DIR for Multi30k) or set data.tokenized=false"
                )


def encode_cached(tokenizer: Tokenizer, texts: list[str], cfg: DataConfig) -> list[np.ndarray]:
    """Ids of ``texts`` + EOS, from the cache when this model has encoded these texts before.

    Stored as one flat int32 array plus offsets (``.npz``); sentences are views into it.
    """
    key = text_digest(texts, settings={"tokenizer": tokenizer.fingerprint})
    path = ensure_cache_dir(cfg.cache_dir) / f"enc-{cfg.name}-{key}.npz"
    tokens, offsets = load_or_build(
        path,
        lambda: flatten_with_eos(tokenizer.encode_batch(texts, cfg.num_workers)),
        _npz_bytes,
        lambda blob: _flat_ids(blob, len(texts)),
    )
    return np.split(tokens, offsets[1:-1]) if len(texts) else []


def _npz_bytes(flat: tuple[np.ndarray, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, tokens=flat[0], offsets=flat[1])
    return buffer.getvalue()


def _flat_ids(blob: bytes, n_texts: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets) from ``_npz_bytes``; a ValueError unless they describe ``n_texts`` sentences."""
    with np.load(io.BytesIO(blob)) as cached:
        tokens, offsets = cached["tokens"], cached["offsets"]
    if len(offsets) != n_texts + 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
        raise ValueError(f"{len(offsets) - 1} sentences / {len(tokens)} tokens, not {n_texts} sentences")
    return tokens, offsets


def flatten_with_eos(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """One int32 array of every sequence with EOS appended, and the n+1 start offsets."""
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(itertools.chain(x, (EOS,)) for x in ids)
    return np.fromiter(flat, dtype=np.int32, count=int(offsets[-1])), offsets


def filter_train(data: EncodedSplit, cfg: DataConfig) -> EncodedSplit:
    """Drop training pairs that are too long, too unbalanced, or empty on one side (logged)."""
    src, tgt = data.src_sizes, data.tgt_sizes
    too_long = (src > cfg.max_source_positions) | (tgt > cfg.max_target_positions)
    ratio = np.maximum(src, tgt) / np.minimum(src, tgt)  # sizes include EOS, so never 0
    unbalanced = ~too_long & (ratio > cfg.max_len_ratio)
    empty = ~too_long & ~unbalanced & ((src <= 1) | (tgt <= 1))  # only EOS: an empty line on one side
    keep = ~(too_long | unbalanced | empty)
    if not keep.all():
        log.info(
            "train filter dropped %d of %d pairs: %d longer than %d/%d tokens, %d with length ratio > %g, "
            "%d with an empty side",
            (~keep).sum(),
            len(keep),
            too_long.sum(),
            cfg.max_source_positions,
            cfg.max_target_positions,
            unbalanced.sum(),
            cfg.max_len_ratio,
            empty.sum(),
        )
        return data.subset(np.flatnonzero(keep))
    return data
