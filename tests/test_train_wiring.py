"""The trainer's wiring, checked through ``train()``, the run folder and checkpoint contents:
the first update against a loss and gradient computed here, the schedule's indexing, the best
checkpoint, validation loss units, budgets, pruning and resume across an epoch boundary."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import tfx.data.batching as batching_mod
import tfx.evaluation.validate as validate_mod
import tfx.training.validation as validation_mod
from tests.test_train import join_two_ranks, rendezvous_ports, tiny_cfg
from tfx.checkpoints.load import build_from_checkpoint, load_checkpoint
from tfx.config import Config
from tfx.data import PAD, collate, make_batches, prepare_data
from tfx.init import apply_init
from tfx.model import build_model
from tfx.optim.loss import label_smoothed_loss
from tfx.reporting.metrics_log import read_metrics
from tfx.runtime import distributed
from tfx.runtime.distributed import DistInfo
from tfx.train import Trainer, train

EPS = 0.3  # an unusual label-smoothing value: a trainer that ignores the config uses 0.1 or 0


def wiring_cfg(tmp_path: Path, optim: dict[str, Any] | None = None, **train_kw: Any) -> Config:
    """A tiny dropout-free run on a 120-pair toy corpus (a few updates per epoch)."""
    no_dropout = {"dropout": 0.0}
    data = {"toy_train_size": 120, "toy_valid_size": 12, "toy_test_size": 4}
    defaults = {"max_updates": 4, "log_every_updates": 1, "layer_stats_every_updates": 0, "valid_max_sentences": 4}
    cfg = tiny_cfg(tmp_path, data, no_dropout, {"label_smoothing": EPS, **(optim or {})}, **{**defaults, **train_kw})
    return dataclasses.replace(cfg, experiment="wiring")


def reference_first_update(cfg: Config, world_size: int = 1) -> dict[str, float]:
    """Loss, nll (bits/token) and gradient norm of update 0, computed here from the same model, init
    and batches: the label-smoothed loss summed over every micro-batch of every rank, divided once
    by the update's token count."""
    corpus = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train",))
    train_split = corpus.splits["train"]
    model = build_model(cfg.model, corpus.tokenizer.vocab_size, PAD)
    apply_init(model, cfg.init.name, seed=cfg.train.seed)
    batches = []
    for rank in range(world_size):
        plan = make_batches(
            train_split, cfg.data.max_tokens, cfg.data.max_sentences, shuffle=True,
            seed=cfg.train.seed, epoch=1, rank=rank, world_size=world_size,
        )  # fmt: skip
        batches += [collate(train_split, ix) for ix in plan[: cfg.train.update_freq]]
    ntokens = sum(b.ntokens for b in batches)
    loss = nll = torch.zeros((), dtype=torch.float64)
    for b in batches:
        part, part_nll = label_smoothed_loss(model(b.src_tokens, b.prev_output_tokens), b.target, EPS, PAD)
        loss, nll = loss + part, nll + part_nll
    grads = torch.autograd.grad(loss / ntokens, [p for p in model.parameters() if p.requires_grad])
    grad_norm = torch.stack([g.norm() for g in grads]).norm().item()
    ln2 = math.log(2)
    return {"loss": loss.item() / ntokens / ln2, "nll": nll.item() / ntokens / ln2, "grad_norm": grad_norm}


def record_updates(into: list[dict[str, float]]):
    return lambda trainer, metrics: into.append(dict(metrics))


