"""The real Multi30k corpus, where ../shared/data is staged (skipped cleanly elsewhere)."""

from __future__ import annotations

import pytest

from tests.data.helpers import SHARED_DATA
from tfx.config import DataConfig
from tfx.data import EOS, collate, make_batches, prepare_data

MULTI30K = SHARED_DATA / "multi30k"


@pytest.fixture
def multi30k_dir():
    if not MULTI30K.is_dir():
        pytest.skip(f"{MULTI30K} is not present on this machine")
    return MULTI30K


def test_multi30k_both_directions(multi30k_dir, tmp_path):
    cfg = DataConfig(
        source="local", name="multi30k", local_dir=str(multi30k_dir), vocab_size=8000, cache_dir=str(tmp_path / "cache")
    )
    corpus = prepare_data(cfg)
    assert {k: len(v) for k, v in corpus.splits.items()} == {"train": 29000, "valid": 1014, "test": 1000}
    assert corpus.tokenizer.vocab_size == 8000
    test = corpus.splits["test"]
    assert all(s[-1] == EOS for s in test.src)
    assert corpus.tokenizer.decode(test.tgt[0]) == test.tgt_text[0]
    valid = corpus.splits["valid"]
    ntokens = sum(collate(valid, b).ntokens for b in make_batches(valid, 4096, shuffle=False))
    assert ntokens == valid.tgt_sizes.sum()
    reverse_cfg = DataConfig(**{**cfg.__dict__, "src_lang": "en", "tgt_lang": "de"})
    reverse = prepare_data(reverse_cfg, splits=("test",))
    assert reverse.splits["test"].src_text == test.tgt_text
    assert reverse.tokenizer.model_bytes == corpus.tokenizer.model_bytes
