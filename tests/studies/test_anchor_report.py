"""tfx.studies.anchor_report's paired bootstrap against Post-LN (issue 64): on decodes written the way
scripts/eval_bleu.sh writes them, with real sacreBLEU scoring (CPU, no model)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from tfx.evaluation.bleu import tokenized_bleu
from tfx.studies.anchor_report import main, paired_lines, table

WORDS = ["ein", "mann", "in", "einem", "blauen", "hemd", "steht", "auf", "der", "leiter", "während", "zwei", "hunde"]


def _refs(n: int = 200) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 14))) + " ." for _ in range(n)]


def _decoded(run: Path, name: str, hyps: list[str], refs: list[str]) -> None:
    """What ``eval_bleu.sh RUN --avg 10`` leaves for one set: the hypotheses and the tokenized score beside them."""
    ckpts = run / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    (ckpts / f"checkpoint_avg10.{name}.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    result = tokenized_bleu(hyps, refs, "de", refs_tokenized=True, hyps_tokenized=True)
    (ckpts / f"checkpoint_avg10.{name}.bleu.json").write_text(json.dumps({"scores": [dataclasses.asdict(result)]}))


def test_each_run_is_tested_against_post_ln_of_its_seed_on_every_set_both_decoded(tmp_path: Path) -> None:
    refs = _refs()
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "test.de").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tok / "test_2017_flickr.de").write_text("\n".join(refs) + "\n", encoding="utf-8")

    def damaged(parity: int) -> list[str]:  # two words dropped from every other sentence
        return [" ".join(r.split()[:-3] + r.split()[-1:]) if i % 2 == parity else r for i, r in enumerate(refs)]

    study = tmp_path / "study"
    _decoded(study / "runs" / "postln_lr0.005_seed1", "test", damaged(1), refs)
    _decoded(study / "runs" / "postln_lr0.005_seed1", "test_2017_flickr.en", damaged(1), refs)
    _decoded(study / "runs" / "tfixup_lr0.005_seed1", "test", refs, refs)  # exact: significantly better
    _decoded(study / "runs" / "tfixup_lr0.005_seed1", "test_2017_flickr.en", damaged(0), refs)  # as good
    _decoded(study / "runs" / "tfixup_lr0.005_seed2", "test", refs, refs)  # no Post-LN seed 2: no pair

    lines = [line for line in paired_lines(study, tok) if line.startswith("- ")]
    base, other = (tokenized_bleu(damaged(parity), refs, "de", True, True).score for parity in (1, 0))
    assert len(lines) == 1 and lines[0].startswith("- tfixup_lr0.005_seed1 against postln_lr0.005_seed1: ")
    test2016, test2017 = lines[0].split(": ", 1)[1].split("; ")
    assert test2016 == f"test2016 100.00 vs {base:.2f} ({100 - base:+.2f}, p = 0.001)"
    assert test2017.startswith(f"test2017 {other:.2f} vs {base:.2f} ({other - base:+.2f}, p = ")
    assert float(test2017.split("p = ")[1].rstrip(")")) > 0.2 and abs(other - base) < 1
    assert "Paired bootstrap against postln" in table(study, tok) and "Paired" not in table(study)


def test_refs_without_the_corpus_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "study" / "runs").mkdir(parents=True)
    assert main([str(tmp_path / "study"), "--refs", str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err.count("\n") == 1
