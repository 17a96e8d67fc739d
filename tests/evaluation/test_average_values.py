"""Checkpoint averaging against hand-computed means: three inputs with different values, and the
property that the mean of k copies of one checkpoint is that checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.checkpoint_helpers import write_checkpoint
from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.evaluation.average import average_checkpoints
from tfx.files.atomic import atomic_save


def write_constant(path: Path, template: Path, value: float, step: int) -> Path:
    """``template`` with every float tensor set to ``value``."""
    ckpt = load_checkpoint(template)
    ckpt["model"] = {k: v.clone().fill_(value) if v.is_floating_point() else v for k, v in ckpt["model"].items()}
    ckpt["step"] = step
    atomic_save(ckpt, path)
    return path


def test_three_checkpoints_average_to_their_mean(tmp_path: Path) -> None:
    """1, 2 and 6 average to 3: not 4.5 (dividing by 2), not 3.5 (first and last only), not 2 or 6."""
    template = write_checkpoint(tmp_path / "t.pt")
    paths = [write_constant(tmp_path / f"{v}.pt", template, v, step) for v, step in ((1.0, 10), (2.0, 30), (6.0, 20))]
    avg = average_checkpoints(paths)
    floats = [v for v in avg["model"].values() if v.is_floating_point()]
    assert floats and all(torch.equal(v, torch.full_like(v, 3.0)) for v in floats)
    assert avg["step"] == 30


def test_three_random_checkpoints_average_elementwise(tmp_path: Path) -> None:
    paths = [write_checkpoint(tmp_path / f"{i}.pt", seed=i) for i in range(3)]
    models = [load_checkpoint(p)["model"] for p in paths]
    avg = average_checkpoints(paths)["model"]
    for key, value in avg.items():
        expected = sum(m[key].double() for m in models) / 3
        torch.testing.assert_close(value, expected.to(value.dtype), rtol=0, atol=1e-7)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("avg") / "t.pt")


@settings(max_examples=25, deadline=None)
@given(k=st.integers(min_value=1, max_value=5), scale=st.floats(min_value=1e-3, max_value=1e3), seed=st.integers(0, 99))
def test_mean_of_identical_checkpoints_is_the_checkpoint(template: Path, k: int, scale: float, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = load_checkpoint(template)
        gen = torch.Generator().manual_seed(seed)
        ckpt["model"] = {
            key: torch.randn(v.shape, generator=gen).mul(scale).to(v.dtype) if v.is_floating_point() else v
            for key, v in ckpt["model"].items()
        }
        path = Path(tmp) / "a.pt"
        atomic_save(ckpt, path)
        original = ckpt["model"]
        avg = average_checkpoints([path] * k)["model"]
        assert avg.keys() == original.keys()
        for key, value in original.items():
            assert avg[key].dtype == value.dtype and torch.equal(avg[key], value), key


def test_a_model_setting_only_one_checkpoint_has_is_a_difference(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.pt")
    ckpt = load_checkpoint(a)
    ckpt["config"]["model"]["extra_setting"] = 1
    atomic_save(ckpt, tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match=r"model.extra_setting differs \(None vs 1\)"):
        average_checkpoints([a, tmp_path / "b.pt"])


def test_step_is_zero_when_no_input_has_one(tmp_path: Path) -> None:
    ckpt = load_checkpoint(write_checkpoint(tmp_path / "a.pt"))
    del ckpt["step"]
    atomic_save(ckpt, tmp_path / "a.pt")
    assert average_checkpoints([tmp_path / "a.pt"] * 2)["step"] == 0


def test_integer_tensors_come_from_the_first_checkpoint(tmp_path: Path) -> None:
    """A counter (int64) is not averaged: the first input's value is kept, dtype and all."""
    paths = []
    for i, step in enumerate((10, 20)):
        ckpt = load_checkpoint(write_checkpoint(tmp_path / f"{i}.pt", seed=i, step=step))
        ckpt["model"]["counter"] = torch.tensor(step)
        atomic_save(ckpt, tmp_path / f"{i}.pt")
        paths.append(tmp_path / f"{i}.pt")
    counter = average_checkpoints(paths)["model"]["counter"]
    assert counter.dtype == torch.int64 and counter.item() == 10


def test_step_is_the_highest_even_when_the_first_input_has_it(tmp_path: Path) -> None:
    paths = [write_checkpoint(tmp_path / f"{s}.pt", step=s) for s in (300, 100, 200)]
    assert average_checkpoints(paths)["step"] == 300
