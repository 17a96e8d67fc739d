"""train.strategy=fsdp (tfx/runtime/sharding.py): two gloo ranks on CPU against one process, checkpoints, resume."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tfx.training.step as step_mod
from tests.test_train import join_two_ranks, rendezvous_ports, tiny_cfg
from tfx.checkpoints.load import load_checkpoint
from tfx.config import Config
from tfx.data import prepare_data
from tfx.evaluation import average, translate
from tfx.model import build_model
from tfx.optim.optimizers import build_optimizer
from tfx.runtime.precision import Precision
from tfx.runtime.sharding import ShardingError, _indexed, _named, load_state_dicts, local_tensor, shard, state_dicts
from tfx.train import TrainingDiverged, train

LAYER_NORM_KEYS = ("layers/enc/grad_norm/000", "layers/dec/grad_norm/001")


def _cfg(tmp_path: Path, **train_kw: Any) -> Config:
    """Dropout-free (ranks draw other masks than one process), clipped below the usual norm, with
    activation checkpointing, a mid-run validation and numbered checkpoints at 3 and 6."""
    kw = {"max_updates": 6, "validate_every_updates": 3, "save_every_updates": 3, "layer_stats_every_updates": 2}
    return tiny_cfg(tmp_path, None, {"dropout": 0.0, "checkpoint_activations": True}, {"clip_norm": 0.5}, **{
        **kw, **train_kw
    })  # fmt: skip


def _with(cfg: Config, **train_kw: Any) -> Config:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train_kw))


def _run(cfg: Config, run_dir: Path, seen: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Per-update loss, grad norm, loss scale and two layers' grad norms (every other update)."""
    seen = {"loss": [], "grad_norm": [], "loss_scale": [], "layers": []} if seen is None else seen

    def record(trainer, metrics: dict[str, float]) -> None:
        seen["loss"].append(metrics["train/loss"])
        seen["grad_norm"].append(metrics["train/grad_norm"])
        seen["loss_scale"].append(metrics.get("train/loss_scale", 1.0))
        seen["layers"] += [metrics[k] for k in LAYER_NORM_KEYS if k in metrics]

    train(cfg, run_dir, on_update=record)
    return seen


