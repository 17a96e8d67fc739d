"""``scripts/eval_bleu.sh`` / ``python -m tfx.evaluate`` on tiny checkpoints."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.checkpoint_helpers import REPO, synthetic_text, tiny_config, write_checkpoint
from tests.evaluation.test_average import make_run
from tfx.config import DataConfig
from tfx.evaluation import evaluate
from tfx.files import atomic

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"


def eval_bleu(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = REPO / "scripts" / "eval_bleu.sh"
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, cwd=cwd)


def write_parallel(folder: Path, prefix: str, n: int = 6) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    src, ref = folder / f"{prefix}.de", folder / f"{prefix}.en"
    src.write_text("\n".join(synthetic_text(n, seed=1)) + "\n", encoding="utf-8")
    ref.write_text("\n".join(synthetic_text(n, seed=2)) + "\n", encoding="utf-8")
    return src, ref


def test_script_prints_bleu_with_signature(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt" / "checkpoint_best.pt")
    src, ref = write_parallel(tmp_path / "data", "test")
    result = eval_bleu(str(ckpt), "--src", str(src), "--ref", str(ref), "--beam", "2", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert any(line.startswith("BLEU = ") and SIGNATURE in line for line in result.stdout.splitlines())
    assert "chrF2 = " in result.stdout
    hyp = ckpt.with_name("checkpoint_best.test.de.hyp")
    assert len(hyp.read_text(encoding="utf-8").split("\n")) == 6 + 1
    report = json.loads(ckpt.with_name("checkpoint_best.test.de.bleu.json").read_text())
    assert report["scores"][0]["signature"].startswith(SIGNATURE) and report["decoding"]["beam"] == 2


def test_several_test_sets_in_one_call_score_as_separate_calls_do(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    """--src/--ref/--output with two test sets: the model loads once, and each set's hypotheses and scores are those a
    call of its own writes (beam 2, fp32 on CPU); mismatched counts are a usage error."""
    ckpt = write_checkpoint(tmp_path / "ckpt" / "checkpoint_best.pt")
    (src_a, ref_a), (src_b, ref_b) = write_parallel(tmp_path / "a", "test", n=6), write_parallel(tmp_path / "b", "t", 4)
    common = ["--beam", "2", "--tok-bleu", "--quiet", "--device", "cpu"]
    both = [tmp_path / "both_a.hyp", tmp_path / "both_b.hyp"]
    args = [str(ckpt), "--src", str(src_a), str(src_b), "--ref", str(ref_a), str(ref_b), "--output", *map(str, both)]
    assert evaluate.main([*args, *common]) == 0
    assert capsys.readouterr().out.count("split: ") == 2
    for (src, ref), hyp in zip([(src_a, ref_a), (src_b, ref_b)], both, strict=True):
        alone = tmp_path / f"alone_{hyp.name}"
        assert evaluate.main([str(ckpt), "--src", str(src), "--ref", str(ref), "--output", str(alone), *common]) == 0
        assert hyp.read_text() == alone.read_text() and len(hyp.read_text().splitlines()) in (6, 4)
        scores = [json.loads(p.with_suffix(".bleu.json").read_text())["scores"] for p in (hyp, alone)]
        assert scores[0] == scores[1]
    with pytest.raises(SystemExit) as usage:
        evaluate.main([str(ckpt), "--src", str(src_a), str(src_b), "--ref", str(ref_a), *common])
    assert usage.value.code == 2 and "--ref needs one file per --src (2), got 1" in capsys.readouterr().err


def test_an_empty_test_set_is_refused_before_any_set_is_decoded(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    """--src A B where B is empty: one error line naming B, a non-zero exit, and A is not decoded either (CPU)."""
    ckpt = write_checkpoint(tmp_path / "ckpt" / "checkpoint_best.pt")
    src_a, ref_a = write_parallel(tmp_path / "a", "test", n=4)
    src_b, ref_b = tmp_path / "empty.de", tmp_path / "empty.en"
    src_b.write_text(""), ref_b.write_text("")
    hyps = [tmp_path / "a.hyp", tmp_path / "b.hyp"]
    args = [str(ckpt), "--src", str(src_a), str(src_b), "--ref", str(ref_a), str(ref_b), "--output", *map(str, hyps)]
    assert evaluate.main([*args, "--beam", "2", "--quiet", "--device", "cpu"]) != 0
    assert "empty.de: no sentences to translate" in capsys.readouterr().err
    assert not any(h.exists() for h in hyps)


def test_script_missing_checkpoint_fails(tmp_path: Path) -> None:
    src, ref = write_parallel(tmp_path, "test")
    result = eval_bleu(str(tmp_path / "nowhere.pt"), "--src", str(src), "--ref", str(ref), cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.startswith("error:") and result.stderr.count("\n") == 1
    assert eval_bleu(cwd=tmp_path).returncode != 0  # no arguments: usage


def test_run_dir_with_average_on_the_toy_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--avg N averages the last N numbered checkpoints; the toy test split is rebuilt from the config."""
    data = DataConfig(source="toy", toy_test_size=5, toy_valid_size=5, cache_dir=str(tmp_path / "cache"))
    ckpts = tmp_path / "run" / "checkpoints"
    for i, step in enumerate([100, 200, 300]):
        write_checkpoint(ckpts / f"checkpoint_{i + 1}_{step}.pt", seed=i, step=step, config=tiny_config(data))
    args = [str(tmp_path / "run"), "--avg", "2", "--beam", "2", "--tok-bleu", "--quiet", "--device", "cpu"]
    assert evaluate.main(args) == 0
    out = capsys.readouterr().out
    assert SIGNATURE in out and "tokenized BLEU" in out and "case:lc" in out
    assert "split: test (5 sentences" in out
    assert (ckpts / "checkpoint_avg2.pt").is_file() and (ckpts / "checkpoint_avg2.test.hyp").is_file()


