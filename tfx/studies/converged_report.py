"""A converged study's report, from its folder alone (``scripts/studies/converged_study.py --replot``):
``converged_study.md`` (mean +- std over seeds and each seed's value, each arm against T-Fixup by paired bootstrap,
the finalists, each arm's grid, where each run stands) and the figures ``converged_study.png`` (valid BLEU per
epoch, seed bands) and ``converged_grid.png`` (each arm's grid as a heatmap)."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

from tfx.data.sources import read_lines
from tfx.evaluation.bleu import paired_bootstrap
from tfx.studies.arms import ARMS, DEFAULT_ARMS
from tfx.studies.converged_runs import (
    KINDS,
    TEST_SETS,
    WINDOW,
    Setting,
    best_of,
    best_valid,
    end_status,
    ended,
    final_runs,
    finalist_name,
    grid_run,
    grid_settings,
    hyp_path,
    score_path,
    setting_name,
    test_scores,
    valid_curve,
)

DASHES = ["--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3))]  # the not-chosen finalists in the figure


def mean_std(values: list[float], digits: int = 2) -> str:
    """``mean ± std (v1 / v2 / ...)`` over the finite values (sample std; one value: no ±); each value to
    ``digits`` places, mean and std to at least one (epochs are whole, their mean need not be)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "—"
    each = each_value(finite, digits)
    if len(finite) == 1:
        return each
    places = max(digits, 1)
    return f"{statistics.fmean(finite):.{places}f} ± {statistics.stdev(finite):.{places}f} ({each})"


def in_arm_order(by_arm: dict[str, Any]) -> dict[str, Any]:
    """``by_arm`` in ``DEFAULT_ARMS``'s order (T-Fixup first), then any other arm in ``ARMS``'s: a study whose arms
    were added over several runs of the script (Pre-LN's first, say) reports them, and tests them against T-Fixup,
    as one that had them all at once."""
    order = [*DEFAULT_ARMS, *(arm for arm in ARMS if arm not in DEFAULT_ARMS)]
    return dict(sorted(by_arm.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))


def each_value(values: list[float], digits: int = 2) -> str:
    """``v1 / v2 / ...``: the finite values, no mean; a dash for none."""
    return " / ".join(f"{v:.{digits}f}" for v in values if math.isfinite(v)) or "—"


def best_cells(runs: list[Path]) -> tuple[str, str]:
    """An arm's "epochs to best" and "valid" cells: mean ± std over the seeds that have ended, those still training
    (or stopped before they ended) counted, not averaged in: a seed at epoch 1 averaged with one at epoch 25 is no
    mean of converged runs. When none has ended (a GPU window's box stopped them all), each seed where it stands."""
    curves = {run: valid_curve(run) for run in runs}
    started = [run for run, curve in curves.items() if curve]
    done = [run for run in started if ended(run)]
    if started and not done:
        stat, shown, note = each_value, started, " [none ended]"
    else:
        stat, shown = mean_std, done
        note = f" [+{len(started) - len(done)} not ended]" if len(done) < len(started) else ""
    bests = [best_of(curves[run]) for run in shown]
    return stat([float(e) for _, e in bests if e], digits=0) + note, stat([b for b, _ in bests]) + note


