"""Helpers for the data-pipeline tests: small configs and corpora, caches always under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tfx.config import DataConfig

SHARED_DATA = Path(__file__).parents[2] / ".." / "shared" / "data"

PAIRS = [
    ("Ein Hund läuft über die Wiese.", "A dog runs across the meadow."),
    ("Zwei Kinder spielen im Park.", "Two children play in the park."),
    ("Eine Frau liest ein Buch.", "A woman reads a book."),
    ("Der Mann fährt Fahrrad.", "The man rides a bike."),
]


def toy_config(tmp_path: Path, **overrides) -> DataConfig:
    """A small toy corpus (fast spm training) with its cache in ``tmp_path``."""
    base = {
        "toy_train_size": 400,
        "toy_valid_size": 30,
        "toy_test_size": 20,
        "vocab_size": 200,
        "cache_dir": str(tmp_path / "cache"),
    }
    return DataConfig(**{**base, **overrides})


def write_text_corpus(folder: Path, pairs_by_split: dict[str, list[tuple[str, str]]]) -> Path:
    """``{split}.de`` / ``{split}.en`` files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in pairs_by_split.items():
        (folder / f"{split}.de").write_text("".join(de + "\n" for de, _ in pairs), encoding="utf-8")
        (folder / f"{split}.en").write_text("".join(en + "\n" for _, en in pairs), encoding="utf-8")
    return folder


def write_hub_parquet(path: Path, pairs: list[tuple[str, str]], nested: bool) -> Path:
    """A parquet file laid out as the hub's export: nested (IWSLT) or flat (bentrevett/multi30k) rows.

    Nested rows carry the ``huggingface`` schema metadata the hub writes, so ``datasets`` sees the
    column as a ``Translation`` feature, exactly as it does for ``IWSLT/iwslt2017``.
    """
    if nested:
        rows = [{"de": de, "en": en} for de, en in pairs]
        features = {"translation": {"languages": ["de", "en"], "_type": "Translation"}}
        struct = pa.struct([("de", pa.string()), ("en", pa.string())])
        table = pa.table({"translation": pa.array(rows, type=struct)})
    else:
        table = pa.table({"en": [en for _, en in pairs], "de": [de for de, _ in pairs]})
        features = {lang: {"dtype": "string", "_type": "Value"} for lang in ("en", "de")}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return path