def test_avg_of_one_checkpoint_evaluates_it_under_its_own_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 67: --avg 5 on a run stopped 12 updates into its second epoch. Its final checkpoint stands in for epoch
    1's (nearly the same weights), and one checkpoint is evaluated as itself: no checkpoint_avg1.pt, no "(s)"."""
    ckpts = tmp_path / "run" / "checkpoints"
    write_checkpoint(ckpts / "checkpoint_1_148.pt", step=148)
    final = write_checkpoint(ckpts / "checkpoint_2_160.pt", seed=1, step=160)
    assert evaluate.resolve_checkpoint(tmp_path / "run", 5) == final
    assert evaluate.resolve_checkpoint(tmp_path / "run", 1) == final
    assert not list(ckpts.glob("checkpoint_avg*"))
    err = capsys.readouterr().err
    assert f"has 1 checkpoint to average, not 5: using {final.name} as it is" in err and "(s)" not in err


def test_avg_leaves_out_a_final_checkpoint_s_near_duplicate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The toy run's last epochs (148 updates each) and its final checkpoint 16 updates into epoch 9: --avg 3 averages
    epochs 6 and 7 with the final state, not with epoch 8's nearly equal weights."""
    ckpts = tmp_path / "run" / "checkpoints"
    for epoch, step in [(6, 888), (7, 1036), (8, 1184), (9, 1200)]:
        write_checkpoint(ckpts / f"checkpoint_{epoch}_{step}.pt", seed=epoch, step=step)
    out = evaluate.resolve_checkpoint(tmp_path / "run", 3)
    assert out == ckpts / "checkpoint_avg3.pt"
    averaged = [Path(p).name for p in torch.load(out, weights_only=True)["averaged_from"]]
    assert averaged == ["checkpoint_6_888.pt", "checkpoint_7_1036.pt", "checkpoint_9_1200.pt"]
    assert "leaving out checkpoint_8_1184.pt" in capsys.readouterr().err


def test_local_split_relative_to_cwd_and_data_dir_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    write_parallel(tmp_path / "corpus", "dev", n=4)
    write_parallel(tmp_path / "elsewhere", "dev", n=3)
    data = DataConfig(source="local", local_dir="corpus", valid_prefix="dev")
    ckpt = write_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_best.pt", config=tiny_config(data))
    monkeypatch.chdir(tmp_path)
    assert evaluate.main(["run", "--split", "valid", "--beam", "1", "--quiet"]) == 0
    assert "split: valid (4 sentences" in capsys.readouterr().out
    assert len(ckpt.with_name("checkpoint_best.valid.hyp").read_text().splitlines()) == 4
    assert evaluate.main(["run", "--split", "valid", "--beam", "1", "--quiet", "--data-dir", "elsewhere"]) == 0
    assert "split: valid (3 sentences" in capsys.readouterr().out
    assert evaluate.main(["run", "--split", "test", "--quiet"]) == 1  # corpus/test.* does not exist
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1


