"""Tokenizer: fixed special ids, round trips, serialization, vocabulary checks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.data.helpers import toy_config
from tfx.data import BOS, EOS, PAD, UNK, DataError, Tokenizer, prepare_data
from tfx.data.vocab import check_vocab


@pytest.fixture
def tokenizer(tmp_path) -> Tokenizer:
    return prepare_data(toy_config(tmp_path), splits=("train",)).tokenizer


def test_special_ids_are_fixed(tokenizer):
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    sp = tokenizer.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD, UNK, BOS, EOS)


def test_encode_decode_round_trip_and_specials(tokenizer, tmp_path):
    valid = prepare_data(toy_config(tmp_path), splits=("valid",), tokenizer=tokenizer).splits["valid"]
    text = valid.src_text[0]
    ids = tokenizer.encode(text)
    assert EOS not in ids and BOS not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([BOS, *ids, EOS, 17, PAD]) == text  # stops at EOS, skips BOS/PAD
    assert tokenizer.decode(np.array(ids)) == text
    assert tokenizer.encode_batch([text, text]) == [ids, ids]


def test_model_bytes_round_trip(tokenizer):
    clone = Tokenizer.from_bytes(tokenizer.model_bytes)
    assert clone.vocab_size == tokenizer.vocab_size
    assert clone.encode("meku laso") == tokenizer.encode("meku laso")


def test_vocab_size_is_an_upper_bound_on_tiny_corpora(tmp_path):
    tokenizer = prepare_data(toy_config(tmp_path, vocab_size=8000), splits=("train",)).tokenizer
    assert 4 < tokenizer.vocab_size < 8000


def test_check_vocab_explains_a_mismatch(tokenizer):
    check_vocab(tokenizer, tokenizer.vocab_size, "checkpoint.pt")
    expected = r"checkpoint\.pt: sentencepiece vocabulary has \d+ pieces but .* 9999"
    with pytest.raises(DataError, match=expected):
        check_vocab(tokenizer, 9999, "checkpoint.pt")
