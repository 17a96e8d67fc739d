"""The depth map's report, from ``<out>`` alone (``scripts/studies/depth_map.py --replot``, and after every cell):
``depth_map.md`` (the map: outcome and best valid BLEU per method and depth; then every run with its setting,
valid BLEU per epoch, greedy test2016 BLEU, seconds per update, peak memory and wall time) and ``depth_map.png``
(best valid BLEU against depth per method, log-x; slow, stuck and diverged cells drawn with their own markers)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tfx.reporting.metrics_log import FILENAME
from tfx.studies.depth_cells import RETRIES, SLOW_BITS, STUCK_BLEU, Cell, describe_setting, summarize, verdict

MARKERS = {"trained": "o", "slow": "s", "stuck": "v", "diverged": "X"}  # stuck hollow; diverged drawn at BLEU 0
SHORT = {"trained": "T", "slow": "L", "stuck": "S", "diverged": "D", "unfinished": "…"}


def planned_cells(study: dict[str, Any]) -> list[Cell]:
    """Every cell the study has planned: stage 1, and stage 2 once chosen, each with its retry."""
    cells = [Cell(d, m) for d in study["depths"] for m in study["arms"]]
    cells += [Cell(d, m) for d in study.get("deep_depths", []) for m in study.get("stage2") or []]
    return [v for c in sorted(set(cells)) for v in (c, Cell(c.depth, c.method, retry=True))]


def fmt(value: float, spec: str = ".2f") -> str:
    return "—" if not math.isfinite(value) else format(value, spec)


def map_lines(out: Path, study: dict[str, Any]) -> list[str]:
    """The map: one row per method, one column per depth; each cell its verdict's outcome and best valid BLEU."""
    depths = sorted({*study["depths"], *study.get("deep_depths", [])})
    lines = ["| method | " + " | ".join(f"N = {d}" for d in depths) + " |", "|---|" + "---:|" * len(depths)]
    for method in study["arms"]:
        cells = []
        for depth in depths:
            found = verdict(out, method, depth)
            if found is None:
                cells.append("")
                continue
            cell, row = found
            retry = " (retry)" if cell.retry else ""
            cells.append(f"{SHORT[row['outcome']]} {fmt(row['best_valid'])}{retry}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def run_lines(out: Path, cells: list[Cell]) -> list[str]:
    """Every run that has a record: its setting, outcome, curve, test score and cost."""
    lines = [
        "| method | N | lr / dropout / warmup | outcome | valid BLEU per epoch | best valid | test2016 (greedy) "
        "| s/update | peak MB | wall h |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for cell in cells:
        if not (cell.run(out) / FILENAME).is_file():
            continue
        r = summarize(cell.run(out))
        curve = " ".join(fmt(b) for b in r["valid_bleu"]) or "—"
        lines.append(
            f"| {cell.method} | {cell.depth} | {describe_setting(cell)} | {r['outcome']} | {curve} "
            f"| {fmt(r['best_valid'])} | {fmt(r['test_bleu'])} | {fmt(r['s_per_update'])} | {fmt(r['peak_mb'], '.0f')} "
            f"| {fmt(r['wall_seconds'] / 3600)} |"
        )
    return lines


def write_report(out: Path) -> str:
    """``depth_map.md`` and ``depth_map.png`` from ``<out>/study.json`` and the run folders; the table's text."""
    study = json.loads((out / "study.json").read_text())
    cells = planned_cells(study)
    retries = sorted({c.method for c in cells if c.retry and (c.run(out) / FILENAME).is_file()})
    stage2 = study.get("stage2")
    lines = [
        "# The depth map on Multi30k De->En",
        "",
        f"Shared overrides: `{' '.join(study['overrides'])}`; wall time so far {study['wall_seconds'] / 3600:.2f} h "
        f"({study['args']['jobs']} runs at once). Outcome: diverged (non-finite), stuck (best greedy valid BLEU "
        f"below {STUCK_BLEU:g} and valid loss down less than {SLOW_BITS:g} bits over the last epoch), slow (below "
        f"{STUCK_BLEU:g} BLEU, loss still falling faster: leaving the plateau when the budget ended; no retry), "
        f"trained (T / L / S / D below, with the best valid BLEU; `…` unfinished). Stage 2 "
        + (f"methods: {', '.join(stage2)}." if stage2 else "not chosen yet."),
        "",
        *map_lines(out, study),
        "",
        *run_lines(out, cells),
        "",
        *(f"- retry of {m}: {RETRIES[m].why}" for m in retries if m in RETRIES),
    ]
    text = "\n".join(lines) + "\n"
    (out / "depth_map.md").write_text(text)
    plot(out, study, out / "depth_map.png")
    return text


def plot(out: Path, study: dict[str, Any], path: Path) -> None:
    """Best valid BLEU against depth (log-x), one line per method through each depth's verdict; a stuck cell's
    marker is hollow, a diverged one is an X at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({*study["depths"], *study.get("deep_depths", [])})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method in study["arms"]:
        found = {d: verdict(out, method, d) for d in depths}
        points = [(d, f[1]) for d, f in found.items() if f is not None and f[1]["outcome"] in MARKERS]
        if not points:
            continue
        ys = [0.0 if r["outcome"] == "diverged" else r["best_valid"] for _, r in points]
        (line,) = ax.plot([d for d, _ in points], ys, linewidth=1.2, label=method)
        for (d, r), y in zip(points, ys, strict=True):
            hollow = r["outcome"] == "stuck"
            ax.plot(d, y, MARKERS[r["outcome"]], color=line.get_color(), markersize=7,
                    markerfacecolor="none" if hollow else line.get_color())  # fmt: skip
    for outcome_name, marker in MARKERS.items():
        hollow = outcome_name == "stuck"
        ax.plot([], [], marker, color="gray", markerfacecolor="none" if hollow else "gray", linestyle="none",
                label=outcome_name)  # fmt: skip
    ax.axhline(STUCK_BLEU, color="gray", linewidth=0.8, linestyle=":")
    ax.set(xscale="log", xlabel="layers per side (N)", ylabel="best valid BLEU (greedy)")
    ax.set_title("Depth map, Multi30k De->En", fontsize=9)
    ax.set_xlim(min(depths) / 1.3, max(depths) * 1.3)  # also before any point: a log axis needs positive limits
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
