"""Beam search and greedy decoding on tiny random models: exactness against references, constraints."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

import tfx.evaluation.decode as decode
from tests.conftest import PAD, VOCAB, tiny_model
from tfx.data import EOS, UNK
from tfx.evaluation.decode import (
    beam_search,
    beam_search_nbest,
    block_repeated_ngrams,
    encode_sources,
    greedy_decode,
    length_batches,
    length_normalized,
    pad_batch,
    score_sequences,
    translate_sentences,
)
from tfx.model import ModelConfig, Transformer

NEG_INF = float("-inf")


def sources(b: int = 4, s: int = 9, seed: int = 0) -> torch.Tensor:
    """Right-padded sources of different lengths, each ending with EOS."""
    src = torch.randint(4, VOCAB, (b, s), generator=torch.Generator().manual_seed(seed))
    for i in range(b):
        n = s - (i % 4)  # lengths s, s-1, s-2, s-3
        src[i, n - 1] = EOS
        src[i, n:] = PAD
    return src


def model_with_eos_bias(bias: float, seed: int = 0, **kw) -> Transformer:
    """A tiny model whose EOS logit is shifted by ``bias``: +large stops at once, -large never stops."""
    torch.manual_seed(seed)
    model = tiny_model(**kw).eval()
    shift = torch.zeros(model.vocab_size)
    shift[EOS] = bias
    model.decoder.register_forward_hook(lambda module, args, out: out + shift)
    return model


def seeded(seed: int, **kw) -> Transformer:
    torch.manual_seed(seed)
    return tiny_model(**kw).eval()


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy(seed: int, use_cache: bool) -> None:
    model, src = seeded(seed), sources(seed=seed)
    greedy = greedy_decode(model, src, use_cache=use_cache)
    assert beam_search(model, src, beam=1, use_cache=use_cache) == greedy
    constrained = dict(min_len=3, no_repeat_ngram=2, max_len_a=0.5, max_len_b=4)
    assert beam_search(model, src, beam=1, **constrained) == greedy_decode(model, src, **constrained)


@pytest.mark.parametrize("beam", [1, 4])
def test_cached_equals_uncached(beam: int) -> None:
    model, src = seeded(0).double(), sources(b=5)
    cached = beam_search_nbest(model, src, beam=beam, no_repeat_ngram=3)
    uncached = beam_search_nbest(model, src, beam=beam, no_repeat_ngram=3, use_cache=False)
    for a, b in zip(cached, uncached, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-9)
    assert greedy_decode(model, src) == greedy_decode(model, src, use_cache=False)


def test_batch_equals_one_by_one() -> None:
    model, src = seeded(1).double(), sources(b=6, s=11)
    batched = beam_search_nbest(model, src, beam=3, lenpen=0.6)
    for i in range(src.size(0)):
        alone = src[i : i + 1, : int(src[i].ne(PAD).sum())]  # no padding at all
        single = beam_search_nbest(model, alone, beam=3, lenpen=0.6)[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[i]]
        assert [h.score for h in single] == pytest.approx([h.score for h in batched[i]], rel=1e-9)
    assert greedy_decode(model, src) == [greedy_decode(model, src[i : i + 1])[0] for i in range(src.size(0))]


def test_reported_scores_are_model_scores() -> None:
    model, src = seeded(2).double(), sources()
    lenpen = 1.3
    best = [hyps[0] for hyps in beam_search_nbest(model, src, beam=4, lenpen=lenpen)]
    logprobs = score_sequences(model, src, [h.tokens for h in best])
    for h, lp in zip(best, logprobs.tolist(), strict=True):
        assert h.logprob == pytest.approx(lp, rel=1e-9)
        assert h.score == pytest.approx(length_normalized(lp, len(h.tokens), lenpen), rel=1e-9)


def test_length_normalized_literal_values() -> None:
    """fairseq's score: logprob / (tokens + 1 for EOS) ** lenpen, pinned to numbers worked by hand."""
    assert length_normalized(-6.0, 2, 1.0) == -2.0
    assert length_normalized(-6.0, 2, 0.0) == -6.0
    assert length_normalized(-8.0, 3, 0.5) == -4.0
    assert length_normalized(-18.0, 2, 2.0) == -2.0


