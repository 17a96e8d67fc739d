"""The depth map's cells (``scripts/studies/depth_map.py``): what each runs, how it ended, what it recorded.

A cell is one method at one depth N (layers per side), at the setting a user tries first: ``+experiment=multi30k
method=NAME`` takes NAME's tuned lr, dropout and warmup from that experiment's ``tuned:`` block (a method without a
row, e.g. a new ``derf``, runs at lr 5e-4, dropout 0.3 and a 100-update warmup if its YAML warms up). Stage 1 is
every method at N = 6, 24, 48; stage 2 is N = 100 and 200 for T-Fixup and the ``others`` methods that trained best
at the deepest stage-1 depth (``stage2_methods``). The runs live in ``<out>/runs/<method>_N<depth>[_retry]``.

**Outcome** (``outcome``), from the run's own ``metrics.jsonl``:

- ``diverged``: the trainer stopped on ``train.max_bad_steps`` consecutive non-finite steps (end status
  ``diverged``), or the last update's train loss or the last valid loss is not finite;
- ``stuck``: it ran its epochs, but its best greedy valid BLEU is below ``STUCK_BLEU`` = 5. A model that ignores
  the source can still emit one generic sentence for every input: "A man in a blue shirt is standing in front of a
  building ." scores 4.08 sacreBLEU on Multi30k's valid set (measured), so below 5 a run has not shown that it
  translates. A loss rule tied to the unigram plateau (8.35 bits, the valid cross-entropy of the training targets'
  unigram distribution) misses a decoder that learned the target language and not the source: DyT's stuck 12+12
  runs (docs/converged.md) sat at 7.1-7.4 bits, below it, with valid BLEU 1-2. The runs that docs call stuck scored
  0.02-2.4; those leaving the plateau after 3 epochs 4.0-10. And its valid loss fell by less than ``SLOW_BITS`` =
  0.5 bits over its last epoch: it is on a plateau, not on its way down;
- ``slow``: below 5 BLEU, but its valid loss fell by ``SLOW_BITS`` or more over its last epoch: it is leaving the
  plateau when the budget ends (Post-LN at N = 6 with its 400-update warmup, 474 updates in all: 8.23 then 7.26
  bits, 1.43 then 3.30 BLEU, measured 2026-12-07). No retry: a smaller lr or a longer warmup would be slower still.
  The 0.5 bits separate the 12+12 probes of docs/converged.md that left the plateau (DyT at warmup 1000: 0.63 bits
  over its third epoch, 4.04 BLEU) from those it calls stuck (DyT without warmup 0.37, Post-LN at warmup 1000 0.24);
- ``trained``: otherwise; ``unfinished``: no end record yet, or stopped by a signal (it resumes).

**Retry**: a cell whose chosen setting diverged or got stuck runs once more, as its own cell variant (``_retry``), at
the smallest change its paper or the 12+12 probes of docs/converged.md point to (``RETRIES``; each says why).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.studies.arms import METHODS
from tfx.studies.converged_runs import best_of, test_scores
from tfx.studies.peak_memory import sessions

# The methods, in the order the table lists them; derf only where conf/method/derf.yaml exists (``study_methods``)
DEPTH_MAP_METHODS = ["tfixup", "postln", "preln", "deepnorm", "admin", "dyt", "derf", "rezero", "fixup"]
STAGE1_DEPTHS = [6, 24, 48]
STAGE2_DEPTHS = [100, 200]
STUCK_BLEU = 5.0  # best greedy valid BLEU below which a run that ran its epochs is stuck or slow (module docstring)
SLOW_BITS = 0.5  # valid-loss fall over the last epoch from which a run below STUCK_BLEU is slow, not stuck
CHECKPOINT_FROM = 200  # depth from which activations are recomputed in backward: N = 200 would hold ~14 GB a run
DEFAULT_SETTING = (5e-4, 0.3, 100)  # multi30k.yaml's oc.select defaults for a method without a tuned row
OUTCOMES = ("trained", "slow", "stuck", "diverged", "unfinished")
SESSIONS = "sessions.jsonl"  # per run: tfx.studies.peak_memory's record of each training session


@dataclass(frozen=True)
class Retry:
    """One retry's change to a method's chosen setting: the lr times ``lr_factor`` or set to ``lr``, the warmup set to
    ``warmup`` (None: unchanged); ``why`` cites where the change comes from."""

    why: str
    lr_factor: float = 1.0
    lr: float | None = None
    warmup: int | None = None


HALF_LR = "half the lr"
RETRIES: dict[str, Retry] = {
    "tfixup": Retry("docs/depth.md 'Deep at width': T-Fixup fails at depth by Adam's first-update spike, and the fix "
                    "inside the method is a smaller lr (no warmup, no LayerNorm); " + HALF_LR, lr_factor=0.5),
    "postln": Retry("docs/converged.md '12+12 on CPU': at its 3+3 setting (1e-3, warmup 400) it trained at 12+12 in "
                    "no seed; the grid's most cautious corner, lr 5e-4 and warmup 1000", lr=5e-4, warmup=1000),
    "preln": Retry("trains at 12+12 at its setting (docs/converged.md, the H200 windows): no probe points elsewhere, "
                   "so the generic smaller step, " + HALF_LR, lr_factor=0.5),
    "deepnorm": Retry("docs/converged.md, second H200 window: at lr 1e-3 its 12+12 seed 1 collapsed (4.42, then "
                      "0.73) where seeds 2-3 trained; " + HALF_LR + ", its warmup kept", lr_factor=0.5),
    "admin": Retry("docs/converged.md '12+12 on CPU': it trains at 12+12 once it warms up (lr 5e-4, warmup 1000: "
                   "5.97 after 3 epochs; warmup 0 trained in no seed), and its paper warms up", lr=5e-4, warmup=1000),
    "dyt": Retry("docs/converged.md 'DyT with a smaller alpha init, or a smaller lr': at 12+12 half the lr left the "
                 "plateau without warmup; " + HALF_LR, lr_factor=0.5),
    "derf": Retry("a point-wise function in LayerNorm's place, as DyT: DyT's fix, " + HALF_LR, lr_factor=0.5),
    "rezero": Retry("trains at 12+12 at its setting (docs/converged.md '12+12 at each arm's own 3+3 setting'): no "
                    "probe points elsewhere, so the generic smaller step, " + HALF_LR, lr_factor=0.5),
    "fixup": Retry("trains at 12+12 at its setting (docs/converged.md '12+12 at each arm's own 3+3 setting'): no "
                   "probe points elsewhere, so the generic smaller step, " + HALF_LR, lr_factor=0.5),
}  # fmt: skip
GENERIC_RETRY = Retry("a method without a probe of its own: the generic smaller step, " + HALF_LR, lr_factor=0.5)


@dataclass(frozen=True, order=True)
class Cell:
    """One run of the map: ``method`` at ``depth`` layers per side, at its chosen setting or its ``retry``."""

    depth: int
    method: str
    retry: bool = False

    @property
    def name(self) -> str:
        return f"{self.method}_N{self.depth}" + ("_retry" if self.retry else "")

    def run(self, out: Path) -> Path:
        return out / "runs" / self.name


def study_methods(asked: list[str] | None = None) -> list[str]:
    """The methods a study maps: ``asked`` (each must be a method), else ``DEPTH_MAP_METHODS`` that have a YAML
    (derf joins the day conf/method/derf.yaml exists)."""
    if asked:
        if unknown := [m for m in asked if m not in METHODS]:
            raise ValueError(f"unknown method {', '.join(unknown)} (one of {', '.join(METHODS)})")
        return asked
    return [m for m in DEPTH_MAP_METHODS if m in METHODS]


@functools.cache
def tuned_rows() -> dict[str, tuple[float, float, int]]:
    """multi30k.yaml's ``tuned:`` block: method -> (lr, dropout, warmup) that ``method=NAME`` takes."""
    from omegaconf import OmegaConf

    from tfx.config import CONF_DIR

    rows = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / "multi30k.yaml").tuned)
    return {m: (float(r["lr"]), float(r["dropout"]), int(r["warmup"])) for m, r in rows.items()}


