"""``python -m tfx.translate`` on a real (tiny, untrained) checkpoint with a real sentencepiece model."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoint_helpers import REPO, write_checkpoint
from tfx.checkpoints.load import build_from_checkpoint, load_checkpoint
from tfx.evaluation import decode, translate
from tfx.evaluation.decode import translate_sentences
from tfx.files import atomic
from tfx.files.atomic import atomic_save

SENTENCES = ["Ein Hund läuft.", "Die Katze", "", "ein roter Hund läuft schnell über die Wiese und weiter", "x"]


def run_cli(*args: str, stdin: str | bytes | None = None, **env: str) -> subprocess.CompletedProcess:
    """``python -m tfx.translate``; ``stdin`` as bytes is passed as they are, ``env`` adds to the environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    if isinstance(stdin, str):
        stdin = stdin.encode("utf-8")
    result = subprocess.run([sys.executable, "-m", "tfx.translate", *args], input=stdin, capture_output=True, env=env)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode())


def binary_stdin(data: bytes) -> io.TextIOWrapper:
    """A stand-in for ``sys.stdin``: text over bytes, as the real one is (``tfx.translate`` reads its ``buffer``)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "ckpt.pt")


def reference_translations(checkpoint: Path, sentences: list[str], beam: int) -> list[str]:
    model, tokenizer, _ = build_from_checkpoint(load_checkpoint(checkpoint))
    return [translate_sentences(model, tokenizer, [s], beam=beam)[0] for s in sentences]


def test_file_to_file_one_line_per_input_in_order(checkpoint: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "hyp.txt"
    assert translate.main([str(checkpoint), "--input", str(src), "--output", str(out), "--beam", "3", "--quiet"]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(SENTENCES)
    assert lines[:-1] == reference_translations(checkpoint, SENTENCES, beam=3)
    assert [p.name for p in out.parent.iterdir()] == ["hyp.txt"]  # no temp file left behind


def test_stdin_to_stdout(checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "stdin", binary_stdin(("\n".join(SENTENCES[:2]) + "\n").encode("utf-8")))
    assert translate.main([str(checkpoint), "--beam", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == reference_translations(checkpoint, SENTENCES[:2], beam=1)


NOT_UTF8 = "\n".join(SENTENCES[:3]).encode("utf-8") + b"\ncaf\xe9 au lait\n"  # line 4 is Latin-1


def test_bytes_on_stdin_that_are_not_utf8_are_one_line_naming_the_line(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The rule files follow (tfx.data.stream.chunk_lines), on stdin's bytes. CPU, fp32."""
    monkeypatch.setattr(sys, "stdin", binary_stdin(NOT_UTF8))
    assert translate.main([str(checkpoint), "--device", "cpu"]) == 1
    out = capsys.readouterr()
    assert out.err == "error: <stdin>: invalid UTF-8 at line 4: re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)\n"
    assert out.out == ""


@pytest.mark.parametrize("env", [{}, {"LC_ALL": "C"}, {"PYTHONIOENCODING": "latin-1"}])
def test_bytes_on_stdin_that_are_not_utf8_are_the_same_line_whatever_the_locale(
    checkpoint: Path, env: dict[str, str]
) -> None:
    """Under C the locale decodes stdin with surrogates (sentencepiece then raised a TypeError), PYTHONIOENCODING
    decodes it as Latin-1: tfx.translate reads the bytes. CPU, fp32."""
    bad = run_cli(str(checkpoint), "--device", "cpu", stdin=NOT_UTF8, **env)
    assert bad.returncode == 1 and bad.stdout == ""
    assert (
        bad.stderr == "error: <stdin>: invalid UTF-8 at line 4: re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)\n"
    )


