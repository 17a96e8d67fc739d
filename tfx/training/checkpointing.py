"""The run's checkpoints during training: when a numbered one is due (every N updates, every N epochs, the
end) and what a save writes (``tfx.checkpoints.manager`` does the writing, ``tfx.checkpoints.train_state`` says
what)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from tfx.checkpoints.manager import CheckpointManager, rng_state
from tfx.checkpoints.train_state import TrainState, checkpoint_payload
from tfx.config import Config
from tfx.data import Tokenizer
from tfx.runtime import distributed
from tfx.runtime.precision import Precision


class Checkpointer:
    """checkpoint_last.pt (never the same state twice) and the weights-only best and numbered copies."""

    def __init__(
        self, ckpts: CheckpointManager, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
        cfg: Config, tokenizer: Tokenizer, world_size: int, device: torch.device, state: TrainState,
    ) -> None:  # fmt: skip
        self.ckpts, self.model, self.optimizer, self.precision = ckpts, model, optimizer, precision
        self.cfg, self.tokenizer, self.world_size, self.device = cfg, tokenizer, world_size, device
        self.state = state
        self._saved: TrainState | None = None  # what checkpoint_last.pt holds (never write it twice)

    def due(self, step: int) -> bool:
        """Whether update ``step`` writes a numbered checkpoint (``train.save_every_updates``)."""
        n = self.cfg.train.save_every_updates
        return bool(n) and step % n == 0

    def label_at_epoch_end(self, epoch: int) -> int | None:
        """The numbered label at the end of ``epoch`` (``train.save_every_epochs``), or None."""
        n = self.cfg.train.save_every_epochs
        return epoch if n and epoch % n == 0 else None

    def save(self, best: bool = False, numbered_epoch: int | None = None, whole_epoch: bool = False) -> None:
        """checkpoint_last.pt unless it already holds this very state; best/numbered weights-only copies.

        Only the last checkpoint resumes, so only it carries the optimizer, RNG and iterator state; without
        Adam's moments best and numbered ones are a third of the size (4 GB, not 13, at 200+200 layers, d 512).
        Every rank calls this: each one's RNG state (and FSDP shards) go in. The caller reads pending updates
        first: a checkpoint holds only counted ones.
        """
        rngs = distributed.gather_to_main(rng_state(self.device))
        write_last = self.state != self._saved
        self._saved = dataclasses.replace(self.state)
        if write_last or best or numbered_epoch is not None:
            payload = checkpoint_payload(self.model, self.optimizer, self.state, self.precision, self.cfg,
                                         self.tokenizer, self.world_size, rngs)  # fmt: skip
            self.ckpts.save(payload, write_last, best, numbered_epoch, whole_epoch)

    def final_numbered_epoch(self) -> int | None:
        """The epoch label of a numbered checkpoint of the final state, so that ``--avg N`` covers the end of
        training (a time budget or a signal stops mid-epoch); None when numbered saves are off or one exists."""
        t = self.cfg.train
        written = distributed.broadcast_object(self.ckpts.has_numbered(self.state.step))  # rank 0's folder decides
        if not (t.save_every_epochs or t.save_every_updates) or written:
            return None
        return self.state.epoch if self.state.batch_in_epoch else self.state.epoch - 1
