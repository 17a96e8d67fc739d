"""tfx.training.build.seed_everything: each run sets PyTorch's global modes from its own config, so a run in the same
process (a study, the test suite) does not inherit the previous run's. CPU; no tensors are computed."""

from __future__ import annotations

import torch

from tfx.config import TrainConfig
from tfx.training.build import seed_everything


def test_a_deterministic_run_leaves_no_mode_behind_for_the_next() -> None:
    try:
        seed_everything(TrainConfig(deterministic=True, threads=0))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False  # the fill costs; nothing reads it
        seed_everything(TrainConfig(deterministic=False, threads=0))
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is True  # PyTorch's default, back
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True
