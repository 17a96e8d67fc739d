"""One language of one split as a stream of chunks, with a content digest and a line count.

Preparation reads a corpus in chunks and never holds it as Python strings: a local file is read in blocks
cut at line ends (the bytes go to the encoding workers as they are), a hub split in slices of its Arrow
table, the toy task from its lists. The digest (sha256 of the file bytes, or the dataset's fingerprint) is
the cache key of everything derived from the side; for files it is remembered by (path, size, mtime, inode)
in ``data.cache_dir/digests.json``, so a warm start stats the files instead of reading them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tfx.data.errors import DataError
from tfx.data.vocab import text_digest

log = logging.getLogger(__name__)

BLOCK_BYTES = 8 * 2**20  # bytes per chunk of a file: ~60k lines of WMT text
SLICE_ROWS = 50_000  # rows per chunk of a hub split or a list
Chunk = bytes | list[str]  # newline-terminated UTF-8 lines, or lines


@dataclass(frozen=True)
class TextSide:
    """Where one side's lines come from (``where``, for messages), their ``digest`` and count, and its chunks."""

    where: str
    digest: str
    lines: int
    chunks: Callable[[], Iterator[Chunk]]

    def line_chunks(self) -> Iterator[list[str]]:
        """Each chunk's lines as strings; a ``NotUtf8`` counts its line from the side's start."""
        done = 0
        for chunk in self.chunks():
            try:
                lines = chunk_lines(chunk, self.where)
            except NotUtf8 as err:
                raise NotUtf8(self.where, done + err.line) from None
            done += len(lines)
            yield lines

    def read_all(self) -> list[str]:
        """Every line as a string: for valid/test (references), never for a training corpus."""
        return [line for lines in self.line_chunks() for line in lines]

    def head(self, n: int) -> list[str]:
        """The first ``n`` lines (or all there are)."""
        out: list[str] = []
        for lines in self.line_chunks():
            out.extend(lines[: n - len(out)])
            if len(out) >= n:
                break
        return out


class NotUtf8(DataError):
    """A chunk that is not UTF-8: ``line`` counts from the chunk's start until the reader adds what came before."""

    def __init__(self, where: str, line: int) -> None:
        super().__init__(where, line)  # the args pickle, so a worker process can raise it to the reader
        self.where, self.line = where, line

    def __str__(self) -> str:
        fix = "re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        return f"{self.where}: invalid UTF-8 at line {self.line}: {fix}"


def chunk_lines(chunk: Chunk, where: str = "") -> list[str]:
    """The lines of a chunk, a whole file (``tfx.data.sources.read_lines``) or standard input (``tfx.translate``):
    ``\\n`` only, ``\\r`` dropped; ``NotUtf8``, naming ``where`` and the line, for bytes that do not decode."""
    if isinstance(chunk, list):
        return chunk
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError as err:
        raise NotUtf8(where, chunk.count(b"\n", 0, err.start) + 1) from err
    lines = text.split("\n")  # not splitlines(): it also breaks at U+2028, \x1c, ... and would misalign sides
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# --- files ------------------------------------------------------------------------------------


def _open(path: Path):  # noqa: ANN202 - a binary file object
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def file_blocks(path: Path) -> Iterator[bytes]:
    """``path``'s (decompressed) bytes in blocks that end at a line end; the last may not."""
    rest = b""
    try:
        with _open(path) as f:
            while block := f.read(BLOCK_BYTES):
                block = rest + block
                cut = block.rfind(b"\n") + 1
                rest = block[cut:]
                if cut:
                    yield block[:cut]
    except (OSError, EOFError) as err:  # gzip's BadGzipFile is an OSError, without an errno
        if isinstance(err, OSError) and err.errno is not None:
            raise  # the machine's failure (the file vanished, a disk error): tfx.files.environment says so
        raise DataError(f"{path}: not a valid gzip file ({err}); re-create or gunzip it") from err
    if rest:
        yield rest


def count_and_hash(path: Path) -> tuple[str, int]:
    """sha256 of the file's bytes as stored, and its line count (of the decompressed text); one read of a
    plain file."""
    h = hashlib.sha256()
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(BLOCK_BYTES):
            h.update(block)
            if path.suffix != ".gz":
                lines, last = lines + block.count(b"\n"), block[-1:]
    if path.suffix == ".gz":
        for block in file_blocks(path):
            lines, last = lines + block.count(b"\n"), block[-1:]
    return h.hexdigest()[:16], lines + (last != b"\n")


class DigestMemo:
    """File digests remembered by (path, size, mtime, inode), as ``make`` and ``git status`` trust them."""

    def __init__(self, cache_dir: str | Path | None) -> None:
        self.path = Path(cache_dir) / "digests.json" if cache_dir else None
        self.entries: dict = {}
        if self.path is not None and self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text())
            except (ValueError, OSError):
                self.entries = {}  # derived data: rebuilt from the files

    def digest(self, path: Path) -> tuple[str, int]:
        stat = path.stat()
        key = str(path.resolve())
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self.entries.get(key)
        if isinstance(entry, dict) and entry.get("stamp") == stamp:
            return entry["digest"], entry["lines"]
        digest, lines = count_and_hash(path)
        self.entries[key] = {"stamp": stamp, "digest": digest, "lines": lines}
        self._save()
        return digest, lines

    def _save(self) -> None:
        if self.path is None:
            return
        from tfx.files.atomic import atomic_open

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.path, "w") as f:
            json.dump(self.entries, f)


def file_side(path: Path, memo: DigestMemo) -> TextSide:
    digest, lines = memo.digest(path)
    return TextSide(str(path), digest, lines, lambda: file_blocks(path))


# --- in-memory lists and hub tables -------------------------------------------------------------


def list_side(lines: list[str], where: str) -> TextSide:
    """A side already in memory (the toy task, small test corpora)."""

    def chunks() -> Iterator[Chunk]:
        for start in range(0, len(lines), SLICE_ROWS):
            yield lines[start : start + SLICE_ROWS]

    return TextSide(where, text_digest(lines), len(lines), chunks)


def column_side(table, column: str, fingerprint: str, where: str) -> TextSide:  # noqa: ANN001 - a pyarrow Table
    """A column of an Arrow table (memory-mapped by ``datasets``), read a slice at a time."""

    def chunks() -> Iterator[Chunk]:
        for start in range(0, table.num_rows, SLICE_ROWS):
            yield [s or "" for s in table.slice(start, SLICE_ROWS).column(column).to_pylist()]

    digest = hashlib.sha256(f"{fingerprint}\0{column}".encode()).hexdigest()[:16]
    return TextSide(where, digest, table.num_rows, chunks)
