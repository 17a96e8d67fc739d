"""Joint sentencepiece vocabulary: fixed special ids, training with a content-hash cache.

One model covers both languages so that ``share_all_embeddings`` is possible. The special ids are
fixed (fairseq's dictionary order) so that the model, the batcher and the decoder agree on them
without consulting the tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from tfx.data.cache import load_or_build
from tfx.data.errors import DataError

log = logging.getLogger(__name__)

PAD = 0  # padding; never a target the loss counts
UNK = 1  # piece not in the vocabulary
BOS = 2  # first decoder input (prev_output_tokens start with it)
EOS = 3  # ends every source and target sequence

SPECIAL_IDS = {"pad_id": PAD, "unk_id": UNK, "bos_id": BOS, "eos_id": EOS}


def num_threads(requested: int = 0) -> int:
    """``requested`` threads, or every core this process may use when 0."""
    return requested if requested > 0 else len(os.sched_getaffinity(0))


class Tokenizer:
    """A sentencepiece model with tfx's special ids, serializable into a checkpoint."""

    def __init__(self, model_bytes: bytes) -> None:
        self._proto = model_bytes
        self.sp = spm.SentencePieceProcessor(model_proto=model_bytes)
        found = {
            "pad_id": self.sp.pad_id(),
            "unk_id": self.sp.unk_id(),
            "bos_id": self.sp.bos_id(),
            "eos_id": self.sp.eos_id(),
        }
        if found != SPECIAL_IDS:
            raise DataError(
                f"sentencepiece model has special ids {found}, tfx needs {SPECIAL_IDS}: "
                "retrain it with tfx (delete it from data.cache_dir)"
            )

    @classmethod
    def from_bytes(cls, model_bytes: bytes) -> Tokenizer:
        """Rebuild from ``model_bytes`` (e.g. stored in a checkpoint)."""
        return cls(model_bytes)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a ``.model`` file written by sentencepiece."""
        return cls(Path(path).read_bytes())

    @property
    def model_bytes(self) -> bytes:
        """The serialized model proto: everything needed to rebuild this tokenizer."""
        return self._proto

    @functools.cached_property
    def fingerprint(self) -> str:
        """Short sha256 of the model: part of the cache key of everything it encoded."""
        return hashlib.sha256(self._proto).hexdigest()[:16]

    @property
    def vocab_size(self) -> int:
        """Number of pieces, specials included (the embedding table's row count)."""
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text``, without BOS/EOS."""
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str], threads: int = 0) -> list[list[int]]:
        """Piece ids of many texts, encoded on ``threads`` threads (0 = all cores)."""
        return self.sp.encode(list(texts), out_type=int, num_threads=num_threads(threads))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS; PAD and BOS are skipped (a decoder's raw output)."""
        if hasattr(ids, "tolist"):  # numpy array or torch tensor
            ids = ids.tolist()
        pieces: list[int] = []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                pieces.append(int(i))
        return self.sp.decode(pieces)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """``decode`` for each sequence."""
        return [self.decode(ids) for ids in batch]


def check_vocab(tokenizer: Tokenizer, expected_size: int, where: str) -> None:
    """Refuse a tokenizer whose size differs from a checkpoint's embedding table (``where`` names it)."""
    if tokenizer.vocab_size != expected_size:
        raise DataError(
            f"{where}: sentencepiece vocabulary has {tokenizer.vocab_size} pieces but the checkpoint was "
            f"trained with {expected_size}: use the tokenizer stored in the checkpoint, or the same "
            "data settings (data.vocab_size, data.spm_model_type, corpus) it was trained with"
        )


def text_digest(*parts: Iterable[str], settings: dict | None = None) -> str:
    """Short sha256 of ``settings`` and the texts: the cache key of anything derived from them."""
    h = hashlib.sha256(json.dumps(settings or {}, sort_keys=True).encode())
    for texts in parts:
        h.update(b"\x00")  # part separator: ("a", "b") and ("a\nb",) hash differently
        h.update("\n".join(texts).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def ensure_cache_dir(cache_dir: str | Path) -> Path:
    """Create the cache folder with a ``.gitignore`` of ``*`` (as pytest does), so it is never committed."""
    path = Path(cache_dir)
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# created by tfx.data: cached sentencepiece models and encoded corpora\n*\n")
    return path


def train_tokenizer(
    sentences: Callable[[], Iterable[str]],
    inputs: dict[str, str],
    langs: Sequence[str],
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    cache_dir: str | Path = "data/cache",
    name: str = "corpus",
    threads: int = 0,
) -> Tokenizer:
    """Train (or reuse from the cache) a joint model on ``sentences()``, the training texts of both languages.

    ``inputs`` names what ``sentences`` yields (the texts' digests, how they were sampled) and is the cache key
    with the settings, so De->En and En->De runs on the same files share one model and the texts are read only
    when the model is not cached. ``hard_vocab_limit=False`` makes ``vocab_size`` an upper bound: a tiny
    corpus (the toy task) gets as many pieces as it has instead of an error.
    """
    settings = {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "coverage": character_coverage,
        "specials": SPECIAL_IDS,
        "spm": spm.__version__,
        "inputs": inputs,
    }
    key = text_digest(settings=settings)
    path = ensure_cache_dir(cache_dir) / f"spm-{name}-{'-'.join(langs)}-{key}.model"

    def build() -> Tokenizer:
        tokenizer = Tokenizer(_train_spm(sentences(), vocab_size, model_type, character_coverage, threads, name))
        log.info("trained sentencepiece %s model, %d pieces: %s", model_type, tokenizer.vocab_size, path)
        return tokenizer

    return load_or_build(path, build, lambda tokenizer: tokenizer.model_bytes, Tokenizer)


def _train_spm(
    sentences: Iterable[str], vocab_size: int, model_type: str, character_coverage: float, threads: int, name: str
) -> bytes:
    """The serialized model sentencepiece trains on ``sentences`` with tfx's special ids."""
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=writer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            hard_vocab_limit=False,
            num_threads=num_threads(threads),
            minloglevel=2,
            **SPECIAL_IDS,
        )
    except RuntimeError as err:  # sentencepiece reports bad settings as RuntimeError("INTERNAL: ...")
        raise DataError(
            f"sentencepiece training on {name} failed ({str(err).strip()}): "
            "check data.vocab_size and the training texts"
        ) from err
    return writer.getvalue()
