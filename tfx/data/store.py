"""Encoded sentences as one file: a flat token array and its offsets, memory-mapped, shared by every rank.

A corpus of millions of pairs held as one numpy array per sentence costs gigabytes of heap in every process;
as a file it costs the page cache once per machine, however many ranks map it (fairseq's ``MMapIndexedDataset``
does the same). Layout, little-endian, in the order it is written::

    tokens uint16|int32[T] | zero pad to 8 | offsets int64[n + 1] | header JSON | header length uint64 | MAGIC
    | MARK | sha256 of everything before MARK

Tokens come first so that they stream to disk (and into the hash) as the encoders return them: nothing is
copied or read back. The trailing hash makes the file self-verifying like every other cache entry
(``tfx.data.cache``): a file that is cut short or damaged is rebuilt. Sizes (what batching needs) are read
eagerly; the tokens stay on disk, in the page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfx.data.cache import DIGEST_BYTES, MARK, DamagedEntry

MAGIC = b"TFXTOKENS2"
TAIL = 8 + len(MAGIC) + len(MARK) + DIGEST_BYTES  # header length, MAGIC, MARK, sha256
READ_BLOCK = 16 * 2**20


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (halves the file and the page cache), else int32."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<i4")


def _pad8(nbytes: int) -> int:
    return -nbytes % 8


class TokenStore(Sequence):
    """Read side: ``store[i]`` is sentence ``i``'s ids as int32 (read from the mapped file), ``sizes`` their
    lengths; ``tokens`` is the whole mapped array."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        n, ntokens, dtype, tokens_bytes = self._read_header()
        if verify:
            check_digest(self.path, self.path.stat().st_size - len(MARK) - DIGEST_BYTES)
        offsets_at = tokens_bytes + _pad8(tokens_bytes)
        # mapped too: ranks share its pages (8 bytes a sentence: 36 MB a side at 4.5M pairs)
        self.offsets = np.memmap(self.path, dtype="<i8", mode="r", offset=offsets_at, shape=(n + 1,)).view(np.ndarray)
        if self.offsets[0] != 0 or self.offsets[-1] != ntokens:
            raise DamagedEntry("its offsets do not describe its tokens")
        if (np.diff(self.offsets) < 0).any():
            raise DamagedEntry("its offsets go backwards")
        self.tokens = np.zeros(0, dtype)  # an empty region cannot be mapped
        if ntokens:
            mapped = np.memmap(self.path, dtype=dtype, mode="r", shape=(ntokens,))
            self.tokens = mapped.view(np.ndarray)  # a plain view slices in ~0.2 us, a memmap in several
        self.sizes = np.diff(self.offsets).astype(np.int32)

    def _read_header(self) -> tuple[int, int, np.dtype, int]:
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            f.seek(max(size - TAIL, 0))
            tail = f.read(TAIL)
            if len(tail) < TAIL or tail[8 : 8 + len(MAGIC)] != MAGIC or tail[8 + len(MAGIC) : -DIGEST_BYTES] != MARK:
                raise DamagedEntry("cut short, or not a tfx token store")
            (header_len,) = struct.unpack("<Q", tail[:8])
            f.seek(max(size - TAIL - header_len, 0))
            try:
                header = json.loads(f.read(header_len))
                n, ntokens, dtype = int(header["sentences"]), int(header["tokens"]), np.dtype(header["dtype"])
            except (ValueError, KeyError, TypeError) as err:
                raise DamagedEntry(f"its header does not parse ({err})") from err
        tokens_bytes = ntokens * dtype.itemsize
        expected = tokens_bytes + _pad8(tokens_bytes) + 8 * (n + 1) + header_len + TAIL
        if size != expected:
            raise DamagedEntry(f"{size} bytes, not the {expected} its header describes")
        return n, ntokens, dtype, tokens_bytes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i):  # noqa: ANN001 - int, as Sequence declares it
        if not isinstance(i, int | np.integer):
            raise TypeError("TokenStore takes one sentence index at a time")
        return self.tokens[self.offsets[i] : self.offsets[i + 1]].astype(np.int32)  # a small copy, as torch wants


def check_digest(path: Path, body: int) -> None:
    """Hash the first ``body`` bytes of ``path`` by reading (not mapping) it, so the check adds nothing to RSS."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = body
        while left:
            block = f.read(min(READ_BLOCK, left))
            if not block:
                raise DamagedEntry("cut short")
            h.update(block)
            left -= len(block)
        if f.read(len(MARK)) != MARK or f.read(DIGEST_BYTES) != h.digest():
            raise DamagedEntry("its content does not match its sha256")


class StoreWriter:
    """Append encoded chunks, then ``finish()``: the store appears at ``path`` whole, or not at all.

    Tokens go straight into the (temporary, then renamed) file and the hash as they come, so a corpus is never
    held in memory; the lengths (8 bytes a sentence) are kept until the end, where offsets and header follow.
    """

    def __init__(self, path: str | Path, dtype: np.dtype) -> None:
        from tfx.files.atomic import atomic_open

        self.path, self.dtype = Path(path), np.dtype(dtype).newbyteorder("<")
        self._exit = contextlib.ExitStack()
        self._file = self._exit.enter_context(atomic_open(self.path))
        self._hash = hashlib.sha256()
        self._lengths: list[np.ndarray] = []
        self._ntokens = 0

    def _write(self, data: bytes) -> None:
        self._hash.update(data)
        self._file.write(data)

    def append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Sentences whose ids, concatenated, are ``tokens`` and whose lengths are ``lengths``."""
        if int(lengths.sum()) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens for lengths summing to {int(lengths.sum())}")
        self._write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int64))
        self._ntokens += len(tokens)

    def finish(self) -> TokenStore:
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        header = json.dumps({"sentences": len(lengths), "tokens": self._ntokens, "dtype": self.dtype.str}).encode()
        self._write(b"\0" * _pad8(self._ntokens * self.dtype.itemsize))
        for part in (offsets.tobytes(), header, struct.pack("<Q", len(header)), MAGIC):
            self._write(part)
        self._file.write(MARK + self._hash.digest())
        self._exit.close()  # fsync and rename into place
        return TokenStore(self.path, verify=False)

    def abandon(self) -> None:
        """Drop the partial file (whatever stopped the encoding): ``path`` keeps what it held before."""
        with contextlib.suppress(_Abandoned):
            self._exit.__exit__(_Abandoned, _Abandoned(), None)


class _Abandoned(Exception):
    """Thrown into the atomic write so that it removes its temporary file."""
