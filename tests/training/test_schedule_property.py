"""The loop's schedule as a property (issue 69): real tiny runs (real computation on the CPU in fp32, 1+1 layers at
d 16 on the toy task, about a second each with their checks) with drawn intervals and a drawn stop, and every action
exactly where its interval puts it; 25 runs, about 30 s on one core.

Each example trains for real with drawn ``log_every_updates``, ``validate_every_updates``, ``save_every_updates``,
``save_every_epochs``, ``layer_stats_every_updates``, ``probe_updates``, a registered ``Action(Every(n, offset))``
and one way of stopping at an arbitrary update: ``max_updates``, ``max_epochs``, a time budget (``max_minutes``,
made deterministic by a fake clock in the trainer: one second of training per update), a stop signal (a real
SIGINT, raised by an action at the drawn update; the loop's handler takes it) or ``patience`` (valid BLEU; the
update it stops at is checked against the validations' BLEU in ``metrics.jsonl``). What the run did is read from
what it wrote (``metrics.jsonl``, TensorBoard's event file, ``checkpoints/``, with ``keep_last`` high enough to
prune nothing) and from the action itself, and compared with the sets the intervals name, derived here from the
intervals and the data plan's epoch lengths alone (no call into ``tfx.training.schedule``):

- TensorBoard scalars at the multiples of the log interval, and at the layer-statistics updates (1, n + 1, 2n + 1,
  ...), whose per-layer heatmaps are written there and only there;
- validation at the multiples of its interval, at every epoch end, and at the final update unless a signal
  stopped the run, each update once;
- numbered checkpoints ``checkpoint_<epoch>_<update>.pt`` at the multiples of ``save_every_updates``, at the ends
  of the epochs ``save_every_epochs`` names, and of the final state whenever numbering is on, each labelled with
  the epoch its update belongs to (none at all when numbering is off);
- the probe at the first ``probe_updates`` updates; the action at the updates ``Every(n, offset)`` names, each
  with the queue read (it sees counted updates).

Explicit examples pin the cases issue 69 found untested: co-prime intervals (log 3, validate 5, save 7) and stops
that fall on no interval's multiple, and a signal at an epoch's last update (``SIGNAL_AT_EPOCH_END``: that epoch
end's validation is left to the resumed run, ``tfx/runtime/stop.py``).
"""

from __future__ import annotations

import dataclasses
import re
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import tfx.training.pending as pending_mod
import tfx.training.trainer as trainer_mod
from tests.test_train import tiny_cfg
from tfx.checkpoints.load import load_checkpoint
from tfx.config import Config
from tfx.data.plan import TrainBatches
from tfx.reporting.dashboard import image_tag
from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.train import train
from tfx.training import build
from tfx.training.schedule import Action, Every

# fp32 pinned (tiny_cfg): CI runs these in its first pass only (docs/testing.md)
pytestmark = pytest.mark.fixed_precision

STOPS = ("max_updates", "max_epochs", "minutes", "signal", "patience")
BACKSTOP = 8  # updates past a signal or a time budget at which max_updates would end a run that ignored them
PATIENCE_BACKSTOP = 40  # max_updates under a patience stop: a run whose BLEU keeps improving ends there
NUMBERED = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")


@dataclasses.dataclass(frozen=True)
class Plan:
    """One drawn run: the intervals (0 = off) and how it stops (``at``: an update, or epochs, or validations)."""

    log: int
    validate: int
    save_updates: int
    save_epochs: int
    layers: int
    probe: int
    action: tuple[int, int]  # Every(n, offset)
    stop: str
    at: int


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    stop = draw(st.sampled_from(STOPS))
    at = draw(st.integers(1, 3)) if stop in ("max_epochs", "patience") else draw(st.integers(1, 30))
    n = draw(st.integers(1, 9))
    return Plan(
        log=draw(st.integers(1, 9)), validate=draw(st.integers(0, 12)), save_updates=draw(st.integers(0, 12)),
        save_epochs=draw(st.integers(0, 3)), layers=draw(st.integers(0, 9)), probe=draw(st.integers(0, 6)),
        action=(n, draw(st.integers(0, 2 * n))), stop=stop, at=at,
    )  # fmt: skip


def config(plan: Plan, cache: Path) -> Config:
    limits = {
        "max_updates": {"max_updates": plan.at},
        "max_epochs": {"max_updates": 0, "max_epochs": plan.at},
        # one fake second per update (``fake_clock``): the budget runs out at update ``at`` exactly
        "minutes": {"max_updates": plan.at + BACKSTOP, "max_minutes": (plan.at - 0.5) / 60},
        "signal": {"max_updates": plan.at + BACKSTOP},
        "patience": {"max_updates": PATIENCE_BACKSTOP, "patience": plan.at, "patience_metric": "bleu"},
    }[plan.stop]
    return tiny_cfg(
        cache.parent,
        data_kw={"toy_train_size": 100, "toy_valid_size": 4, "cache_dir": str(cache)},
        model_kw={"encoder_layers": 1, "decoder_layers": 1, "d_model": 16, "ffn_dim": 32, "heads": 2},
        log_every_updates=plan.log, validate_every_updates=plan.validate, save_every_updates=plan.save_updates,
        save_every_epochs=plan.save_epochs, layer_stats_every_updates=plan.layers, probe_updates=plan.probe,
        probe_sentences=2, valid_max_sentences=2, keep_last=1000, **limits,
    )  # fmt: skip


