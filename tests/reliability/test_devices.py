"""A device that is not there, and a folder where a checkpoint file belongs: one line each, early."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tfx.evaluation.translate
from tests.reliability.helpers import cli, tiny_cfg
from tfx.runtime.distributed import DeviceError, available_devices
from tfx.train import train

MISSING = ["cuda:99", "tpu", "garbage"] + ([] if torch.cuda.is_available() else ["cuda"])


@pytest.mark.parametrize("device", MISSING)
def test_a_missing_device_fails_before_data_preparation(tmp_path: Path, device: str) -> None:
    available = ", ".join(available_devices())
    with pytest.raises(DeviceError, match=rf"^train.device={device}: .*available: {available}"):
        train(tiny_cfg(tmp_path, device=device), tmp_path / "run")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_missing_device_is_one_line(tmp_path: Path) -> None:
    proc = cli(f"hydra.run.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}", "train.device=cuda:99")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in output, output[-2000:]
    assert "train.device=cuda:99: no such device on this machine; available: cpu" in output
    assert "Warning" not in output, output[-2000:]  # e.g. Hydra warning about a callback hook we lack


def test_translate_with_a_missing_device_is_one_line(tmp_path: Path, capsys) -> None:
    assert tfx.evaluation.translate.main([str(tmp_path / "x.pt"), "--device", "cuda:99"]) == 1
    assert "--device=cuda:99: no such device" in capsys.readouterr().err


def test_translate_given_a_run_folder_uses_its_best_checkpoint_and_one_without_says_so(tmp_path: Path, capsys) -> None:
    """tfx.translate RUN reads RUN's checkpoint_best.pt, as tfx.evaluate RUN does (issue 67); a folder without one
    is refused in one line. CPU, fp32 (tiny_cfg)."""
    train(tiny_cfg(tmp_path, max_updates=2, save_every_updates=2), tmp_path / "run")
    source = tmp_path / "source.txt"
    source.write_text("w1 w2 w3\n")
    out = tmp_path / "out.txt"
    assert tfx.evaluation.translate.main([str(tmp_path / "run"), "--device", "cpu", "--input", str(source),
                                          "--output", str(out)]) == 0  # fmt: skip
    assert len(out.read_text().splitlines()) == 1
    (tmp_path / "run" / "checkpoints" / "checkpoint_best.pt").unlink()
    capsys.readouterr()
    assert tfx.evaluation.translate.main([str(tmp_path / "run"), "--device", "cpu", "--input", str(source)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no checkpoint_best.pt" in err, err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert tfx.evaluation.translate.main([str(empty), "--device", "cpu", "--input", str(source)]) == 1
    assert "has no checkpoint_best.pt" in capsys.readouterr().err
