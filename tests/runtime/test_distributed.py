"""Who is rank what: torchrun's variables, else srun's (one task per GPU), else one process."""

from __future__ import annotations

import pytest

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
