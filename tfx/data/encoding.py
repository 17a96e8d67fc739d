"""A side of text -> its token store: chunks encoded by sentencepiece in worker processes, written as they come.

The reader hands each chunk (newline-aligned bytes, or lines) to a pool of ``data.num_workers`` processes and
writes the results in order, with a few chunks in flight, so memory stays flat whatever the corpus size.
Small sides (valid, test, Multi30k) are encoded in this process with sentencepiece's own threads: starting
workers would cost more than it saves. Either way a sentence's ids are ``Tokenizer.encode`` plus EOS.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np
import sentencepiece as spm

from tfx.data.cache import DamagedEntry
from tfx.data.store import StoreWriter, TokenStore, token_dtype
from tfx.data.stream import NotUtf8, TextSide, chunk_lines
from tfx.data.vocab import EOS, Tokenizer, num_threads
from tfx.data.word_cache import encode_by_word
from tfx.files.environment import writing

log = logging.getLogger(__name__)

PARALLEL_MIN_LINES = 200_000  # below this, worker start-up costs more than the pool saves
IN_FLIGHT = 2  # chunks queued per worker: enough to keep it busy, few enough to keep memory flat


def load_or_encode(path: Path, side: TextSide, tokenizer: Tokenizer, workers: int = 0) -> TokenStore:
    """The store at ``path`` if it verifies, else ``side`` encoded into it (a damaged one is logged and rebuilt)."""
    if path.exists():
        try:
            return TokenStore(path)
        except (DamagedEntry, OSError, ValueError) as err:
            log.warning("cache entry %s does not load (%s): rebuilding it", path, err)
    return encode_side(side, tokenizer, path, workers)


def encode_side(side: TextSide, tokenizer: Tokenizer, path: Path, workers: int = 0) -> TokenStore:
    """Encode every line of ``side`` (ids + EOS) into a new store at ``path``."""
    workers, dtype = num_threads(workers), token_dtype(tokenizer.vocab_size)
    writer = StoreWriter(path, dtype)
    with writing(path):  # a full disk's error names the store: its writes go to an open file, which names none
        try:
            if workers > 1 and side.lines >= PARALLEL_MIN_LINES:
                pieces = _encode_in_pool(side, tokenizer, workers, dtype)
            else:
                pieces = (
                    flatten_with_eos(tokenizer.encode_batch(lines, workers), dtype) for lines in side.line_chunks()
                )
            for tokens, lengths in pieces:
                writer.append(tokens, lengths)
            store = writer.finish()
        except BaseException:
            writer.abandon()  # the partial file goes; the store at ``path``, if any, stays as it was
            raise
    log.info("encoded %s: %d sentences, %d tokens -> %s", side.where, len(store), len(store.tokens), path)
    return store


def _encode_in_pool(
    side: TextSide, tokenizer: Tokenizer, workers: int, dtype: np.dtype
):  # -> Iterator[(tokens, lengths)]
    """Encoded chunks in order, from ``workers`` processes with at most ``IN_FLIGHT`` chunks each queued."""
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pending: collections.deque[Future] = collections.deque()
    done_lines = 0
    with ProcessPoolExecutor(workers, context, initializer=_start_worker, initargs=(tokenizer.model_bytes,)) as pool:
        try:
            for chunk in itertools.chain(side.chunks(), [None]):
                if chunk is not None:
                    pending.append(pool.submit(_encode_chunk, chunk, side.where, dtype))
                while pending and (chunk is None or len(pending) >= IN_FLIGHT * workers):
                    try:
                        tokens, lengths = pending.popleft().result()
                    except NotUtf8 as err:
                        raise NotUtf8(side.where, done_lines + err.line) from None
                    done_lines += len(lengths)
                    yield tokens, lengths
        finally:
            for future in pending:
                future.cancel()


_worker_processor: spm.SentencePieceProcessor | None = None


def _start_worker(model_bytes: bytes) -> None:
    global _worker_processor
    _worker_processor = spm.SentencePieceProcessor(model_proto=model_bytes)


def _encode_chunk(chunk: bytes | list[str], where: str, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """A worker's chunk: through the word cache (``tfx.data.word_cache``), or whole lines where it declines."""
    assert _worker_processor is not None, "the pool's initializer loads the tokenizer"
    by_word = None
    with contextlib.suppress(UnicodeEncodeError):  # a hub slice as file bytes, unless a string is not UTF-8
        if isinstance(chunk, bytes) or (chunk and not any("\n" in line for line in chunk)):
            as_bytes = chunk if isinstance(chunk, bytes) else ("\n".join(chunk) + "\n").encode("utf-8")
            by_word = encode_by_word(_worker_processor, as_bytes)
    if by_word is not None:
        return by_word[0].astype(dtype), by_word[1]
    ids = _worker_processor.encode(chunk_lines(chunk, where), out_type=int, num_threads=1)
    return flatten_with_eos(ids, dtype)


def flatten_with_eos(ids: list[list[int]], dtype: np.dtype | type = np.int32) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence with EOS appended (in place), as one array, and each one's length (EOS included)."""
    for x in ids:
        x.append(EOS)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum())), lengths