def epoch_ends(cfg: Config, last: int) -> list[int]:
    """The update that ends each epoch, from the data plan (``update_freq`` batches an update), up to the first
    epoch that ends after update ``last``."""
    corpus = build.prepare_corpus(cfg, True)
    plan = TrainBatches(corpus.splits["train"], cfg.data, cfg.train.seed, 0, 1)
    ends = [0]
    while ends[-1] <= last:
        ends.append(ends[-1] - (-len(plan.epoch(len(ends))) // cfg.train.update_freq))
    return ends[1:]


def every(n: int, last: int, offset: int = 0) -> set[int]:
    """The updates 1..last an ``n``-update interval of phase ``offset`` names (n, 2n, ... for phase 0)."""
    if not n:
        return set()
    return set(range(offset % n or n, last + 1, n))


@dataclasses.dataclass
class Seen:
    """What a run did, read from its outputs."""

    final: int
    status: str
    logged: list[int]  # TensorBoard train/loss
    layer_images: list[int]  # TensorBoard ~layers/enc/act_rms (the heatmap of layers/enc/act_rms/*)
    validated: list[int]
    bleu: list[float]
    probed: list[int]
    epochs: dict[int, int]  # update -> the epoch metrics.jsonl gives it
    numbered: set[tuple[int, int]]
    last_step: int
    actions: list[tuple[int, int]]  # (update, updates still queued) at each run of the action


class At:
    """Due at one update: the stop signal's."""

    def __init__(self, step: int) -> None:
        self.step = step

    def due(self, step: int) -> bool:
        return step == self.step


def raise_stop_signal(trainer: Any) -> None:
    handler = signal.getsignal(signal.SIGINT)
    assert handler not in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler), "no stop handler in the loop"
    signal.raise_signal(signal.SIGINT)  # handled at once (main thread): the loop sees it at its next stop check


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training time as one second per update: the trainer's clock moves by one at each reading (an update's time
    is two consecutive readings), the queue's not at all (its read adds nothing)."""
    ticks = iter(range(1, 1_000_000))
    monkeypatch.setattr(trainer_mod, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    monkeypatch.setattr(pending_mod, "time", SimpleNamespace(perf_counter=lambda: 0.0))


def run(plan: Plan, cfg: Config, run_dir: Path, stop_at: int) -> Seen:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    actions: list[tuple[int, int]] = []
    n, offset = plan.action
    registered = [Action(Every(n, offset), lambda t: actions.append((t.state.step, len(t.queue))))]
    if plan.stop == "signal":
        registered.append(Action(At(stop_at), raise_stop_signal))
    with pytest.MonkeyPatch.context() as mp:
        if plan.stop == "minutes":
            fake_clock(mp)
        summary = train(cfg, run_dir, actions=registered)
    records = read_metrics(run_dir / FILENAME)
    updates = [r for r in records if r["event"] == "update"]
    valid = [r for r in records if r["event"] == "valid"]
    (end,) = [r for r in records if r["event"] == "end"]
    tb = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "images": 0})
    tb.Reload()
    heatmap = image_tag("layers/enc/act_rms")
    images = tb.Images(heatmap) if heatmap in tb.Tags()["images"] else []
    ckpts = run_dir / "checkpoints"
    names = [NUMBERED.match(p.name) for p in ckpts.iterdir()]
    assert [r["step"] for r in updates] == list(range(1, summary["step"] + 1)), "an update without its record"
    return Seen(
        final=summary["step"], status=end["status"], logged=[e.step for e in tb.Scalars("train/loss")],
        layer_images=[e.step for e in images], validated=[r["step"] for r in valid],
        bleu=[r["valid/bleu"] for r in valid], probed=[r["step"] for r in updates if "probe/output_change" in r],
        epochs={r["step"]: r["epoch"] for r in updates}, numbered={(int(m[1]), int(m[2])) for m in names if m},
        last_step=load_checkpoint(ckpts / "checkpoint_last.pt")["step"], actions=actions,
    )  # fmt: skip


def patience_stop(bleu: list[float], patience: int) -> int | None:
    """The index of the validation after which ``patience`` in a row brought no better BLEU, if any."""
    best, stale = -1.0, 0
    for i, value in enumerate(bleu):
        stale = 0 if value > best else stale + 1
        best = max(best, value)
        if stale >= patience:
            return i
    return None


