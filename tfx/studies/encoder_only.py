"""Encoder-only T-Fixup (layer6ai-labs/T-Fixup#6): a plain ``nn.TransformerEncoder`` converted by ``tfx.convert``
against the same model with LayerNorm (Pre-LN; Post-LN with and without warmup), on a generated sorting task.

The question of T-Fixup#6 was whether T-Fixup, derived for an encoder-decoder, trains an encoder-only stack without
LayerNorm and warmup. The task: a sequence of ``length`` symbols drawn from ``symbols``, and at every position the
symbol of the sorted sequence there (a per-position classification, like a masked-token head). Each output needs the
rank of every input (compare all pairs) and then the input whose rank is its position: two rounds of attention
composed, learnable in a few hundred updates on one CPU thread, not in fifty. Data are drawn fresh each update
(no overfitting, no dropout); a fixed held-out set scores the final model.

Arms (``ARMS``), one model class for all: token embedding x sqrt(d) + sinusoidal positions, ``nn.TransformerEncoder``
(d, 4 heads, FFN 2d, ReLU, dropout 0), a linear head; Adam (0.9, 0.98), constant lr after any warmup:

- ``tfixup``: built Post-LN, then ``tfx.convert(model, "tfixup")``: no LayerNorm, Xavier + 0.67 N^-1/4 on v/out/FFN,
  table N(0, d^-1/2) x (9N)^-1/4; no warmup.
- ``preln``: ``norm_first=True`` + a final LayerNorm; no warmup.
- ``postln``: ``norm_first=False`` (torch's default), linear warmup over ``warmup`` updates.
- ``postln_nowarmup``: the same without warmup: the control that shows what the warmup is for.

The LayerNorm arms keep torch's own init (Xavier-uniform packed q/k/v, Kaiming-uniform(a=sqrt 5) Linear layers) with
the table N(0, d^-1/2) (fairseq's, as examples/convert_transformer.py: torch's N(0, 1) x sqrt(d) would swamp them).
Layout under ``out``: ``runs/<run>/record.json`` (a finished run: never recomputed) and ``runs/<run>/tb/``
(TensorBoard), ``encoder_only.md`` and ``encoder_only.png`` (``write_report``, from the records alone).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfx.conversion import convert
from tfx.files.atomic import atomic_open
from tfx.model.transformer import sinusoidal_table


@dataclass(frozen=True)
class Arm:
    """How one arm differs: where LayerNorm sits (None: converted, no LayerNorm) and whether the lr warms up."""

    name: str
    norm_first: bool | None
    warmup: bool
    summary: str


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("tfixup", None, False, "tfx.convert(method='tfixup'): no LayerNorm, T-Fixup init, no warmup"),
        Arm("preln", True, False, "Pre-LN + final LayerNorm, torch init, no warmup"),
        Arm("postln", False, True, "Post-LN, torch init, linear warmup"),
        Arm("postln_nowarmup", False, False, "Post-LN, torch init, no warmup (control)"),
    )
}


@dataclass(frozen=True)
class StudyConfig:
    """The whole comparison: every arm at every depth, lr and seed, with one fixed budget."""

    arms: tuple[str, ...] = tuple(ARMS)
    depths: tuple[int, ...] = (6, 24)
    lrs: tuple[float, ...] = (5e-4, 1e-3)
    seeds: tuple[int, ...] = (1, 2)
    steps: int = 600  # Adam updates per run
    batch: int = 32  # sequences per update
    warmup: int = 100  # the warming arms' linear warmup, in updates (1/6 of the budget)
    d_model: int = 64
    heads: int = 4
    symbols: int = 32  # the alphabet sorted
    length: int = 16  # symbols per sequence
    held_out: int = 512  # sequences in the fixed held-out set
    log_every: int = 10  # updates per loss-curve point (the mean of those updates)

    def __post_init__(self) -> None:
        unknown = set(self.arms) - set(ARMS)
        if unknown:
            raise ValueError(f"unknown arms {sorted(unknown)}: use {sorted(ARMS)}")
        if min(self.steps, self.batch, self.log_every, self.d_model, self.length, self.held_out) < 1:
            raise ValueError("steps, batch, log_every, d_model, length and held_out must be >= 1")
        if self.d_model % self.heads or self.warmup < 0 or self.symbols < 2:
            raise ValueError("d_model must divide by heads, warmup must be >= 0 and symbols >= 2")


@dataclass(frozen=True)
class RunSpec:
    arm: str
    depth: int
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}_N{self.depth}_lr{self.lr:g}_s{self.seed}"


def planned_runs(cfg: StudyConfig) -> list[RunSpec]:
    """Deepest first, so that the longest runs do not end the study alone on one core."""
    order = sorted(cfg.depths, reverse=True)
    return [RunSpec(a, d, lr, s) for d in order for lr in cfg.lrs for s in cfg.seeds for a in cfg.arms]


def sort_batch(batch: int, length: int, symbols: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """(inputs, targets), both (B, T): random symbols, and at each position the sorted sequence's symbol there."""
    x = torch.randint(0, symbols, (batch, length), generator=g)
    return x, x.sort(dim=1).values


