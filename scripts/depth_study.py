"""Stability vs depth: T-Fixup against Xavier, Post-LN (with/without warmup) and Pre-LN at N = 6..200.

T-Fixup's claim (Huang et al., ICML 2020, Sec. 3-5) is that its init bounds the per-update
change of the model's output, ``||f(x; θ_{t+1}) - f(x; θ_t)|| = Θ(η)``, independently of depth,
so a LayerNorm-free Transformer trains without warmup at 200 layers per side. This script
trains the same small model at several depths under five configurations and records, per run:

- ``final train loss``: mean of the train loss (bits/token, label-smoothed, as the trainer
  reports) over the last 10 *applied* updates (steps skipped for a non-finite gradient are
  not updates and are counted separately);
- ``best valid loss``: the lowest ``valid/loss`` the trainer logged (it validates once, at the
  end, so this is the final valid loss); when training stopped on non-finite steps (no
  validation), ``tfx.validate.valid_loss`` of the last weights;
- ``diverged``: ``non-finite`` when the trainer stopped on consecutive non-finite steps or the
  final loss is not finite; ``loss rose`` when the final loss is above the loss of the first
  update (the untrained model's loss on its first batch); else ``no``;
- ``max Δf``: the output-change probe. A fixed batch x (the first ``--probe-sentences`` valid
  pairs, teacher-forced) is run in eval mode (no grad) before training and after each of the
  first ``--probe-updates`` applied updates; with z_t the decoder's logits (B, T, V) at θ_t and
  P the set of non-pad target positions, ``Δf_t = sqrt(mean_{p∈P, v} (z_t[p, v] - z_{t-1}[p, v])²)``
  (RMS over non-pad positions and the vocabulary, so it does not grow with V or the batch),
  and the table reports ``max_t Δf_t`` and, because the max is often one early transient,
  the median over t. Non-finite logits make both ``non-finite``. The log-probability version
  (shift-invariant) is stored in the JSON too.

Configurations (``--configs``), all Adam(0.9, 0.98) at ``--lr``, weight decay 1e-4, label
smoothing 0.1, no clipping; "no warmup" is T-Fixup's lr * sqrt(4000 / (4000 + t)), which decays
by < 3% over a few hundred updates:

1. ``tfixup``         norm none, T-Fixup init, no warmup;
2. ``xavier``         norm none, Xavier init, no warmup;
3. ``postln``         Post-LN, Xavier, no warmup;
4. ``postln_warmup``  Post-LN, Xavier, fairseq inverse-sqrt warmup over ``--warmup-fraction``
                      of the updates (default 1/4: 50 of 200), from 1e-7, then lr * sqrt(W / t);
5. ``preln``          Pre-LN (final LayerNorm per stack), Xavier, no warmup.

Outputs under ``--out``: ``runs/<config>_N<depth>/`` (one trainer run folder each; TensorBoard:
``tensorboard --logdir <out>/runs``, with the probe as ``study/output_change``),
``depth_study.md`` (the table), ``depth_study.png`` (loss curves: one panel per configuration,
one line per depth) and ``depth_study.json`` (every number, per-update losses and probes);
``--replot`` rewrites the table and the plot from the JSON without training.

Budget (measured on this project's 2-core AMD EPYC VM): eager PyTorch on small matrices is
bound by per-op overhead here, and two OpenMP threads stall badly whenever another process
holds a core, so each run uses one thread (``--threads``) and ``--jobs`` runs go in parallel
processes, deepest first. At d_model 32 and max_tokens 256 one 200+200 update takes ~1.4 s
(fused AdamW; 2.1 s with foreach, which loops op by op on CPU) plus ~0.4 s for the probe over
the first 100 updates. The defaults (d_model 32, 200 updates) took 25.4 min wall, inside the
30-minute budget; wider or longer studies are flags. Dropout defaults to 0: it costs ~40% of
the forward time here, and this study is about optimization stability, not regularization.

Ctrl-C (or SIGTERM to the script) stops every run at its next update; the rows finished so far
are already written.

Usage: ``python scripts/depth_study.py --out outputs/depth_study [--depths 6 24 100 200]
[--configs tfixup xavier ...] [--updates 200] [--d-model 32] [--data multi30k --local-dir ../shared/data/multi30k]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor

# Run as a plain file from a checkout without `pip install -e .`: make the repo root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tfx.config import Config, DataConfig, InitConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from tfx.data import PAD, Batch, EncodedSplit, collate, prepare_data  # noqa: E402
from tfx.init import apply_init  # noqa: E402
from tfx.model import Transformer, build_model  # noqa: E402
from tfx.train import Trainer, TrainingDiverged, train  # noqa: E402
from tfx.validate import valid_loss  # noqa: E402

log = logging.getLogger("depth_study")

DEFAULT_DEPTHS = (6, 24, 100, 200)
FINAL_WINDOW = 10  # updates averaged into the final train loss
SMOOTH = 10  # running-mean window of the plotted curves


@dataclass(frozen=True)
class Variant:
    """One configuration of the study: where LayerNorm goes, which init, warmup or not."""

    norm: str
    init: str
    warmup: bool
    label: str


VARIANTS: dict[str, Variant] = {
    "tfixup": Variant("none", "tfixup", False, "T-Fixup, no LN, no warmup"),
    "xavier": Variant("none", "xavier", False, "Xavier, no LN, no warmup"),
    "postln": Variant("post", "xavier", False, "Post-LN + Xavier, no warmup"),
    "postln_warmup": Variant("post", "xavier", True, "Post-LN + Xavier, warmup"),
    "preln": Variant("pre", "xavier", False, "Pre-LN + Xavier, no warmup"),
}


@dataclass
class StudySettings:
    """Everything a study needs; ``main`` fills it from the command line, tests build it directly."""

    out: Path  # study folder: runs/, depth_study.{md,png,json}
    data: DataConfig  # the same corpus and batching for every run
    depths: list[int] = field(default_factory=lambda: list(DEFAULT_DEPTHS))  # layers per side
    configs: list[str] = field(default_factory=lambda: list(VARIANTS))  # keys of VARIANTS
    updates: int = 200  # applied updates per run
    d_model: int = 32  # residual width
    ffn_dim: int = 64  # FFN hidden width
    heads: int = 4  # attention heads
    dropout: float = 0.0  # residual/embedding dropout (attention/activation dropout are 0)
    lr: float = 5e-4  # Adam peak learning rate, all configs
    warmup_fraction: float = 0.25  # postln_warmup: warmup length / updates
    seed: int = 1  # data order and init, identical across runs
    device: str = "auto"  # trainer device
    threads: int = 1  # torch CPU threads per run
    jobs: int = 2  # runs in parallel processes (1 = in this process)
    probe_updates: int = 100  # Δf is recorded for updates 1..probe_updates
    probe_sentences: int = 8  # valid pairs in the fixed probe batch
    valid_max_sentences: int = 4  # the trainer's end-of-run BLEU decodes this many (BLEU is not used)
    checkpoint_activations: bool = False  # slower; only needed when memory is short
    keep_checkpoints: bool = False  # else each run's checkpoints/ is deleted when it ends

    @property
    def warmup_updates(self) -> int:
        return max(1, round(self.warmup_fraction * self.updates))


@dataclass
class RunSpec:
    """One (configuration, depth) run, picklable for a worker process."""

    name: str
    config: str
    depth: int
    cfg: Config
    run_dir: Path
    probe_updates: int
    probe_sentences: int
    keep_checkpoints: bool


@dataclass
class RunResult:
    name: str
    config: str
    depth: int
    losses: list[float]  # train loss (bits/token) of each applied update, in order
    output_change: list[float]  # Δf_t on logits, t = 1..probe_updates
    logprob_change: list[float]  # the same on log-probabilities
    stopped_non_finite: bool  # the trainer raised TrainingDiverged
    skipped_steps: int  # non-finite steps the trainer skipped
    valid_loss: float
    seconds: float  # the whole run: data, build, training, probe, validation
    train_seconds: float  # the trainer's own time in training steps (probe and validation excluded)

    @property
    def final_loss(self) -> float:
        return mean(self.losses[-FINAL_WINDOW:])

    @property
    def diverged(self) -> str:
        """``non-finite`` / ``loss rose`` / ``no`` (definitions in the module docstring)."""
        if self.stopped_non_finite or not self.losses or not math.isfinite(self.final_loss):
            return "non-finite"
        return "loss rose" if self.final_loss > self.losses[0] else "no"

    @property
    def max_output_change(self) -> float:
        return finite_max(self.output_change)

    @property
    def median_output_change(self) -> float:
        """The typical update, next to the max (which is often one early transient)."""
        values = self.output_change
        if not values or not all(math.isfinite(v) for v in values):
            return math.nan
        return statistics.median(values)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def finite_max(values: list[float]) -> float:
    """max, but nan as soon as one value is not finite (Python's max would depend on the order)."""
    if not values or not all(math.isfinite(v) for v in values):
        return math.nan
    return max(values)


# ---------------------------------------------------------------- configs
def build_config(settings: StudySettings, config: str, depth: int) -> Config:
    """The trainer's ``Config`` for one run: identical data, width and budget across the study."""
    v = VARIANTS[config]
    s = settings
    model = ModelConfig(
        encoder_layers=depth, decoder_layers=depth, d_model=s.d_model, ffn_dim=s.ffn_dim, heads=s.heads,
        norm=v.norm, dropout=s.dropout, attention_dropout=0.0, activation_dropout=0.0,
        checkpoint_activations=s.checkpoint_activations,
    )  # fmt: skip
    optim = OptimConfig(lr=s.lr, warmup_updates=s.warmup_updates if v.warmup else 0)
    train_cfg = TrainConfig(
        seed=s.seed, device=s.device, precision="fp32", threads=s.threads, max_updates=s.updates,
        validate_every_updates=0, valid_max_sentences=s.valid_max_sentences, log_every_updates=10,
        save_every_epochs=0, max_bad_steps=10, progress=False,
    )  # fmt: skip
    return Config(experiment=f"depth_study/{config}", data=s.data, model=model, init=InitConfig(v.init),
                  optim=optim, train=train_cfg)  # fmt: skip


def plan_runs(settings: StudySettings) -> list[RunSpec]:
    """Every (config, depth), deepest first so parallel workers finish together."""
    specs = []
    for depth in sorted(settings.depths, reverse=True):
        for config in settings.configs:
            name = f"{config}_N{depth}"
            specs.append(
                RunSpec(name, config, depth, build_config(settings, config, depth), settings.out / "runs" / name,
                        settings.probe_updates, settings.probe_sentences, settings.keep_checkpoints)
            )  # fmt: skip
    return specs


# ------------------------------------------------------------------ probe
def probe_batch(split: EncodedSplit, sentences: int) -> Batch:
    """The fixed batch: the first ``sentences`` pairs of the valid split (same for every run)."""
    return collate(split, list(range(min(sentences, len(split)))))


def initial_model(cfg: Config, vocab_size: int) -> Transformer:
    """θ_0 exactly as ``Trainer`` builds it: ``apply_init`` reseeds and sets every parameter.

    The trainer calls the hook only *after* an update, so the pre-training output comes from
    this replica (a test checks it equals the trainer's own initial weights).
    """
    model = build_model(cfg.model, vocab_size, PAD)
    apply_init(model, cfg.init.name, seed=cfg.train.seed)
    return model


@torch.no_grad()
def probe_logits(model: Transformer, batch: Batch, device: torch.device) -> Tensor:
    """fp32 logits (B, T, V) of the fixed batch in eval mode; the model's mode is restored.

    Eval mode with no grad draws no random numbers, so probing leaves training unchanged.
    """
    was_training = model.training
    model.eval()
    try:
        batch = batch.to(device)
        return model(batch.src_tokens, batch.prev_output_tokens).float()
    finally:
        model.train(was_training)


def rms_change(new: Tensor, old: Tensor, keep: Tensor) -> float:
    """sqrt(mean over kept positions and the last dim of (new - old)²); ``keep`` is (B, T) bool."""
    diff = (new - old)[keep]  # (P, V)
    return float(diff.pow(2).mean().sqrt())


class OutputProbe:
    """The ``on_update`` hook: records losses, and Δf_t for the first ``max_updates`` updates.

    A step the trainer skipped (non-finite gradient) leaves ``trainer.state.step`` unchanged: it
    is counted as skipped, and neither its loss nor a Δf is recorded (θ did not change).
    """

    def __init__(self, batch: Batch, initial_logits: Tensor, max_updates: int) -> None:
        self.batch = batch
        self.keep = batch.target.ne(PAD)
        self.previous = initial_logits
        self.max_updates = max_updates
        self.losses: list[float] = []
        self.output_change: list[float] = []
        self.logprob_change: list[float] = []
        self.skipped = 0
        self.trainer: Trainer | None = None
        self._step = 0

    def __call__(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self.trainer = trainer
        if trainer.state.step == self._step:
            self.skipped += 1
            return
        self._step = trainer.state.step
        self.losses.append(metrics["train/loss"])
        if self._step > self.max_updates:
            return
        logits = probe_logits(trainer.model, self.batch, trainer.device).cpu()
        change = rms_change(logits, self.previous, self.keep)
        lp_change = rms_change(logits.log_softmax(-1), self.previous.log_softmax(-1), self.keep)
        self.output_change.append(change)
        self.logprob_change.append(lp_change)
        self.previous = logits
        trainer.logger.scalars({"study/output_change": change, "study/logprob_change": lp_change}, self._step)


# -------------------------------------------------------------------- run
class StudyInterrupted(RuntimeError):
    """SIGINT/SIGTERM reached a run: the study stops (finished rows are already written)."""


_interrupted = False  # per process: set once a stop signal arrived, so queued runs are not started


def _note_interrupt(signum: int, frame: object) -> None:
    global _interrupted
    _interrupted = True


def _worker_init() -> None:
    """Worker processes: a signal between runs only sets the flag (the trainer handles it within a run)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _note_interrupt)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def best_logged_valid_loss(run_dir: Path) -> float | None:
    """Lowest ``valid/loss`` in the run's TensorBoard events, or None when it never validated."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    if "valid/loss" not in acc.Tags()["scalars"]:
        return None
    return min(e.value for e in acc.Scalars("valid/loss"))


def run_one(spec: RunSpec) -> RunResult:
    """Train one run from scratch (its folder is cleared first, so nothing resumes) and measure it."""
    global _interrupted
    if _interrupted:
        raise StudyInterrupted(f"{spec.name}: not started, the study was interrupted")
    shutil.rmtree(spec.run_dir, ignore_errors=True)
    tic = time.perf_counter()
    cfg = spec.cfg
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)  # the trainer sets it too, but the probe runs first
    corpus = prepare_data(cfg.data, seed=cfg.train.seed, splits=("train", "valid"))
    batch = probe_batch(corpus.splits["valid"], spec.probe_sentences)
    reference = initial_model(cfg, corpus.tokenizer.vocab_size)
    # θ_0's logits on CPU; on a GPU run the first Δf then also holds CPU-vs-GPU rounding (~1e-6).
    probe = OutputProbe(batch, probe_logits(reference, batch, torch.device("cpu")), spec.probe_updates)
    del reference, corpus
    stopped = False
    try:
        summary = train(cfg, spec.run_dir, on_update=probe)
        if summary["stopped_by"] is not None:  # the trainer caught SIGINT/SIGTERM and stopped early
            _interrupted = True
            raise StudyInterrupted(f"{spec.name}: stopped by {summary['stopped_by']} at update {summary['step']}")
    except TrainingDiverged as e:
        log.warning("%s: %s", spec.name, e)
        stopped = True
    trainer = probe.trainer
    if stopped and trainer is not None:
        trainer.logger.close()  # the trainer's own close runs only when it finishes
    skipped = trainer.state.skipped_steps if trainer is not None else probe.skipped
    train_seconds = trainer.state.train_seconds if trainer is not None else 0.0
    valid = best_logged_valid_loss(spec.run_dir)
    if valid is None and trainer is not None:
        valid = valid_loss(trainer.model.eval(), trainer.corpus, cfg, trainer.device, bf16=False)["valid/loss"]
    if not spec.keep_checkpoints:
        shutil.rmtree(spec.run_dir / "checkpoints", ignore_errors=True)  # 200+200 layers: ~400 MB each
    return RunResult(
        spec.name, spec.config, spec.depth, probe.losses, probe.output_change, probe.logprob_change, stopped,
        skipped, math.nan if valid is None else valid, time.perf_counter() - tic, train_seconds,
    )  # fmt: skip


def run_all(specs: list[RunSpec], jobs: int, on_result: Callable[[list[RunResult]], None]) -> list[RunResult]:
    """Sequentially in this process (``jobs == 1``) or in ``jobs`` spawned worker processes.

    ``on_result`` gets the results so far after each run, so a long study that is stopped
    still leaves its finished rows behind.
    """
    results: list[RunResult] = []

    def done(result: RunResult) -> None:
        results.append(result)
        report_progress(result, len(results), len(specs))
        on_result(results)

    if jobs == 1:
        for spec in specs:
            done(run_one(spec))
        return results
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init)
    try:
        futures = [pool.submit(run_one, spec) for spec in specs]
        for future in as_completed(futures):
            done(future.result())
    except BaseException:
        # Ctrl-C / SIGTERM / a failed run: drop queued runs and stop the running ones at their next
        # update (the trainer turns SIGTERM into a clean stop), instead of waiting for them all.
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in multiprocessing.active_children():
            worker.terminate()
        raise
    pool.shutdown()
    return results