def write_report(out: Path) -> str:
    study = json.loads((out / "study.json").read_text())
    study["settings"], study["finalists"] = in_arm_order(study["settings"]), in_arm_order(study.get("finalists", {}))
    args = argparse.Namespace(**{"tuned": {}, **study["args"]})  # a study recorded before --tuned existed has none
    lines = [
        f"# Converged comparison: Multi30k {args.direction}, {args.layers}+{args.layers} layers, seeds {args.seeds}",
        "",
        f"Every run: `{' '.join(study['overrides'])}`; grid: lr {args.lrs} x dropout {args.dropouts} x warmup "
        f"{args.warmups} ({args.grid_epochs} epochs, seed 1; warmup-free methods: warmup 0){tuned_text(args)}; per lr "
        f"and dropout the grid's best warmup trained on (patience {args.patience}, at most {args.max_epochs} epochs), "
        f"the best on valid is the arm's setting. Test: beam 5; `best` = the best-valid checkpoint, `avg` = the best "
        f"window of {WINDOW} numbered checkpoints on valid. sacreBLEU (13a, cased) / tokBLEU (lowercased, tokenized). "
        f"Wall time {study['wall_seconds'] / 60:.1f} min.",
        "",
        "| arm | setting | epochs to best | valid | " + " | ".join(
            f"{label} {kind} sacre / tok" for label in TEST_SETS.values() for kind in KINDS) + " |",
        "|---|---|---|---|" + "---|" * (len(TEST_SETS) * len(KINDS)),
    ]  # fmt: skip
    for arm, setting in study["settings"].items():
        runs = list(final_runs(out, finalist_name(arm, *setting[:2]), args.seeds).values())
        cells = [setting_name(*setting), *best_cells(runs)]
        for test in TEST_SETS:
            for kind in KINDS:
                pairs = [test_scores(r, kind, test) for r in runs]
                cells.append(f"{mean_std([p[0] for p in pairs])} / {mean_std([p[1] for p in pairs])}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += significance_lines(out, study, args)
    lines += finalist_lines(out, study, args)
    lines += grid_lines(out, study, args)
    lines += run_lines(out)
    text = "\n".join(lines) + "\n"
    (out / "converged_study.md").write_text(text)
    plot(out, study, args)
    plot_grid(out, study, args)
    return text


def finalist_lines(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Every finalist's grid and converged valid BLEU and its test2016 score; none for a study that chose nothing
    (``--tuned`` arms whose seed 1 ran elsewhere)."""
    if not study.get("finalists"):
        return []
    test = next(iter(TEST_SETS))
    label = TEST_SETS[test]
    lines = ["", f"Finalists (seed 1; greedy valid BLEU, best and at the end of the grid's budget; {label} sacreBLEU "
             "of the best-valid checkpoint, beam 5: is the choice on valid the choice on test? `...`: not ended yet, "
             "its best so far):", "",
             f"| arm | setting | grid valid | converged valid | epochs to best | epochs | {label} | chosen |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, finalists in study["finalists"].items():
        for name, setting in finalists.items():
            run = final_runs(out, name, [1])[1]
            mark = "yes" if arm in study["settings"] and list(setting) == list(study["settings"][arm]) else ""
            if not run.exists():  # not started (a study run --until grid): the grid's score, the rest to come
                grid = best_valid(grid_run(out, arm, tuple(setting)))[0]
                cells = [f"{grid:.2f}", "not started", "—", "—", "—"]
            else:
                curve = valid_curve(run)
                bleu, epoch = best_of(curve)
                grid = max(curve[: args.grid_epochs], default=math.nan)
                scored = f"{test_scores(run, 'best', test)[0]:.2f}".replace("nan", "—")
                going = "" if ended(run) else " ..."  # queued or training: its best so far, not a converged score
                cells = [f"{grid:.2f}", f"{bleu:.2f}{going}", str(epoch), f"{len(curve)}{going}", scored]
            cells = [arm, setting_name(*setting), *cells, mark]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def run_lines(out: Path) -> list[str]:
    """Where each converged run stands: its valid BLEU per epoch and how it ended (`...`: still training or
    stopped before it ended), so a study stopped mid-way (a GPU window's box) shows what each run reached."""
    runs = sorted((out / "runs" / "final").glob("*/seed*"))
    if not runs:
        return []
    lines = ["", "Where each run stands (greedy valid BLEU per epoch; how it ended, `...` while it has not):", ""]
    for run in runs:
        curve = " ".join(f"{b:.2f}" for b in valid_curve(run))
        lines.append(f"- {run.parent.name}/{run.name}: {curve} [{end_status(run) or '...'}]")
    return lines


def tuned_text(args: argparse.Namespace) -> str:
    """The report's words for the arms whose setting was tuned elsewhere (``--tuned``), if any."""
    if not args.tuned:
        return ""
    return "; tuned elsewhere, a grid of one setting: " + ", ".join(
        f"{a} {setting_name(*s)}" for a, s in args.tuned.items())  # fmt: skip


def grid_cells(out: Path, arm: str, args: argparse.Namespace) -> dict[tuple[float, float], dict[int, list[float]]]:
    """An arm's grid: per (lr, dropout), per warmup, the greedy valid BLEU of each epoch run so far."""
    cells: dict[tuple[float, float], dict[int, list[float]]] = {}
    for lr, dropout, warmup in grid_settings(arm, args):
        cells.setdefault((lr, dropout), {})[warmup] = valid_curve(grid_run(out, arm, (lr, dropout, warmup)))
    return cells


def grid_lines(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Each arm's grid as a table, a row per lr and dropout and a column per warmup: the valid BLEU after each
    epoch, the setting each finalist continues in bold, `...` after a run that has not ended."""
    lines = []
    for arm in in_arm_order(dict.fromkeys(study["arms"])):
        cells = grid_cells(out, arm, args)
        if not any(curve for row in cells.values() for curve in row.values()):
            continue
        warmups = list(next(iter(cells.values())))
        finalists = {tuple(s) for s in study.get("finalists", {}).get(arm, {}).values()}
        lines += ["", f"{arm}'s grid (seed 1; greedy valid BLEU after epoch 1 / ... / {args.grid_epochs}; bold: the "
                  "setting a finalist continues):", "",
                  "| lr | dropout | " + " | ".join(f"warmup {w}" for w in warmups) + " |",
                  "|---|---|" + "---|" * len(warmups)]  # fmt: skip
        for (lr, dropout), row in cells.items():
            texts = []
            for warmup, curve in row.items():
                text = " / ".join(f"{b:.2f}" for b in curve) or "—"
                if curve and not ended(grid_run(out, arm, (lr, dropout, warmup))):
                    text += " ..."
                texts.append(f"**{text}**" if (lr, dropout, warmup) in finalists else text)
            lines.append(f"| {lr:g} | {dropout:g} | " + " | ".join(texts) + " |")
    return lines


def plot_grid(out: Path, study: dict[str, Any], args: argparse.Namespace) -> dict[str, list[list[float]]]:
    """``converged_grid.png``: a heatmap per arm of its grid's valid BLEU at the grid's last epoch (rows lr and
    dropout, columns warmup; one colour scale for every arm, the finalists framed). Returns each arm's matrix (nan
    where a run has not reached that epoch); no figure when no grid run has."""
    matrices, grids, finalists = {}, {}, study.get("finalists", {})
    for arm in in_arm_order(dict.fromkeys(study["arms"])):
        grids[arm] = grid_cells(out, arm, args)
        last = [[c[args.grid_epochs - 1] if len(c) >= args.grid_epochs else math.nan for c in row.values()]
                for row in grids[arm].values()]  # fmt: skip
        if any(math.isfinite(v) for row in last for v in row):
            matrices[arm] = last
    if not matrices:
        return matrices
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    values = [v for m in matrices.values() for row in m for v in row if math.isfinite(v)]
    low, high = min(values), max(values)
    widths = [len(m[0]) for m in matrices.values()]  # a column per warmup, the same size in every panel
    fig, axes = plt.subplots(1, len(matrices), figsize=(2.0 + 1.0 * sum(widths), 3.0), squeeze=False,
                             gridspec_kw={"width_ratios": widths}, layout="constrained")  # fmt: skip
    labelled: list[tuple[float, float]] = []  # the rows of the panel to the left, whose labels this one shares
    for ax, (arm, matrix) in zip(axes[0], matrices.items(), strict=True):
        warmups, rows = list(next(iter(grids[arm].values()))), list(grids[arm])
        framed = {tuple(s) for s in finalists.get(arm, {}).values()}
        image = ax.imshow(matrix, cmap="viridis", vmin=low, vmax=high, aspect="auto")
        for i, j in itertools.product(range(len(rows)), range(len(warmups))):
            if math.isfinite(value := matrix[i][j]):
                dark = value < (low + high) / 2  # white on viridis' dark half, black on its light half
                ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8, color="white" if dark else "k")
            if (*rows[i], warmups[j]) in framed:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_xticks(range(len(warmups)), [str(w) for w in warmups], fontsize=8)
        ax.set_yticks(range(len(rows)), row_labels(rows, labelled), fontsize=8)
        labelled = rows
        ax.set(title=arm, xlabel="warmup")
    axes[0][0].set_ylabel("peak lr / dropout")
    fig.colorbar(image, ax=axes[0].tolist(), label=f"valid BLEU, epoch {args.grid_epochs} (red: finalist)")
    fig.savefig(out / "converged_grid.png", dpi=110)
    plt.close(fig)
    return matrices


def row_labels(rows: list[tuple[float, float]], left: list[tuple[float, float]]) -> list[str]:
    """A heatmap panel's row labels (``lr / dropout``), or none where the panel to its left has the same rows and
    its labels serve both; a grid of one (an arm tuned elsewhere) beside a full grid labels its own."""
    return [] if rows == left else [f"{lr:g} / {d:g}" for lr, d in rows]


def significance_lines(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Each arm against the first arm (T-Fixup, in ``in_arm_order``), seed by seed (seed s against T-Fixup's seed
    s), on every test decode: sacreBLEU difference and the paired bootstrap's p-value. Test-set noise only: a
    row is two runs; the seeds' spread is the table's ± above."""
    settings = study["settings"]
    if len(settings) < 2:
        return []
    baseline, tgt = next(iter(settings)), args.direction.split("-")[1]
    paths = {test: Path(args.data_dir) / f"{test}.{tgt}" for test in TEST_SETS}
    refs = {test: read_lines(path) for test, path in paths.items() if path.is_file()}  # once, for every seed
    rows = [seed_row(out, settings, seed, refs) for seed in args.seeds]
    return ["", f"Against {baseline}, seed by seed (sacreBLEU difference and the paired bootstrap's p-value, 1000 "
            f"resamples, sacrebleu's --paired-bs, so 0.001 is its smallest p: the test set's sampling noise, not the "
            f"seeds'):", "",
            "| arm | seed | " + " | ".join(f"{label} {kind}" for label in TEST_SETS.values() for kind in KINDS) + " |",
            "|---|---|" + "---|" * (len(TEST_SETS) * len(KINDS)),
            *(f"| {arm} | {seed} | " + " | ".join(cells) + " |" for seed, row in zip(args.seeds, rows, strict=True)
              for arm, cells in row.items())]  # fmt: skip


def seed_row(out: Path, settings: dict[str, Any], seed: int, refs: dict[str, list[str]]) -> dict[str, list[str]]:
    """One seed's cells for each arm after the first, against the first arm's run of the same seed; a dash where a
    decode is missing (not run yet) or a test set has no references in ``refs`` (a replot away from the corpus)."""
    baseline, *others = settings
    runs = {arm: final_runs(out, finalist_name(arm, *settings[arm][:2]), [seed])[seed] for arm in settings}
    cells: dict[str, list[str]] = {arm: [] for arm in others}
    for test, kind in itertools.product(TEST_SETS, KINDS):
        scored = [arm for arm in others if score_path(runs[arm], kind, test).exists()]
        results = {}
        if scored and score_path(runs[baseline], kind, test).exists() and test in refs:
            hyps = {arm: read_lines(hyp_path(runs[arm], kind, test)) for arm in [baseline, *scored]}
            results = paired_bootstrap(hyps.pop(baseline), hyps, refs[test])
        for arm in others:
            r = results.get(arm)
            cells[arm].append(f"{r.score - r.baseline:+.2f} (p {r.p_value:.3f})" if r else "—")
    return cells


def plot(out: Path, study: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Valid BLEU per epoch: each arm's setting, the mean over seeds with their range as a band; the arm's other
    finalists (seed 1) dashed, in the same colour, each with its own dashes. An arm still choosing (a replot
    during the study) shows its finalists so far, all dashed. Returns the legend's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    finalists = study.get("finalists", {})
    for arm in dict.fromkeys([*study["settings"], *finalists]):
        color, setting = None, study["settings"].get(arm)
        if setting is not None:
            color = plot_setting(ax, out, arm, setting, args.seeds)
        others = [(n, o) for n, o in finalists.get(arm, {}).items() if setting is None or list(o) != list(setting)]
        state = "not chosen" if setting is not None else "converging"
        for (name, other), dashes in zip(others, itertools.cycle(DASHES)):  # a dash pattern per finalist
            if curve := valid_curve(final_runs(out, name, [1])[1]):
                (line,) = ax.plot(range(1, len(curve) + 1), curve, linestyle=dashes, linewidth=1, color=color,
                                  label=f"{arm} ({setting_name(*other)}, {state})")  # fmt: skip
                color = line.get_color()  # the arm's colour, for its other finalists
    ax.set(xlabel="epoch", ylabel="valid BLEU (greedy)", title="valid BLEU per epoch (mean; band: seeds' range)")
    ax.grid(alpha=0.3)
    has_curves = bool(ax.get_legend_handles_labels()[1])  # none yet: a study run --until grid
    labels = [text.get_text() for text in ax.legend(fontsize=7).get_texts()] if has_curves else []
    fig.tight_layout()
    fig.savefig(out / "converged_study.png", dpi=110)
    plt.close(fig)
    return labels


def plot_setting(ax: Any, out: Path, arm: str, setting: Setting, seeds: list[int]) -> str | None:
    """An arm's chosen setting: the mean over its seeds' curves, their range as a band; returns its colour."""
    curves = [c for c in map(valid_curve, final_runs(out, finalist_name(arm, *setting[:2]), seeds).values()) if c]
    if not curves:
        return None
    n = max(map(len, curves))
    at = [[c[i] for c in curves if i < len(c)] for i in range(n)]
    epochs = range(1, n + 1)
    (line,) = ax.plot(epochs, [statistics.fmean(v) for v in at], marker="o", markersize=3,
                      label=f"{arm} ({setting_name(*setting)})")  # fmt: skip
    ax.fill_between(epochs, [min(v) for v in at], [max(v) for v in at], alpha=0.2, color=line.get_color())
    return line.get_color()