class SortEncoder(nn.Module):
    """Token embedding x sqrt(d) + fixed positions -> ``nn.TransformerEncoder`` -> a linear head per position."""

    def __init__(self, cfg: StudyConfig, depth: int, norm_first: bool) -> None:
        super().__init__()
        d = cfg.d_model
        self.scale = math.sqrt(d)
        self.embed = nn.Embedding(cfg.symbols, d)
        nn.init.normal_(self.embed.weight, std=d**-0.5)  # fairseq's table; T-Fixup's conversion redraws it anyway
        self.register_buffer("positions", sinusoidal_table(cfg.length, d), persistent=False)
        layer = nn.TransformerEncoderLayer(d, cfg.heads, 2 * d, 0.0, batch_first=True, norm_first=norm_first)
        final = nn.LayerNorm(d) if norm_first else None  # Pre-LN's stream is unnormalised until this one
        self.encoder = nn.TransformerEncoder(layer, depth, norm=final, enable_nested_tensor=False)
        self.head = nn.Linear(d, cfg.symbols)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.encoder(self.scale * self.embed(x) + self.positions[: x.size(1)])  # (B, T, D)
        return self.head(hidden)  # (B, T, V)


def build_model(arm: Arm, depth: int, cfg: StudyConfig, seed: int) -> SortEncoder:
    """The arm's model, its weights drawn from ``seed``; the T-Fixup arm is the Post-LN model converted."""
    torch.manual_seed(seed)
    model = SortEncoder(cfg, depth, norm_first=bool(arm.norm_first))
    if arm.norm_first is None:
        convert(model, "tfixup", seed=seed)
    return model


def warmup_factor(step: int, warmup: int) -> float:
    """The lr multiplier at update ``step`` (1-based): linear from 1/warmup to 1, then 1; warmup 0: always 1."""
    return 1.0 if warmup == 0 else min(1.0, step / warmup)


