"""The Multi30k release's tokenization (tfx.data.pretokenize), checked on lines of the release itself."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.data.helpers import SHARED_DATA
from tfx.data.pretokenize import main, multi30k_tokenize, pretokenize_folder
from tfx.files import atomic

MULTI30K = SHARED_DATA / "multi30k"


@pytest.mark.parametrize(
    ("raw", "lang", "tokenized"),
    [
        # test2016 line 1 and train line 1 as data/task1/tok (and the anchor's files, BPE removed) have them
        ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "de",
         "ein mann mit einem orangefarbenen hut , der etwas anstarrt ."),
        ("Two young, White males are outside near many bushes.", "en",
         "two young , white males are outside near many bushes ."),
        # escaping on, hyphens kept whole (no -a): train.en line 106
        ("A young blond-haired boy and a dark-haired girl are eating at a kid's table.", "en",
         "a young blond-haired boy and a dark-haired girl are eating at a kid &apos;s table ."),
        # a final "10." stays whole, as in the release (test2016 line 982); newer tokenizer.perl splits it
        ("Der Spieler mit der Nummer 10.", "de", "der spieler mit der nummer 10."),
    ],
)  # fmt: skip
def test_lines_come_out_as_the_release_tokenized_them(raw: str, lang: str, tokenized: str) -> None:
    assert multi30k_tokenize([raw], lang) == [tokenized]


def test_no_runs_of_spaces_survive() -> None:
    """train.en line 16217: the normalizer turns the backtick into an apostrophe and leaves two spaces before the
    period; the release's words, one space apart, are what BLEU and the vocabulary see."""
    assert multi30k_tokenize(["A man and a woman on a motorcycle .`"], "en") == [
        "a man and a woman on a motorcycle . &apos;"
    ]


def test_a_folder_keeps_names_and_line_counts_and_skips_other_files(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    (src / "train.de").write_text("Ein Hund läuft.\nZwei Katzen!\n", encoding="utf-8")
    (src / "train.en").write_text("A dog runs.\nTwo cats!\n", encoding="utf-8")
    (src / "README.md").write_text("not a corpus\n", encoding="utf-8")
    assert main([str(src), str(tmp_path / "tok")]) == 0
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == ["train.de", "train.en"]
    assert (tmp_path / "tok" / "train.de").read_text(encoding="utf-8") == "ein hund läuft .\nzwei katzen !\n"


def test_a_folder_it_may_not_write_is_one_line_and_keeps_earlier_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """EACCES from mkstemp (raised by a stand-in: tests run as root, whom chmod does not stop) names the file and
    out_dir; a file tokenized before is left whole. No model: precision and device do not apply."""
    src, out = tmp_path / "raw", tmp_path / "tok"
    src.mkdir()
    out.mkdir()
    (src / "train.de").write_text("Ein Hund läuft.\n", encoding="utf-8")
    (out / "train.de").write_text("ein hund läuft .\n", encoding="utf-8")

    def forbidden(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:  # noqa: A002 - mkstemp's own name
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(Path(dir) / f"{prefix}x1y2{suffix}"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", forbidden)
    with pytest.raises(SystemExit) as stopped:
        main([str(src), str(out)])
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (
        f"tfx.data.pretokenize: permission denied: {out / 'train.de'}: check its permissions and its folder's "
        "(ls -ld), or point out_dir at a folder you can write\n"
    )
    assert (out / "train.de").read_text(encoding="utf-8") == "ein hund läuft .\n"


def test_usage_names_the_command_a_user_types(capsys: pytest.CaptureFixture) -> None:
    """Issue 67: `usage: python -m tfx.data.pretokenize`, not `usage: pretokenize.py`, in --help and in an error."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m tfx.data.pretokenize [-h] src_dir out_dir")
    with pytest.raises(SystemExit):
        main([])
    assert capsys.readouterr().err.startswith("usage: python -m tfx.data.pretokenize ")


def test_an_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no \\*.de or \\*.en"):
        pretokenize_folder(tmp_path, tmp_path / "out")


def test_test2016_references_have_the_anchors_reflen() -> None:
    """The anchor's log (LividWo/Revisit-MMT README-baseline.md) reads reflen=12103: the word count of its
    test2016 German references, which this tokenization of the staged raw file reproduces."""
    if not MULTI30K.is_dir():
        pytest.skip(f"{MULTI30K} is not present on this machine")
    lines = (MULTI30K / "test.de").read_text(encoding="utf-8").splitlines()
    assert sum(len(line.split()) for line in multi30k_tokenize(lines, "de")) == 12103
