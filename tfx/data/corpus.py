"""``prepare_data``: raw text -> joint sentencepiece vocabulary -> cached token stores -> filtered splits.

Everything expensive is cached under ``cfg.cache_dir`` by a hash of its inputs: the sentencepiece
model by the training texts' digests and settings, each encoded (split, language) by the model and
the text's digest. A warm start stats the files (``tfx.data.stream``), maps the stores and reads the
raw text of valid/test only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tfx.config import DataConfig
from tfx.data.encoding import load_or_encode
from tfx.data.errors import DataError
from tfx.data.sources import check_split, split_sides
from tfx.data.store import MAGIC as STORE_FORMAT
from tfx.data.store import TokenStore
from tfx.data.stream import DigestMemo, TextSide
from tfx.data.vocab import Tokenizer, ensure_cache_dir, text_digest, train_tokenizer

log = logging.getLogger(__name__)


@dataclass
class EncodedSplit:
    """Aligned id sequences (each ending with EOS) and, for valid/test, the raw sentences they came from.

    ``src``/``tgt`` are any sequences of id arrays: a memory-mapped ``TokenStore`` (or a ``Rows`` view of one)
    from ``prepare_data``, lists in tests. The training split keeps no raw text (``None``): at WMT size that
    text is gigabytes of Python strings, and nothing reads it.
    """

    src: Sequence[np.ndarray]
    tgt: Sequence[np.ndarray]
    src_text: list[str] | None = None  # references for BLEU, inputs for translation output
    tgt_text: list[str] | None = None
    src_sizes: np.ndarray = field(init=False, repr=False)  # len(src[i]), for batching and filtering
    tgt_sizes: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        texts = [len(t) for t in (self.src_text, self.tgt_text) if t is not None]
        if len(self.src) != len(self.tgt) or any(n != len(self.src) for n in texts):
            raise ValueError("EncodedSplit: src, tgt, src_text and tgt_text must have equal lengths")
        self.src_sizes, self.tgt_sizes = sizes_of(self.src), sizes_of(self.tgt)

    def __len__(self) -> int:
        return len(self.src)

    def subset(self, keep: np.ndarray) -> EncodedSplit:
        """The examples at positions ``keep`` (an index array), in that order: views, nothing copied."""
        texts = [None if t is None else [t[i] for i in keep] for t in (self.src_text, self.tgt_text)]
        return EncodedSplit(Rows(self.src, keep), Rows(self.tgt, keep), *texts)


def sizes_of(sentences: Sequence[np.ndarray]) -> np.ndarray:
    """Each sentence's length: a store's eager sizes (int32: 18 MB a side at 4.5M pairs), or counted."""
    sizes = getattr(sentences, "sizes", None)
    if sizes is not None:
        return sizes
    return np.fromiter((len(x) for x in sentences), dtype=np.int64, count=len(sentences))


class Rows(Sequence):
    """The sentences of ``base`` at ``index``: the filtered training split, without copying a token."""

    def __init__(self, base: Sequence[np.ndarray], index: np.ndarray) -> None:
        if isinstance(base, Rows):  # a subset of a subset indexes the first base directly
            base, index = base.base, base.index[index]
        self.base, self.index = base, np.asarray(index, dtype=np.int64)
        self.sizes = sizes_of(base)[self.index]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):  # noqa: ANN001 - one index, as Sequence declares it
        return self.base[int(self.index[i])]


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
    memo = DigestMemo(ensure_cache_dir(cfg.cache_dir))
    sides = {split: split_sides(cfg, split, seed, memo) for split in splits}
    if tokenizer is None and "train" not in sides:
        sides["train"] = split_sides(cfg, "train", seed, memo)  # only to train (or find) the vocabulary
    for split, (src, _) in sides.items():
        if not src.lines:
            raise DataError(f"split {split} of {cfg.name} ({cfg.source}) has no sentences: check its files")
    if cfg.tokenized:
        heads = {split: (src.head(CASE_CHECK_LINES), tgt.head(CASE_CHECK_LINES)) for split, (src, tgt) in sides.items()}
        check_lowercased(heads, cfg.src_lang, cfg.tgt_lang)
    if tokenizer is None:
        tokenizer = vocabulary(cfg, *sides["train"])
    encoded = {}
    for split in splits:
        src, tgt = sides[split]
        texts = (None, None) if split == "train" else (src.read_all(), tgt.read_all())
        data = EncodedSplit(encode_cached(tokenizer, src, cfg), encode_cached(tokenizer, tgt, cfg), *texts)
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


SAMPLE_SEED = 1  # which lines a sampled vocabulary trains on; part of its cache key


def vocabulary(cfg: DataConfig, src: TextSide, tgt: TextSide) -> Tokenizer:
    """The joint sentencepiece model of the training split: trained on every sentence, or, past
    ``data.spm_sample_sentences``, on the same randomly drawn lines of both sides (logged)."""
    by_lang = dict(sorted({cfg.src_lang: src, cfg.tgt_lang: tgt}.items()))
    sides = list(by_lang.values())
    total = sum(side.lines for side in sides)
    picks = None
    if 0 < cfg.spm_sample_sentences < total:
        per_side = max(cfg.spm_sample_sentences // len(sides), 1)
        rng = np.random.default_rng(SAMPLE_SEED)
        picks = np.sort(rng.choice(src.lines, size=min(per_side, src.lines), replace=False))
        log.info(
            "sentencepiece trains on %d of the %d training sentences (the same %d lines of each side; "
            "data.spm_sample_sentences=%d)",
            len(picks) * len(sides),
            total,
            len(picks),
            cfg.spm_sample_sentences,
        )
    inputs = {lang: side.digest for lang, side in by_lang.items()}
    inputs["sample"] = "all" if picks is None else f"{len(picks)} lines, seed {SAMPLE_SEED}"
    return train_tokenizer(
        lambda: sampled_lines(sides, picks),
        inputs,
        list(by_lang),
        cfg.vocab_size,
        cfg.spm_model_type,
        cfg.spm_character_coverage,
        cfg.cache_dir,
        cfg.name,
        cfg.num_workers,
    )


def sampled_lines(sides: list[TextSide], picks: np.ndarray | None) -> Iterator[str]:
    """The lines of each side in turn: all of them, or those at the sorted positions ``picks``."""
    for side in sides:
        done = 0
        for lines in side.line_chunks():
            if picks is None:
                yield from lines
            else:
                lo, hi = np.searchsorted(picks, (done, done + len(lines)))
                yield from (lines[i - done] for i in picks[lo:hi].tolist())
            done += len(lines)


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


def encode_cached(tokenizer: Tokenizer, side: TextSide, cfg: DataConfig) -> TokenStore:
    """Ids of every line of ``side`` + EOS, memory-mapped from the cache when this model has encoded this text
    before (``tfx.data.store``; a damaged entry is rebuilt)."""
    settings = {"tokenizer": tokenizer.fingerprint, "text": side.digest, "format": STORE_FORMAT.decode()}
    key = text_digest(settings=settings)
    path = ensure_cache_dir(cfg.cache_dir) / f"enc-{cfg.name}-{key}.tok"
    return load_or_encode(path, side, tokenizer, cfg.num_workers)


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
