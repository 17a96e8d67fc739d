"""tfx.average's command line and messages: argument checks, the --best-window search reported on
stderr (with the decoding scorer replaced by a parameter sum, so no model is decoded), and the exact
wording of each refusal."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoint_helpers import tiny_config, write_checkpoint
from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.checkpoints.numbered import checkpoint_dir, last_checkpoints
from tfx.evaluation import average
from tfx.evaluation.average import average_checkpoints, best_window, parse_args, windows
from tfx.files import atomic
from tfx.files.atomic import atomic_save

KEY = "encoder.embedding.embed.weight"


def run_of(tmp_path: Path, n: int) -> list[Path]:
    ckpts = tmp_path / "run" / "checkpoints"
    return [write_checkpoint(ckpts / f"checkpoint_{e}_{100 * e}.pt", seed=e, step=100 * e) for e in range(1, n + 1)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run-dir", "r"], "--run-dir needs --last N or --best-window K"),
        (["--run-dir", "r", "--last", "2", "--best-window", "2"], "--run-dir needs --last N or --best-window K"),
        (["--inputs", "a.pt", "--last", "2"], "--last and --best-window go with --run-dir, not --inputs"),
        (["--inputs", "a.pt", "--best-window", "2"], "--last and --best-window go with --run-dir, not --inputs"),
        (
            ["--run-dir", "r", "--last", "1", "--candidates", "-1"],
            "--candidates and --valid-max-sentences must be >= 0",
        ),
        (
            ["--run-dir", "r", "--last", "1", "--valid-max-sentences", "-1"],
            "--candidates and --valid-max-sentences must be >= 0",
        ),
        (["--inputs", "a.pt", "--beam", "0"], "--beam must be >= 1"),
        ([], "one of the arguments --inputs --run-dir is required"),
    ],
)
def test_argument_mistakes_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*argv, "--output", "o.pt"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m tfx.average ") and err.endswith(
        f"\npython -m tfx.average: error: {message}\n"
    )


def test_defaults_and_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--inputs", "a.pt"])
    assert capsys.readouterr().err.endswith("error: the following arguments are required: --output\n")
    args = parse_args(["--run-dir", "r", "--best-window", "3", "--output", "o.pt", "--data-dir", "d"])
    assert (args.output, args.data_dir) == (Path("o.pt"), Path("d")) and isinstance(args.output, Path)
    args = parse_args(["--run-dir", "r", "--best-window", "3", "--output", "o.pt"])
    assert (args.run_dir, args.best_window, args.last, args.inputs) == (Path("r"), 3, None, None)
    assert (args.candidates, args.valid_max_sentences, args.quiet, args.data_dir) == (0, 0, False, None)
    assert parse_args(["--inputs", "a.pt", "b.pt", "--output", "o.pt", "--quiet"]).inputs == [
        Path("a.pt"),
        Path("b.pt"),
    ]
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    assert "Average the parameters of several checkpoints" in text and "Averaging the last few" not in text


def spy_scorer(monkeypatch: pytest.MonkeyPatch, seen: list[Any]) -> None:
    """valid_scorer replaced: a window's score is the sum of one parameter; records what it was given."""

    def valid_scorer(first: dict[str, Any], args: Any) -> Any:
        seen.append((first["step"], args.best_window))
        return lambda ckpt: float(ckpt["model"][KEY].double().sum())

    monkeypatch.setattr(average, "valid_scorer", valid_scorer)


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = average.load_checkpoint
    monkeypatch.setattr(average, "load_checkpoint", lambda p: reads.append(Path(p).name) or real(p))
    return reads


