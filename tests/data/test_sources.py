"""Sources: toy determinism, local files (incl. .gz), hub-layout parquet, and their error messages."""

from __future__ import annotations

import gzip
import time

import pytest

from tests.data.helpers import PAIRS, toy_config, write_hub_parquet, write_text_corpus
from tfx.config import DataConfig
from tfx.data import DataError, prepare_data, read_parallel_text, sources
from tfx.data.sources import load_split, toy_lexicon, toy_translate


def test_toy_is_deterministic_per_seed_and_differs_across_seeds(tmp_path):
    cfg = toy_config(tmp_path)
    assert load_split(cfg, "train", seed=1) == load_split(cfg, "train", seed=1)
    assert load_split(cfg, "train", seed=1) != load_split(cfg, "train", seed=2)
    assert load_split(cfg, "valid", seed=1) != load_split(cfg, "test", seed=1)


def test_toy_target_is_lexicon_lookup_with_adjacent_pairs_swapped(tmp_path):
    cfg = toy_config(tmp_path)
    words, lexicon = toy_lexicon(cfg.toy_vocab, seed=1)
    assert len(words) == cfg.toy_vocab and len(set(lexicon.values())) == cfg.toy_vocab
    assert toy_translate(words[:3], lexicon) == [lexicon[words[1]], lexicon[words[0]], lexicon[words[2]]]
    src, tgt = load_split(cfg, "train", seed=1)
    lengths = {len(s.split()) for s in src}
    assert min(lengths) >= cfg.toy_min_len and max(lengths) <= cfg.toy_max_len
    assert all(toy_translate(s.split(), lexicon) == t.split() for s, t in zip(src, tgt, strict=True))


def test_local_folder_reads_plain_and_gz_in_both_directions(tmp_path):
    folder = write_text_corpus(tmp_path / "corpus", {"train": PAIRS, "valid": PAIRS[:2]})
    with gzip.open(folder / "test.de.gz", "wt", encoding="utf-8") as f:
        f.write("Ein Test.\n")
    with gzip.open(folder / "test.en.gz", "wt", encoding="utf-8") as f:
        f.write("A test.\n")
    cfg = DataConfig(source="local", local_dir=str(folder), vocab_size=200, cache_dir=str(tmp_path / "c"))
    corpus = prepare_data(cfg)
    decode = corpus.tokenizer.decode
    assert [decode(ids) for ids in corpus.splits["train"].src] == [de for de, _ in PAIRS]
    assert corpus.splits["test"].tgt_text == ["A test."] and decode(corpus.splits["test"].tgt[0]) == "A test."
    reverse = prepare_data(DataConfig(**{**cfg.__dict__, "src_lang": "en", "tgt_lang": "de"}))
    assert [decode(ids) for ids in reverse.splits["train"].src] == [en for _, en in PAIRS]
    assert reverse.tokenizer.model_bytes == corpus.tokenizer.model_bytes  # one joint model for both


def test_read_parallel_text_strips_only_line_endings(tmp_path):
    (tmp_path / "a.de").write_bytes("eins \r\nzwei\u2028drei\n".encode())  # CRLF; U+2028 is not a newline
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    src, tgt = read_parallel_text(tmp_path / "a.de", tmp_path / "a.en")
    assert src == ["eins ", "zwei\u2028drei"] and tgt == ["one", "two"]


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    (tmp_path / "train.de").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_parallel_text(tmp_path / "train.de", tmp_path / "train.en")
    message = str(err.value)
    assert "train.de" in message and "train.en" in message and "3" in message and "2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "train.de").write_bytes("gut\nschön\n".encode() + b"kaputt \xff\n")
    (tmp_path / "train.en").write_text("good\nnice\nbroken\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.de: invalid UTF-8 at line 3"):
        read_parallel_text(tmp_path / "train.de", tmp_path / "train.en")


def test_missing_file_says_what_to_set(tmp_path):
    write_text_corpus(tmp_path, {"train": PAIRS})  # no valid/test files
    cfg = DataConfig(source="local", local_dir=str(tmp_path), vocab_size=200, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match=r"missing file .*valid\.de.*data\.local_dir"):
        prepare_data(cfg)
    with pytest.raises(DataError, match="data.local_dir"):
        prepare_data(DataConfig(source="local", cache_dir=str(tmp_path / "c")))


def test_unknown_split_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"unknown split 'dev': use one of train, valid, test"):
        prepare_data(toy_config(tmp_path), splits=("train", "dev"))


@pytest.mark.parametrize("nested", [True, False], ids=["translation-field", "flat-rows"])
def test_hub_parquet_round_trip(tmp_path, nested):
    files = {
        split: str(write_hub_parquet(tmp_path / f"{split}.parquet", PAIRS, nested))
        for split in ("train", "validation", "test")
    }
    cfg = DataConfig(
        source="hub",
        name="hubtest",
        hub_field="translation" if nested else None,
        hub_data_files={"train": files["train"], "validation": files["validation"], "test": files["test"]},
        vocab_size=200,
        cache_dir=str(tmp_path / "cache"),
    )
    corpus = prepare_data(cfg)
    for split in ("valid", "test"):
        assert corpus.splits[split].src_text == [de for de, _ in PAIRS]
        assert corpus.splits[split].tgt_text == [en for _, en in PAIRS]
    train = corpus.splits["train"]
    assert [corpus.tokenizer.decode(ids) for ids in train.tgt] == [en for _, en in PAIRS]
    assert corpus.tokenizer.decode(corpus.splits["valid"].tgt[1]) == PAIRS[1][1]


def test_hub_missing_language_names_language_and_fields(tmp_path):
    path = write_hub_parquet(tmp_path / "train.parquet", PAIRS, nested=True)
    cfg = DataConfig(
        source="hub",
        hub_field="translation",
        src_lang="fr",
        hub_data_files={"train": str(path)},
        cache_dir=str(tmp_path / "cache"),
    )
    expected = r"no language 'fr' under field 'translation' \(fields present: de, en\)"
    with pytest.raises(DataError, match=expected):
        prepare_data(cfg, splits=("train",))


def test_hub_offline_fails_fast_with_local_alternatives(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "hub_reachable", lambda timeout: False)  # as on a machine without network
    cfg = DataConfig(
        source="hub",
        hub_name="IWSLT/iwslt2017",
        hub_config="iwslt2017-de-en",
        hub_revision="refs/convert/parquet",
        hub_field="translation",
        hub_cache_dir=str(tmp_path / "hf"),
        cache_dir=str(tmp_path / "cache"),
    )
    start = time.monotonic()
    with pytest.raises(DataError) as err:
        prepare_data(cfg)
    assert time.monotonic() - start < 20  # no retry loop (datasets alone waits ~25 s without DNS)
    message = str(err.value)
    assert "IWSLT/iwslt2017" in message and "data.local_dir=" in message and "data.hub_data_files=" in message
    assert "\n" not in message


def test_hub_reachable_gives_up_quickly(monkeypatch):
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    start = time.monotonic()
    assert not sources.hub_reachable(timeout=2.0)
    assert time.monotonic() - start < 3
