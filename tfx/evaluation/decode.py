"""Greedy and beam search over the KV-cached incremental decoder, and batched translation of text.

Conventions follow fairseq's ``SequenceGenerator`` so that BLEU numbers are comparable:

* A hypothesis is scored by ``sum(log p) / len ** lenpen`` where the sum and ``len`` both count the
  final EOS (fairseq's ``--lenpen``; ``lenpen=0`` ranks by raw log-probability, ``> 1`` favours
  longer outputs).
* Output length is at most ``max_len_a * src_len + max_len_b`` tokens before the EOS, ``src_len``
  counting the source EOS, capped by the decoder's position table. fairseq defaults to
  ``a=0, b=200``; we default to ``a=1.2, b=10`` (fairseq's WMT recipe): no sane translation is that
  much longer than its source, and an untrained model stops long before 200 tokens.
  When ``max_len < min_len`` the maximum wins (EOS is forced).
* Each step keeps the ``2 * beam`` best candidates: EOS candidates among the first ``beam`` are
  finished, the ``beam`` best others continue (at most ``beam`` candidates can be EOS, one per
  beam, so ``beam`` continuations always exist). A sentence stops once it has ``beam`` finished
  hypotheses (fairseq's rule: an unfinished one could in principle still win with ``lenpen > 0``,
  but waiting for that costs a decode to ``max_len`` for a negligible BLEU change), or at its
  maximum length, where EOS is forced. Finished sentences leave the batch, so a batch costs what
  its longest sentence costs, at shrinking width.
* PAD and BOS are never generated; EOS is blocked until ``min_len`` tokens exist.
* Log-probabilities are fp32 even under bf16 autocast.

``use_cache=False`` recomputes the whole prefix at every step: a slow reference for tests and
``scripts/bench/bench_decode.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tfx.data import BOS, EOS, PAD
from tfx.model import EncoderOut, Transformer
from tfx.runtime import stop

log = logging.getLogger(__name__)

NEG_INF = -math.inf


# Decoding defaults, the one place beam_search, greedy_decode, translate_sentences and the
# tfx.translate / tfx.evaluate options take them from.
BEAM = 5  # beam size
LENPEN = 1.0  # score = logprob / len ** lenpen
MAX_LEN_A, MAX_LEN_B = 1.2, 10  # output length <= a * src_len + b
MAX_TOKENS = 4096  # padded source tokens per batch


@dataclass
class Hypothesis:
    """A finished translation."""

    tokens: list[int]  # token ids, without BOS and EOS
    score: float  # logprob / (len(tokens) + 1) ** lenpen: what beam search ranks by
    logprob: float  # sum of the token log-probabilities, EOS included


# --- model helpers --------------------------------------------------------------------------------


def max_positions(model: Transformer) -> int:
    """Longest sequence the model's sinusoidal position table covers."""
    return model.decoder.embedding.positions.size(0)