def test_first_update_uses_label_smoothing_and_divides_by_the_update_token_count(tmp_path: Path) -> None:
    """Two accumulated micro-batches: gradient and loss equal one big batch's, normalized by its tokens."""
    cfg = wiring_cfg(tmp_path, max_updates=1, update_freq=2)
    seen: list[dict[str, float]] = []
    train(cfg, tmp_path / "run", on_update=record_updates(seen))
    ref = reference_first_update(cfg)
    assert seen[0]["train/grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    assert seen[0]["train/loss"] == pytest.approx(ref["loss"], rel=1e-5)
    assert seen[0]["train/nll_loss"] == pytest.approx(ref["nll"], rel=1e-5)
    assert ref["loss"] - ref["nll"] > 1e-3 * ref["loss"]  # smoothing is visible, far beyond the tolerance


def test_schedule_starts_at_update_zero(tmp_path: Path) -> None:
    """Warmup from 1e-4 to 2e-3 over 4 updates, then inverse sqrt: the first update gets the
    initial rate, the fifth the peak."""
    cfg = wiring_cfg(tmp_path, optim={"warmup_updates": 4, "warmup_init_lr": 1e-4}, max_updates=6)
    seen: list[dict[str, float]] = []
    train(cfg, tmp_path / "run", on_update=record_updates(seen))
    expected = [1e-4, 5.75e-4, 1.05e-3, 1.525e-3, 2e-3, 2e-3 * math.sqrt(4 / 5)]
    assert [m["train/lr"] for m in seen] == pytest.approx(expected, rel=1e-12)


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_best_checkpoint_pruning_and_validation_loss_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripted BLEU 5, 20, 10, 15 at updates 2, 4, 6, 8: checkpoint_best.pt holds update 4's weights;
    keep_last=2 leaves the numbered checkpoints of updates 6 and 8; valid/loss is the label-smoothed
    loss in bits per target token of the final weights."""
    scores = iter([5.0, 20.0, 10.0, 15.0])
    real_bleu = validate_mod.corpus_bleu
    monkeypatch.setattr(
        validate_mod, "corpus_bleu", lambda h, r: dataclasses.replace(real_bleu(h, r), score=next(scores))
    )
    cfg = wiring_cfg(tmp_path, max_updates=8, validate_every_updates=2, save_every_updates=2, keep_last=2)
    weights: dict[int, dict[str, torch.Tensor]] = {}
    record = lambda trainer, _m: weights.update({trainer.state.step: {  # noqa: E731
        k: v.detach().clone() for k, v in trainer.model.state_dict().items()}})  # fmt: skip
    summary = train(cfg, tmp_path / "run", on_update=record)
    ckpts = tmp_path / "run" / "checkpoints"
    assert summary["best_bleu"] == 20.0
    assert tensorboard_scalars(tmp_path / "run", "valid/bleu") == [(2, 5.0), (4, 20.0), (6, 10.0), (8, 15.0)]
    best = load_checkpoint(ckpts / "checkpoint_best.pt")
    assert best["step"] == 4
    assert all(torch.equal(best["model"][k], weights[4][k]) for k in weights[4])
    assert not all(torch.equal(best["model"][k], weights[8][k]) for k in weights[8])
    assert sorted(p.name for p in ckpts.glob("checkpoint_*_*.pt")) == ["checkpoint_1_6.pt", "checkpoint_1_8.pt"]

    model, _, _ = build_from_checkpoint(load_checkpoint(ckpts / "checkpoint_last.pt"))
    valid = prepare_data(cfg.data, seed=cfg.train.seed, splits=("valid",)).splits["valid"]
    batch = collate(valid, list(range(len(valid))))
    with torch.no_grad():
        loss, _ = label_smoothed_loss(model(batch.src_tokens, batch.prev_output_tokens), batch.target, EPS, PAD)
    bits = loss.item() / batch.ntokens / math.log(2)
    assert tensorboard_scalars(tmp_path / "run", "valid/loss")[-1] == (8, pytest.approx(bits, rel=1e-5))


def epoch_lengths(cfg: Config, epochs: int) -> list[int]:
    split = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train",)).splits["train"]
    return [len(make_batches(split, cfg.data.max_tokens, shuffle=True, seed=cfg.train.seed, epoch=e))
            for e in range(1, epochs + 1)]  # fmt: skip


def test_max_epochs_runs_whole_epochs(tmp_path: Path) -> None:
    cfg = wiring_cfg(tmp_path, max_updates=100, max_epochs=2)
    summary = train(cfg, tmp_path / "run")
    assert summary["step"] == sum(epoch_lengths(cfg, 2)) and summary["epoch"] == 3


@pytest.mark.parametrize("stop_after", ["end of epoch 1", "one update before it"])
def test_resume_across_an_epoch_boundary_equals_uninterrupted(tmp_path: Path, stop_after: str) -> None:
    cfg = wiring_cfg(tmp_path)
    first_epoch = epoch_lengths(cfg, 1)[0]
    stop = first_epoch if stop_after == "end of epoch 1" else first_epoch - 1
    total = first_epoch + 3
    at = lambda n: dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_updates=n))  # noqa: E731
    full = train(at(total), tmp_path / "full")
    part = train(at(stop), tmp_path / "split")
    rest = train(at(total), tmp_path / "split")
    assert part["losses"] + rest["losses"] == full["losses"]  # exact
    assert rest["epoch"] == full["epoch"] == 2
    last = [load_checkpoint(d / "checkpoints" / "checkpoint_last.pt")["model"] for d in (tmp_path / "full",
                                                                                      tmp_path / "split")]  # fmt: skip
    assert all(torch.equal(last[0][k], last[1][k]) for k in last[0])


def test_max_minutes_stops_after_the_first_update(tmp_path: Path) -> None:
    summary = train(wiring_cfg(tmp_path, max_updates=5, max_minutes=1e-9), tmp_path / "run")
    assert summary["step"] == 1


def test_validate_every_minutes_validates_when_due(tmp_path: Path) -> None:
    """A tiny interval is due after every update; without it, a 3-update run validates once, at its end."""
    train(wiring_cfg(tmp_path, max_updates=3, validate_every_minutes=1e-9), tmp_path / "due")
    train(wiring_cfg(tmp_path, max_updates=3), tmp_path / "off")
    assert [s for s, _ in tensorboard_scalars(tmp_path / "due", "valid/bleu")] == [1, 2, 3]
    assert [s for s, _ in tensorboard_scalars(tmp_path / "off", "valid/bleu")] == [3]


def test_each_epoch_is_shuffled_with_its_own_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[int] = []
    real = batching_mod.make_batches
    monkeypatch.setattr(batching_mod, "make_batches", lambda *a, **kw: planned.append(kw["epoch"]) or real(*a, **kw))
    train(wiring_cfg(tmp_path, max_updates=100, max_epochs=2), tmp_path / "run")
    assert planned == [1, 2]


def test_keep_last_prunes_by_update_not_by_file_name(tmp_path: Path) -> None:
    """Ten numbered saves: the two newest are updates 9 and 10, though checkpoint_E_10.pt sorts
    before checkpoint_E_9.pt by name."""
    train(wiring_cfg(tmp_path, max_updates=10, save_every_updates=1, keep_last=2), tmp_path / "run")
    numbered = (tmp_path / "run" / "checkpoints").glob("checkpoint_*_*.pt")
    assert sorted(int(p.stem.rsplit("_", 1)[1]) for p in numbered) == [9, 10]


def thirty_seconds_per_update(trainer: Any, _metrics: dict[str, float]) -> None:
    """Training time as a clock that reads 30 s per update (the hook runs before the budget and
    validation checks), so minute budgets are tested exactly, without sleeping."""
    trainer.state.train_seconds = 30.0 * trainer.state.step


def test_max_minutes_counts_minutes_of_training_time(tmp_path: Path) -> None:
    """One minute at 30 s per update: the budget is spent after update 2, not 1 (seconds) or 3 (>)."""
    summary = train(wiring_cfg(tmp_path, max_updates=10, max_minutes=1.0), tmp_path / "run", thirty_seconds_per_update)
    assert summary["step"] == 2


def test_validate_every_minute_of_training_time(tmp_path: Path) -> None:
    """At 30 s per update, validation is due every second update (and at the end of the run)."""
    cfg = wiring_cfg(tmp_path, max_updates=5, validate_every_minutes=1.0)
    train(cfg, tmp_path / "run", thirty_seconds_per_update)
    assert [s for s, _ in tensorboard_scalars(tmp_path / "run", "valid/bleu")] == [2, 4, 5]


# --- DDP: two ranks emulated in this process (fast), then 2 gloo processes (slow) ----------------


def test_two_rank_step_scales_by_world_size_over_the_global_token_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real ``train_step`` in a two-rank world whose ranks hold identical batches: every
    all-reduced sum doubles and DDP's gradient average is the identity, so the correct step
    (loss * world size / all ranks' tokens) gives exactly the one-rank gradient. Dropping the
    world-size factor halves it; dividing by this rank's tokens only (no all-reduce) doubles it."""
    cfg = wiring_cfg(tmp_path, max_updates=1)
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        trainer.dist = DistInfo(rank=0, world_size=2)
        trainer.stepper.world_size = 2  # the stepper is built once, with the world it was built in
        monkeypatch.setattr(distributed, "all_reduce_sum", lambda value, device: 2 * value)
        split = trainer.corpus.splits["train"]
        plan = make_batches(
            split, cfg.data.max_tokens, cfg.data.max_sentences, shuffle=True, seed=cfg.train.seed, epoch=1
        )
        metrics = trainer.train_step([collate(split, plan[0])])
    finally:
        trainer.close()
    ref = reference_first_update(cfg)
    assert metrics["train/grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    assert metrics["train/loss"] == pytest.approx(ref["loss"], rel=1e-5)


def _first_update_worker(rank: int, cfg: Config, run_dir: str, port: int, out: str) -> None:
    join_two_ranks(rank, port)
    seen: list[dict[str, float]] = []
    train(cfg, Path(run_dir), on_update=record_updates(seen))
    torch.save(seen[0], f"{out}.{rank}")


@pytest.mark.slow
def test_two_process_ddp_first_gradient_is_the_global_token_mean(tmp_path: Path) -> None:
    """Each rank's loss is divided by the tokens of both ranks and multiplied by the world size
    (DDP averages): the all-reduced gradient equals the gradient of the union of both ranks'
    batches, normalized once. Compared before Adam, which would hide a wrong scale."""
    cfg = wiring_cfg(tmp_path, max_updates=1)
    prepare_data(cfg.data, seed=cfg.train.seed)  # fill the cache before the ranks start
    out = str(tmp_path / "first")
    with rendezvous_ports(1) as (port,):
        mp.spawn(_first_update_worker, args=(cfg, str(tmp_path / "ddp"), port, out), nprocs=2, join=True)
    ref = reference_first_update(cfg, world_size=2)
    for rank in (0, 1):
        metrics = torch.load(f"{out}.{rank}", weights_only=True)
        assert metrics["train/grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
        assert metrics["train/loss"] == pytest.approx(ref["loss"], rel=1e-5)


def test_patience_stops_after_that_many_validations_without_a_better_bleu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripted valid BLEU per epoch 10, 12, 11, 11.5, 12 (not better), 13: patience 3 stops after the fifth
    epoch, with the best (12, epoch 2) in checkpoint_best.pt; the count survives a resume, which validates no
    more."""
    from tfx.evaluation.validate import ValidResult

    scripted = iter([10.0, 12.0, 11.0, 11.5, 12.0, 13.0])
    seen: list[float] = []

    def scripted_validation(*args, **kwargs) -> ValidResult:
        bleu = next(scripted)
        seen.append(bleu)
        return ValidResult({"valid/loss": 1.0, "valid/bleu": bleu}, bleu, "scripted", [])

    monkeypatch.setattr(validation_mod, "validate_on_main", scripted_validation)
    cfg = wiring_cfg(tmp_path, max_updates=0, max_epochs=30, patience=3)
    summary = train(cfg, tmp_path / "run")
    assert seen == [10.0, 12.0, 11.0, 11.5, 12.0] and summary["epoch"] == 6  # five epochs done
    best = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_best.pt")
    assert best["metrics"]["best_bleu"] == 12.0 and best["epoch"] == 3  # saved at the end of epoch 2
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    assert last["train_state"]["stale_validations"] == 3
    ends = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["event"] == "end"]
    assert ends[-1]["status"] == "early stop: no better valid BLEU in 3 validations (best 12.00)"
    again = train(cfg, tmp_path / "run")  # resumed: patience is spent, so it trains nothing more
    assert (again["epoch"], again["step"]) == (6, summary["step"]) and len(seen) == 5


def test_patience_on_valid_loss_stops_where_fairseq_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fairseq's --patience waits on its --best-checkpoint-metric, valid loss by default (lower is better, a tie is
    not better): scripted losses 5, 4, 4 (tie), 4.5, 3.9 (better: the count starts again), 4, 4, 4.2 stop after the
    eighth epoch with patience 3, while the valid BLEU, rising every epoch, would never have stopped it."""
    from tfx.evaluation.validate import ValidResult

    scripted = iter([5.0, 4.0, 4.0, 4.5, 3.9, 4.0, 4.0, 4.2, 3.0])
    seen: list[float] = []

    def scripted_validation(*args, **kwargs) -> ValidResult:
        loss = next(scripted)
        seen.append(loss)
        bleu = float(len(seen))  # better every time: patience on BLEU would not stop
        return ValidResult({"valid/loss": loss, "valid/bleu": bleu}, bleu, "scripted", [])

    monkeypatch.setattr(validation_mod, "validate_on_main", scripted_validation)
    cfg = wiring_cfg(tmp_path, max_updates=0, max_epochs=30, patience=3, patience_metric="loss")
    summary = train(cfg, tmp_path / "run")
    assert seen == [5.0, 4.0, 4.0, 4.5, 3.9, 4.0, 4.0, 4.2] and summary["epoch"] == 9  # eight epochs done
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    assert last["train_state"]["best_loss"] == 3.9 and last["train_state"]["stale_validations"] == 3
    ends = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["event"] == "end"]
    assert ends[-1]["status"] == "early stop: no lower valid loss in 3 validations (best 3.900)"


def test_a_signal_during_the_last_validation_then_a_resume_validates_once_and_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arrives while the last epoch validates (as when a study is stopped): the checkpoint holds that
    validation, so the resumed run, its budget spent, ends "completed" without validating that update again.
    Validating again wrote a second valid record at the same update and counted it as one more stale
    validation: a study's run of 30 epochs with patience 3 (best at 28) ended as an early stop, its curve 31
    points long (2026-12-02). CPU, fp32, scripted BLEU."""
    import os
    import signal

    from tfx.evaluation.validate import ValidResult

    scripted = iter([12.0, 11.0, 10.0, 9.0])

    def scripted_validation(*args, **kwargs) -> ValidResult:
        bleu = next(scripted)
        if bleu == 10.0:  # the third (last) epoch's validation
            os.kill(os.getpid(), signal.SIGTERM)
        return ValidResult({"valid/loss": 1.0, "valid/bleu": bleu}, bleu, "scripted", [])

    monkeypatch.setattr(validation_mod, "validate_on_main", scripted_validation)
    cfg = wiring_cfg(tmp_path, max_updates=0, max_epochs=3, patience=3)
    assert train(cfg, tmp_path / "run")["stopped_by"] == "SIGTERM"
    again = train(cfg, tmp_path / "run")
    assert again["stopped_by"] is None and again["epoch"] == 4
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["valid/bleu"] for r in records if r["event"] == "valid"] == [12.0, 11.0, 10.0]
    assert [r["status"] for r in records if r["event"] == "end"][-1] == "completed"
