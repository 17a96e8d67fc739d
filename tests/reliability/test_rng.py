"""RNG state on resume: loaded on the CPU whatever the device, and one stream per DDP rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

import tfx.runtime.distributed
from tests.reliability.helpers import tiny_cfg, with_changes
from tests.test_train import join_two_ranks, rendezvous_ports
from tfx.checkpoints.load import load_checkpoint
from tfx.train import Trainer, train


def saved_cpu_state(ckpt: dict, rank: int = 0) -> torch.Tensor:
    rng = ckpt["rng"]
    return (rng[rank] if isinstance(rng, list) else rng)["torch"]


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
def test_resume_on_another_device_restores_the_rng_state(tmp_path: Path, monkeypatch) -> None:
    """On a GPU the checkpoint used to be mapped to the device, and ``torch.set_rng_state`` refuses
    a CUDA ByteTensor. Here the device is 'meta' (not the CPU, as a GPU is not): weights land there,
    the RNG state must still come back as the CPU tensor it was saved as."""
    cfg = tiny_cfg(tmp_path, max_updates=2)
    train(cfg, tmp_path / "run")
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    monkeypatch.setattr(tfx.runtime.distributed, "resolve_device", lambda *args, **kwargs: torch.device("meta"))
    torch.manual_seed(12345)
    trainer = Trainer(with_changes(cfg, train={"max_updates": 4}), tmp_path / "run")
    try:
        assert trainer.state.step == 2 and next(trainer.model.parameters()).device.type == "meta"
        assert torch.equal(torch.get_rng_state(), saved_cpu_state(ckpt))
    finally:
        trainer.close()


def dropout_probe() -> torch.Tensor:
    """The mask dropout would draw next from this process's stream (the stream is left untouched)."""
    state = torch.get_rng_state()
    mask = F.dropout(torch.ones(256), 0.5, training=True) != 0
    torch.set_rng_state(state)
    return mask


def _rank_worker(rank: int, cfg, run_dir: str, ports: list[int], out: str) -> None:
    record: dict[str, torch.Tensor] = {}
    wrap = Trainer._wrap

    def record_initial_weights(self, model):  # before DDP, which would copy rank 0's weights anyway
        record["weights"] = torch.cat([p.detach().flatten() for p in model.parameters()])
        return wrap(self, model)

    Trainer._wrap = record_initial_weights
    for phase, (port, updates) in enumerate(zip(ports, (2, 3), strict=True)):
        join_two_ranks(rank, port)
        trainer = Trainer(with_changes(cfg, train={"max_updates": updates}), Path(run_dir))
        try:
            if phase == 0:
                record["probe"] = dropout_probe()
                trainer.run()
                record["saved"] = torch.get_rng_state()  # nothing draws after the final save
            else:
                record["resumed"] = torch.get_rng_state()
        finally:
            trainer.close()
            tfx.runtime.distributed.teardown()
    torch.save(record, f"{out}.{rank}")


@pytest.mark.slow
def test_ddp_ranks_start_identical_draw_their_own_dropout_and_resume_their_own_stream(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, layer_stats_every_updates=0)
    cfg = with_changes(cfg, model={"dropout": 0.3})
    out = str(tmp_path / "rank")
    with rendezvous_ports(2) as ports:
        mp.spawn(_rank_worker, args=(cfg, str(tmp_path / "run"), ports, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # the init is seeded alike on every rank
    assert not torch.equal(ranks[0]["probe"], ranks[1]["probe"])  # dropout is not
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    for rank, record in enumerate(ranks):
        assert torch.equal(saved_cpu_state(ckpt, rank), record["saved"])
        assert torch.equal(record["resumed"], record["saved"]), f"rank {rank} did not get its own stream back"
    assert not torch.equal(ranks[0]["saved"], ranks[1]["saved"])