# Issue 69's cases, tried first: co-prime log/validate/save intervals, so a numbered save falls where nothing else
# is due (7, 14), and stops on no interval's multiple (16 and 13: mid-epoch 2, the final state numbered by updates)
SAVE_ALONE = Plan(log=3, validate=5, save_updates=7, save_epochs=0, layers=0, probe=0, action=(4, 2),
                  stop="max_updates", at=16)  # fmt: skip
SIGNAL = Plan(log=3, validate=5, save_updates=7, save_epochs=1, layers=4, probe=2, action=(6, 0), stop="signal", at=13)
SIGNAL_AT_EPOCH_END = Plan(
    log=4, validate=5, save_updates=0, save_epochs=1, layers=0, probe=0, action=(7, 0), stop="signal", at=18
)  # epochs of 9 updates: the end of epoch 2
TIME_BUDGET = Plan(log=3, validate=0, save_updates=7, save_epochs=0, layers=0, probe=0, action=(8, 1), stop="minutes",
                   at=13)  # fmt: skip
EPOCHS = Plan(log=2, validate=5, save_updates=0, save_epochs=2, layers=0, probe=3, action=(3, 3), stop="max_epochs",
              at=3)  # fmt: skip
PATIENCE = Plan(log=3, validate=4, save_updates=7, save_epochs=0, layers=5, probe=0, action=(9, 0), stop="patience",
                at=2)  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("schedule_property")


# derandomized: CI draws the same runs; no shrinking (a run a second): a failing run prints its Plan and message
@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans())
@example(plan=SAVE_ALONE)
@example(plan=SIGNAL)
@example(plan=SIGNAL_AT_EPOCH_END)
@example(plan=TIME_BUDGET)
@example(plan=EPOCHS)
@example(plan=PATIENCE)
def test_every_action_runs_exactly_where_its_interval_puts_it(plan: Plan, workdir: Path) -> None:
    """Drawn intervals and stops (see the module docstring): log, layer stats, validation, numbered saves, probe
    and a registered action each at exactly the updates their intervals name up to the final update, the epoch
    ends' validations and numbered saves with their epoch's label, and a numbered checkpoint of the final state
    whenever numbering is on. Real runs, CPU, fp32."""
    cfg = config(plan, workdir / "cache")
    ends = epoch_ends(cfg, max(PATIENCE_BACKSTOP, 30 + BACKSTOP) + 9 * 3)  # past any run's end (max_epochs 3 too)
    stop_at = plan.at
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        seen = run(plan, cfg, Path(tmp) / "run", stop_at)
    final, ctx = seen.final, f"{plan} ended at update {seen.final}"

    if plan.stop == "max_epochs":
        assert final == ends[plan.at - 1], ctx
    elif plan.stop == "patience":
        stopped = patience_stop(seen.bleu, plan.at)
        assert final == (PATIENCE_BACKSTOP if stopped is None else seen.validated[stopped]), ctx
        assert stopped is None or stopped == len(seen.validated) - 1, f"validated after the patience stop: {ctx}"
    else:
        assert final == stop_at, ctx
    assert seen.last_step == final, f"checkpoint_last.pt holds update {seen.last_step}: {ctx}"
    status = {"signal": "stopped by SIGINT", "patience": "early stop"}.get(plan.stop, "completed")
    assert seen.status.startswith(status) or (plan.stop == "patience" and final == PATIENCE_BACKSTOP), ctx

    epoch_of = {s: next(e for e, end in enumerate(ends, 1) if s <= end) for s in range(1, final + 1)}
    assert seen.epochs == epoch_of, f"the data plan's epochs differ from the run's: {ctx}"
    ended = [end for end in ends if end <= final]  # the epoch ends the run reached (max_epochs: its last update)

    layer_updates = set(range(1, final + 1, plan.layers)) if plan.layers else set()
    assert seen.logged == sorted(every(plan.log, final) | layer_updates), f"TensorBoard scalars: {ctx}"
    assert seen.layer_images == sorted(layer_updates), f"layer statistics: {ctx}"

    # a signal stops before any validation not yet done at its update, an epoch end's too: the resumed run does it
    # (tests/training/test_stop_anywhere.py)
    signalled = {final} if plan.stop == "signal" else set()
    validations = every(plan.validate, final) | (set(ended) - signalled) | ({final} - signalled)
    assert seen.validated == sorted(validations), f"validations: {ctx}"

    assert seen.probed == list(range(1, min(plan.probe, final) + 1)), f"probe: {ctx}"
    n, offset = plan.action
    assert seen.actions == [(s, 0) for s in sorted(every(n, final, offset))], f"registered action: {ctx}"

    numbering = bool(plan.save_updates or plan.save_epochs)
    saved = every(plan.save_updates, final) | {end for e, end in enumerate(ended, 1) if plan.save_epochs and
                                               e % plan.save_epochs == 0}  # fmt: skip
    if numbering:
        assert (epoch_of[final], final) in seen.numbered, f"no numbered checkpoint of the final state: {ctx}"
        saved.add(final)
    assert seen.numbered == {(epoch_of[s], s) for s in saved}, f"numbered checkpoints: {ctx}"