@contextlib.contextmanager
def inference(model: Transformer, autocast_dtype: torch.dtype | None, device: torch.device) -> Iterator[None]:
    """Eval mode (no dropout, restored afterwards: the trainer validates mid-training), no autograd,
    optional autocast."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), torch.autocast(device.type, autocast_dtype, enabled=autocast_dtype is not None):
            yield
    finally:
        model.train(was_training)


def max_output_lengths(src_tokens: Tensor, max_len_a: float, max_len_b: int, limit: int) -> Tensor:
    """Per-sentence maximum output length (B,), EOS excluded; ``src_len`` counts the source EOS."""
    src_lens = src_tokens.ne(PAD).sum(1).to(torch.float64)
    return (max_len_a * src_lens + max_len_b).floor().long().clamp(0, limit)


def select_encoder_out(enc: EncoderOut, rows: Tensor) -> EncoderOut:
    return EncoderOut(enc.hidden.index_select(0, rows), enc.padding_mask.index_select(0, rows))


class CachedStepper:
    """Next-token log-probs from the newest token and the decoder's key/value cache.

    The encoder output (and so each layer's source keys and values) keeps one row per sentence: the
    beams of a sentence share it (``MultiheadAttention`` groups their queries).
    """

    def __init__(self, model: Transformer, enc: EncoderOut, max_steps: int = 0) -> None:
        self.model, self.enc, self.state = model, enc, model.new_decoder_state(max_steps)

    def log_probs(self, prefix: Tensor) -> Tensor:
        """prefix (N, t) -> (N, V) fp32; only the last column is fed."""
        return self.model.decode_step(prefix[:, -1:], self.enc, self.state).float().log_softmax(-1)

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None:
        """Keep decoder row ``rows[i]`` as row i; ``sentences`` (the sentences still searching, when some
        finished) selects encoder rows. The cache is left alone when nothing moves."""
        if sentences is not None:
            self.enc = select_encoder_out(self.enc, sentences)
        if sentences is not None or not torch.equal(rows, torch.arange(rows.numel(), device=rows.device)):
            self.state.reorder(rows, cross=sentences)


class UncachedStepper:
    """Reference: run the decoder over the whole prefix at every step (quadratic, no cache)."""

    def __init__(self, model: Transformer, enc: EncoderOut) -> None:
        self.model, self.enc = model, enc

    def log_probs(self, prefix: Tensor) -> Tensor:
        return self.model.decoder(prefix, self.enc)[:, -1].float().log_softmax(-1)

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None:
        if sentences is not None:
            self.enc = select_encoder_out(self.enc, sentences)


def make_stepper(
    model: Transformer, enc: EncoderOut, use_cache: bool, max_steps: int = 0
) -> CachedStepper | UncachedStepper:
    return CachedStepper(model, enc, max_steps) if use_cache else UncachedStepper(model, enc)


# --- constraints ----------------------------------------------------------------------------------


def block_repeated_ngrams(lprobs: Tensor, generated: Tensor, n: int) -> None:
    """Forbid any token that would complete an n-gram already present in ``generated`` (N, t).

    All windows are compared at once: window i matches when its first n-1 tokens equal the last
    n-1 generated tokens, and then its n-th token is banned.
    """
    t = generated.size(1)
    if n <= 0 or t < n:
        return
    windows = generated.unfold(1, n, 1)  # (N, t-n+1, n)
    suffix = generated[:, t - n + 1 :]  # (N, n-1)
    match = (windows[:, :, : n - 1] == suffix[:, None, :]).all(-1)  # (N, t-n+1)
    rows, cols = match.nonzero(as_tuple=True)
    lprobs[rows, windows[rows, cols, n - 1]] = NEG_INF


def constrain(
    lprobs: Tensor, generated: Tensor, step: int, min_len: int, max_lens: Tensor, no_repeat_ngram: int
) -> None:
    """Mask (in place) what may not come next after ``step`` generated tokens; ``max_lens`` is per row."""
    eos = lprobs[:, EOS].clone()
    lprobs[:, PAD] = NEG_INF
    lprobs[:, BOS] = NEG_INF
    if step < min_len:
        lprobs[:, EOS] = NEG_INF
    block_repeated_ngrams(lprobs, generated, no_repeat_ngram)
    forced = max_lens <= step  # (N,) rows that must end now
    if forced.any():
        lprobs[forced] = NEG_INF
        lprobs[forced, EOS] = eos[forced]


def check_args(beam: int, lenpen: float, max_len_a: float, max_len_b: int, min_len: int, no_repeat: int) -> None:
    if beam < 1:
        raise ValueError(f"beam={beam} must be >= 1")
    if max_len_a < 0 or max_len_b < 0 or min_len < 0 or no_repeat < 0:
        raise ValueError("max_len_a, max_len_b, min_len and no_repeat_ngram must be >= 0")
    if not math.isfinite(lenpen):
        raise ValueError(f"lenpen={lenpen} must be finite")


# --- search ---------------------------------------------------------------------------------------


def beam_search(model: Transformer, src_tokens: Tensor, **options: Any) -> list[list[int]]:
    """Best hypothesis per sentence of ``src_tokens`` (B, S) (right-padded, each ending with EOS),
    as token ids without BOS/EOS. ``options`` are ``beam_search_nbest``'s (beam, lenpen, ...); see
    the module docstring for the scoring conventions."""
    return [hyps[0].tokens for hyps in beam_search_nbest(model, src_tokens, **options)]


def beam_search_nbest(
    model: Transformer,
    src_tokens: Tensor,
    beam: int = BEAM,
    lenpen: float = LENPEN,
    max_len_a: float = MAX_LEN_A,
    max_len_b: int = MAX_LEN_B,
    min_len: int = 1,
    no_repeat_ngram: int = 0,
    use_cache: bool = True,
    autocast_dtype: torch.dtype | None = None,
) -> list[list[Hypothesis]]:
    """Up to ``beam`` finished hypotheses per sentence, best ``score`` first."""
    check_args(beam, lenpen, max_len_a, max_len_b, min_len, no_repeat_ngram)
    if src_tokens.size(0) == 0:
        return []
    with inference(model, autocast_dtype, src_tokens.device):
        return _beam_search(model, src_tokens, beam, lenpen, max_len_a, max_len_b, min_len, no_repeat_ngram, use_cache)


def _beam_search(
    model: Transformer,
    src: Tensor,
    k: int,
    lenpen: float,
    max_len_a: float,
    max_len_b: int,
    min_len: int,
    no_repeat_ngram: int,
    use_cache: bool,
) -> list[list[Hypothesis]]:
    device, n_sent, vocab = src.device, src.size(0), model.vocab_size
    sent_max = max_output_lengths(src, max_len_a, max_len_b, max_positions(model) - 1)  # (B,)
    max_steps = int(sent_max.max()) + 1
    stepper = make_stepper(model, model.encode(src), use_cache, max_steps)  # one encoder row per sentence
    tokens = torch.full((n_sent * k, max_steps + 1), PAD, dtype=torch.long, device=device)  # (N, T)
    tokens[:, 0] = BOS
    # Only beam 0 is live at first: identical beams would fill the beam with duplicates.
    scores = torch.full((n_sent, k), NEG_INF, device=device)  # (B, K) cumulative log-probs
    scores[:, 0] = 0.0
    active = torch.arange(n_sent, device=device)  # original index of each sentence still searching
    finished: list[list[Hypothesis]] = [[] for _ in range(n_sent)]
    ranks = torch.arange(2 * k, device=device)
    for step in range(max_steps):
        n_act = active.numel()
        max_lens = sent_max[active].repeat_interleave(k)  # (N,)
        if step == 0:  # every beam of a sentence starts from BOS: run one row per sentence, then fan out
            lprobs = stepper.log_probs(tokens[::k, :1]).repeat_interleave(k, dim=0)  # (N, V)
        else:
            lprobs = stepper.log_probs(tokens[:, : step + 1])  # (N, V)
        constrain(lprobs, tokens[:, 1 : step + 1], step, min_len, max_lens, no_repeat_ngram)
        cand = (scores[:, :, None] + lprobs.view(n_act, k, vocab)).view(n_act, k * vocab)
        top_scores, top_idx = cand.topk(2 * k, dim=1)  # (B', 2K), best first
        top_beam, top_tok = top_idx // vocab, top_idx % vocab
        is_eos = top_tok.eq(EOS)
        _finish(finished, active, tokens, top_scores, top_beam, is_eos & top_scores.isfinite(), step, k, lenpen)
        # The k best non-EOS candidates continue (EOS ranks are pushed behind all others).
        keep = (is_eos.long() * 2 * k + ranks).topk(k, dim=1, largest=False).indices  # (B', K)
        scores = top_scores.gather(1, keep)
        src_rows = (torch.arange(n_act, device=device)[:, None] * k + top_beam.gather(1, keep)).view(-1)
        next_tok = top_tok.gather(1, keep).view(-1)
        n_done = torch.tensor([len(finished[i]) for i in active.tolist()], device=device)
        done = (n_done >= k) | (sent_max[active] <= step) | ~scores[:, 0].isfinite()
        if done.all():
            break
        left = None
        if done.any():
            left = (~done).nonzero().squeeze(1)
            active, scores = active[left], scores[left]
            src_rows, next_tok = src_rows.view(n_act, k)[left].view(-1), next_tok.view(n_act, k)[left].view(-1)
        # After step 0 the decoder cache still has one row per sentence: beam row r came from row r // k.
        stepper.reorder(src_rows // k if step == 0 else src_rows, left)
        tokens = tokens.index_select(0, src_rows)
        tokens[:, step + 1] = next_tok
    return [sorted(h, key=lambda h: -h.score) or [Hypothesis([], NEG_INF, NEG_INF)] for h in finished]


def _finish(
    finished: list[list[Hypothesis]],
    active: Tensor,
    tokens: Tensor,
    top_scores: Tensor,
    top_beam: Tensor,
    final: Tensor,
    step: int,
    k: int,
    lenpen: float,
) -> None:
    """Record EOS candidates among each sentence's first ``k`` ranks, best first, up to ``k`` per sentence."""
    sent, rank = final[:, :k].nonzero(as_tuple=True)  # row-major: best rank first within a sentence
    if sent.numel() == 0:
        return
    beam_rows = sent * k + top_beam[sent, rank]
    hyp_tokens = tokens[beam_rows, 1 : step + 1].tolist()
    logprobs = top_scores[sent, rank].tolist()
    norm = (step + 1) ** lenpen  # length counts the EOS
    for s, toks, lp in zip(active[sent].tolist(), hyp_tokens, logprobs, strict=True):
        if len(finished[s]) < k:
            finished[s].append(Hypothesis(toks, lp / norm, lp))


def greedy_decode(
    model: Transformer,
    src_tokens: Tensor,
    max_len_a: float = MAX_LEN_A,
    max_len_b: int = MAX_LEN_B,
    min_len: int = 1,
    no_repeat_ngram: int = 0,
    use_cache: bool = True,
    autocast_dtype: torch.dtype | None = None,
) -> list[list[int]]:
    """Argmax decoding: the same tokens as ``beam_search(beam=1)`` without the beam bookkeeping."""
    check_args(1, 0.0, max_len_a, max_len_b, min_len, no_repeat_ngram)
    if src_tokens.size(0) == 0:
        return []
    with inference(model, autocast_dtype, src_tokens.device):
        return _greedy(model, src_tokens, max_len_a, max_len_b, min_len, no_repeat_ngram, use_cache)


def _greedy(
    model: Transformer, src: Tensor, max_len_a: float, max_len_b: int, min_len: int, no_repeat: int, use_cache: bool
) -> list[list[int]]:
    device, n_sent = src.device, src.size(0)
    sent_max = max_output_lengths(src, max_len_a, max_len_b, max_positions(model) - 1)
    max_steps = int(sent_max.max()) + 1
    stepper = make_stepper(model, model.encode(src), use_cache, max_steps)
    tokens = torch.full((n_sent, max_steps + 1), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = BOS
    active = torch.arange(n_sent, device=device)
    out: list[list[int]] = [[] for _ in range(n_sent)]
    for step in range(max_steps):
        lprobs = stepper.log_probs(tokens[:, : step + 1])
        constrain(lprobs, tokens[:, 1 : step + 1], step, min_len, sent_max[active], no_repeat)
        next_tok = lprobs.argmax(-1)  # (N,)
        done = next_tok.eq(EOS) | ~lprobs.max(-1).values.isfinite()
        sent = active.tolist()
        for i in done.nonzero().squeeze(1).tolist():
            out[sent[i]] = tokens[i, 1 : step + 1].tolist()
        if done.all():
            break
        if done.any():
            left = (~done).nonzero().squeeze(1)
            active, next_tok, tokens = active[left], next_tok[left], tokens[left]
            stepper.reorder(left, left)
        tokens[:, step + 1] = next_tok
    return out


def score_sequences(model: Transformer, src_tokens: Tensor, hyps: Sequence[Sequence[int]]) -> Tensor:
    """Teacher-forced ``log p(hyp + EOS | src)`` per row (N,), fp32: what beam search sums up.

    ``hyps[i]`` holds token ids without BOS/EOS and is scored against ``src_tokens[i]``.
    """
    if len(hyps) != src_tokens.size(0):
        raise ValueError(f"{len(hyps)} hypotheses for {src_tokens.size(0)} sources")
    device = src_tokens.device
    width = max((len(h) for h in hyps), default=0) + 1
    prev = torch.full((len(hyps), width), PAD, dtype=torch.long, device=device)
    target = torch.full_like(prev, PAD)
    for i, h in enumerate(hyps):
        seq = torch.tensor(list(h), dtype=torch.long, device=device)
        prev[i, 0], prev[i, 1 : len(h) + 1] = BOS, seq
        target[i, : len(h)], target[i, len(h)] = seq, EOS
    with inference(model, None, device):
        lprobs = model(src_tokens, prev).float().log_softmax(-1)  # (N, T, V)
        token_lp = lprobs.gather(2, target[:, :, None]).squeeze(2)  # (N, T)
        return token_lp.masked_fill(target.eq(PAD), 0.0).sum(1)


def length_normalized(logprob: Tensor | float, n_tokens: int, lenpen: float) -> Tensor | float:
    """fairseq's length-normalized score of a hypothesis of ``n_tokens`` tokens (EOS excluded)."""
    return logprob / (n_tokens + 1) ** lenpen


# --- text in, text out ----------------------------------------------------------------------------


def length_batches(lengths: Sequence[int], max_tokens: int | None, batch_size: int | None) -> list[list[int]]:
    """Indices grouped longest-first so that ``len(batch) * longest <= max_tokens`` (and at most
    ``batch_size`` sentences): little padding, and an out-of-memory shows on the first batch."""
    if max_tokens is None and batch_size is None:
        raise ValueError("give max_tokens or batch_size")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches:
            current = batches[-1]
            width = lengths[current[0]]  # the longest comes first
            fits_tokens = max_tokens is None or (len(current) + 1) * width <= max_tokens
            fits_count = batch_size is None or len(current) < batch_size
            if fits_tokens and fits_count:
                current.append(i)
                continue
        batches.append([i])
    return batches


def pad_batch(seqs: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    """Right-padded (B, S) long tensor."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


def encode_sources(tokenizer, sentences: Sequence[str], limit: int) -> list[list[int]]:
    """Piece ids + EOS; sources longer than the position table are cut (and logged), not refused."""
    ids = tokenizer.encode_batch(list(sentences)) if sentences else []
    too_long = sum(len(x) + 1 > limit for x in ids)
    if too_long:
        log.warning("%d source sentence(s) longer than %d tokens were truncated", too_long, limit)
    return [x[: limit - 1] + [EOS] for x in ids]


def translate_sentences(
    model: Transformer,
    tokenizer,
    sentences: Sequence[str],
    beam: int = BEAM,
    lenpen: float = LENPEN,
    max_tokens: int | None = MAX_TOKENS,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    autocast_dtype: torch.dtype | None = None,
    max_len_a: float = MAX_LEN_A,
    max_len_b: int = MAX_LEN_B,
) -> list[str]:
    """Detokenized translations of raw ``sentences``, in input order.

    Batches are formed by source length (``max_tokens`` padded source tokens and/or ``batch_size``
    sentences per batch); ``beam=1`` takes the greedy path. ``device`` defaults to the model's.
    """
    from tqdm.auto import tqdm

    device = torch.device(device) if device is not None else next(model.parameters()).device
    src_ids = encode_sources(tokenizer, sentences, max_positions(model))
    out: list[str] = [""] * len(src_ids)
    search = dict(max_len_a=max_len_a, max_len_b=max_len_b, autocast_dtype=autocast_dtype)
    with tqdm(total=len(src_ids), disable=not progress, unit="sent", desc="translate") as bar:
        for batch in length_batches([len(x) for x in src_ids], max_tokens, batch_size):
            stop.check()  # inside training's validation, a stop signal ends the decode at the next batch
            src = pad_batch([src_ids[i] for i in batch], device)
            if beam == 1:
                hyps = greedy_decode(model, src, **search)
            else:
                hyps = beam_search(model, src, beam=beam, lenpen=lenpen, **search)
            for i, h in zip(batch, hyps, strict=True):
                out[i] = tokenizer.decode(h)
            bar.update(len(batch))
    return out


__all__ = [
    "Hypothesis",
    "beam_search",
    "beam_search_nbest",
    "greedy_decode",
    "length_batches",
    "length_normalized",
    "score_sequences",
    "translate_sentences",
]
