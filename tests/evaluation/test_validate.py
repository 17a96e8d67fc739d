"""Valid BLEU follows the metric the test split is scored with (tfx.evaluation.validate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tfx.evaluation.validate as validate_mod
from tests.test_train import tiny_cfg
from tfx.data import PAD, prepare_data
from tfx.evaluation.bleu import corpus_bleu, tokenized_bleu
from tfx.model import build_model


@pytest.mark.parametrize("tokenized", [False, True])
def test_valid_bleu_is_tokenized_bleu_on_tokenized_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenized: bool
) -> None:
    """Hypotheses holding a Moses escape (``&apos;``): 13a splits it in three, tok:none keeps it one token, so the two
    scores differ. A data.tokenized run's valid BLEU is the tokenized one (chrF, a detokenized metric, left out)."""
    cfg = tiny_cfg(tmp_path, {"tokenized": tokenized})
    corpus = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train", "valid"))
    model = build_model(cfg.model, corpus.tokenizer.vocab_size, PAD)
    refs = corpus.splits["valid"].tgt_text[: cfg.train.valid_max_sentences]
    hyps = [f"{ref} &apos;s" for ref in refs]
    monkeypatch.setattr(validate_mod, "translate_sentences", lambda *a, **k: hyps)
    result = validate_mod.validate(model, corpus, cfg, torch.device("cpu"), bf16=False)
    tok = tokenized_bleu(hyps, refs, cfg.data.tgt_lang, refs_tokenized=True, hyps_tokenized=True)
    detok = corpus_bleu(hyps, refs)
    assert tok.score != pytest.approx(detok.score)
    expected = tok if tokenized else detok
    assert (result.bleu, result.signature) == (pytest.approx(expected.score), expected.signature)
    assert ("valid/chrf" in result.metrics) is not tokenized