def test_best_window_reports_every_window_and_saves_the_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    paths = run_of(tmp_path, 4)
    seen: list[Any] = []
    spy_scorer(monkeypatch, seen)
    score = {i: float(average_checkpoints(paths[i : i + 3])["model"][KEY].double().sum()) for i in range(2)}
    reads = count_reads(monkeypatch)
    out = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(tmp_path / "run"), "--best-window", "3", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    names = [p.name for p in paths]
    assert sorted(reads) == names  # each checkpoint read once, the first one included
    assert captured.err.splitlines() == [
        f"window {names[i]} .. {names[i + 2]}: valid score {score[i]:.2f}" for i in range(2)
    ]
    top = max(score, key=score.get)
    assert captured.out == f"averaged 3 checkpoints ({', '.join(names[top : top + 3])}) -> {out}\n"
    saved = load_checkpoint(out)
    assert saved["averaged_from"] == [str(p) for p in paths[top : top + 3]]
    assert saved["window_scores"] == [[names[i : i + 3], pytest.approx(score[i])] for i in range(2)]
    assert saved["step"] == 100 * (top + 3)
    assert seen == [(100, 3)]  # the scorer is built once, from the first window's first checkpoint

    # --candidates 1: one window, built from its own first checkpoint; --quiet: nothing on stderr
    seen.clear()
    argv = ["--run-dir", str(tmp_path / "run"), "--best-window", "3", "--candidates", "1", "--quiet"]
    assert average.main([*argv, "--output", str(out)]) == 0
    assert capsys.readouterr().err == "" and seen == [(200, 3)]
    assert load_checkpoint(out)["averaged_from"] == [str(p) for p in paths[1:]]


def test_best_window_of_one_checkpoint_and_a_foreign_checkpoint(tmp_path: Path) -> None:
    """Windows of one are the checkpoints themselves; a checkpoint of another model in the run is refused."""
    paths = run_of(tmp_path, 3)
    best, results = best_window(paths, 1, lambda c: -abs(c["step"] - 200))
    assert [w for w, _ in results] == [[p] for p in paths]
    assert best["step"] == 200 and best["averaged_from"] == [str(paths[1])]
    assert all(torch.equal(v, load_checkpoint(paths[1])["model"][k]) for k, v in best["model"].items())
    write_checkpoint(paths[2], step=300, config=tiny_config(d_model=16))
    with pytest.raises(
        CheckpointError, match=r"^cannot average .*checkpoint_1_100\.pt and .*checkpoint_3_300\.pt: model"
    ):
        best_window(paths, 2, lambda c: 0.0)


def test_too_few_checkpoints_for_the_window_fail_before_any_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_of(tmp_path, 3)
    reads: list[str] = []
    monkeypatch.setattr(average, "load_checkpoint", lambda p: reads.append(str(p)))
    argv = ["--run-dir", str(tmp_path / "run"), "--best-window", "4", "--output", str(tmp_path / "o.pt")]
    assert average.main(argv) == 1
    assert capsys.readouterr().err == "error: 3 checkpoints to average: cannot choose a window of 4\n"
    assert reads == []


def message(call: Any, *args: Any) -> str:
    with pytest.raises(CheckpointError) as info:
        call(*args)
    return str(info.value)


def test_refusals_word_for_word(tmp_path: Path) -> None:
    paths = run_of(tmp_path, 2)
    assert message(checkpoint_dir, tmp_path / "nope") == f"run folder {tmp_path / 'nope'} does not exist"
    assert message(last_checkpoints, tmp_path / "run", 0) == "--avg/--last 0: need at least 1 checkpoint"
    (tmp_path / "empty").mkdir()
    assert message(last_checkpoints, tmp_path / "empty", 1) == (
        f"{tmp_path / 'empty'} has no numbered checkpoints (checkpoint_<epoch>_<step>.pt) to average: "
        "evaluate checkpoint_best.pt (leave out --avg)"
    )
    assert message(windows, paths, 0) == "--best-window 0: need at least 1 checkpoint"
    assert message(windows, paths, 3) == "2 checkpoints to average: cannot choose a window of 3"
    assert message(windows, paths[:1], 2) == "1 checkpoint to average: cannot choose a window of 2"
    assert message(average_checkpoints, []) == "no checkpoints to average"