@functools.cache
def warms_up(method: str) -> bool:
    """Whether the method's YAML takes its warmup from ``optim.budget_warmup`` (a literal 0 means it never warms up)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(METHODS[method]), resolve=False)
    return raw.get("optim", {}).get("warmup_updates", 0) != 0


def chosen_setting(method: str) -> tuple[float, float, int, bool]:
    """(lr, dropout, warmup updates, whether a tuned row gave them) of ``+experiment=multi30k method=NAME``."""
    lr, dropout, warmup = tuned_rows().get(method, DEFAULT_SETTING)
    return lr, dropout, warmup if warms_up(method) else 0, method in tuned_rows()


def cell_setting(cell: Cell) -> tuple[float, float, int]:
    """(lr, dropout, warmup updates) the cell trains at."""
    lr, dropout, warmup, _ = chosen_setting(cell.method)
    if not cell.retry:
        return lr, dropout, warmup
    retry = RETRIES.get(cell.method, GENERIC_RETRY)
    lr = retry.lr if retry.lr is not None else lr * retry.lr_factor
    return lr, dropout, warmup if retry.warmup is None else retry.warmup


def describe_setting(cell: Cell) -> str:
    lr, dropout, warmup = cell_setting(cell)
    source = "retry" if cell.retry else ("tuned" if chosen_setting(cell.method)[3] else "default: no tuned row")
    return f"{lr:g} / {dropout:g} / {warmup} ({source})"


def cell_overrides(cell: Cell, shared: list[str]) -> list[str]:
    """The ``tfx.train`` overrides of ``cell``: the study's ``shared`` ones, the method (its tuned row comes with it),
    the depth, activation checkpointing from ``CHECKPOINT_FROM``, and a retry's explicit lr and warmup."""
    depth = [f"model.encoder_layers={cell.depth}", f"model.decoder_layers={cell.depth}"]
    recompute = ["model.checkpoint_activations=true"] if cell.depth >= CHECKPOINT_FROM else []
    change = []
    if cell.retry:
        lr, _, warmup = cell_setting(cell)
        change = [f"optim.lr={lr:g}", f"optim.warmup_updates={warmup}"]
    return [*shared, f"method={cell.method}", *depth, *recompute, *change]


