"""What a run is built from, in the order ``Trainer`` calls it: data -> model -> init -> optimizer -> wrapper.

Building and initializing are separate steps (STYLE.md): ``build_model`` makes the modules, ``apply_init``
sets their values, and only then is the optimizer made over the (placed, maybe sharded)
parameters. A resumed run skips the init: every weight comes from its checkpoint.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable

import torch
from torch import nn

from tfx.config import Config, OptimConfig, TrainConfig
from tfx.data import PAD, Batch, Corpus, collate, prepare_data
from tfx.init import SCHEMES, apply_init
from tfx.model import Transformer, build_model
from tfx.optim.optimizers import build_optimizer
from tfx.reporting.statistics import OutputChange
from tfx.runtime import distributed, sharding
from tfx.runtime.compilation import compile_for_training
from tfx.runtime.distributed import DistInfo
from tfx.runtime.precision import Precision
from tfx.training.step import Stepper

log = logging.getLogger("tfx.train")

# Ranks start from identical weights (the init is seeded with train.seed on every rank), then
# draw different dropout masks: rank r > 0 reseeds its stream with seed + r * this stride.
DROPOUT_SEED_STRIDE = 1_000_003


def seed_everything(t: TrainConfig) -> None:
    """Threads, determinism and the torch/python seeds, before anything draws a random number or runs a GEMM."""
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    # Each run sets the mode its config says (runs in one process, as in studies and tests, do not inherit it).
    # Strict: with warn_only, PyTorch keeps e.g. the memory-efficient attention backward's split-key atomics (it
    # only warns); strict mode makes it deterministic, and an op with no deterministic kernel raises (tfx.train
    # reports that in one line).
    torch.use_deterministic_algorithms(t.deterministic)
    # Under deterministic mode PyTorch fills new tensors (NaN): correct code never reads them, filling costs.
    # Set either way, so a later run in the process gets PyTorch's default back.
    torch.utils.deterministic.fill_uninitialized_memory = not t.deterministic
    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when the first cuBLAS handle is made
    torch.manual_seed(t.seed)
    random.seed(t.seed)


def prepare_corpus(cfg: Config, is_main: bool) -> Corpus:
    """Rank 0 trains/caches the vocabulary first; the other ranks then read its cache."""
    if not is_main:
        distributed.barrier()
    corpus = prepare_data(cfg.data, seed=cfg.train.seed)
    if is_main:
        distributed.barrier()
    return corpus


def initialized_model(cfg: Config, vocab_size: int, fresh: bool, first_batch: Callable[[], Batch]) -> Transformer:
    """The model, initialized by ``cfg.init`` unless resuming (``fresh=False``).

    A resumed run reads every weight (Admin's omega too) from its checkpoint: no init, no profiling.
    ``first_batch`` is called only for schemes that profile the model on data (Admin).
    """
    model = build_model(cfg.model, vocab_size, PAD)
    if fresh:
        batch = first_batch() if SCHEMES[cfg.init.name].needs_batch else None
        apply_init(model, cfg.init.name, seed=cfg.train.seed, batch=batch)
    return model


def reseed_dropout(seed: int, rank: int) -> None:
    """After the (identical) init: rank r > 0 draws its own dropout masks."""
    if rank > 0:
        torch.manual_seed(seed + DROPOUT_SEED_STRIDE * rank)


def warmup_outlasts_run(optim: OptimConfig, t: TrainConfig) -> str | None:
    """One line when the lr warmup does not end before ``train.max_updates`` (the run never trains at ``optim.lr``;
    issue 67: DyT and Fixup on the toy task capped at 300 updates were still warming up), else None."""
    warmup, cap = optim.warmup_updates, t.max_updates
    if not cap or warmup < cap:
        return None
    reached = (optim.warmup_init_lr + (optim.lr - optim.warmup_init_lr) * cap / warmup) / optim.lr
    return (
        f"optim.warmup_updates={warmup} >= train.max_updates={cap}: the run ends still warming up, at "
        f"{reached:.0%} of optim.lr={optim.lr:g}; lower optim.warmup_updates or raise train.max_updates"
    )


def place_and_optimize(
    model: Transformer, cfg: Config, device: torch.device
) -> tuple[Precision, torch.optim.Optimizer]:
    """Move (and under FSDP shard) the model, then build the optimizer over the parameters it ends up with; warn
    (rank 0) when its warmup outlasts the run."""
    first_rank = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if first_rank and (warning := warmup_outlasts_run(cfg.optim, cfg.train)):
        log.warning(warning)
    model.to(device)
    precision = Precision(cfg.train.precision, device)
    if cfg.train.strategy == "fsdp":  # before the optimizer, which must hold the sharded parameters
        sharding.shard(model, device, precision.bf16)
    return precision, build_optimizer(model, cfg.optim, device)


def wrap(
    model: Transformer,
    t: TrainConfig,
    dist: DistInfo,
    device: torch.device,
    packed: bool = False,
    backend: str = "inductor",
) -> nn.Module:
    """What the step calls: the model compiled (``train.compile``, ``tfx.runtime.compilation``) and/or inside DDP
    (FSDP shards in place instead). Packed batches have one shape per run: static graphs, compiled once.
    Padded ones change shape every step, so they compile with symbolic shapes. ``backend``: torch.compile's
    (a benchmark's ``eager`` traces only: a quick dry run on CPU)."""
    net: nn.Module = model
    if t.compile:
        net = compile_for_training(model, t.compile_scope, dynamic=not packed, backend=backend)
    if dist.enabled and not sharding.is_sharded(model):
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(net, device_ids=ids)
    return net


def fresh_stepper(
    cfg: Config,
    vocab_size: int,
    device: torch.device,
    first_batch: Callable[[], Batch],
    packed: bool = False,
    backend: str = "inductor",
) -> Stepper:
    """What a fresh single-process run steps with, built by the functions above in ``Trainer``'s order (seed ->
    model -> init -> place -> optimizer -> wrap). ``scripts/bench/bench_train.py`` times this, so a change to the
    build order changes what it times too (tests/scripts/bench/test_bench_train.py checks it against ``Trainer``)."""
    seed_everything(cfg.train)
    model = initialized_model(cfg, vocab_size, True, first_batch)
    single = DistInfo()
    reseed_dropout(cfg.train.seed, single.rank)
    precision, optimizer = place_and_optimize(model, cfg, device)
    net = wrap(model, cfg.train, single, device, packed=packed, backend=backend)
    return Stepper(model, net, optimizer, precision, cfg.optim, device, single.world_size)


def output_probe(
    model: Transformer, corpus: Corpus, t: TrainConfig, step: int, device: torch.device
) -> OutputChange | None:
    """The output-change probe on the first ``probe_sentences`` valid pairs, while updates remain to probe."""
    valid = corpus.splits["valid"]
    if step >= t.probe_updates or len(valid) == 0:
        return None
    return OutputChange(model, collate(valid, list(range(min(t.probe_sentences, len(valid))))), device)
