"""Damaged cache entries are rebuilt, not fatal: a cut-short encoded corpus or sentencepiece model,
a flipped byte, an entry from before content hashes; two processes rebuilding one entry at once.
CPU only; no model computation (ids and sentencepiece bytes are compared exactly)."""

from __future__ import annotations

import logging
import multiprocessing as mp
from pathlib import Path

import pytest

from tests.data.helpers import toy_config
from tfx.data import prepare_data
from tfx.data.cache import DamagedEntry, load_or_build, seal, unseal


def _ids(corpus) -> dict[str, list[list[int]]]:
    return {f"{name}.{side}": [s.tolist() for s in getattr(split, side)]
            for name, split in corpus.splits.items() for side in ("src", "tgt")}  # fmt: skip


def _entries(cache: Path, pattern: str) -> list[Path]:
    found = sorted(cache.glob(pattern))
    assert found, f"no {pattern} in {cache}"
    return found


def test_seal_round_trips_and_every_damage_is_named() -> None:
    blob = seal(b"payload bytes")
    assert unseal(blob) == b"payload bytes"
    with pytest.raises(DamagedEntry, match="cut short"):
        unseal(blob[:-5])
    with pytest.raises(DamagedEntry, match="cut short"):
        unseal(b"")
    flipped = bytes([blob[0] ^ 1]) + blob[1:]
    with pytest.raises(DamagedEntry, match="does not match its sha256"):
        unseal(flipped)


def test_load_or_build_builds_once_then_reads_and_rebuilds_what_does_not_parse(tmp_path: Path, caplog) -> None:
    path, built = tmp_path / "entry.bin", []

    def build() -> str:
        built.append(1)
        return "value"

    def parse(blob: bytes) -> str:
        if blob != b"value":
            raise ValueError("unexpected bytes")
        return blob.decode()

    args = (build, str.encode, parse)
    assert load_or_build(path, *args) == "value" and len(built) == 1
    assert load_or_build(path, *args) == "value" and len(built) == 1  # from the cache
    path.write_bytes(seal(b"other"))  # verifies, but does not parse
    with caplog.at_level(logging.WARNING, logger="tfx.data.cache"):
        assert load_or_build(path, *args) == "value" and len(built) == 2
    assert f"cache entry {path} does not load (ValueError: unexpected bytes): rebuilding it" in caplog.text
    assert unseal(path.read_bytes()) == b"value"


@pytest.mark.parametrize("damage", ["cut short", "one byte flipped", "no content hash"])
def test_damaged_encoded_corpus_and_spm_model_are_rebuilt_equal_to_fresh_ones(
    tmp_path: Path, damage: str, caplog
) -> None:
    fresh_cfg = toy_config(tmp_path / "fresh")
    fresh = prepare_data(fresh_cfg)
    cfg = toy_config(tmp_path / "run")
    prepare_data(cfg)
    cache = Path(cfg.cache_dir)
    damaged = [*_entries(cache, "enc-*.tok"), *_entries(cache, "spm-*.model")]
    for path in damaged:
        blob = path.read_bytes()
        if damage == "cut short":
            path.write_bytes(blob[: len(blob) // 2])
        elif damage == "one byte flipped":
            path.write_bytes(blob[:10] + bytes([blob[10] ^ 0x40]) + blob[11:])
        else:  # what tfx wrote before entries were sealed: the bare payload
            path.write_bytes(unseal(blob))
    with caplog.at_level(logging.WARNING, logger="tfx.data.cache"):
        again = prepare_data(cfg)
    rebuilt = [r for r in caplog.records if "rebuilding it" in r.getMessage()]
    assert len(rebuilt) == len(damaged), caplog.text
    assert again.tokenizer.model_bytes == fresh.tokenizer.model_bytes
    assert _ids(again) == _ids(fresh)
    for path in damaged:  # the rebuilt entries are the fresh run's, byte for byte
        assert path.read_bytes() == (Path(fresh_cfg.cache_dir) / path.name).read_bytes()


def _prepare(cache_dir: str, start: mp.synchronize.Barrier) -> None:
    start.wait()
    prepare_data(toy_config(Path(cache_dir).parent))


@pytest.mark.slow
def test_two_processes_rebuilding_the_same_damaged_entries_leave_whole_ones(tmp_path: Path) -> None:
    cfg = toy_config(tmp_path)
    first = prepare_data(cfg)
    first_ids, first_model = _ids(first), first.tokenizer.model_bytes
    del first  # its stores map the files damaged in place below: reading them now would fault (SIGBUS)
    cache = Path(cfg.cache_dir)
    for path in [*_entries(cache, "enc-*.tok"), *_entries(cache, "spm-*.model")]:
        path.write_bytes(path.read_bytes()[:100])
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_prepare, args=(cfg.cache_dir, start)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    assert not list(cache.glob(".*.tmp")), "a temp file was left behind"
    for path in [*_entries(cache, "enc-*.tok"), *_entries(cache, "spm-*.model")]:
        unseal(path.read_bytes())  # each entry whole and verified
    again = prepare_data(cfg)
    assert again.tokenizer.model_bytes == first_model and _ids(again) == first_ids