def stage1_cells(methods: list[str], depths: list[int]) -> list[Cell]:
    """Every method at every stage-1 depth, shallow first (results come early; a retry queues behind its cell)."""
    return [Cell(d, m) for d in sorted(depths) for m in methods]


def outcome(records: list[dict[str, Any]]) -> str:
    """``trained``, ``slow``, ``stuck``, ``diverged`` or ``unfinished``, from a run's metrics records (module
    docstring)."""
    ends = [r for r in records if r["event"] == "end"]
    status = ends[-1]["status"] if ends else "stopped"
    if status.startswith("stopped"):
        return "unfinished"
    updates = [r["train/loss"] for r in records if r["event"] == "update" and "train/loss" in r]
    valids = [r for r in records if r["event"] == "valid"]
    nonfinite = bool(updates) and not math.isfinite(updates[-1])
    nonfinite |= bool(valids) and not math.isfinite(valids[-1].get("valid/loss", math.nan))
    if status == "diverged" or nonfinite:
        return "diverged"
    best = max((r.get("valid/bleu", math.nan) for r in valids), default=math.nan)
    if best >= STUCK_BLEU:
        return "trained"
    losses = per_validation(records, "valid/loss")
    return "slow" if len(losses) >= 2 and losses[-2] - losses[-1] >= SLOW_BITS else "stuck"


def failed(result: str) -> bool:
    """An outcome that earns the cell its retry."""
    return result in ("stuck", "diverged")


def valid_bleus(records: list[dict[str, Any]]) -> list[float]:
    """Greedy valid BLEU per epoch (one validation an epoch in this study)."""
    return per_validation(records, "valid/bleu")


def per_validation(records: list[dict[str, Any]], key: str) -> list[float]:
    """``key`` of each validation in update order, the first record of an update (a resumed run may repeat one)."""
    by_step: dict[int, float] = {}
    for r in records:
        if r["event"] == "valid":
            by_step.setdefault(r["step"], r.get(key, math.nan))
    return [by_step[s] for s in sorted(by_step)]


def summarize(run: Path) -> dict[str, Any]:
    """What the table shows of one run: outcome, valid BLEU per epoch and its best, greedy test2016 BLEU (nan until
    decoded), seconds per update (the trainer's training time, validation excluded, over its updates), peak resident
    MB and wall seconds over its training sessions (``tfx.studies.peak_memory``)."""
    records = read_metrics(run / FILENAME) if (run / FILENAME).is_file() else []
    ends = [r for r in records if r["event"] == "end"]
    steps = max((r["step"] for r in records if r["event"] == "update"), default=0)
    train_seconds = ends[-1]["train_seconds"] if ends else math.nan
    done = sessions(run / SESSIONS)
    curve = valid_bleus(records)
    return {
        "outcome": outcome(records) if records else "unfinished",
        "valid_bleu": curve,
        "best_valid": best_of(curve)[0],
        "test_bleu": test_scores(run, "best", "test")[0],
        "updates": steps,
        "s_per_update": train_seconds / steps if steps else math.nan,
        "peak_mb": max((s["max_rss_mb"] for s in done), default=math.nan),
        "wall_seconds": sum(s["wall_seconds"] for s in done) if done else math.nan,
    }


def verdict(out: Path, method: str, depth: int) -> tuple[Cell, dict[str, Any]] | None:
    """The cell that speaks for ``method`` at ``depth``: its chosen setting if that trained or is not yet known,
    else its retry once that has a record; None before the chosen run has a record."""
    chosen = Cell(depth, method)
    if not (chosen.run(out) / FILENAME).is_file():
        return None
    first = summarize(chosen.run(out))
    retry = Cell(depth, method, retry=True)
    if failed(first["outcome"]) and (retry.run(out) / FILENAME).is_file():
        return retry, summarize(retry.run(out))
    return chosen, first


def settled(out: Path, method: str, depth: int) -> bool:
    """Whether the cell has its final outcome: its chosen run trained, or it failed and its retry has ended."""
    found = verdict(out, method, depth)
    return (
        found is not None
        and found[1]["outcome"] != "unfinished"
        and not (not found[0].retry and failed(found[1]["outcome"]))
    )


def stage2_methods(out: Path, methods: list[str], depth: int, others: int) -> list[str]:
    """Stage 2's methods: T-Fixup (the reference, whatever its outcome), then the ``others`` methods whose cell at
    ``depth`` (the deepest of stage 1) trained, chosen setting or retry, by highest best valid BLEU there (ties: the
    table's order). Read from the recorded runs, so a re-run chooses the same."""
    scored = []
    for method in methods:
        found = verdict(out, method, depth)
        if method != "tfixup" and found is not None and found[1]["outcome"] == "trained":
            scored.append((-found[1]["best_valid"], methods.index(method), method))
    head = ["tfixup"] if "tfixup" in methods else []
    return [*head, *(method for _, _, method in sorted(scored)[:others])]