def build_optimizer(model: nn.Module, arm: Arm, lr: float, cfg: StudyConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """Adam (0.9, 0.98) with the arm's schedule; the scheduler's ``optimizer`` holds the lr of update 1 already."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    warmup = cfg.warmup if arm.warmup else 0
    # LambdaLR counts from 0 at construction; update k is trained at the lr set after k - 1 scheduler steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: warmup_factor(done + 1, warmup))


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, float]:
    """Held-out loss, token accuracy and exact-sequence accuracy (every position right)."""
    model.eval()
    logits = model(x)
    model.train()
    hit = logits.argmax(-1).eq(y)
    return {
        "loss": F.cross_entropy(logits.flatten(0, 1), y.flatten()).item(),
        "token_acc": hit.float().mean().item(),
        "exact_acc": hit.all(dim=1).float().mean().item(),
    }


@dataclass
class Curve:
    """The train loss as the mean over each ``every`` updates; the first non-finite loss ends the run."""

    every: int
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    window: list[float] = field(default_factory=list)

    def add(self, step: int, loss: float) -> float | None:
        """The window's mean when it closes at ``step``, else None."""
        self.window.append(loss)
        if step % self.every:
            return None
        mean = sum(self.window) / len(self.window)
        self.steps.append(step)
        self.losses.append(mean)
        self.window.clear()
        return mean


def train_run(spec: RunSpec, cfg: StudyConfig, run_dir: Path) -> dict[str, Any]:
    """Train one run on one thread, log it to TensorBoard, return its record (nothing written but the log)."""
    from torch.utils.tensorboard import SummaryWriter  # only a run needs it: a replot stays light

    torch.set_num_threads(1)
    arm = ARMS[spec.arm]
    model = build_model(arm, spec.depth, cfg, spec.seed)
    scheduler = build_optimizer(model, arm, spec.lr, cfg)
    data = torch.Generator().manual_seed(spec.seed)
    held_x, held_y = sort_batch(cfg.held_out, cfg.length, cfg.symbols, torch.Generator().manual_seed(10_000))
    curve, diverged = Curve(cfg.log_every), None
    tic = time.perf_counter()
    with SummaryWriter(str(run_dir / "tb")) as tb:
        for step in range(1, cfg.steps + 1):
            x, y = sort_batch(cfg.batch, cfg.length, cfg.symbols, data)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            if not torch.isfinite(loss):
                diverged = step
                break
            scheduler.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            scheduler.optimizer.step()
            scheduler.step()
            mean = curve.add(step, loss.item())
            if mean is not None:
                tb.add_scalar("train/loss", mean, step)
                tb.add_scalar("lr", scheduler.optimizer.param_groups[0]["lr"], step)
        final = evaluate(model, held_x, held_y) if diverged is None else {}
        for key, value in final.items():
            tb.add_scalar(f"held_out/{key}", value, cfg.steps)
    seconds = time.perf_counter() - tic
    return {"run": asdict(spec), "diverged_at": diverged, "held_out": final, "seconds": seconds,
            "curve": {"steps": curve.steps, "loss": curve.losses}, "config": asdict(cfg)}  # fmt: skip


def record_path(out: Path, spec: RunSpec) -> Path:
    return out / "runs" / spec.name / "record.json"


def run_and_record(spec: RunSpec, cfg: StudyConfig, out: Path) -> str:
    """One run, its record written atomically last: a run stopped midway leaves no record and runs again."""
    path = record_path(out, spec)
    record = train_run(spec, cfg, path.parent)
    with atomic_open(path, "w") as f:
        json.dump(record, f)
    return f"{spec.name}: {describe(record)}"


def describe(record: dict[str, Any]) -> str:
    if record["diverged_at"] is not None:
        return f"diverged at update {record['diverged_at']} ({record['seconds']:.0f} s)"
    h = record["held_out"]
    return f"held-out exact {h['exact_acc']:.3f}, token {h['token_acc']:.3f}, loss {h['loss']:.3f} " \
           f"({record['seconds']:.0f} s)"  # fmt: skip


def run_study(cfg: StudyConfig, out: Path, jobs: int = 1, log: Callable[[str], None] = print) -> list[RunSpec]:
    """Every planned run without a record, ``jobs`` at a time (one thread each); returns the runs it trained.
    ``study.json`` adds this call's wall time to the study's, with the machine and date of the last call."""
    todo = [s for s in planned_runs(cfg) if not record_path(out, s).is_file()]
    log(f"{len(planned_runs(cfg)) - len(todo)} runs recorded, {len(todo)} to train, {jobs} at a time")
    tic = time.perf_counter()
    if jobs == 1:
        for spec in todo:
            log(run_and_record(spec, cfg, out))
    else:
        # spawn: a fresh interpreter per worker, so no torch thread pool is inherited half-initialised from a fork
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            for line in pool.map(run_and_record, todo, [cfg] * len(todo), [out] * len(todo)):
                log(line)
    note_wall_time(out, time.perf_counter() - tic, jobs)
    return todo


def note_wall_time(out: Path, seconds: float, jobs: int) -> None:
    path = out / "study.json"
    study = json.loads(path.read_text()) if path.is_file() else {"wall_seconds": 0.0}
    study.update(wall_seconds=study["wall_seconds"] + seconds, jobs=jobs, machine=cpu_model(),
                 date=time.strftime("%Y-%m-%d"), torch=torch.__version__)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w") as f:
        json.dump(study, f, indent=1)


def load_records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/record.json"))]


def spread(values: list[float]) -> str:
    """mean ± half the range over seeds (two seeds: ± half their difference)."""
    mean = sum(values) / len(values)
    return f"{mean:.3f} ± {(max(values) - min(values)) / 2:.3f}"


def group(records: Iterable[dict[str, Any]]) -> dict[tuple[str, int, float], list[dict[str, Any]]]:
    """Records by (arm, depth, lr), seeds together, in ``ARMS`` order, then depth and lr."""
    groups: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in records:
        run = r["run"]
        groups.setdefault((run["arm"], run["depth"], run["lr"]), []).append(r)
    rank = {name: i for i, name in enumerate(ARMS)}
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][1], rank[kv[0][0]], kv[0][2])))


