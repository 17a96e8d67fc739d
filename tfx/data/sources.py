"""Raw parallel text from one of three sources: a synthetic toy task, local files, the HF hub.

Every loader returns ``(src_texts, tgt_texts)`` for one split, as aligned lists of str, and turns
bad input into a one-line ``DataError``.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from tfx.config import DataConfig
from tfx.data.errors import DataError
from tfx.data.stream import DigestMemo, TextSide, chunk_lines, column_side, file_side, list_side

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
Texts = tuple[list[str], list[str]]


def check_split(split: str) -> None:
    """Refuse a split name tfx does not know."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")


def load_split(cfg: DataConfig, split: str, seed: int = 1) -> Texts:
    """Source and target sentences of ``split`` from ``cfg.source``, as lists (``split_sides`` read whole).

    ``data.local_dir`` set on a hub dataset reads its text files instead: ``DataConfig`` turns such
    a config into ``source=local`` (the offline override of the hub experiments).
    """
    src, tgt = split_sides(cfg, split, seed)
    return src.read_all(), tgt.read_all()


def split_sides(
    cfg: DataConfig, split: str, seed: int = 1, memo: DigestMemo | None = None
) -> tuple[TextSide, TextSide]:
    """Source and target of ``split`` as streams (``tfx.data.stream``): what preparation reads, chunk by chunk.

    ``load_split`` gives the same lines as lists; this is the form that scales to corpora that do not fit in
    memory as Python strings. Refuses sides whose line counts differ.
    """
    check_split(split)
    if cfg.source == "toy":
        src, tgt = toy_split(cfg, split, seed)
        sides = list_side(src, f"toy {split} ({cfg.src_lang})"), list_side(tgt, f"toy {split} ({cfg.tgt_lang})")
    elif cfg.source == "local":
        folder = local_folder(cfg)
        prefix = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}[split]
        memo = memo or DigestMemo(None)
        sides = tuple(file_side(find_text_file(folder, prefix, lang), memo) for lang in (cfg.src_lang, cfg.tgt_lang))
    elif cfg.source == "hub":
        sides = hub_sides(cfg, split)
    else:
        raise DataError(f"data.source={cfg.source!r}: use toy, local or hub")
    src, tgt = sides
    if src.lines != tgt.lines:
        raise DataError(
            f"misaligned corpus: {src.where} has {src.lines} lines but {tgt.where} has {tgt.lines}; "
            "the two files must be line-aligned translations"
        )
    return src, tgt


# --- toy --------------------------------------------------------------------------------------

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def toy_lexicon(n_words: int, seed: int) -> tuple[list[str], dict[str, str]]:
    """``n_words`` source pseudo-words and a one-to-one map to as many distinct target words."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words = np.array([a + b for a in syllables for b in syllables])  # 4900 two-syllable words
    chosen = np.random.default_rng([seed, 0]).choice(len(words), size=2 * n_words, replace=False)
    src_words = [str(w) for w in words[chosen[:n_words]]]
    tgt_words = [str(w) for w in words[chosen[n_words:]]]
    return src_words, dict(zip(src_words, tgt_words, strict=True))


def toy_translate(words: list[str], lexicon: dict[str, str]) -> list[str]:
    """Word-by-word lookup, then swap each adjacent pair: a local reordering a model must learn."""
    out = [lexicon[w] for w in words]
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def toy_split(cfg: DataConfig, split: str, seed: int) -> Texts:
    """A deterministic synthetic corpus: same seed, same lexicon and sentences; another seed, others.

    Sentences are ``toy_min_len``..``toy_max_len`` uniform random words; the language codes are only
    labels here. Each split draws from its own random stream, all sharing one lexicon.
    """
    sizes = {"train": cfg.toy_train_size, "valid": cfg.toy_valid_size, "test": cfg.toy_test_size}
    src_words, lexicon = toy_lexicon(cfg.toy_vocab, seed)
    rng = np.random.default_rng([seed, 1 + SPLITS.index(split)])
    lengths = rng.integers(cfg.toy_min_len, cfg.toy_max_len + 1, size=sizes[split])
    src, tgt = [], []
    for n in lengths:
        words = [src_words[i] for i in rng.integers(0, len(src_words), size=n)]
        src.append(" ".join(words))
        tgt.append(" ".join(toy_translate(words, lexicon)))
    return src, tgt


# --- local files ------------------------------------------------------------------------------


def find_text_file(folder: Path, prefix: str, lang: str) -> Path:
    """``folder/prefix.lang``, or its ``.gz``; a DataError saying what to set when neither exists."""
    plain = folder / f"{prefix}.{lang}"
    for path in (plain, plain.with_name(plain.name + ".gz")):
        if path.is_file():
            return path
    raise DataError(
        f"missing file {plain} (or {plain.name}.gz): set data.local_dir to a folder holding "
        f"<prefix>.<lang> files, or change data.*_prefix / data.src_lang / data.tgt_lang"
    )


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (``.gz`` decompressed), without line endings (``chunk_lines``: the one rule for
    files, chunks and standard input)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing file {path}: check data.local_dir and the file prefixes")
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise DataError(f"{path}: not a valid gzip file ({err}); re-create or gunzip it") from err
    return chunk_lines(data, str(path))


def read_parallel_text(src_path: str | Path, tgt_path: str | Path) -> Texts:
    """Two line-aligned files; refuses files whose line counts differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"misaligned corpus: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
            "the two files must be line-aligned translations"
        )
    return src, tgt


