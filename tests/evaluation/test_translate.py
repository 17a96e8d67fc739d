"""``python -m tfx.translate`` on a real (tiny, untrained) checkpoint with a real sentencepiece model."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoint_helpers import REPO, write_checkpoint
from tfx.checkpoints.load import build_from_checkpoint, load_checkpoint
from tfx.evaluation import translate
from tfx.evaluation.decode import translate_sentences
from tfx.files.atomic import atomic_save

SENTENCES = ["Ein Hund läuft.", "Die Katze", "", "ein roter Hund läuft schnell über die Wiese und weiter", "x"]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tfx.translate", *args], input=stdin, capture_output=True, text=True, env=env
    )


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
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(SENTENCES[:2]) + "\n"))
    assert translate.main([str(checkpoint), "--beam", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == reference_translations(checkpoint, SENTENCES[:2], beam=1)


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
