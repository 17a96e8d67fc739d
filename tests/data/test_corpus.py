"""prepare_data: EOS-terminated ids, caching, train-only filtering."""

from __future__ import annotations

import pytest
import sentencepiece as spm

from tests.data.helpers import PAIRS, toy_config, write_text_corpus
from tfx.config import DataConfig
from tfx.data import EOS, DataError, Tokenizer, prepare_data
from tfx.data.sources import load_split


def test_every_sequence_ends_with_eos_and_only_valid_and_test_keep_their_text(tmp_path):
    corpus = prepare_data(toy_config(tmp_path))
    assert set(corpus.splits) == {"train", "valid", "test"}
    for name, split in corpus.splits.items():
        assert len(split) == len(split.tgt) == len(split.src_sizes) > 0
        assert all(s[-1] == EOS and EOS not in s[:-1] for s in [*split.src, *split.tgt])
        texts = (split.src_text, split.tgt_text)
        assert texts == (None, None) if name == "train" else len(split.src_text) == len(split.tgt_text) == len(split)
    valid = corpus.splits["valid"]
    assert corpus.tokenizer.decode(valid.tgt[0]) == valid.tgt_text[0]


def test_second_run_reuses_model_and_encodings(tmp_path, monkeypatch):
    cfg = toy_config(tmp_path)
    first = prepare_data(cfg)
    cached = sorted((tmp_path / "cache").glob("*.*"))
    mtimes = [p.stat().st_mtime_ns for p in cached]
    assert any(p.suffix == ".model" for p in cached) and sum(p.suffix == ".tok" for p in cached) == 6

    def fail(*args, **kwargs):
        raise AssertionError("cache miss: this should have come from the cache")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", fail)
    monkeypatch.setattr(Tokenizer, "encode_batch", fail)
    second = prepare_data(cfg)
    assert [p.stat().st_mtime_ns for p in cached] == mtimes
    assert second.tokenizer.model_bytes == first.tokenizer.model_bytes
    for name, split in first.splits.items():
        assert [s.tolist() for s in second.splits[name].src] == [s.tolist() for s in split.src]


def test_cache_key_follows_content(tmp_path):
    prepare_data(toy_config(tmp_path), seed=1, splits=("train",))
    prepare_data(toy_config(tmp_path), seed=2, splits=("train",))
    assert len(list((tmp_path / "cache").glob("*.model"))) == 2


def test_length_filter_applies_to_train_only(tmp_path, caplog):
    long_pair = (" ".join(["Hund"] * 30), "dog")
    folder = write_text_corpus(tmp_path / "c", {s: [*PAIRS, long_pair] for s in ("train", "valid", "test")})
    cfg = DataConfig(
        source="local",
        local_dir=str(folder),
        vocab_size=200,
        max_source_positions=20,
        cache_dir=str(tmp_path / "cache"),
    )
    with caplog.at_level("INFO", logger="tfx.data"):
        corpus = prepare_data(cfg)
    assert len(corpus.splits["train"]) == len(PAIRS)
    assert len(corpus.splits["valid"]) == len(corpus.splits["test"]) == len(PAIRS) + 1
    assert "train filter dropped 1 of 5 pairs" in caplog.text


def test_empty_train_after_filtering_is_an_error(tmp_path):
    cfg = toy_config(tmp_path, max_source_positions=2)
    with pytest.raises(DataError, match="split train of toy is empty after length filtering"):
        prepare_data(cfg)


def test_given_tokenizer_skips_training_split(tmp_path, monkeypatch):
    tokenizer = prepare_data(toy_config(tmp_path), splits=("train",)).tokenizer
    monkeypatch.setattr(spm.SentencePieceTrainer, "train", lambda **kw: pytest.fail("trained again"))
    corpus = prepare_data(toy_config(tmp_path / "other"), splits=("test",), tokenizer=tokenizer)
    assert set(corpus.splits) == {"test"} and corpus.tokenizer is tokenizer


def test_empty_split_is_an_error(tmp_path):
    folder = write_text_corpus(tmp_path / "c", {"train": PAIRS, "valid": [], "test": PAIRS})
    cfg = DataConfig(source="local", local_dir=str(folder), vocab_size=200, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match=r"split valid of toy \(local\) has no sentences"):
        prepare_data(cfg)


@pytest.mark.parametrize(
    "change", [{"vocab_size": 100}, {"spm_model_type": "unigram"}, {"spm_character_coverage": 0.98}]
)
def test_changed_sentencepiece_settings_retrain_and_reencode(tmp_path, monkeypatch, change):
    """A new vocab_size, model_type or character_coverage trains a new model, and every split is encoded by it: the
    encoded-corpus cache is keyed by the tokenizer, so ids of the old model are never reused."""
    old = prepare_data(toy_config(tmp_path), splits=("train", "valid"))
    trained = []
    real_train = spm.SentencePieceTrainer.train
    monkeypatch.setattr(spm.SentencePieceTrainer, "train", lambda **kw: trained.append(kw) or real_train(**kw))
    new = prepare_data(toy_config(tmp_path, **change), splits=("train", "valid"))
    assert len(trained) == 1
    assert len(list((tmp_path / "cache").glob("*.model"))) == 2
    assert new.tokenizer.model_bytes != old.tokenizer.model_bytes
    for split in ("train", "valid"):
        data = new.splits[split]
        texts = load_split(toy_config(tmp_path, **change), split)[0]
        expected = [ids + [EOS] for ids in new.tokenizer.encode_batch(texts)]
        assert [s.tolist() for s in data.src] == expected
        assert [s.tolist() for s in data.src] != [s.tolist() for s in old.splits[split].src]


def test_tokenized_data_refuses_cased_text_and_takes_lowercased(tmp_path):
    """data.tokenized promises lowercased, tokenized files: raw ones (capitals) are refused by split and side,
    before a vocabulary is trained on them; the same pairs lowercased are taken."""
    cased = [("Ein Hund läuft .", "a dog runs ."), ("zwei katzen .", "two cats .")]
    folder = write_text_corpus(tmp_path / "raw", {"train": cased, "valid": cased, "test": cased})
    cfg = DataConfig(source="local", local_dir=str(folder), tokenized=True, vocab_size=60,
                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    with pytest.raises(DataError, match=r"split train \(de\) is not lowercased \(1 of its first 2 lines"):
        prepare_data(cfg)
    lowered = [(de.lower(), en) for de, en in cased]
    folder = write_text_corpus(tmp_path / "tok", {"train": lowered, "valid": lowered, "test": lowered})
    corpus = prepare_data(DataConfig(**{**cfg.__dict__, "local_dir": str(folder)}))
    assert len(corpus.splits["train"]) == 2