def report_progress(r: RunResult, i: int, n: int) -> None:
    print(
        f"[{i}/{n}] {r.name}: final {r.final_loss:.3f} | valid {r.valid_loss:.3f} | diverged {r.diverged} | "
        f"max Δf {r.max_output_change:.3g} | {r.seconds:.0f} s",
        flush=True,
    )


# ---------------------------------------------------------------- outputs
def fmt(x: float, spec: str = ".3f") -> str:
    """``spec``, but 3 significant digits for huge values and ``non-finite`` for nan/inf."""
    if not math.isfinite(x):
        return "non-finite"
    return format(x, ".3g" if abs(x) >= 1e4 else spec)


def markdown_table(results: list[RunResult], configs: list[str], depths: list[int]) -> str:
    """One row per (config, depth), in the order of ``configs`` then increasing depth."""
    by_key = {(r.config, r.depth): r for r in results}
    lines = [
        "| config | N | final train loss | best valid loss | diverged | max Δf (logits RMS) | median Δf "
        "| skipped steps | s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for config in configs:
        for depth in sorted(depths):
            r = by_key.get((config, depth))
            if r is None:
                lines.append(f"| {config} | {depth} | not run yet | | | | | | |")
                continue
            lines.append(
                f"| {config} | {depth} | {fmt(r.final_loss)} | {fmt(r.valid_loss)} | {r.diverged} | "
                f"{fmt(r.max_output_change, '.3g')} | {fmt(r.median_output_change, '.3g')} | {r.skipped_steps} "
                f"| {r.seconds:.0f} |"
            )
    return "\n".join(lines)


def write_markdown(path: Path, settings: StudySettings, results: list[RunResult], wall: float) -> None:
    s = settings
    configs = "\n".join(f"- `{name}`: {VARIANTS[name].label}" for name in s.configs)
    text = f"""# Depth study: training stability vs depth

{s.updates} updates per run, data `{s.data.name}` (max_tokens {s.data.max_tokens}), d_model {s.d_model},
ffn {s.ffn_dim}, {s.heads} heads, dropout {s.dropout}, Adam lr {s.lr:g} (betas 0.9/0.98), fp32, seed {s.seed}.
Warmup (postln_warmup only): linear over {s.warmup_updates} updates from 1e-7, then inverse-sqrt.
Others: no warmup, lr * sqrt(4000 / (4000 + t)).
{len(results)} of {len(s.configs) * len(s.depths)} runs done, {s.jobs} parallel job(s) x {s.threads} thread(s),
wall time {wall / 60:.1f} min.

{configs}

Columns (exact definitions in `scripts/depth_study.py`): final train loss = mean label-smoothed loss
(bits/token) of the last {FINAL_WINDOW} updates; best valid loss = lowest `valid/loss` logged (one
validation, at the end); diverged = `non-finite` (stopped on non-finite steps) or `loss rose` (final
loss above the first update's loss); max Δf = max over the first {s.probe_updates} updates of the RMS
change of the logits of a fixed batch ({s.probe_sentences} valid sentences, eval mode) per update;
median Δf = the median over the same updates.

{markdown_table(results, s.configs, s.depths)}

TensorBoard: `tensorboard --logdir {s.out / "runs"}`. Curves: `depth_study.png`.
"""
    path.write_text(text)


def running_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(path: Path, results: list[RunResult], configs: list[str], depths: list[int]) -> None:
    """One panel per configuration, one line per depth, log-y.

    Each panel keeps its own y range: no-LN Xavier starts thousands of bits up and would flatten
    every other panel onto one line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {(r.config, r.depth): r for r in results}
    colors = plt.get_cmap("viridis")([i / max(len(depths) - 1, 1) for i in range(len(depths))])
    cols = min(len(configs), 3)
    rows = math.ceil(len(configs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), sharex=True, squeeze=False)
    for ax, config in zip(axes.flat, configs, strict=False):
        for depth, color in zip(sorted(depths), colors, strict=True):
            r = by_key.get((config, depth))
            if r is None:
                continue
            finite = [v if math.isfinite(v) else math.nan for v in r.losses]
            label = f"N={depth}" + ("" if r.diverged == "no" else f" ({r.diverged})")
            ax.plot(range(1, len(finite) + 1), running_mean(finite, SMOOTH), color=color, label=label)
            if r.stopped_non_finite:
                ax.plot(len(finite), finite[-1] if finite else math.nan, "x", color=color, ms=8)
        ax.set_title(VARIANTS[config].label, fontsize=9)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("update")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"train loss (bits), running mean of {SMOOTH}")
    for ax in list(axes.flat)[len(configs) :]:
        ax.set_visible(False)
    fig.suptitle("Train loss vs depth (x: stopped on non-finite steps)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_json(path: Path) -> tuple[StudySettings, list[RunResult], float]:
    """Settings, results and wall time of a finished (or interrupted) study, for ``--replot``."""
    saved = json.loads(path.read_text())
    meta = dict(saved["settings"])
    settings = StudySettings(**{**meta, "out": Path(meta["out"]), "data": DataConfig(**meta["data"])})
    names = {f.name for f in fields(RunResult)}
    results = [RunResult(**{k: v for k, v in run.items() if k in names}) for run in saved["runs"]]
    return settings, results, saved["wall_seconds"]


def write_outputs(settings: StudySettings, results: list[RunResult], wall: float, json_too: bool = True) -> None:
    write_markdown(settings.out / "depth_study.md", settings, results, wall)
    if json_too:
        write_json(settings.out / "depth_study.json", settings, results, wall)
    plot(settings.out / "depth_study.png", results, settings.configs, settings.depths)


def write_json(path: Path, settings: StudySettings, results: list[RunResult], wall: float) -> None:
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    runs = [{**asdict(r), "final_loss": r.final_loss, "diverged": r.diverged,
             "max_output_change": r.max_output_change} for r in results]  # fmt: skip
    path.write_text(json.dumps({"settings": meta, "wall_seconds": wall, "runs": runs}, indent=1, default=str))


# ------------------------------------------------------------------- main
def run_study(settings: StudySettings) -> list[RunResult]:
    """Train every run, then write the table, the plot and the JSON under ``settings.out``."""
    unknown = sorted(set(settings.configs) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown configs {unknown}: use {sorted(VARIANTS)}")
    settings.out.mkdir(parents=True, exist_ok=True)
    prepare_data(settings.data, seed=settings.seed)  # build the vocabulary cache once, before any worker
    tic = time.perf_counter()

    def write_so_far(results: list[RunResult]) -> None:
        write_outputs(settings, results, time.perf_counter() - tic)

    return run_all(plan_runs(settings), settings.jobs, write_so_far)


def data_config(name: str, local_dir: str | None, max_tokens: int, cache_dir: str) -> DataConfig:
    """The toy task (synthetic, no files) or Multi30k De->En from a local folder."""
    if name == "toy":
        return DataConfig(source="toy", name="toy", vocab_size=256, max_tokens=max_tokens, cache_dir=cache_dir)
    return DataConfig(
        source="local", name=name, local_dir=local_dir or f"../shared/data/{name}", vocab_size=8000,
        max_tokens=max_tokens, cache_dir=cache_dir,
    )  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("outputs/depth_study"))
    p.add_argument("--depths", type=int, nargs="+", default=list(DEFAULT_DEPTHS), help="layers per side")
    p.add_argument("--configs", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--updates", type=int, default=200, help="updates per run")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--ffn-dim", type=int, default=None, help="default: 2 x d_model")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-fraction", type=float, default=0.25, help="postln_warmup: warmup / updates")
    p.add_argument("--max-tokens", type=int, default=256, help="token budget per batch")
    p.add_argument("--data", default="toy", help="toy, or a local corpus name such as multi30k")
    p.add_argument("--local-dir", default=None, help="folder of <split>.<lang> files (default ../shared/data/NAME)")
    p.add_argument("--cache-dir", default="data/cache", help="sentencepiece / encoded-data cache")
    p.add_argument("--probe-updates", type=int, default=100)
    p.add_argument("--probe-sentences", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    p.add_argument("--checkpoint-activations", action="store_true", help="recompute layers in backward")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoints/ folder")
    p.add_argument("--replot", action="store_true", help="only rewrite the .md and .png from <out>/depth_study.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.replot:
        settings, results, wall = load_json(args.out / "depth_study.json")
        write_outputs(settings, results, wall, json_too=False)
        print((args.out / "depth_study.md").read_text())
        return 0
    settings = StudySettings(
        out=args.out, data=data_config(args.data, args.local_dir, args.max_tokens, args.cache_dir),
        depths=args.depths, configs=args.configs, updates=args.updates, d_model=args.d_model,
        ffn_dim=args.ffn_dim or 2 * args.d_model, heads=args.heads, dropout=args.dropout, lr=args.lr,
        warmup_fraction=args.warmup_fraction, seed=args.seed, device=args.device, threads=args.threads,
        jobs=args.jobs, probe_updates=args.probe_updates, probe_sentences=args.probe_sentences,
        checkpoint_activations=args.checkpoint_activations, keep_checkpoints=args.keep_checkpoints,
    )  # fmt: skip
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill PID` stops the workers too (see run_all)
    try:
        run_study(settings)
    except (KeyboardInterrupt, StudyInterrupted) as e:
        print(f"interrupted ({e}); finished runs are in {settings.out / 'depth_study.md'}", file=sys.stderr)
        return 130
    print(f"wrote {settings.out / 'depth_study.md'}, depth_study.png, depth_study.json")
    print((settings.out / "depth_study.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
