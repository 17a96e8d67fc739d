"""Data pipeline: parallel text (toy / local files / HF hub) -> joint sentencepiece ids -> batches.

``prepare_data`` gives a ``Corpus`` of ``EncodedSplit``s; ``make_batches`` plans an epoch as lists
of indices; ``collate`` pads one of them into a ``Batch``. Bad input raises ``DataError`` with a
one-line message meant to be printed as is.
"""

from tfx.data.batching import Batch, collate, make_batches
from tfx.data.corpus import Corpus, EncodedSplit, prepare_data
from tfx.data.errors import DataError
from tfx.data.sources import read_parallel_text
from tfx.data.vocab import BOS, EOS, PAD, UNK, Tokenizer, check_vocab

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "UNK",
    "Batch",
    "Corpus",
    "DataError",
    "EncodedSplit",
    "Tokenizer",
    "check_vocab",
    "collate",
    "make_batches",
    "prepare_data",
    "read_parallel_text",
]
