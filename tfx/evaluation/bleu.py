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
  ``hyps_tokenized=True`` scores a model trained on such files (its output is tokenized already).
  ``compound_split=True`` adds the T-Fixup reference's ``compound_split_bleu.sh`` step: every hyphen
  between two non-space characters becomes `` ##AT##-##AT## `` in hypotheses and references, so
  "two-to-three" counts as three tokens plus separators rather than one (the WMT'14 En-De habit of
  Vaswani et al.; it raises BLEU on hyphen-rich text).

Every result carries its kind and signature so a printed number says what it is.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

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


# compound_split_bleu.sh's Perl `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`: same left-to-right, non-overlapping
# matches, so "a-b-c" becomes "a ##AT##-##AT## b-c" there and here.
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(lines: Sequence[str]) -> list[str]:
    """The reference's compound splitting of tokenized text (``compound_split_bleu.sh``)."""
    return [_COMPOUND.sub(r"\1 ##AT##-##AT## \2", line) for line in lines]


def _tokenized_metric() -> BLEU:
    """BLEU on text tokenized on purpose: ``tok:none``, lowercased (tokenized_bleu's and its paired test's)."""
    return BLEU(tokenize="none", lowercase=True, force=True)


def tokenized_bleu(
    hyps: Sequence[str],
    refs: Sequence[str],
    lang: str,
    refs_tokenized: bool = False,
    hyps_tokenized: bool = False,
    compound: bool = False,
) -> BleuResult:
    """IWSLT'14-style BLEU: Moses-tokenize (each side unless already ``*_tokenized``), lowercase, ``tok:none``.

    Tokenize first, lowercase second, as fairseq's script does (Moses' non-breaking prefixes are
    case-sensitive). ``lang`` is the target language. ``compound`` splits hyphenated compounds
    afterwards, as the T-Fixup reference's ``compound_split_bleu.sh`` does.
    """
    _check(hyps, refs)
    tok_hyps = list(hyps) if hyps_tokenized else moses_tokenize(hyps, lang)
    tok_refs = list(refs) if refs_tokenized else moses_tokenize(refs, lang)
    if compound:
        tok_hyps, tok_refs = compound_split(tok_hyps), compound_split(tok_refs)
    bleu = _tokenized_metric()
    b = bleu.corpus_score(tok_hyps, [tok_refs])
    given = [side for side, done in (("hyp", hyps_tokenized), ("ref", refs_tokenized)) if done]
    signature = f"{bleu.get_signature()}|moses:{lang}-escape"
    if given:
        signature += f"|pretok:{'+'.join(given)}"
    if compound:
        signature += "|compound-split"
    return BleuResult(b.score, signature, None, None, TOKENIZED, _detail(b))


def add_scoring_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``tfx.evaluate`` and ``tfx.average --best-window``."""
    parser.add_argument("--tok-bleu", action="store_true", help="also score tokenized, lowercased (IWSLT'14) BLEU")
    parser.add_argument(
        "--refs-tokenized", action="store_true",
        help="the references are Moses-tokenized already (e.g. fairseq's test.en): score them as they are "
        "(implies --tok-bleu)",
    )  # fmt: skip
    parser.add_argument(
        "--compound-split", action="store_true",
        help="split hyphenated compounds (##AT##-##AT##) as the T-Fixup reference's compound_split_bleu.sh "
        "(implies --tok-bleu)",
    )  # fmt: skip


def score_all(
    hyps: Sequence[str],
    refs: Sequence[str],
    lang: str,
    args: argparse.Namespace,
    tokenized_data: bool = False,
    refs_tokenized: bool = False,
) -> list[BleuResult]:
    """The scores ``add_scoring_args`` asked for; the last one is the headline (window choice uses it).

    ``tokenized_data``: the model was trained on tokenized text (``data.tokenized``), so its output
    is tokenized and only tokenized BLEU means anything: sacreBLEU's 13a on such text is skipped.
    ``refs_tokenized`` (or ``--refs-tokenized``): the references are tokenized (e.g. that run's own split).
    """
    results = [] if tokenized_data else [corpus_bleu(hyps, refs)]
    if tokenized_data or args.tok_bleu or args.refs_tokenized or args.compound_split:
        tok = tokenized_bleu(
            hyps, refs, lang, refs_tokenized=refs_tokenized or args.refs_tokenized, hyps_tokenized=tokenized_data,
            compound=args.compound_split,
        )  # fmt: skip
        results.append(tok)
    return results


@dataclass(frozen=True)
class PairedResult:
    """A system against the baseline on the same sentences (sacreBLEU 13a, or tokenized BLEU): Koehn's paired
    bootstrap."""

    baseline: float  # the baseline's BLEU
    score: float  # the system's BLEU
    ci: float  # half-width of the system's 95 % bootstrap confidence interval
    p_value: float  # how often resampled differences are this large by chance (sacrebleu's ``--paired-bs``)
    signature: str  # e.g. nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0


def paired_bootstrap(
    baseline: Sequence[str],
    systems: Mapping[str, Sequence[str]],
    refs: Sequence[str],
    n_samples: int = 1000,
    tokenized: bool = False,
) -> dict[str, PairedResult]:
    """Each of ``systems`` against ``baseline``, all line-aligned with ``refs``: sacrebleu's paired bootstrap
    resampling (Koehn 2004; the Moses script's test), fixed seed, so a report rewritten gives the same p-values.
    It measures the test set's sampling noise only: one training run per system says nothing of seeds.

    ``tokenized``: hypotheses and references are tokenized already (a ``data.tokenized`` run on its own text), and
    the test is on ``tokenized_bleu``'s metric for them (``tok:none``, lowercased) instead of sacreBLEU's 13a."""
    for hyps in (baseline, *systems.values()):
        _check(hyps, refs)
    named = [("baseline", list(baseline)), *((name, list(hyps)) for name, hyps in systems.items())]
    metric = _tokenized_metric() if tokenized else BLEU()
    signatures, scores = PairedTest(named, {"BLEU": metric}, [list(refs)], test_type="bs", n_samples=n_samples)()
    base, *rest = scores["BLEU"]
    return {
        name: PairedResult(base.score, r.score, float(r.ci), float(r.p_value), str(signatures["BLEU"]))
        for name, r in zip(systems, rest, strict=True)
    }


def _detail(score) -> str:
    """'66.0/41.2/28.1/19.9 (BP = 1.000 ratio = 1.012 hyp_len = ... ref_len = ...)'."""
    return score.format().split(" = ", 1)[1].split(" ", 1)[1]


__all__ = [
    "DETOK",
    "TOKENIZED",
    "BleuResult",
    "PairedResult",
    "add_scoring_args",
    "compound_split",
    "score_all",
    "corpus_bleu",
    "moses_tokenize",
    "paired_bootstrap",
    "tokenized_bleu",
]