def _poisoned_on_rank_1(rank: int, cfg: Config, run_dir: Path) -> tuple[str, list[float]]:
    """Rank 1's loss is NaN: the global grad norm is NaN on both ranks, so both skip, then both stop;
    under fp16 both scalers see the overflow and halve the scale. Returns the error and the scales."""
    real = step_mod.label_smoothed_loss

    def poisoned(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        return (loss * float("nan") if rank == 1 else loss), nll

    step_mod.label_smoothed_loss = poisoned
    seen: dict[str, list[float]] = {"loss": [], "grad_norm": [], "loss_scale": [], "layers": []}
    try:
        _run(cfg, run_dir, seen)
    except TrainingDiverged as err:
        return str(err), seen["loss_scale"]
    finally:
        step_mod.label_smoothed_loss = real
    return "did not stop", seen["loss_scale"]


@contextlib.contextmanager
def overflow_at_first_update(on_rank: int) -> Iterator[None]:
    """One inf in ``on_rank``'s shard of the first update's gradients (all of them in one process).

    A real fp16 overflow rarely hits every shard: only a reduction of the scaler's "found inf" over
    ranks (torch's DTensor does it) makes every rank skip that update and halve its scale.
    """
    real = Precision.unscale_and_clip
    updates = []

    def inject(self, optimizer, params, max_norm):
        if not updates and int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == on_rank:
            local_tensor(optimizer.param_groups[0]["params"][0].grad).view(-1)[0] = float("inf")
        updates.append(1)
        return real(self, optimizer, params, max_norm)

    Precision.unscale_and_clip = inject
    try:
        yield
    finally:
        Precision.unscale_and_clip = real


def as_srun_task(rank: int, port: int) -> None:
    """The environment srun gives task ``rank`` of a 2-task step on this host (no torchrun variables), to meet
    on ``port`` (``rendezvous_ports``: the test's store stands in for the one rank 0 would host)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        os.environ.pop(name, None)
    os.environ.update(
        SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
        SLURM_STEP_NODELIST="localhost", SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="4242", MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )  # fmt: skip


def _fsdp_worker(rank: int, cfgs: dict[str, Config], root: str, ports: list[int]) -> None:
    runs = Path(root)
    out: dict[str, Any] = {}
    for name in ("full", "bf16"):
        join_two_ranks(rank, ports.pop())
        out[name] = _run(cfgs[name], runs / f"fsdp_{name}")
    as_srun_task(rank, ports.pop())  # ranks from SLURM's variables, as under hydra/launcher=slurm
    with overflow_at_first_update(on_rank=0):
        out["fp16"] = _run(cfgs["fp16"], runs / "fsdp_fp16")
    join_two_ranks(rank, ports.pop())
    out["first"] = _run(cfgs["half"], runs / "fsdp_resumed")
    join_two_ranks(rank, ports.pop())
    out["second"] = _run(cfgs["full"], runs / "fsdp_resumed")
    join_two_ranks(rank, ports.pop())
    out["poisoned"] = _poisoned_on_rank_1(rank, cfgs["poisoned"], runs / "fsdp_poisoned")
    torch.save(out, runs / f"out.{rank}")


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_process_and_their_checkpoints_load_anywhere(tmp_path: Path) -> None:
    """Two gloo ranks with train.strategy=fsdp against one process with update_freq=2 (the same
    batches per update, as the DDP test): fp32 with activation checkpointing, clipping and layer
    stats; bf16 with update_freq 2 (against one shard: both all-gather bf16 weights); fp16 with
    an overflow in one rank's shard (ranks from srun's variables). Then resume, the non-finite skip,
    translate/average/single-process resume of the gathered checkpoints."""
    cfg = _cfg(tmp_path, strategy="fsdp")
    prepare_data(cfg.data, seed=cfg.train.seed)  # fill the cache before the ranks start
    cfgs = {
        "full": cfg,
        "half": _with(cfg, max_updates=3),
        "bf16": _with(cfg, precision="bf16", update_freq=2, max_updates=3, validate_every_updates=0),
        "fp16": _with(cfg, precision="fp16", max_updates=3, validate_every_updates=0),
        "poisoned": _with(cfg, precision="fp16", max_bad_steps=2, validate_every_updates=0, save_every_updates=0),
    }
    with rendezvous_ports(6) as ports:
        mp.spawn(_fsdp_worker, args=(cfgs, str(tmp_path), ports), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"out.{r}", weights_only=True) for r in (0, 1)]
    fsdp = ranks[0]

    single = _run(_with(cfg, strategy="ddp", update_freq=2), tmp_path / "single")
    for key in ("loss", "grad_norm", "layers"):  # the global grad norm, as one process computes it
        assert fsdp["full"][key] == pytest.approx(single[key], rel=1e-4), key
        assert ranks[1]["full"][key] == pytest.approx(fsdp["full"][key], rel=1e-6), key
    assert len(fsdp["full"]["layers"]) == 3 * len(LAYER_NORM_KEYS)
    assert max(single["grad_norm"]) > 0.5  # clipping was active
    # fsdp without a distributed launch runs as one shard (bf16: both all-gather bf16 weights)
    bf16_one_shard = _run(_with(cfgs["bf16"], update_freq=4), tmp_path / "bf16_one_shard")
    assert fsdp["bf16"]["loss"] == pytest.approx(bf16_one_shard["loss"], rel=1e-3)
    bf16_plain = _run(_with(cfgs["bf16"], strategy="ddp", update_freq=4), tmp_path / "bf16_plain")
    assert bf16_one_shard["loss"] == pytest.approx(bf16_plain["loss"], rel=1e-3)  # bf16 weights vs bf16 autocast
    with overflow_at_first_update(on_rank=0):
        fp16_single = _run(_with(cfgs["fp16"], strategy="ddp", update_freq=2), tmp_path / "fp16_single")
    assert fsdp["fp16"]["loss"] == pytest.approx(fp16_single["loss"], rel=1e-3)
    assert len(fp16_single["loss"]) == 4 and fp16_single["loss_scale"] == [2.0**15] * 4  # update 0 skipped
    assert fsdp["fp16"]["loss_scale"] == ranks[1]["fp16"]["loss_scale"] == fp16_single["loss_scale"]

    assert fsdp["first"]["loss"] + fsdp["second"]["loss"] == fsdp["full"]["loss"]  # resume is exact
    assert ranks[0]["poisoned"] == ranks[1]["poisoned"]  # the same error, and the same halved loss scale
    assert "2 consecutive non-finite steps at update 0" in ranks[0]["poisoned"][0]
    assert ranks[0]["poisoned"][1] == [2.0**15]  # the initial 2**16, halved

    _check_gathered_checkpoints(tmp_path, cfg)


def _check_gathered_checkpoints(tmp_path: Path, cfg: Config) -> None:
    """FSDP's checkpoints have the single-process format, values and uses."""
    ckpts, ref_ckpts = tmp_path / "fsdp_full" / "checkpoints", tmp_path / "single" / "checkpoints"
    last, ref = load_checkpoint(ckpts / "checkpoint_last.pt"), load_checkpoint(ref_ckpts / "checkpoint_last.pt")
    assert last["model"].keys() == ref["model"].keys()
    for key, value in ref["model"].items():  # Adam moves a weight whose gradient is ~0 by up to lr per step
        torch.testing.assert_close(last["model"][key], value, rtol=1e-3, atol=1e-3)
    opt, ref_opt = last["optimizer"], ref["optimizer"]
    assert [g["params"] for g in opt["param_groups"]] == [g["params"] for g in ref_opt["param_groups"]]
    for index, state in ref_opt["state"].items():
        torch.testing.assert_close(opt["state"][index]["exp_avg_sq"], state["exp_avg_sq"], rtol=1e-3, atol=1e-9)
    (tmp_path / "src.txt").write_text("a b c\nd e\n")
    args = ["--input", str(tmp_path / "src.txt"), "--device", "cpu", "--quiet", "--beam", "2"]
    assert translate.main([str(ckpts / "checkpoint_best.pt"), *args, "--output", str(tmp_path / "out.txt")]) == 0
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 2
    assert (
        average.main(["--run-dir", str(tmp_path / "fsdp_full"), "--last", "2", "--output", str(tmp_path / "a.pt")]) == 0
    )
    # A single process resumes from it (world size and update_freq changed: force).
    more = _with(cfg, strategy="ddp", update_freq=2, max_updates=7, resume_mode="force",
                 resume=str(ckpts / "checkpoint_last.pt"))  # fmt: skip
    assert train(more, tmp_path / "continued")["step"] == 7