def table_lines(records: list[dict[str, Any]]) -> list[str]:
    """One row per arm, depth and lr: held-out exact-sequence and token accuracy, loss (mean ± half-range over the
    seeds that finished), diverged runs, seconds per run."""
    lines = [
        "| N | arm | lr | seeds | diverged | held-out exact-sequence acc | held-out token acc | held-out loss "
        "| s/run |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (arm, depth, lr), runs in group(records).items():
        done = [r["held_out"] for r in runs if r["diverged_at"] is None]
        cells = [spread([h[k] for h in done]) if done else "—" for k in ("exact_acc", "token_acc", "loss")]
        seconds = sum(r["seconds"] for r in runs) / len(runs)
        lines.append(f"| {depth} | {arm} | {lr:g} | {len(runs)} | {len(runs) - len(done)} | " + " | ".join(cells)
                     + f" | {seconds:.0f} |")  # fmt: skip
    return lines


def best_lr(runs_by_lr: dict[float, list[dict[str, Any]]]) -> float:
    """The lr whose seeds end with the lowest mean held-out loss (a diverged seed counts as infinite)."""

    def score(runs: list[dict[str, Any]]) -> float:
        return sum(math.inf if r["diverged_at"] else r["held_out"]["loss"] for r in runs) / len(runs)

    return min(runs_by_lr, key=lambda lr: score(runs_by_lr[lr]))


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Train loss against updates, one panel per depth, each arm at its best lr (mean over seeds; log-y)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group(records)
    depths = sorted({depth for _, depth, _ in groups})
    fig, axes = plt.subplots(1, len(depths), figsize=(4.2 * len(depths), 3.2), squeeze=False, sharey=True)
    for ax, depth in zip(axes[0], depths, strict=True):
        for arm in ARMS:
            by_lr = {lr: runs for (a, d, lr), runs in groups.items() if a == arm and d == depth}
            if not by_lr:
                continue
            lr = best_lr(by_lr)
            curves = [r["curve"] for r in by_lr[lr]]
            n = min(len(c["loss"]) for c in curves)  # a diverged seed's curve is cut short
            if n:
                mean = [sum(c["loss"][i] for c in curves) / len(curves) for i in range(n)]
                ax.plot(curves[0]["steps"][:n], mean, label=f"{arm} (lr {lr:g})", lw=1.2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # 0.2, not 2 x 10^-1
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"N = {depth} layers", fontsize=9)
        ax.set_xlabel("update", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("train loss (mean of seeds)", fontsize=8)
    fig.suptitle("Encoder-only sorting: T-Fixup (converted) vs LayerNorm", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(out: Path, figure: Path | None = None) -> str:
    """``encoder_only.md`` and ``encoder_only.png`` in ``out`` from the records alone (and the figure at
    ``figure`` too, if given); returns the markdown."""
    records = load_records(out)
    if not records:
        raise FileNotFoundError(f"no run records under {out / 'runs'}")
    cfg = records[0]["config"]
    study = json.loads((out / "study.json").read_text()) if (out / "study.json").is_file() else {}
    cost = f"{sum(r['seconds'] for r in records) / 60:.1f} min of one-thread runs"
    if study:
        cost += f", {study['wall_seconds'] / 60:.1f} min wall at {study['jobs']} at once on {study['machine']}"
    lines = [
        "# Encoder-only T-Fixup on generated sorting (T-Fixup#6)",
        "",
        f"{cfg['steps']} updates of {cfg['batch']} sequences ({cfg['length']} symbols of {cfg['symbols']}), "
        f"d {cfg['d_model']}, {cfg['heads']} heads, FFN {2 * cfg['d_model']}, dropout 0, Adam (0.9, 0.98), "
        f"constant lr; postln warms up linearly over {cfg['warmup']} updates. Held-out: {cfg['held_out']} fixed "
        "sequences after the last update. mean ± half-range over seeds; fp32, CPU, one thread per run. "
        f"Cost: {cost}.",
        "",
        *table_lines(records),
        "",
    ]
    text = "\n".join(lines)
    (out / "encoder_only.md").write_text(text)
    for target in [out / "encoder_only.png"] + ([figure] if figure else []):
        plot(records, target)
    return text


def cpu_model() -> str:
    """The CPU's model name as lscpu prints it (``/proc/cpuinfo``), for the record of where a table came from."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"unknown CPU, {os.cpu_count()} cores"