def local_folder(cfg: DataConfig) -> Path:
    """``data.local_dir``, refused in one line when unset or missing."""
    if not cfg.local_dir:
        raise DataError("data.source=local needs data.local_dir=DIR (a folder with train/valid/test.<lang>)")
    folder = Path(cfg.local_dir)
    if not folder.is_dir():
        raise DataError(f"data.local_dir={cfg.local_dir}: no such folder (relative to {os.getcwd()})")
    return folder


# --- Hugging Face hub -------------------------------------------------------------------------


def hub_reachable(timeout: float) -> bool:
    """Whether a TCP connection to the hub endpoint opens within ``timeout`` seconds.

    Without this an offline machine waits through huggingface_hub's five retries (about 25 s
    measured with no DNS) or, behind a firewall that drops packets, much longer. Runs in a thread
    because name resolution ignores socket timeouts. Behind a proxy the proxy decides: assume yes.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlsplit(constants.ENDPOINT)
    address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def offline_mode() -> Iterator[None]:
    """Switch datasets/huggingface_hub to offline mode (cache only) for the duration.

    Both libraries read HF_HUB_OFFLINE once at import, so setting the env var here would be too late;
    their module flags are what their request code checks.
    """
    import datasets.config as dconfig
    from huggingface_hub import constants

    saved = (dconfig.HF_HUB_OFFLINE, dconfig.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE)
    dconfig.HF_HUB_OFFLINE = dconfig.HF_DATASETS_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dconfig.HF_HUB_OFFLINE, dconfig.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE = saved


def hub_data_files(cfg: DataConfig, split: str) -> str | list[str] | None:
    """Local parquet file(s) for ``split``; keys may be tfx names (valid) or hub names (validation)."""
    files = cfg.hub_data_files or {}
    found = files.get(split) or files.get(cfg.hub_splits.get(split, split))
    if found is None or isinstance(found, str):
        return found
    return [str(f) for f in found]  # an OmegaConf ListConfig is not a list to datasets


def load_hub_dataset(cfg: DataConfig, split: str):  # -> datasets.Dataset
    """One split as a ``datasets.Dataset``: from local parquet files, or the hub (cache if offline)."""
    import datasets

    hub_split_name = cfg.hub_splits.get(split, split)
    files = hub_data_files(cfg, split)
    if files is not None:
        # The same loader the hub's parquet export goes through, pointed at local files.
        cache = cfg.hub_cache_dir or str(Path(cfg.cache_dir) / "hf_datasets")
        try:
            return datasets.load_dataset(
                "parquet", data_files={hub_split_name: files}, split=hub_split_name, cache_dir=cache
            )
        except (FileNotFoundError, ValueError, OSError) as err:
            message = f"data.hub_data_files[{split}]={files}: {type(err).__name__}: {err}"
            raise DataError(message.replace("\n", " ")) from err
    if cfg.hub_name is None:
        raise DataError(f"data.source=hub: no data.hub_name and no data.hub_data_files entry for {split}")
    where = f"{cfg.hub_name} (config {cfg.hub_config}, revision {cfg.hub_revision}, split {hub_split_name})"
    online = hub_reachable(cfg.hub_timeout)
    guard = contextlib.nullcontext() if online else offline_mode()
    try:
        with guard:
            return datasets.load_dataset(
                cfg.hub_name,
                cfg.hub_config,
                revision=cfg.hub_revision,
                split=hub_split_name,
                cache_dir=cfg.hub_cache_dir,
            )
    except Exception as err:  # datasets raises many types: ConnectionError, FileNotFoundError, ValueError...
        if not online:
            raise DataError(
                f"cannot reach the Hugging Face hub for {where} and it is not in the datasets cache: use "
                "local files instead: data.local_dir=DIR (text files train/valid/test.<lang>) or "
                "data.hub_data_files={train: train.parquet, valid: ..., test: ...}"
            ) from err
        message = f"loading {where} failed: {type(err).__name__}: {err}"
        raise DataError(message.replace("\n", " ")) from err


def hub_columns(cfg: DataConfig, split: str):  # -> (pyarrow.Table, [source column, target column], fingerprint)
    """The split's Arrow table with nested fields flattened, and the columns holding the two languages."""
    dataset = load_hub_dataset(cfg, split)
    table = dataset.data.table.flatten()  # nested struct fields become "translation.de" columns
    prefix = f"{cfg.hub_field}." if cfg.hub_field else ""
    present = [c.removeprefix(prefix) for c in table.column_names if c.startswith(prefix)]
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if lang not in present:
            field_hint = f"under field {cfg.hub_field!r} " if cfg.hub_field else ""
            raise DataError(
                f"hub rows of split {split} have no language {lang!r} {field_hint}(fields present: "
                f"{', '.join(present or table.column_names)}); set data.src_lang/tgt_lang or data.hub_field"
            )
    return table, [prefix + cfg.src_lang, prefix + cfg.tgt_lang], dataset._fingerprint


def hub_sides(cfg: DataConfig, split: str) -> tuple[TextSide, TextSide]:
    """``split``'s two columns as streams over the memory-mapped Arrow table."""
    table, columns, fingerprint = hub_columns(cfg, split)
    where = cfg.hub_name or "hub_data_files"
    src, tgt = (column_side(table, c, fingerprint, f"{where} {split} ({c})") for c in columns)
    return src, tgt