def test_a_read_only_output_folder_is_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """mkstemp fails with EROFS in the checkpoint's folder (raised by a stand-in: root ignores chmod); the line names
    the hypothesis file and --output, and nothing is written. CPU, fp32, greedy."""
    ckpt = write_checkpoint(tmp_path / "ckpt" / "checkpoint_best.pt")
    src, ref = write_parallel(tmp_path / "data", "test", n=2)

    def read_only(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:  # noqa: A002 - mkstemp's own name
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(Path(dir) / f"{prefix}x1y2{suffix}"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    with pytest.raises(SystemExit) as stopped:
        evaluate.main([str(ckpt), "--src", str(src), "--ref", str(ref), "--beam", "1", "--device", "cpu", "--quiet"])
    assert stopped.value.code == 1
    hyp = ckpt.with_name("checkpoint_best.test.de.hyp")
    assert capsys.readouterr().err == (
        f"tfx.evaluate: read-only file system: cannot write {hyp}: point --output at a folder you can write\n"
    )
    assert [p.name for p in ckpt.parent.iterdir()] == ["checkpoint_best.pt"]


def test_run_dir_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = make_run(tmp_path)
    (run / "checkpoints" / "checkpoint_best.pt").unlink()
    assert evaluate.main([str(run), "--quiet"]) == 1
    assert "no checkpoint_best.pt" in capsys.readouterr().err
    for old in (run / "checkpoints").glob("checkpoint_*_*.pt"):
        old.unlink()
    assert evaluate.main([str(run), "--avg", "9", "--quiet"]) == 1
    assert "has no numbered checkpoints" in capsys.readouterr().err


def write_pair(folder: Path, prefix: str, src_line: str, ref_line: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{prefix}.de").write_text(src_line + "\n", encoding="utf-8")
    (folder / f"{prefix}.en").write_text(ref_line + "\n", encoding="utf-8")
    return folder / f"{prefix}.de", folder / f"{prefix}.en"


def tok_score(ckpt: Path, stem: str) -> dict:
    return json.loads(ckpt.with_name(f"{ckpt.stem}.{stem}.bleu.json").read_text())["scores"][-1]


def test_refs_tokenized_scores_a_fairseq_reference_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw-text model against fairseq's tokenized test.en: escaping the reference again broke `&apos;`."""
    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    src, ref = write_pair(tmp_path, "test", "es ist diese pyramide .", "it &apos;s that pyramid .")
    monkeypatch.setattr(evaluate, "translate_with_args", lambda *a, **k: ["It's that pyramid."])
    base = [str(ckpt), "--src", str(src), "--ref", str(ref), "--beam", "1", "--quiet", "--device", "cpu"]
    assert evaluate.main([*base, "--tok-bleu"]) == 0
    assert tok_score(ckpt, "test.de")["score"] < 50.0  # the reference's &apos; escaped twice
    assert evaluate.main([*base, "--refs-tokenized"]) == 0
    assert tok_score(ckpt, "test.de")["score"] == pytest.approx(100.0)


def test_a_run_on_tokenized_text_is_scored_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """data.tokenized: the model writes tokenized text and its own split is tokenized; compound split on request."""
    line = "it &apos;s a well-known pyramid ."
    write_pair(tmp_path / "corpus", "test", "es ist eine bekannte pyramide .", line)
    data = DataConfig(source="local", local_dir=str(tmp_path / "corpus"), tokenized=True)
    ckpt = write_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_best.pt", config=tiny_config(data))
    monkeypatch.setattr(evaluate, "translate_with_args", lambda *a, **k: [line])
    assert evaluate.main([str(ckpt), "--beam", "1", "--quiet", "--device", "cpu", "--compound-split"]) == 0
    score = tok_score(ckpt, "test")
    assert score["score"] == pytest.approx(100.0)
    assert "pretok:hyp+ref" in score["signature"] and "compound-split" in score["signature"]
    assert "tok:13a" not in capsys.readouterr().out  # sacreBLEU of tokenized text is not reported
