"""Who is rank what: torchrun's variables, else srun's (one task per GPU), else one process."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from tests.test_train import join_two_ranks, rendezvous_ports
from tfx.runtime.distributed import SLURM_PORT_BASE, DistInfo, first_host, launch_info

SRUN_TASK = {
    "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
    "SLURM_STEP_NODELIST": "gpu[003-004]", "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_JOB_ID": "1234",
}  # fmt: skip


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("gpu[003-004,010],cpu1", "gpu003"), ("node7", "node7"), ("a,b", "a"), ("n[1-2]", "n1"), ("x-y[05]", "x-y05")],
)
def test_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_an_srun_task_is_one_rank_and_meets_the_others_on_the_first_node() -> None:
    info, init = launch_info(SRUN_TASK)
    assert info == DistInfo(rank=5, world_size=8, local_rank=1)
    assert init == f"tcp://gpu003:{SLURM_PORT_BASE + 1234}"
    assert launch_info({**SRUN_TASK, "MASTER_ADDR": "head", "MASTER_PORT": "29500"})[1] == "tcp://head:29500"


def test_torchrun_wins_over_slurm_and_a_shell_in_an_allocation_is_one_process() -> None:
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}
    assert launch_info({**SRUN_TASK, **torchrun}) == (DistInfo(3, 4, 3), None)  # torchrun inside a SLURM job
    salloc_shell = {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP")}
    assert launch_info(salloc_shell) == (DistInfo(), None)  # SLURM_NTASKS=8 alone is not a launch
    assert launch_info({}) == (DistInfo(), None)


def test_the_tests_ranks_meet_on_a_port_no_other_process_can_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-rank tests' rendezvous (tests/test_train.py): CI's other pytest pass cannot listen on a port handed
    out there, before or while the ranks use it (issue 69: a port found free and let go was bound by the other
    pass first, and a rank joined the other pass's group), and rank 0 joins the store there instead of hosting one."""
    short = datetime.timedelta(seconds=10)
    with rendezvous_ports(2) as ports:
        assert len(set(ports)) == 2
        for port in ports:  # the other pass's rank 0, told the same port
            with pytest.raises(dist.DistNetworkError, match="EADDRINUSE"):
                dist.TCPStore("127.0.0.1", port, world_size=2, is_master=True, wait_for_workers=False, timeout=short)
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE"):
            monkeypatch.setenv(name, "")  # recorded, for undo(): join_two_ranks sets them in this process
        join_two_ranks(0, ports[1])
        store, rank, world_size = next(dist.rendezvous("env://", timeout=short))  # as init_process_group meets
        assert (rank, world_size) == (0, 2)
        store.set("rank_0", "here")
        other = dist.TCPStore("127.0.0.1", ports[1], world_size=2, is_master=False, timeout=short)
        assert other.get("rank_0") == b"here"  # rank 0 is a client of the store there, as any other rank
        del store, other
        monkeypatch.undo()  # (with TORCHELASTIC_USE_AGENT_STORE set, a TCPStore server ignores a failed bind)
    again = dist.TCPStore("127.0.0.1", ports[0], world_size=2, is_master=True, wait_for_workers=False, timeout=short)
    del again  # the block let the ports go