@pytest.mark.parametrize(("lenpen", "power"), [(1.0, 1), (2.0, 2), (0.0, 0)])
def test_beam_scores_divide_by_length_with_eos(lenpen: float, power: int) -> None:
    """The beam step's own normalization, checked against the formula (not ``length_normalized``)."""
    model, src = seeded(2).double(), sources()
    for hyps in beam_search_nbest(model, src, beam=4, lenpen=lenpen):
        for h in hyps:
            assert h.score == pytest.approx(h.logprob / (len(h.tokens) + 1) ** power, rel=1e-12)
            assert h.logprob < 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_large_beam_scores_at_least_greedy(seed: int) -> None:
    model, src = seeded(seed).double(), sources(seed=seed)
    greedy = greedy_decode(model, src)
    greedy_lp = score_sequences(model, src, greedy).tolist()
    beam = beam_search_nbest(model, src, beam=16, lenpen=1.0)
    for g, g_lp, hyps in zip(greedy, greedy_lp, beam, strict=True):
        assert hyps[0].score >= length_normalized(g_lp, len(g), 1.0) - 1e-9


def test_beam_covering_every_prefix_is_exhaustive() -> None:
    """Generable tokens {UNK, 4, 5, 6} (PAD and BOS never are), at most 3 of them: a beam of 128
    holds every prefix, so beam search must return all 84 possible hypotheses, ranked exactly as
    brute-force scoring ranks them."""
    torch.manual_seed(0)
    model = (
        Transformer(
            ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, ffn_dim=32, heads=2, dropout=0.0), 7, PAD
        )
        .eval()
        .double()
    )
    src = torch.tensor([[4, 5, 6, EOS]])
    lenpen = 0.7
    nbest = beam_search_nbest(model, src, beam=128, lenpen=lenpen, max_len_a=0, max_len_b=3)[0]
    every = [list(seq) for n in (1, 2, 3) for seq in itertools.product((UNK, 4, 5, 6), repeat=n)]
    lps = score_sequences(model, src.expand(len(every), -1), every).tolist()
    brute = sorted(((length_normalized(lp, len(h), lenpen), h) for h, lp in zip(every, lps, strict=True)), reverse=True)
    assert len(nbest) == len(every)
    assert [h.tokens for h in nbest] == [h for _, h in brute]
    assert [h.score for h in nbest] == pytest.approx([s for s, _ in brute], rel=1e-9)


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_and_max_len(beam: int) -> None:
    src = sources()
    src_lens = src.ne(PAD).sum(1).tolist()
    eager = model_with_eos_bias(+1e4)  # wants to stop at once
    assert all(len(h) == 1 for h in beam_search(eager, src, beam=beam))  # default min_len=1: never empty
    assert all(len(h) == 0 for h in beam_search(eager, src, beam=beam, min_len=0))
    assert all(len(h) == 5 for h in beam_search(eager, src, beam=beam, min_len=5))
    endless = model_with_eos_bias(-1e4)  # never wants to stop: the length limit decides
    out = beam_search(endless, src, beam=beam, max_len_a=0.5, max_len_b=2)
    assert [len(h) for h in out] == [int(0.5 * n + 2) for n in src_lens]
    # max_len < min_len: the maximum wins
    assert all(len(h) == 2 for h in beam_search(eager, src, beam=beam, max_len_a=0, max_len_b=2, min_len=5))


def test_length_capped_by_positions() -> None:
    torch.manual_seed(0)
    model = tiny_model(max_positions=12).eval()
    model.decoder.register_forward_hook(lambda module, args, out: out - 1e4 * (torch.arange(out.size(-1)) == EOS))
    out = beam_search(model, sources(), beam=2, max_len_a=10, max_len_b=100)
    assert all(len(h) == 11 for h in out)  # BOS + 11 tokens fill the 12 positions


def repeated_ngrams(seq: list[int], n: int) -> bool:
    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("beam", [1, 4])
