"""The Multi30k release's own tokenization, so that a run trains and is scored on the text published systems used.

Multi30k's ``data/task1/tok/*.lc.norm.tok.*`` files (multi30k/dataset, ``scripts/task1-tokenize.sh``) are
``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L`` over the raw release (Moses 3a0631a,
XML escaping on, no ``-a``). Systems trained on them, such as the published anchor of ``+experiment=multi30k_tiny``
(LividWo/Revisit-MMT, whose ``data/multi30k-en-de`` holds these files with BPE applied), report BLEU on that
tokenized, lowercased text. Only the raw release is staged here, so this rebuilds the tokenized one with
sacremoses. Measured against the anchor's files with BPE removed, word for word: 28993 of 29000 train.de lines,
1013 of 1014 valid.de lines, and every line of train.en, valid.en and the test2016, test2017 and MSCOCO sets in
both languages; the 8 others differ in where a period lands beside a closing quote (docs/converged.md,
"published anchor").

Lowercasing comes first, as in the release (``tfx.evaluation.bleu.moses_tokenize`` follows fairseq's IWSLT'14 order,
tokenize then lowercase), and Moses' final-period rule of newer ``tokenizer.perl`` versions is not applied:
the release keeps ``10.`` whole at a line's end, and so does this.

    python -m tfx.data.pretokenize ../shared/data/multi30k data/multi30k_tok
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from pathlib import Path

from tfx.files.atomic import atomic_open
from tfx.files.environment import Remedy, environment_errors

LANGS = ("de", "en")  # the Multi30k Task 1 languages staged here


@functools.lru_cache(maxsize=4)
def _moses(lang: str):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def multi30k_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """``lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l lang`` as sacremoses has them.

    Runs of spaces collapse to one: the normalizer can leave two (``motorcycle  .``) where Perl left one.
    """
    normalizer, tokenizer = _moses(lang)
    out = []
    for line in lines:
        normalized = normalizer.normalize(line.lower())
        tokens = tokenizer.tokenize(normalized, escape=True, aggressive_dash_splits=False, return_str=True)
        out.append(" ".join(tokens.split()))
    return out


def pretokenize_folder(src_dir: Path, out_dir: Path) -> list[Path]:
    """Write every ``*.de`` / ``*.en`` file of ``src_dir`` tokenized under the same name in ``out_dir``.

    Line counts are kept (tfx pairs lines by position), so an empty result line stays an empty line.
    """
    files = sorted(p for p in src_dir.iterdir() if p.suffix.lstrip(".") in LANGS and p.is_file())
    if not files:
        raise FileNotFoundError(f"{src_dir}: no *.de or *.en files to tokenize")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        target = out_dir / path.name
        with atomic_open(target, "w", encoding="utf-8") as f:  # a full disk leaves the file of a previous run whole
            f.writelines(f"{line}\n" for line in multi30k_tokenize(lines, path.suffix[1:]))
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfx.data.pretokenize", description=__doc__.split("\n\n")[0])
    parser.add_argument("src_dir", type=Path, help="raw Multi30k text files (train.de, valid.en, ...)")
    parser.add_argument("out_dir", type=Path, help="where the tokenized, lowercased files go (same names)")
    args = parser.parse_args(argv)
    with environment_errors("tfx.data.pretokenize", Remedy({"out_dir": args.out_dir})):
        for path in pretokenize_folder(args.src_dir, args.out_dir):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
