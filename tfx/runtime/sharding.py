"""``train.strategy=fsdp``: PyTorch FSDP2 (``fully_shard``) and the state dicts of a sharded model.

Each encoder and decoder layer is its own FSDP unit, then the root (embeddings, output
projection, final norms): a layer's weights are all-gathered just before it runs and freed
after, its gradients reduce-scattered as soon as its backward is done. Every rank then holds
1/N of the fp32 weights, gradients and Adam moments (docs/gpu-and-scaling.md "Beyond one device" has the
arithmetic). Parameters become ``DTensor``s sharded on dim 0; the optimizer is built on them.

- bf16: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: layers all-gather bf16
  copies of the fp32 shards and reduce gradients in fp32 (the forward still autocasts, so the
  loss and softmax stay fp32).
- fp16: fp32 weights, fp16 autocast and ``torch.amp.GradScaler`` as without FSDP: on ``DTensor``
  gradients its "found inf" is reduced over ranks (torch does it), so every rank skips the same
  updates. (FSDP1's ``ShardedGradScaler`` would all-reduce it a second time, and it breaks fused
  Adam: its found-inf tensor has shape (1,) where the fused kernel expects a scalar.)
- Gradient accumulation: no reduce-scatter on non-final micro-batches (``sync``); each layer then
  keeps its unsharded gradient until the last one (full-size gradients in memory meanwhile).
- Clipping: ``clip_grad_norm_`` on ``DTensor`` gradients reduces the per-shard norms, so the
  norm (logged and clipped against) is the global one on every rank.
- Checkpoints hold the full (unsharded) state dict gathered on rank 0, in the format of a
  single-process run (``state_dicts``), so translate/average/a single-process resume load them.
- Validation runs on rank 0 with an unsharded copy of the weights (``unsharded``).

Works on CPU with gloo (the tests) as on CUDA with NCCL. Without a distributed launch it runs as
one shard in a one-process group (no memory saved; useful to check a setup).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tfx.model import Transformer

log = logging.getLogger("tfx.train")

# FSDP2 and torch.distributed.checkpoint are imported when a model is sharded, not with this module: they add
# about a second to every start of tfx.train, and most runs never shard. Nothing is an FSDPModule or a DTensor
# before their modules are imported, so the type checks below look them up in sys.modules instead.
_FSDP, _DTENSOR = "torch.distributed.fsdp", "torch.distributed.tensor"


class ShardingError(ValueError):
    """``train.strategy=fsdp`` cannot run here (message is one line)."""


def is_sharded(model: nn.Module) -> bool:
    fsdp_module = getattr(sys.modules.get(_FSDP), "FSDPModule", None)  # None before torch 2.6 (FSDP1 only)
    return fsdp_module is not None and isinstance(model, fsdp_module)


def is_dtensor(t: torch.Tensor) -> bool:
    tensor = sys.modules.get(_DTENSOR)
    return tensor is not None and isinstance(t, tensor.DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a ``DTensor``; any other tensor as it is."""
    return t.to_local() if is_dtensor(t) else t


def all_reduce_norms(local_norms: torch.Tensor) -> torch.Tensor:
    """Global L2 norms from each rank's norms of its shards (one all-reduce for the whole vector)."""
    squares = local_norms.double().square()
    dist.all_reduce(squares)
    return squares.sqrt().to(local_norms.dtype)


def shard(model: Transformer, device: torch.device, bf16: bool) -> None:
    """``fully_shard`` every encoder/decoder layer, then the root, over all ranks (in place)."""
    try:  # FSDP2 is public from torch 2.6
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        needs = f"train.strategy=fsdp needs torch >= 2.6 (FSDP2); this is torch {torch.__version__}"
        raise ShardingError(needs) from None
    if not dist.is_initialized():  # a single process: one shard, so the same code path runs
        log.warning("train.strategy=fsdp in one process: one shard, no memory saved (launch with torchrun)")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kwargs: dict[str, Any] = {"mesh": mesh} | ({"mp_policy": policy} if policy else {})
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


_FULL = {"full_state_dict": True, "cpu_offload": True}  # gathered on rank 0, in host memory


def sync(model: nn.Module, enabled: bool) -> None:
    """FSDP: reduce-scatter gradients in this backward (the last micro-batch) or keep accumulating."""
    if is_sharded(model):
        model.set_requires_gradient_sync(enabled)


def unsharded(model: nn.Module, build: Callable[[], nn.Module], device: torch.device) -> nn.Module | None:
    """``model`` itself unless sharded. Sharded: on rank 0 a plain model (``build()``) holding the full fp32
    weights, None on the other ranks; every rank must call it.

    Validation and beam search run on rank 0 alone, but a forward pass of a sharded model is a
    collective. So rank 0 decodes with a copy gathered as for a checkpoint; running the FSDP
    model itself there would need every rank in every decoding step, and its hooks would record
    those forwards as if they were training. Costs rank 0 one full fp32 model on its device (and
    its host, on the way) while validating.
    """
    if not is_sharded(model):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(**_FULL))
    if dist.get_rank() != 0:
        return None
    copy = build().to(device)
    copy.load_state_dict(state)
    return copy


def state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts in the single-process format; under FSDP every rank must call it.

    Sharded: gathered into full CPU tensors on rank 0 (other ranks get empty dicts), and the
    optimizer's per-parameter names turned back into the indices ``Optimizer.state_dict`` uses.
    """
    if not is_sharded(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    options = StateDictOptions(**_FULL)
    if not optimizer.state:  # no update applied yet: nothing to gather (see _no_state_yet)
        main = dist.get_rank() == 0
        return get_model_state_dict(model, options=options), optimizer.state_dict() if main else {}
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return model_state, _indexed(optim_state) if optim_state else {}


def load_state_dicts(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any], optim_state: dict[str, Any] | None
) -> None:
    """Load full (single-process format) state dicts; under FSDP rank 0's are broadcast and sharded.

    ``optim_state`` None: the weights only (``train.resume_mode=weights``); the optimizer keeps no state.
    """
    if not is_sharded(model):
        model.load_state_dict(model_state)
        if optim_state is not None:
            optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(**_FULL, broadcast_from_rank0=True)
    main = dist.get_rank() == 0  # the others' dicts are not read: they receive rank 0's tensors
    # Two calls: set_state_dict would skip the model on ranks whose (unused) model dict is empty.
    set_model_state_dict(model, model_state if main else {}, options=options)
    # Every rank reads the file, so all agree (None: weights only; empty: see _no_state_yet).
    if optim_state is not None and optim_state["state"]:
        named = _named(model, optimizer, optim_state) if main else {}
        set_optimizer_state_dict(model, optimizer, named, options=options)


# _no_state_yet: torch.distributed.checkpoint's state-dict functions first create the state of an
# optimizer that has none by stepping it once with zero gradients and lr 0. Adam's step count then
# starts at 1, and every later bias correction differs from an uninterrupted run. So an optimizer
# without state (a checkpoint written before the first applied update, e.g. after a skipped one)
# is saved as torch saves it and not loaded at all.


def _indexed(state: dict[str, Any]) -> dict[str, Any]:
    """Parameter names -> 0..n-1 in param-group order, as ``Optimizer.state_dict`` numbers them."""
    index: dict[str, int] = {}
    for group in state["param_groups"]:
        for name in group["params"]:
            index.setdefault(name, len(index))
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _named(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``_indexed`` for this optimizer: index i is the i-th parameter of its groups."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    if len(names) != sum(len(g["params"]) for g in state["param_groups"]):
        raise ValueError(f"the optimizer state has another number of parameters than this model's {len(names)}")
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