def test_optimizer_state_names_and_indices_round_trip(tmp_path: Path) -> None:
    """Under FSDP the optimizer state is keyed by parameter name; checkpoints keep torch's indices."""
    cfg = tiny_cfg(tmp_path)
    model = build_model(cfg.model, 40, 0)
    optimizer = build_optimizer(model, cfg.optim, torch.device("cpu"))
    model(torch.tensor([[5, 6, 2]]), torch.tensor([[2, 7]])).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    named = _named(model, optimizer, state)
    assert set(named["state"]) == {n for n, p in model.named_parameters()}
    assert named["param_groups"][0]["params"][0] == "encoder.embedding.embed.weight"
    again = _indexed(named)
    assert again["param_groups"] == state["param_groups"]
    assert all(again["state"][i]["exp_avg"] is s["exp_avg"] for i, s in state["state"].items())


def test_an_optimizer_without_state_is_saved_and_loaded_without_stepping_it(tmp_path: Path) -> None:
    """torch's state-dict functions would step a stateless optimizer once (lr 0) to create its state:
    Adam's step count would start at 1 after a checkpoint written before the first applied update."""
    cpu = torch.device("cpu")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = tiny_cfg(tmp_path)
        model = build_model(cfg.model, 40, 0)
        shard(model, cpu, bf16=False)
        optimizer = build_optimizer(model, cfg.optim, cpu)
        model_state, optim_state = state_dicts(model, optimizer)
        assert not optimizer.state and optim_state["state"] == {}
        assert optim_state["param_groups"][0]["params"] == list(range(len(list(model.parameters()))))
        key = "decoder.layers.1.ffn.fc2.weight"
        saved = model_state[key].clone()  # loading puts the shards into the dict it is given
        load_state_dicts(model, optimizer, model_state, optim_state)
        assert not optimizer.state
        assert torch.equal(state_dicts(model, optimizer)[0][key], saved)
    finally:
        dist.destroy_process_group()


def test_fsdp_on_a_torch_without_fsdp2_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)  # its import fails, as before torch 2.6
    with pytest.raises(ShardingError, match=r"train.strategy=fsdp needs torch >= 2.6 \(FSDP2\); this is torch"):
        train(tiny_cfg(tmp_path, strategy="fsdp"), tmp_path / "run")


def test_starting_tfx_train_imports_no_fsdp_nor_distributed_checkpoint() -> None:
    """They cost about a second per start (CPU, torch 2.13) and only a sharded run needs them."""
    heavy = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint")
    code = f"import sys, tfx.train; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
