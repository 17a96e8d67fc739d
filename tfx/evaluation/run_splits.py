"""A run's own data splits, read back from the config its checkpoint holds, and the valid-split scorer.

``tfx.evaluate`` translates a run's test split with ``split_texts``; ``tfx.average --best-window``
scores each window's average on the valid split with ``valid_scorer``. Below both, so the window
search needs no import of ``tfx.evaluation.evaluate`` (which itself imports ``tfx.evaluation.average`` for
``--avg``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfx.checkpoints.load import build_from_checkpoint
from tfx.config import DataConfig
from tfx.data import DataError
from tfx.data.sources import split_sides
from tfx.evaluation.bleu import score_all
from tfx.evaluation.translate import translate_with_args
from tfx.runtime.distributed import resolve_device

Texts = tuple[list[str], list[str]]


def data_config(config: dict[str, Any], data_dir: Path | None) -> DataConfig:
    """The run's ``DataConfig``; fields this version does not know are ignored, ``data_dir`` replaces local_dir."""
    known = {f.name for f in dataclasses.fields(DataConfig)}
    fields = {k: v for k, v in config.get("data", {}).items() if k in known}
    if data_dir is not None:
        if fields.get("source") != "local":
            raise DataError(f"--data-dir applies to data.source=local runs; this run used {fields.get('source')!r}")
        fields["local_dir"] = str(data_dir)
    try:
        return DataConfig(**fields)
    except ValueError as err:
        raise DataError(f"the checkpoint's data config is invalid: {err}") from err


def split_texts(cfg: DataConfig, split: str, seed: int) -> Texts:
    """Source and reference sentences of the run's ``split``, as text (nothing is encoded)."""
    if cfg.source == "local" and not cfg.local_dir:
        raise DataError("the run has data.source=local but no data.local_dir: pass --data-dir or --src/--ref")
    src, tgt = split_sides(cfg, split, seed)
    return src.read_all(), tgt.read_all()


def valid_scorer(first: dict[str, Any], args: argparse.Namespace) -> Callable[[dict[str, Any]], float]:
    """Checkpoint dict -> headline score (``score_all``) of its translation of the run's valid split.

    For ``tfx.average --best-window``: ``first`` (any checkpoint of the run) gives the data config
    and tokenizer, so the split is read and the model built once for all windows.
    """
    device = resolve_device(args.device, setting="--device")
    model, tokenizer, config = build_from_checkpoint(first, device)
    cfg = data_config(config, args.data_dir)
    src, refs = split_texts(cfg, "valid", config.get("train", {}).get("seed", 1))
    if args.valid_max_sentences:
        src, refs = src[: args.valid_max_sentences], refs[: args.valid_max_sentences]
    if not src:
        raise DataError("the run's valid split has no sentences to choose a window with")

    def score(ckpt: dict[str, Any]) -> float:
        model.load_state_dict(ckpt["model"])  # windows of one run share the architecture and vocabulary
        hyps = translate_with_args(model, tokenizer, src, args, device, progress=False)
        return score_all(hyps, refs, cfg.tgt_lang, args, cfg.tokenized, refs_tokenized=cfg.tokenized)[-1].score

    return score