def test_utf8_on_stdin_is_translated_as_the_same_text_in_a_file_whatever_the_locale(checkpoint: Path) -> None:
    """PYTHONIOENCODING=latin-1 made "läuft" on stdin two other characters, and would have written a translation
    holding "€" as an error: stdin and stdout are UTF-8 bytes, as files are. CPU, fp32, greedy."""
    stdin = ("\n".join(SENTENCES) + "\n").encode("utf-8")
    result = run_cli(str(checkpoint), "--device", "cpu", "--beam", "1", stdin=stdin, PYTHONIOENCODING="latin-1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == reference_translations(checkpoint, SENTENCES, beam=1)


def test_stdout_is_utf8_whatever_its_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """As --output files are: a translation holding a character Latin-1 lacks is written, not a UnicodeEncodeError."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="latin-1"))
    translate.write_lines(None, ["5 € für Kaffee", "ok"])
    assert raw.getvalue().decode("utf-8") == "5 € für Kaffee\nok\n"


def test_a_full_disk_writing_the_output_is_one_line_and_keeps_the_old_file(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """ENOSPC at fsync (raised by a stand-in) names --output; the previous translations stay whole. CPU, fp32."""
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("Ein Hund läuft.\n", encoding="utf-8")
    out.write_text("earlier translations\n", encoding="utf-8")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", no_space)
    with pytest.raises(SystemExit) as stopped:
        translate.main([str(checkpoint), "--input", str(src), "--output", str(out), "--device", "cpu", "--quiet"])
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (
        f"tfx.translate: no space left on device writing {out}: free space there, or point --output at another disk\n"
    )
    assert out.read_text(encoding="utf-8") == "earlier translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "in.txt", "out.txt"]


def test_the_host_out_of_memory_is_one_line(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """MemoryError from the decoder (a stand-in) says what to lower. CPU, fp32."""

    def no_memory(*args: object, **kwargs: object) -> list[str]:
        raise MemoryError

    monkeypatch.setattr(translate, "translate_sentences", no_memory)
    monkeypatch.setattr(sys, "stdin", binary_stdin(b"Hallo\n"))
    with pytest.raises(SystemExit) as stopped:
        translate.main([str(checkpoint), "--device", "cpu"])
    assert stopped.value.code == 1
    assert capsys.readouterr().err == "tfx.translate: out of memory on the host: lower --max-tokens or --beam\n"


def test_corrupt_checkpoint_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    result = run_cli(str(bad), stdin="Hallo\n")
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error:") and "bad.pt" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("problem", ["missing checkpoint", "missing input", "vocabulary mismatch", "not tfx"])
def test_errors_are_one_line(problem: str, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = [str(checkpoint), "--input", str(tmp_path / "nowhere.txt")]
    if problem == "missing checkpoint":
        args[0] = str(tmp_path / "nowhere.pt")
    elif problem == "vocabulary mismatch":
        ckpt = load_checkpoint(checkpoint)
        ckpt["vocab_size"] += 1
        atomic_save(ckpt, checkpoint)
    elif problem == "not tfx":
        atomic_save({"model": {}, "config": {"model": {"no_such_field": 1}}}, checkpoint)
    assert translate.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err


def test_threads_option_sets_torchs_cpu_threads(checkpoint: Path, tmp_path: Path) -> None:
    """--threads N (tfx.translate, tfx.evaluate, tfx.average): N torch threads for the decode; 0 leaves the default."""
    import torch

    src = tmp_path / "in.txt"
    src.write_text("Ein Hund läuft.\n", encoding="utf-8")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert translate.main([str(checkpoint), "--input", str(src), "--output", str(tmp_path / "o"), "--quiet",
                               "--threads", "1"]) == 0  # fmt: skip
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SystemExit):
        translate.parse_args([str(checkpoint), "--threads", "-1"])


def test_help_shows_every_default(capsys: pytest.CaptureFixture) -> None:
    """Issue 67: --help says what a decode does unless told otherwise (the defaults tfx.evaluate shares)."""
    with pytest.raises(SystemExit):
        translate.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option, default in [("--beam", decode.BEAM), ("--lenpen", decode.LENPEN), ("--max-tokens", decode.MAX_TOKENS),
                            ("--max-len-a", decode.MAX_LEN_A), ("--max-len-b", decode.MAX_LEN_B),
                            ("--device", "auto"), ("--threads", 0)]:  # fmt: skip
        after = text.split(f"{option} {option.lstrip('-').upper().replace('-', '_')} ", 1)[1]
        assert f"(default: {default})" in after.split(" --", 1)[0], option
    assert "(default: stdin)" in text and "(default: stdout)" in text and "run folder" in text


def test_a_run_folder_is_its_best_checkpoint_as_for_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 67: tfx.translate RUN (or RUN/checkpoints) reads checkpoint_best.pt, as tfx.evaluate RUN does; a folder
    without one is one line naming it."""
    run = tmp_path / "run"
    best = write_checkpoint(run / "checkpoints" / "checkpoint_best.pt", seed=3)
    write_checkpoint(run / "checkpoints" / "checkpoint_1_100.pt", seed=4)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES[:2]) + "\n", encoding="utf-8")
    expected = "".join(f"{line}\n" for line in reference_translations(best, SENTENCES[:2], beam=2))
    for i, target in enumerate([run, run / "checkpoints", best]):
        out = tmp_path / f"out{i}.txt"
        assert translate.main([str(target), "--input", str(src), "--output", str(out), "--beam", "2", "--quiet"]) == 0
        assert out.read_text(encoding="utf-8") == expected
    best.unlink()
    assert translate.main([str(run), "--input", str(src), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {run / 'checkpoints'} has no checkpoint_best.pt: pass a checkpoint file\n"
