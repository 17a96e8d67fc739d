"""torchrun / srun / DDP plumbing: one process per device, rank 0 alone logs and writes."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device_pref: str) -> tuple[DistInfo, torch.device]:
    """Join the process group torchrun (or srun) describes, if any, and pick this rank's device."""
    info, init_method = launch_info(os.environ)
    device = resolve_device(device_pref, info.local_rank)
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=init_method, rank=info.rank, world_size=info.world_size)
    return info, device


def launch_info(env: Mapping[str, str]) -> tuple[DistInfo, str | None]:
    """This process's rank and the rendezvous (None = torchrun's ``env://``), from the environment.

    torchrun sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (also when it runs inside a SLURM job).
    Without them, a task that ``srun`` started is one rank (one task per GPU, as the submitit
    launcher starts them: ``hydra.launcher.tasks_per_node``): ``SLURM_PROCID``, ``SLURM_LOCALID``
    and ``SLURM_STEP_NUM_TASKS``, which only srun sets (an sbatch or salloc shell has
    ``SLURM_NTASKS`` but is a single process). Rank 0 listens on the first node of the step.
    """
    if "WORLD_SIZE" in env:
        return DistInfo(int(env.get("RANK", "0")), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))), None
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", "1"))
    if tasks <= 1:
        return DistInfo(), None
    info = DistInfo(int(env["SLURM_PROCID"]), tasks, int(env.get("SLURM_LOCALID", "0")))
    host = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
    port = env.get("MASTER_PORT") or str(SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % SLURM_PORT_RANGE)
    return info, f"tcp://{host}:{port}"


# srun tasks agree on a port without talking: one derived from the job id (array tasks have their own).
SLURM_PORT_BASE, SLURM_PORT_RANGE = 20000, 40000


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[003-004,010],cpu1`` -> ``gpu003``."""
    match = re.match(r"([^,\[]+)(?:\[([^-,\]]+))?", nodelist.strip())
    if match is None:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}")
    prefix, first = match.groups()
    return prefix + (first or "")


class DeviceError(ValueError):
    """A device setting names a device this machine does not have (message is one line)."""


def available_devices() -> list[str]:
    """What ``train.device`` / ``--device`` may name here."""
    names = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def resolve_device(pref: str, local_rank: int = 0, setting: str = "train.device") -> torch.device:
    """``auto`` = this rank's CUDA device when there is one, else CPU; anything else must exist here.

    Checked at start-up, so a missing GPU is one line naming ``setting``, not a traceback after
    data preparation.
    """
    if pref == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(f"cuda:{local_rank}" if pref == "cuda" else pref)
    except (RuntimeError, ValueError):
        device = None
    known = available_devices()
    name = None if device is None else (str(device) if device.type != "mps" else "mps")
    if device is None or (device.type != "cpu" and name not in known):
        raise DeviceError(f"{setting}={pref}: no such device on this machine; available: {', '.join(known)} (or auto)")
    return device


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(value: float | torch.Tensor, device: torch.device) -> float | torch.Tensor:
    """The sum over ranks: a number comes back as a number (a host sync), a device tensor as a tensor
    reduced in place on the device (none)."""
    if not dist.is_initialized():
        return value
    if isinstance(value, torch.Tensor):
        dist.all_reduce(value)
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def gather_to_main(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order on rank 0 (other ranks get ``[]``); ``[obj]`` without DDP."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out or []


def broadcast_object(obj: Any) -> Any:
    """Rank 0's value on every rank (e.g. the run folder, which Hydra names per process)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
