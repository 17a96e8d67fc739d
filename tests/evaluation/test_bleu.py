"""BLEU wrappers: sacrebleu parity, signatures, and the fairseq IWSLT'14 tokenized convention."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
import sacrebleu

from tfx.evaluation.bleu import (
    DETOK,
    TOKENIZED,
    compound_split,
    corpus_bleu,
    moses_tokenize,
    paired_bootstrap,
    tokenized_bleu,
)

HYPS = ["The cat sat on a mat.", "Hello, world!", "Don't stop me now."]
REFS = ["The cat sat on the mat.", "Hello world!", "Don't stop me now."]
SIGNATURE_13A = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"


def test_corpus_bleu_matches_sacrebleu_and_carries_signatures() -> None:
    result = corpus_bleu(HYPS, REFS)
    assert result.score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert result.chrf == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert result.signature.startswith(SIGNATURE_13A)
    assert result.chrf_signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    assert result.kind == DETOK
    text = str(result)
    assert SIGNATURE_13A in text and "detokenized" in text and "chrF2" in text
    assert corpus_bleu(REFS, REFS).score == pytest.approx(100.0)


def test_tokenized_bleu_lowercases_and_tokenizes() -> None:
    hyps = ['Don\'t say "R&D", say research.', "The U.S."]
    refs_raw = ['don\'t say "r&d" , say research .', "the U.S."]
    refs_fairseq = ["don &apos;t say &quot; r &amp; d &quot; , say research .", "the u.s ."]  # prepare-iwslt14 output
    assert corpus_bleu(hyps, refs_raw).score < 100.0
    assert tokenized_bleu(hyps, refs_raw, "en").score == pytest.approx(100.0)
    result = tokenized_bleu(hyps, refs_fairseq, "en", refs_tokenized=True)
    assert result.score == pytest.approx(100.0)
    assert result.kind == TOKENIZED and result.chrf is None
    assert "case:lc" in result.signature and "tok:none" in result.signature and "moses:en" in result.signature
    assert "tokenized BLEU" in str(result)


def test_moses_rules_that_sacremoses_misses() -> None:
    assert moses_tokenize(["It’s in the U.S.", "Wait...", "Done."], "en") == [
        "It &apos;s in the U.S .",  # ’ -> ' (fairseq's sed), final period split (tokenizer.perl)
        "Wait ...",
        "Done .",
    ]


def test_misaligned_or_empty_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="line-aligned"):
        corpus_bleu(HYPS, REFS[:2])
    with pytest.raises(ValueError, match="no sentences"):
        tokenized_bleu([], [], "en")


@pytest.mark.parametrize("lang", ["en", "de"])
def test_reproduces_fairseq_iwslt14_references(shared_data: Path, lang: str) -> None:
    """Raw IWSLT'14 test lines, tokenized our way, equal fairseq's prepare-iwslt14.sh output, except
    the few lines whose '&' the IWSLT XML double-escaped (see shared/data/README.md)."""
    raw = (shared_data / "iwslt14_deen_raw" / f"test.{lang}").read_text(encoding="utf-8").split("\n")[:1500]
    ref = (shared_data / "iwslt14_deen_fairseq_tok" / f"test.{lang}").read_text(encoding="utf-8").split("\n")[:1500]
    ours = [line.lower() for line in moses_tokenize(raw, lang)]
    differ = [(a, b) for a, b in zip(ours, ref, strict=True) if a != b]
    assert all("&amp; amp ;" in b or "&amp; gt ;" in b for _, b in differ), differ[:3]


def test_compound_split_is_the_reference_perl_rule() -> None:
    """compound_split_bleu.sh's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`: non-overlapping, left to right."""
    line = "it had two-to-three-to-400 times - a-b-c x-"
    expected = (
        "it had two ##AT##-##AT## to ##AT##-##AT## three ##AT##-##AT## to ##AT##-##AT## 400 times"
        " - a ##AT##-##AT## b-c x-"
    )
    assert compound_split([line]) == [expected]
    if shutil.which("perl"):
        perl = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=line + "\n",
                              capture_output=True, text=True, check=True)  # fmt: skip
        assert perl.stdout.rstrip("\n") == expected


def test_compound_split_changes_the_score_of_hyphenated_text() -> None:
    hyps, refs = ["a well-known fact ."], ["a well-made fact ."]
    plain = tokenized_bleu(hyps, refs, "en", refs_tokenized=True, hyps_tokenized=True)
    split = tokenized_bleu(hyps, refs, "en", refs_tokenized=True, hyps_tokenized=True, compound=True)
    assert split.score > plain.score  # "well" and "##AT##-##AT##" now match
    assert "compound-split" in split.signature and "pretok:hyp+ref" in split.signature
    assert "compound-split" not in plain.signature


def test_pretokenized_text_scored_as_is() -> None:
    """A model trained on fairseq's tokenized text writes `&apos;`: re-tokenizing it would escape the `&` again."""
    line = ["it &apos;s that pyramid ."]
    assert tokenized_bleu(line, line, "en", refs_tokenized=True, hyps_tokenized=True).score == pytest.approx(100.0)
    assert tokenized_bleu(line, line, "en", refs_tokenized=True).score < 50.0  # hyp escaped twice


def test_paired_bootstrap_tells_a_better_system_from_an_equally_good_one() -> None:
    """The baseline drops two words from every odd sentence; "equal" does the same to the even ones (the same
    damage on other sentences), "exact" is the reference: only "exact" is significantly better (CPU, no model)."""
    rng = random.Random(0)
    words = ["a", "man", "in", "a", "blue", "shirt", "is", "on", "the", "ladder", "while", "two", "dogs", "run"]
    refs = [" ".join(rng.choices(words, k=rng.randint(6, 14))) + "." for _ in range(300)]

    def damaged(parity: int) -> list[str]:
        return [" ".join(r.split()[:-3] + r.split()[-1:]) if i % 2 == parity else r for i, r in enumerate(refs)]

    baseline = damaged(1)
    results = paired_bootstrap(baseline, {"exact": refs, "equal": damaged(0)}, refs)
    exact, equal = results["exact"], results["equal"]
    assert exact.baseline == pytest.approx(corpus_bleu(baseline, refs).score)
    assert exact.score == pytest.approx(100.0) and exact.p_value < 0.01
    assert abs(equal.score - equal.baseline) < 0.5 and equal.p_value > 0.2 and 0 < equal.ci < 5
    assert "bs:1000" in exact.signature and "tok:13a" in exact.signature
    assert paired_bootstrap(baseline, {"equal": damaged(0)}, refs) == {"equal": equal}  # fixed seed: repeatable
    with pytest.raises(ValueError, match="line-aligned"):
        paired_bootstrap(baseline, {"short": refs[:-1]}, refs)
