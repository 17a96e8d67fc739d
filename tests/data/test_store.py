"""Token stores (``tfx.data.store``), chunked reading (``tfx.data.stream``) and the encoding pool
(``tfx.data.encoding``): the memory-mapped corpus gives the ids, sizes, batches and errors the in-memory one
gave. CPU only, no model computation; ids are compared exactly."""

from __future__ import annotations

import errno
import gzip
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from tests.data.helpers import PAIRS, SHARED_DATA, write_text_corpus
from tfx.config import DataConfig
from tfx.data import EOS, DataError, collate, encoding, make_batches, prepare_data, stream, word_cache
from tfx.data.cache import DamagedEntry
from tfx.data.corpus import SAMPLE_SEED, EncodedSplit, filter_train
from tfx.data.sources import load_split, read_lines
from tfx.data.store import StoreWriter, TokenStore, token_dtype
from tfx.data.vocab import Tokenizer, _train_spm


def write_store(path: Path, sentences: list[list[int]], vocab_size: int = 100, chunk: int = 3) -> TokenStore:
    writer = StoreWriter(path, token_dtype(vocab_size))
    for start in range(0, len(sentences), chunk):
        part = sentences[start : start + chunk]
        flat = np.array([i for s in part for i in s], dtype=np.int64)
        writer.append(flat, np.array([len(s) for s in part]))
    return writer.finish()


SENTENCES = [[5, 6, EOS], [EOS], [7, 8, 9, 10, EOS], [11, EOS], [12, 13, EOS]]


@pytest.mark.parametrize("vocab_size", [100, 70_000])
def test_a_store_gives_back_each_sentence_and_its_size(tmp_path: Path, vocab_size: int) -> None:
    store = write_store(tmp_path / "s.tok", SENTENCES, vocab_size)
    assert store.tokens.dtype == (np.uint16 if vocab_size <= 2**16 else np.int32)
    again = TokenStore(tmp_path / "s.tok")  # verified on open
    assert [again[i].tolist() for i in range(len(again))] == SENTENCES
    assert again.sizes.tolist() == [len(s) for s in SENTENCES] and again[2].dtype == np.int32
    assert len(write_store(tmp_path / "empty.tok", [])) == 0


