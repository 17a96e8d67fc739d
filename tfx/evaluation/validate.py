"""Validation on rank 0: teacher-forced loss and BLEU (sacreBLEU; tokenized BLEU on tokenized data)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from tfx.config import Config
from tfx.data import PAD, Corpus, collate, make_batches
from tfx.evaluation.bleu import BleuResult, corpus_bleu, tokenized_bleu
from tfx.evaluation.decode import translate_sentences
from tfx.model import Transformer, build_model
from tfx.optim.loss import label_smoothed_loss
from tfx.runtime import sharding, stop

N_SAMPLES = 5  # sample translations shown in TensorBoard


@dataclass
class ValidResult:
    metrics: dict[str, float]
    bleu: float
    signature: str
    samples: list[tuple[str, str, str]]  # (source, reference, hypothesis)


@torch.no_grad()
def valid_loss(model: Transformer, corpus: Corpus, cfg: Config, device: torch.device, bf16: bool) -> dict[str, float]:
    split = corpus.splits["valid"]
    loss_sum = nll_sum = ntokens = 0.0
    for indices in make_batches(split, cfg.data.max_tokens, cfg.data.max_sentences, shuffle=False):
        stop.check()  # a stop signal ends validation at the next batch (tfx.runtime.stop)
        batch = collate(split, indices).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch.src_tokens, batch.prev_output_tokens)
        loss, nll = label_smoothed_loss(logits, batch.target, cfg.optim.label_smoothing, PAD)
        loss_sum, nll_sum, ntokens = loss_sum + loss.item(), nll_sum + nll.item(), ntokens + batch.ntokens
    loss_bits, nll_bits = loss_sum / ntokens / math.log(2), nll_sum / ntokens / math.log(2)
    return {"valid/loss": loss_bits, "valid/nll_loss": nll_bits, "valid/ppl": 2 ** min(nll_bits, 100.0)}


def valid_bleu(hyps: list[str], refs: list[str], cfg: Config) -> BleuResult:
    """sacreBLEU (13a) of detokenized text; on ``data.tokenized`` text, the tokenized BLEU its test is scored with.

    13a would tokenize such text again (``&apos;s`` -> ``& apos ; s``), so valid BLEU, checkpoint_best.pt and
    patience on BLEU would follow another metric than the test's (``tfx.evaluate``, ``tfx.average --best-window``).
    """
    if cfg.data.tokenized:
        return tokenized_bleu(hyps, refs, cfg.data.tgt_lang, refs_tokenized=True, hyps_tokenized=True)
    return corpus_bleu(hyps, refs)


def validate(model: Transformer, corpus: Corpus, cfg: Config, device: torch.device, bf16: bool) -> ValidResult:
    was_training = model.training
    model.eval()
    try:
        metrics = valid_loss(model, corpus, cfg, device, bf16)
        split = corpus.splits["valid"]
        n = cfg.train.valid_max_sentences or len(split)
        sources, refs = split.src_text[:n], split.tgt_text[:n]
        hyps = translate_sentences(
            model,
            corpus.tokenizer,
            sources,
            beam=cfg.train.valid_beam,
            max_tokens=cfg.data.max_tokens,
            device=device,
            progress=False,
        )
    finally:
        model.train(was_training)
    bleu = valid_bleu(hyps, refs, cfg)
    metrics["valid/bleu"] = bleu.score
    if bleu.chrf is not None:  # detokenized text only
        metrics["valid/chrf"] = bleu.chrf
    samples = list(zip(sources[:N_SAMPLES], refs[:N_SAMPLES], hyps[:N_SAMPLES], strict=True))
    return ValidResult(metrics, bleu.score, bleu.signature, samples)


def validate_on_main(
    model: Transformer, corpus: Corpus, cfg: Config, device: torch.device, bf16: bool, is_main: bool
) -> ValidResult | None:
    """Every rank calls this (gathering an FSDP model is a collective); rank 0 validates, the others get None.

    Sharded, rank 0 validates a full copy (``sharding.unsharded``), freed when this returns.
    """
    build = functools.partial(build_model, cfg.model, corpus.tokenizer.vocab_size, PAD)
    plain = sharding.unsharded(model, build, device)
    return validate(plain, corpus, cfg, device, bf16) if is_main else None
