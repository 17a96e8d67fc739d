"""A damaged ``checkpoint_last.pt`` (an interrupted copy after a clean save): one line naming the newest
readable checkpoint and the setting that resumes from it, the damaged file untouched until then;
``train.resume_mode=weights`` goes on from those weights. CPU, fp32 (the tiny run pins it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.reliability.helpers import cli, tiny_cfg, with_changes
from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.train import train

PARTS = {"max_updates": 6, "save_every_updates": 3, "validate_every_updates": 3}


def _cut_short(path: Path) -> bytes:
    """Cut ``path`` to half its size, as an interrupted copy leaves it; returns what is left."""
    left = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(left)
    return left


def test_a_cut_short_last_checkpoint_names_the_newest_readable_one_and_is_left_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(tiny_cfg(tmp_path, **PARTS), run_dir)
    ckpts = run_dir / "checkpoints"
    numbered = ckpts / "checkpoint_1_6.pt"
    assert numbered.is_file() and (ckpts / "checkpoint_1_3.pt").is_file()
    (ckpts / "checkpoint_best.pt").unlink()  # so the newest readable one is unambiguous
    left = _cut_short(ckpts / "checkpoint_last.pt")

    with pytest.raises(CheckpointError) as caught:
        train(tiny_cfg(tmp_path, **{**PARTS, "max_updates": 9}), run_dir)
    message = str(caught.value)
    assert "\n" not in message
    assert f"checkpoint {ckpts / 'checkpoint_last.pt'} is unreadable" in message and "truncated" in message
    assert f"the newest readable checkpoint is {numbered} (update 6, epoch 1; weights only" in message
    assert f"train.resume={numbered.resolve()} train.resume_mode=weights" in message
    assert (ckpts / "checkpoint_last.pt").read_bytes() == left, "the damaged file was touched"


def test_resume_mode_weights_goes_on_from_the_weights_at_their_update(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(tiny_cfg(tmp_path, **PARTS), run_dir)
    numbered = run_dir / "checkpoints" / "checkpoint_1_3.pt"
    weights = load_checkpoint(numbered)["model"]
    _cut_short(run_dir / "checkpoints" / "checkpoint_last.pt")
    seen: list[tuple[int, float]] = []

    def first_update(trainer, metrics: dict[str, float]) -> None:
        if not seen:
            name, first = next(iter(trainer.model.named_parameters()))
            seen.append((trainer.state.step, float((first.detach() - weights[name]).abs().max())))

    cfg = tiny_cfg(tmp_path, **{**PARTS, "max_updates": 8})
    cfg = with_changes(cfg, train={"resume": str(numbered), "resume_mode": "weights"})
    summary = train(cfg, run_dir, on_update=first_update)
    assert summary["step"] == 8 and len(summary["losses"]) == 5  # updates 4..8, counting on from 3
    step, moved = seen[0]
    assert step == 4 and 0 < moved < 0.1  # one update away from the numbered checkpoint's weights
    resumed = load_checkpoint(run_dir / "checkpoints" / "checkpoint_last.pt")
    assert resumed["step"] == 8 and {"optimizer", "rng", "train_state"} <= resumed.keys()


def test_strict_resume_from_weights_only_points_at_resume_mode_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(tiny_cfg(tmp_path, **PARTS), run_dir)
    numbered = run_dir / "checkpoints" / "checkpoint_1_3.pt"
    cfg = with_changes(tiny_cfg(tmp_path, **PARTS), train={"resume": str(numbered)})
    with pytest.raises(CheckpointError, match="holds weights only .* train.resume_mode=weights"):
        train(cfg, run_dir)


@pytest.mark.slow
def test_the_cli_after_a_damaged_checkpoint_and_cache_exits_1_in_one_line_then_follows_its_advice(
    tmp_path: Path,
) -> None:
    """The whole user path: damaged cache entries are rebuilt, the damaged last checkpoint stops the run
    with exit 1 and one line (no traceback), and the command it names resumes."""
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    common = (f"hydra.run.dir={run_dir}", f"data.cache_dir={cache}", "train.save_every_updates=3")
    first = cli(*common, "train.max_updates=6")
    assert first.returncode == 0, first.stderr[-2000:]
    for entry in [*cache.glob("enc-*.npz"), *cache.glob("spm-*.model")]:
        _cut_short(entry)
    left = _cut_short(run_dir / "checkpoints" / "checkpoint_last.pt")

    stopped = cli(*common, "train.max_updates=9")
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 1 and "Traceback" not in output, output[-3000:]
    assert "does not load" in output and "rebuilding it" in output  # the cache went on
    (advice,) = [line for line in output.splitlines() if "is unreadable" in line]
    assert (run_dir / "checkpoints" / "checkpoint_last.pt").read_bytes() == left
    setting = re.search(r"run again with (train\.resume=\S+(?: train\.resume_mode=weights)?)", advice)
    assert setting, advice

    resumed = cli(*common, "train.max_updates=9", *setting.group(1).split())
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert re.search(r"resumed from \S+checkpoint_\w+\.pt at update 6", output), output[-3000:]
    last = torch.load(run_dir / "checkpoints" / "checkpoint_last.pt", weights_only=True)
    assert last["step"] == 9