@pytest.mark.parametrize("damage", ["cut short", "token flipped", "offset flipped", "trailer flipped", "empty"])
def test_a_damaged_store_is_refused_by_name(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s.tok"
    write_store(path, SENTENCES)
    blob = bytearray(path.read_bytes())
    at = {"token flipped": 2, "offset flipped": 24, "trailer flipped": len(blob) - 40}.get(damage)
    if at is not None:
        blob[at] ^= 0x10
    path.write_bytes(bytes(blob[: len(blob) // 2] if damage == "cut short" else b"" if damage == "empty" else blob))
    with pytest.raises(DamagedEntry):
        TokenStore(path)


def test_an_abandoned_write_leaves_the_old_store_and_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "s.tok"
    write_store(path, SENTENCES)
    before = path.read_bytes()
    writer = StoreWriter(path, token_dtype(100))
    writer.append(np.array([1, 2, EOS]), np.array([3]))
    writer.abandon()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.tok"]


def test_a_full_disk_while_encoding_names_the_store_and_keeps_the_old_one(tmp_path: Path, monkeypatch) -> None:
    """A write to an open file reports ENOSPC without a path (raised here by a stand-in): the error names the store,
    the store there before is untouched and no temporary file is left."""
    path = tmp_path / "s.tok"
    write_store(path, SENTENCES)
    before = path.read_bytes()

    def no_space(self: StoreWriter, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(StoreWriter, "_write", no_space)
    tokenizer = Tokenizer(_train_spm([a for a, _ in PAIRS] * 20, 60, "bpe", 1.0, 1, "test"))
    side = stream.list_side(["ein Hund", "eine Katze"], "test (de)")
    with pytest.raises(OSError) as raised:
        encoding.encode_side(side, tokenizer, path)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.tok"]


def test_a_file_that_vanishes_is_the_machines_failure_not_a_bad_gzip_file(tmp_path: Path) -> None:
    """ENOENT from reading a side keeps its errno (tfx.files.environment says what it is); gzip's own errors,
    which have none, stay a DataError."""
    with pytest.raises(FileNotFoundError):
        list(stream.file_blocks(tmp_path / "gone.de"))
    (tmp_path / "bad.de.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="not a valid gzip file"):
        list(stream.file_blocks(tmp_path / "bad.de.gz"))


def test_chunked_reading_splits_lines_as_read_lines_does(tmp_path: Path, monkeypatch) -> None:
    """Blocks cut at line ends, CRLF, U+2028 inside a line, no final newline, gzip: the same lines as reading the
    whole file, whatever the block size."""
    text = "eins \r\nzwei\u2028drei\n\nvier ä\nfünf"
    plain, packed = tmp_path / "a.de", tmp_path / "b.de.gz"
    plain.write_bytes(text.encode())
    packed.write_bytes(gzip.compress(text.encode()))
    for block in (1, 3, 7, 1 << 20):
        monkeypatch.setattr(stream, "BLOCK_BYTES", block)
        for path in (plain, packed):
            side = stream.file_side(path, stream.DigestMemo(None))
            assert side.read_all() == read_lines(path) and side.lines == len(read_lines(path)) == 5


def test_invalid_utf8_is_named_by_its_line_in_the_whole_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.de"
    path.write_bytes(b"ok\n" * 10 + b"bad \xff\n" + b"ok\n")
    monkeypatch.setattr(stream, "BLOCK_BYTES", 8)
    side = stream.file_side(path, stream.DigestMemo(None))
    with pytest.raises(DataError, match=rf"{path}: invalid UTF-8 at line 11: re-encode"):
        side.read_all()


def test_digests_are_remembered_until_the_file_changes(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.de"
    path.write_text("eins\nzwei\n")
    hashed = []
    real = stream.count_and_hash
    monkeypatch.setattr(stream, "count_and_hash", lambda p: hashed.append(p) or real(p))
    first = stream.DigestMemo(tmp_path / "cache").digest(path)
    assert stream.DigestMemo(tmp_path / "cache").digest(path) == first and len(hashed) == 1  # read from disk
    path.write_text("eins\ndrei\n")  # same size, new content and mtime
    assert stream.DigestMemo(tmp_path / "cache").digest(path) != first and len(hashed) == 2
    (tmp_path / "cache" / "digests.json").write_text("{not json")  # derived data: rebuilt
    assert stream.DigestMemo(tmp_path / "cache").digest(path)[1] == 2


def corpus_folder(tmp_path: Path, n: int = 300) -> Path:
    rng = np.random.default_rng(0)
    words = [de.split() + en.split() for de, en in PAIRS]
    vocab = sorted({w for ws in words for w in ws})
    pairs = [(" ".join(rng.choice(vocab, rng.integers(1, 12))), " ".join(rng.choice(vocab, rng.integers(1, 12))))
             for _ in range(n)]  # fmt: skip
    return write_text_corpus(tmp_path / "corpus", {"train": pairs, "valid": pairs[:20], "test": pairs[20:30]})


def in_memory(cfg: DataConfig, split: str, tokenizer: Tokenizer) -> EncodedSplit:
    """The pipeline before token stores: lists of per-sentence arrays, the raw text kept."""
    src, tgt = load_split(cfg, split)

    def ids(texts: list[str]) -> list[np.ndarray]:
        return [np.array([*x, EOS], dtype=np.int32) for x in tokenizer.encode_batch(texts)]

    data = EncodedSplit(ids(src), ids(tgt), src, tgt)
    return filter_train(data, cfg) if split == "train" else data


def assert_same_batches(new: EncodedSplit, old: EncodedSplit, max_tokens: int) -> None:
    assert new.src_sizes.tolist() == old.src_sizes.tolist() and new.tgt_sizes.tolist() == old.tgt_sizes.tolist()
    for epoch in (1, 2):
        plan, reference = (make_batches(s, max_tokens, seed=3, epoch=epoch) for s in (new, old))
        assert [list(b) for b in plan] == [list(b) for b in reference]
        for indices in plan[:20]:
            a, b = collate(new, indices), collate(old, indices)
            assert all((getattr(a, k) == getattr(b, k)).all() for k in ("src_tokens", "prev_output_tokens", "target"))


def test_prepared_splits_equal_the_in_memory_pipeline(tmp_path: Path, monkeypatch) -> None:
    """Vocabulary, ids, filtering and every batch as the in-memory pipeline made them, with the training split
    encoded in worker processes (forced here: 4 lines per chunk, 2 workers)."""
    monkeypatch.setattr(encoding, "PARALLEL_MIN_LINES", 1)
    monkeypatch.setattr(stream, "BLOCK_BYTES", 64)
    cfg = DataConfig(source="local", local_dir=str(corpus_folder(tmp_path)), vocab_size=60, max_len_ratio=3.0,
                     cache_dir=str(tmp_path / "cache"), num_workers=2)  # fmt: skip
    corpus = prepare_data(cfg)
    src, tgt = load_split(cfg, "train")
    spm = Tokenizer(_train_spm(iter([*src, *tgt]), 60, "bpe", 1.0, 2, "check"))  # every line, de then en
    assert corpus.tokenizer.model_bytes == spm.model_bytes
    for split in ("train", "valid", "test"):
        assert_same_batches(corpus.splits[split], in_memory(cfg, split, spm), max_tokens=60)
    assert corpus.splits["valid"].src_text == load_split(cfg, "valid")[0]


@pytest.mark.skipif(not (SHARED_DATA / "multi30k" / "train.de").exists(), reason="needs ../shared/data/multi30k")
def test_multi30k_batches_equal_the_in_memory_pipeline(tmp_path: Path) -> None:
    """The real corpus at +experiment=multi30k's data settings: the same vocabulary, ids and batches as before."""
    cfg = DataConfig(source="local", name="multi30k", local_dir=str(SHARED_DATA / "multi30k"),
                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    corpus = prepare_data(cfg, splits=("train", "valid"))
    src, tgt = load_split(cfg, "train")
    assert (
        corpus.tokenizer.model_bytes == Tokenizer(_train_spm(iter([*src, *tgt]), 8000, "bpe", 1.0, 0, "m")).model_bytes
    )
    for split in ("train", "valid"):
        assert_same_batches(corpus.splits[split], in_memory(cfg, split, corpus.tokenizer), max_tokens=4096)


def test_a_vocabulary_past_the_sample_size_trains_on_the_same_lines_of_both_sides(tmp_path: Path, monkeypatch, caplog):
    folder = corpus_folder(tmp_path, n=300)
    seen: list[str] = []
    real = _train_spm
    monkeypatch.setattr("tfx.data.vocab._train_spm", lambda s, *a: real(seen.extend(s) or iter(seen), *a))
    cfg = DataConfig(source="local", local_dir=str(folder), vocab_size=60, spm_sample_sentences=100,
                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="tfx.data"):
        prepare_data(cfg, splits=("train",))
    src, tgt = load_split(cfg, "train")
    picks = np.sort(np.random.default_rng(SAMPLE_SEED).choice(300, size=50, replace=False))
    assert seen == [src[i] for i in picks] + [tgt[i] for i in picks]  # the same lines of each side, in file order
    assert "sentencepiece trains on 100 of the 600 training sentences" in caplog.text
    seen.clear()
    prepare_data(DataConfig(**{**cfg.__dict__, "spm_sample_sentences": 0}), splits=("train",))
    assert seen == [*src, *tgt] and len(list((tmp_path / "cache").glob("*.model"))) == 2  # its own cache entry


def _prepare_on_rank(rank: int, cfg: DataConfig, port: int, out: str) -> None:
    import torch

    from tests.test_train import join_two_ranks
    from tfx.config import Config, TrainConfig
    from tfx.data.plan import TrainBatches
    from tfx.runtime import distributed
    from tfx.training import build

    join_two_ranks(rank, port)
    encoded: list[str] = []
    real = encoding.encode_side
    encoding.encode_side = lambda side, *args: encoded.append(side.where) or real(side, *args)
    dist, _ = distributed.setup("cpu")
    try:
        corpus = build.prepare_corpus(Config(data=cfg, train=TrainConfig(seed=3)), dist.is_main)
        train = corpus.splits["train"]
        plan = TrainBatches(train, cfg, 3, dist.rank, dist.world_size).epoch(1)
        stores = sorted(
            str(getattr(s, "base", s).path) for split in corpus.splits.values() for s in (split.src, split.tgt)
        )
        torch.save({"encoded": encoded, "stores": stores, "plan": [list(map(int, b)) for b in plan]}, f"{out}.{rank}")
    finally:
        distributed.teardown()


@pytest.mark.slow
def test_two_ranks_wait_for_one_preparer_and_map_its_files(tmp_path: Path) -> None:
    """Rank 0 encodes every split while rank 1 waits; rank 1 then maps the same files (encodes nothing), and
    each rank's epoch plan is its share of the in-memory pipeline's plan for the same seed (gloo, CPU)."""
    import torch
    import torch.multiprocessing as mp

    from tests.test_train import rendezvous_ports

    cfg = DataConfig(source="local", local_dir=str(corpus_folder(tmp_path)), vocab_size=60,
                     cache_dir=str(tmp_path / "cache"), max_tokens=60)  # fmt: skip
    out = str(tmp_path / "rank")
    with rendezvous_ports(1) as (port,):
        mp.spawn(_prepare_on_rank, args=(cfg, port, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in (0, 1)]
    assert len(ranks[0]["encoded"]) == 6 and ranks[1]["encoded"] == []
    assert ranks[0]["stores"] == ranks[1]["stores"] and len(ranks[0]["stores"]) == 6
    reference = in_memory(cfg, "train", prepare_data(cfg, splits=("train",)).tokenizer)
    for rank, got in enumerate(ranks):
        expected = make_batches(reference, 60, seed=3, epoch=1, rank=rank, world_size=2)
        assert got["plan"] == [list(map(int, b)) for b in expected]


AWKWARD = [
    "Ein Hund läuft.",
    "  two  spaces   and\ta tab ",
    "no\u00a0break space, ﬁne … ligatures and ellipses",
    "\u0301combining first, e\u0301 composed later, ＦＵＬＬＷＩＤＴＨ",
    "",
    "中文没有空格。 日本語 ▁literal▁ ▁",
    "control\x01char, zero\u200bwidth, emoji 🙂🙂",
    "crlf line",
    "x",
]


def word_model(tmp_path: Path, **settings) -> spm.SentencePieceProcessor:
    import io

    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(AWKWARD * 20 + [de for de, _ in PAIRS] * 20),
                                   model_writer=writer, vocab_size=120, model_type="bpe", hard_vocab_limit=False,
                                   minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3, **settings)  # fmt: skip
    return spm.SentencePieceProcessor(model_proto=writer.getvalue())


def test_the_word_cache_gives_sentencepieces_ids_on_awkward_text(tmp_path: Path) -> None:
    """NBSP, tabs, runs of spaces, NFKC ligatures and full-width letters, a combining mark after a space, CJK
    without spaces, a literal ▁, control and zero-width characters, CRLF, no final newline: the same ids as
    sentencepiece on each whole line."""
    sp = word_model(tmp_path)
    chunk = ("\n".join(AWKWARD[:7]) + "\ncrlf line\r\nx").encode()
    tokens, lengths = word_cache.encode_by_word(sp, chunk)
    expected = [[*ids, EOS] for ids in sp.encode([line.removesuffix("\r") for line in AWKWARD], out_type=int)]
    assert [t.tolist() for t in np.split(tokens, np.cumsum(lengths)[:-1])] == expected


def test_the_word_cache_declines_what_it_cannot_encode_exactly(tmp_path: Path, monkeypatch) -> None:
    """A model without the dummy prefix (pieces of a line are not its words' pieces) fails the per-chunk check,
    and bytes that are not UTF-8 go the plain path: None, so the caller encodes whole lines."""
    plain = ("\n".join(de for de, _ in PAIRS) + "\n").encode()
    assert word_cache.encode_by_word(word_model(tmp_path), plain) is not None
    assert word_cache.encode_by_word(word_model(tmp_path, add_dummy_prefix=False), plain) is None
    assert word_cache.encode_by_word(word_model(tmp_path), b"ok\nbad \xff\n") is None


def test_invalid_utf8_found_by_an_encoding_worker_names_its_line_in_the_whole_file(tmp_path: Path, monkeypatch) -> None:
    """Chunks go to two worker processes; the one that meets the bad byte reports its line within its chunk and the
    reader adds the lines of the chunks before it."""
    monkeypatch.setattr(encoding, "PARALLEL_MIN_LINES", 1)
    monkeypatch.setattr(stream, "BLOCK_BYTES", 16)
    folder = write_text_corpus(tmp_path / "c", {"train": PAIRS * 5, "valid": PAIRS, "test": PAIRS})
    (folder / "train.de").write_bytes(b"ein hund\n" * 10 + b"kaputt \xff\n" + b"ein hund\n" * 9)
    cfg = DataConfig(
        source="local", local_dir=str(folder), vocab_size=60, cache_dir=str(tmp_path / "cache"), num_workers=2
    )
    tokenizer = prepare_data(
        DataConfig(**{**cfg.__dict__, "local_dir": str(corpus_folder(tmp_path))}), splits=("train",)
    ).tokenizer
    side = stream.file_side(folder / "train.de", stream.DigestMemo(None))
    with pytest.raises(DataError, match=r"train.de: invalid UTF-8 at line 11: re-encode"):
        encoding.encode_side(side, tokenizer, tmp_path / "out.tok", workers=2)
    assert not (tmp_path / "out.tok").exists()