def test_no_repeat_ngram(beam: int) -> None:
    model = model_with_eos_bias(-1e4, seed=3)
    src = sources(b=4, s=12)
    free = beam_search(model, src, beam=beam, max_len_b=30)
    assert any(repeated_ngrams(h, 2) for h in free)  # an untrained model loops: the test has teeth
    for n in (1, 2, 3):
        blocked = beam_search(model, src, beam=beam, max_len_b=30, no_repeat_ngram=n)
        assert not any(repeated_ngrams(h, n) for h in blocked)
        lengths = [int(1.2 * n_src + 30) for n_src in src.ne(PAD).sum(1).tolist()]
        assert [len(h) for h in blocked] == lengths  # blocking never made the search give up early


def test_eval_mode_and_training_flag_restored() -> None:
    model = seeded(0, dropout=0.5)
    src = sources()
    expected = beam_search(model, src, beam=3)
    model.train()
    assert beam_search(model, src, beam=3) == expected  # no dropout while decoding
    assert model.training


def test_bf16_autocast_runs() -> None:
    model, src = seeded(0), sources()
    out = beam_search(model, src, beam=2, autocast_dtype=torch.bfloat16)
    assert len(out) == src.size(0) and all(isinstance(t, int) for h in out for t in h)


def test_length_batches_cover_every_index_within_budget() -> None:
    lengths = [5, 17, 3, 9, 9, 30, 1, 12]
    batches = length_batches(lengths, max_tokens=40, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 40


class WordTokenizer:
    """Whitespace words <-> ids 4.. (enough of the Tokenizer API for translate_sentences)."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[4 + (sum(map(ord, w)) % 46) for w in t.split()] for t in texts]

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_sentences_keeps_input_order(beam: int) -> None:
    model, tok = seeded(0), WordTokenizer()
    sentences = ["a b c d e f", "x", "", "p q r", "a b c d e f g h i j", "m n"]
    together = translate_sentences(model, tok, sentences, beam=beam, max_tokens=12)
    alone = [translate_sentences(model, tok, [s], beam=beam)[0] for s in sentences]
    assert together == alone
    assert translate_sentences(model, tok, [], beam=beam) == []


def test_block_repeated_ngrams_bans_only_the_completing_token() -> None:
    """After 4 5 4, the bigram (4, 5) exists and 4 is last: only 5 is banned (not 4, which (5, 4) ends)."""
    lprobs = torch.zeros(1, 8)
    block_repeated_ngrams(lprobs, torch.tensor([[4, 5, 4]]), 2)
    assert lprobs[0].isinf().nonzero().flatten().tolist() == [5]
    lprobs = torch.zeros(1, 8)
    block_repeated_ngrams(lprobs, torch.tensor([[4, 5, 6, 4, 5]]), 3)  # (4, 5, 6) exists, (4, 5) is last
    assert lprobs[0].isinf().nonzero().flatten().tolist() == [6]


@pytest.mark.parametrize("beam", [1, 3])
def test_zero_maximum_length_gives_empty_outputs(beam: int) -> None:
    model, src = model_with_eos_bias(-50.0), sources()  # EOS never chosen freely: the cap forces it
    hyps = beam_search(model, src, beam=beam, max_len_a=0, max_len_b=0)
    assert hyps == [[]] * src.size(0)


def scripted(first: dict[int, float], then: dict[int, float]) -> Transformer:
    """A model whose logits ignore the source: ``first`` at output position 0, ``then`` after it,
    every other token at -1e4 (decode with ``use_cache=False`` so each call sees the whole prefix)."""
    model = seeded(0)

    def logits(positions: int) -> torch.Tensor:
        out = torch.full((positions, model.vocab_size), -1e4)
        for t in range(positions):
            for tok, value in (first if t == 0 else then).items():
                out[t, tok] = value
        return out

    model.decoder.register_forward_hook(lambda module, args, out: logits(out.size(1)).expand_as(out).clone())
    return model


def test_more_eos_candidates_than_free_slots_keep_k_hypotheses() -> None:
    """Beam 2: step 0 finishes the empty output (EOS ranks second), step 1 offers two EOS candidates
    (after 4 and after 5) for the one slot left; only the better, [4], is kept."""
    model = scripted({4: 0.0, EOS: -0.1, 5: -0.2}, {EOS: 0.0})
    nbest = beam_search_nbest(model, sources(b=1), beam=2, lenpen=1.0, min_len=0, use_cache=False)[0]
    assert [h.tokens for h in nbest] == [[4], []]
    lp = torch.tensor([0.0, -0.1, -0.2]).log_softmax(0)  # the three live tokens at step 0
    assert [h.logprob for h in nbest] == pytest.approx([lp[0].item(), lp[1].item()], abs=1e-4)


def test_pad_batch_right_pads_with_pad() -> None:
    out = pad_batch([[5, 6, EOS], [7, EOS], [EOS]], torch.device("cpu"))
    assert out.dtype == torch.long and out.tolist() == [[5, 6, EOS], [7, EOS, PAD], [EOS, PAD, PAD]]


def test_encode_sources_appends_eos_and_cuts_to_the_position_table(caplog: pytest.LogCaptureFixture) -> None:
    """Limit 4 positions: 3 words + EOS fit exactly; 4 words are cut to 3 + EOS and counted."""
    tok = WordTokenizer()
    sentences = ["a b c d", "p q r", "x", ""]
    words = tok.encode_batch(sentences)
    with caplog.at_level(logging.WARNING, logger="tfx.evaluation.decode"):
        ids = encode_sources(tok, sentences, limit=4)
    assert ids == [words[0][:3] + [EOS], words[1] + [EOS], words[2] + [EOS], [EOS]]
    assert caplog.messages == ["1 source sentence(s) longer than 4 tokens were truncated"]
    assert encode_sources(tok, [], 4) == []


def test_translate_sentences_passes_its_settings_to_the_search(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Each batch goes to greedy (beam 1) or beam search with the caller's lenpen, length limits and
    autocast; batches respect batch_size and go to the given device (default: the model's); the
    output is the decoded best hypothesis per sentence."""
    model, tok = model_with_eos_bias(-2.0), WordTokenizer()
    sentences = ["a b c d e f", "x y", "p q r"]
    calls: list[tuple[str, int, dict]] = []
    for name in ("greedy_decode", "beam_search"):
        real = getattr(decode, name)
        spy = lambda m, src, _f=real, _n=name, **kw: calls.append((_n, src.size(0), kw)) or _f(m, src, **kw)  # noqa: E731
        monkeypatch.setattr(decode, name, spy)
    devices: list[torch.device] = []
    real_pad = decode.pad_batch
    monkeypatch.setattr(decode, "pad_batch", lambda seqs, device: devices.append(device) or real_pad(seqs, device))
    search = dict(max_len_a=0.5, max_len_b=2, autocast_dtype=torch.bfloat16)
    out = translate_sentences(model, tok, sentences, beam=3, lenpen=0.2, batch_size=2, max_tokens=None, **search)
    assert calls == [
        ("beam_search", 2, dict(beam=3, lenpen=0.2, **search)),
        ("beam_search", 1, dict(beam=3, lenpen=0.2, **search)),
    ]
    src = [torch.tensor([ids]) for ids in encode_sources(tok, sentences, 64)]
    assert out == [tok.decode(beam_search(model, s, beam=3, lenpen=0.2, **search)[0]) for s in src]
    assert capsys.readouterr().err == ""  # no progress bar unless asked
    calls.clear()
    out = translate_sentences(model, tok, sentences, beam=1, device="cpu", progress=True, **search)
    assert calls == [("greedy_decode", 3, search)]
    assert out == [tok.decode(greedy_decode(model, s, **search)[0]) for s in src]
    assert "3/3" in capsys.readouterr().err
    assert devices == [torch.device("cpu")] * 3  # the model's device, then the one given


def test_length_batches_exact_groups() -> None:
    """Longest first (stable among equals); a batch may fill the token budget exactly."""
    assert length_batches([4, 4, 4, 2], max_tokens=8, batch_size=None) == [[0, 1], [2, 3]]
    assert length_batches([1, 2, 3, 4, 5], max_tokens=None, batch_size=2) == [[4, 3], [2, 1], [0]]
    assert length_batches([3, 3, 3], max_tokens=100, batch_size=2) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="^give max_tokens or batch_size$"):
        length_batches([1], None, None)