def test_fewer_than_asked_averages_those_there_are_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A short run has fewer numbered checkpoints than ``--last N``: all of them, and one line naming both counts."""
    paths = run_of(tmp_path, 2)
    folder = tmp_path / "run" / "checkpoints"
    assert last_checkpoints(tmp_path / "run", 3) == paths
    assert capsys.readouterr().err == f"{folder} has 2 checkpoints to average, not 3: averaging those 2\n"
    assert last_checkpoints(tmp_path / "run", 2) == paths and capsys.readouterr().err == ""


def test_windows_of_one_and_of_all(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.pt" for i in range(3)]
    assert windows(paths, 1) == [[p] for p in paths]
    assert windows(paths, 3) == [paths]
    assert windows(paths, 1, candidates=2) == [[paths[1]], [paths[2]]]


def changed(tmp_path: Path, name: str, edit: Any) -> Path:
    ckpt = load_checkpoint(tmp_path / "a.pt")
    edit(ckpt)
    atomic_save(ckpt, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda c: c["config"]["model"].update(d_model=64), "model.d_model differs (32 vs 64)"),
        (lambda c: c.update(vocab_size=c["vocab_size"] + 1), "vocab_size differs ({v} vs {w})"),
        (lambda c: c.update(spm_model=c["spm_model"] + b"x"), "their sentencepiece models differ"),
        (lambda c: c["model"].update(extra=torch.zeros(1)), "their parameter names differ"),
    ],
    ids=["model-config", "vocab-size", "sentencepiece-model", "parameter-names"],
)
def test_each_difference_is_named(tmp_path: Path, edit: Any, why: str) -> None:
    a = write_checkpoint(tmp_path / "a.pt")
    b = changed(tmp_path, "b.pt", edit)
    v = load_checkpoint(a)["vocab_size"]
    assert message(average_checkpoints, [a, b]) == f"cannot average {a} and {b}: " + why.format(v=v, w=v + 1)


def test_a_full_disk_writing_the_average_is_one_line_and_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """ENOSPC at fsync (raised by a stand-in) names --output; the average written before stays whole. CPU, fp32
    checkpoints (their values are not what is checked here)."""
    paths = run_of(tmp_path, 2)
    out = tmp_path / "avg.pt"
    out.write_bytes(b"an earlier average")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", no_space)
    with pytest.raises(SystemExit) as stopped:
        average.main(["--inputs", *map(str, paths), "--output", str(out)])
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (
        f"tfx.average: no space left on device writing {out}: free space there, or point --output at another disk\n"
    )
    assert out.read_bytes() == b"an earlier average" and sorted(p.name for p in tmp_path.iterdir()) == ["avg.pt", "run"]


def test_last_and_best_window_share_evaluate_s_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The toy run's folder (issue 67): checkpoint_9_1200.pt, 16 updates after checkpoint_8_1184.pt, stands in for it
    in --last and in --best-window as in tfx.evaluate --avg, so no window holds nearly the same weights twice."""
    ckpts = tmp_path / "run" / "checkpoints"
    steps = [(5, 740), (6, 888), (7, 1036), (8, 1184), (9, 1200)]
    paths = [write_checkpoint(ckpts / f"checkpoint_{e}_{s}.pt", seed=e, step=s) for e, s in steps]
    window = [paths[i] for i in (0, 1, 2, 4)]
    out = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(tmp_path / "run"), "--last", "5", "--output", str(out)]) == 0
    assert load_checkpoint(out)["averaged_from"] == [str(p) for p in window]
    captured = capsys.readouterr()
    assert "leaving out checkpoint_8_1184.pt" in captured.err and "has 4 checkpoints to average, not 5" in captured.err
    spy_scorer(monkeypatch, [])
    argv = ["--run-dir", str(tmp_path / "run"), "--best-window", "4", "--quiet", "--output", str(out)]
    assert average.main(argv) == 0
    assert load_checkpoint(out)["averaged_from"] == [str(p) for p in window]
    assert average.main([*argv[:3], "5", *argv[4:]]) == 1
    assert capsys.readouterr().err.endswith("error: 4 checkpoints to average: cannot choose a window of 5\n")


def test_a_window_of_one_is_written_as_it_is_and_said_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--last 5 on a run with one numbered checkpoint: its weights, in the singular, and nothing called an average."""
    (path,) = run_of(tmp_path, 1)
    out = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(tmp_path / "run"), "--last", "5", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote the weights of {path.name} (nothing to average it with) -> {out}\n"
    assert captured.err == f"{path.parent} has 1 checkpoint to average, not 5: using {path.name} as it is\n"
    saved, original = load_checkpoint(out), load_checkpoint(path)
    assert all(torch.equal(v, original["model"][k]) for k, v in saved["model"].items())
