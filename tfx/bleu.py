"""BLEU and chrF with sacrebleu, in the two flavours MT papers report.

* ``corpus_bleu``: sacreBLEU on detokenized text (``tok:13a``, cased). Comparable across papers
  whenever the signature matches; this is the number to quote.
* ``tokenized_bleu``: the IWSLT'14 De-En convention behind most published numbers on that set
  (e.g. T-Fixup's 35.7 BLEU, fairseq's ``prepare-iwslt14.sh`` + ``fairseq-generate``). Hypotheses
  and references go through that script's steps: ``’`` -> ``'``, Moses ``tokenizer.perl -l LANG``
  (XML escaping on, no aggressive dash splitting), lowercasing; then BLEU with ``tok:none``.
  Escaping stays on because fairseq's reference files contain ``&apos;``/``&quot;``; with
  ``refs_tokenized=True`` such files are used as they are. On the raw IWSLT'14 test set this
  reproduces fairseq's tokenized ``test.en`` on 6745 of 6750 lines (the other 5 hold an ``&`` the
  IWSLT XML double-escaped). Tokenized BLEU runs 1-2 points above sacreBLEU: never compare the two.

Every result carries its kind and signature so a printed number says what it is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

DETOK = "sacreBLEU (detokenized, tok:13a)"
TOKENIZED = "tokenized BLEU (Moses-tokenized + lowercased, tok:none; the IWSLT'14 fairseq convention)"


@dataclass(frozen=True)
class BleuResult:
    """A corpus score with everything needed to tell what kind of number it is."""

    score: float  # BLEU, 0-100
    signature: str  # sacrebleu's signature, e.g. nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0
    chrf: float | None  # chrF2, 0-100 (detokenized BLEU only)
    chrf_signature: str | None
    kind: str = DETOK  # DETOK or TOKENIZED
    detail: str = ""  # sacrebleu's one-line summary: n-gram precisions, brevity penalty, lengths

    def __str__(self) -> str:
        lines = [f"BLEU = {self.score:.2f}  [{self.kind}]  {self.signature}"]
        if self.detail:
            lines.append(f"  {self.detail}")
        if self.chrf is not None:
            lines.append(f"chrF2 = {self.chrf:.2f}  {self.chrf_signature}")
        return "\n".join(lines)


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references: they must be line-aligned")
    if not hyps:
        raise ValueError("no sentences to score")


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> BleuResult:
    """sacreBLEU and chrF2 of detokenized ``hyps`` against one detokenized reference each."""
    _check(hyps, refs)
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(hyps), [list(refs)])
    c = chrf.corpus_score(list(hyps), [list(refs)])
    return BleuResult(b.score, str(bleu.get_signature()), c.score, str(chrf.get_signature()), DETOK, _detail(b))


@functools.lru_cache(maxsize=8)
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


# tokenizer.perl splits a final "x." even after a non-breaking prefix ("the U.S." -> "the U.S ."):
# "split last words independently as they are unlikely to be non-breaking prefixes". sacremoses
# 0.1/0.2 lacks that rule. A run of dots is not split (Perl protects it as DOTMULTI).
_FINAL_PERIOD = re.compile(r"(\S*[^.\s])\.$")


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """fairseq ``prepare-iwslt14.sh`` tokenization: ``’`` -> ``'``, then ``tokenizer.perl -l LANG``
    (escaping on, no ``-a``) as sacremoses implements it, plus Moses' final-period rule."""
    tok = _moses(lang)
    out = []
    for line in lines:
        line = tok.tokenize(line.replace("\u2019", "'"), escape=True, aggressive_dash_splits=False, return_str=True)
        out.append(_FINAL_PERIOD.sub(r"\1 .", line))
    return out


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str, refs_tokenized: bool = False) -> BleuResult:
    """IWSLT'14-style BLEU: Moses-tokenize (refs too unless ``refs_tokenized``), lowercase, ``tok:none``.

    Tokenize first, lowercase second, as fairseq's script does (Moses' non-breaking prefixes are
    case-sensitive). ``lang`` is the target language.
    """
    _check(hyps, refs)
    tok_hyps = moses_tokenize(hyps, lang)
    tok_refs = list(refs) if refs_tokenized else moses_tokenize(refs, lang)
    bleu = BLEU(tokenize="none", lowercase=True, force=True)  # input is tokenized on purpose
    b = bleu.corpus_score(tok_hyps, [tok_refs])
    signature = f"{bleu.get_signature()}|moses:{lang}-escape"
    return BleuResult(b.score, signature, None, None, TOKENIZED, _detail(b))


def _detail(score) -> str:
    """'66.0/41.2/28.1/19.9 (BP = 1.000 ratio = 1.012 hyp_len = ... ref_len = ...)'."""
    return score.format().split(" = ", 1)[1].split(" ", 1)[1]


__all__ = ["DETOK", "TOKENIZED", "BleuResult", "corpus_bleu", "moses_tokenize", "tokenized_bleu"]