def test_score_sequences_checks_counts_and_takes_empty_input() -> None:
    model, src = seeded(0), sources(b=3)
    with pytest.raises(ValueError, match="^2 hypotheses for 3 sources$"):
        score_sequences(model, src, [[4], [5]])
    assert score_sequences(model, src[:0], []).shape == (0,)


def test_greedy_and_beam_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both searches use the KV cache unless told not to, and forbid an empty output (min_len 1)."""
    eager = model_with_eos_bias(+1e4)
    assert all(len(h) == 1 for h in greedy_decode(eager, sources()))
    used: list[bool] = []
    real = decode.make_stepper
    monkeypatch.setattr(decode, "make_stepper", lambda *a, **kw: used.append(a[2]) or real(*a, **kw))
    greedy_decode(eager, sources())
    beam_search(eager, sources(), beam=2)
    assert used == [True, True]


@pytest.mark.parametrize("search", [beam_search, greedy_decode])
def test_empty_batch_gives_no_outputs(search) -> None:
    assert search(seeded(0), torch.zeros((0, 5), dtype=torch.long)) == []


@pytest.mark.parametrize("search", [beam_search, greedy_decode])
def test_autocast_dtype_reaches_the_decoder(search) -> None:
    model, dtypes = seeded(0), set()
    model.decoder.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))
    search(model, sources(b=2), autocast_dtype=torch.bfloat16, max_len_b=3)
    assert dtypes == {torch.bfloat16}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2, 1.0, -0.5, 10, 1, 0), "^max_len_a, max_len_b, min_len and no_repeat_ngram must be >= 0$"),
        ((2, 1.0, 1.2, -1, 1, 0), "^max_len_a, max_len_b, min_len and no_repeat_ngram must be >= 0$"),
        ((2, 1.0, 1.2, 10, -1, 0), "^max_len_a, max_len_b, min_len and no_repeat_ngram must be >= 0$"),
        ((2, 1.0, 1.2, 10, 1, -1), "^max_len_a, max_len_b, min_len and no_repeat_ngram must be >= 0$"),
        ((2, float("nan"), 1.2, 10, 1, 0), "^lenpen=nan must be finite$"),
        ((0, 1.0, 1.2, 10, 1, 0), "^beam=0 must be >= 1$"),
    ],
)
def test_check_args_messages(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode.check_args(*args)


def test_max_output_length_is_computed_in_float64_like_fairseq() -> None:
    """1.05 * 100 is 105.00000000000001 in float64 (fairseq's Python floats) but 104.99999 in float32."""
    src = torch.full((1, 100), 5)
    assert decode.max_output_lengths(src, 1.05, 0, 1000).tolist() == [int(1.05 * 100)] == [105]


def test_greedy_length_capped_by_positions() -> None:
    torch.manual_seed(0)
    model = tiny_model(max_positions=12).eval()
    model.decoder.register_forward_hook(lambda module, args, out: out - 1e4 * (torch.arange(out.size(-1)) == EOS))
    out = greedy_decode(model, sources(), max_len_a=10, max_len_b=100)
    assert all(len(h) == 11 for h in out)  # BOS + 11 tokens fill the 12 positions


def test_beam_search_with_nan_model_returns_an_empty_hypothesis() -> None:
    """A model that outputs NaN finishes nothing; every sentence still gets one (empty, -inf) hypothesis."""
    model = seeded(0)
    model.decoder.register_forward_hook(lambda module, args, out: out * float("nan"))
    nbest = beam_search_nbest(model, sources(b=3), beam=2)
    assert [[(h.tokens, h.score, h.logprob) for h in hyps] for hyps in nbest] == [[([], NEG_INF, NEG_INF)]] * 3


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_stops_once_every_sentence_has_beam_hypotheses(use_cache: bool) -> None:
    """EOS always ranks first: step 0 may not end (min_len 1), so step 1 finishes both beams and the
    search stops there, long before the maximum length."""
    model, calls = model_with_eos_bias(1e4), []
    model.decoder.register_forward_hook(lambda module, args, out: calls.append(1))
    nbest = beam_search_nbest(model, sources(b=3), beam=2, use_cache=use_cache)
    assert len(calls) == 2
    assert [[len(h.tokens) for h in hyps] for hyps in nbest] == [[1, 1]] * 3
