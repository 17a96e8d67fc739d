"""Entries of ``data.cache_dir``: derived bytes that carry their own sha256, rebuilt when they do not verify.

A cache file can be cut short or damaged outside tfx's atomic writes (a copy to a shared
filesystem, a full disk, an older tfx's file). Each entry is its payload, then ``MARK``, then the
payload's sha256: an entry that is short, mismatched or does not parse is logged in one line and
rebuilt, and the run goes on. Writes go through ``atomic_open`` (a unique temp name, then a
rename), so ranks or runs that rebuild one entry at the same time each leave a whole file; the
last rename wins, and every reader sees one complete entry or none.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tfx.files.atomic import atomic_open

log = logging.getLogger(__name__)

T = TypeVar("T")
MARK = b"\0tfx-cache-sha256:"
DIGEST_BYTES = 32


class DamagedEntry(ValueError):
    """A cache entry that does not verify; the message says why (one line)."""


def seal(payload: bytes) -> bytes:
    """``payload`` framed for the cache: it, ``MARK``, and its sha256."""
    return payload + MARK + hashlib.sha256(payload).digest()


def unseal(blob: bytes) -> bytes:
    """The payload of a sealed entry; ``DamagedEntry`` when it is cut short or does not match its hash."""
    tail = len(MARK) + DIGEST_BYTES
    if len(blob) < tail or blob[-tail:-DIGEST_BYTES] != MARK:
        raise DamagedEntry("cut short, or written without a content hash")
    payload, digest = blob[:-tail], blob[-DIGEST_BYTES:]
    if hashlib.sha256(payload).digest() != digest:
        raise DamagedEntry("its content does not match its sha256")
    return payload


def load_or_build(path: Path, build: Callable[[], T], dump: Callable[[T], bytes], parse: Callable[[bytes], T]) -> T:
    """The entry at ``path`` if it verifies and parses, else ``build()`` written there (atomically).

    ``dump``/``parse`` turn the value into bytes and back; any failure of ``parse`` counts as damage.
    """
    if path.exists():
        try:
            value = parse(unseal(path.read_bytes()))
        except Exception as err:  # noqa: BLE001 - whatever fails to load, the cure is the same: rebuild
            log.warning("cache entry %s does not load (%s): rebuilding it", path, _reason(err))
        else:
            log.debug("from the cache: %s", path)
            return value
    value = build()
    with atomic_open(path) as f:
        f.write(seal(dump(value)))
    return value


def _reason(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
