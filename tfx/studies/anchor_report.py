"""The published-anchor runs of ``scripts/gpu/gpu_anchor.sh`` (issue 52, docs/converged.md "published anchor"): where
each run stands, T-Fixup's lr chosen on valid, and the report's table, read back from the study folder alone.

The study folder holds one ``tfx.train`` run per folder, ``runs/<method>_lr<lr>_seed<seed>``, each evaluated by
``scripts/eval_bleu.sh RUN --avg 10`` on valid and test2016 (``checkpoints/checkpoint_avgN.{valid,test}.bleu.json``)
and on the three later test sets (``checkpoints/checkpoint_avgN.<src file>.bleu.json``, ``--refs-tokenized``).

    python -m tfx.studies.anchor_report STUDY              # the report's table (markdown) on stdout
    python -m tfx.studies.anchor_report STUDY --refs TOK   # and each run against Post-LN's of its seed, paired
    python -m tfx.studies.anchor_report STUDY --best-lr tfixup   # the lr whose last-10 average scores best on valid
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfx.evaluation.bleu import paired_bootstrap
from tfx.reporting.metrics_log import FILENAME, read_metrics
from tfx.studies.converged_runs import end_status

RUN_NAME = re.compile(r"^(?P<method>[a-z_]+)_lr(?P<lr>[0-9.e+-]+)_seed(?P<seed>\d+)$")
# eval_bleu.sh's score files by column: the run's own splits, then the --src files' names
SETS = {
    "valid": "valid",
    "test2016": "test",
    "test2017": "test_2017_flickr.en",
    "test2018": "test_2018_flickr.en",
    "MSCOCO": "test_2017_mscoco.en",
}
TESTS = ("test2016", "test2017", "test2018", "MSCOCO")  # SETS' test columns, in the table's order
# LividWo/Revisit-MMT README-baseline.md, test2016 only
ANCHOR = "| anchor: Wu et al. 2021 (fairseq, 2 GPUs) | postln | 0.005 | 1 | <= 8000 | published | | **41.02** | 71.0/47.5/34.3/24.5 | 0.999 | 12096/12103 | | | |"  # noqa: E501
HEADER = (
    "| run | method | lr | seed | updates | stop status | valid | test2016 | test2016 1-4-gram precisions | BP "
    "| hyp/ref len | test2017 | test2018 | MSCOCO |\n"
    "|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"
)
_DETAIL = re.compile(r"^(?P<prec>[\d.]+/[\d.]+/[\d.]+/[\d.]+) \(BP = (?P<bp>[\d.]+) .*hyp_len = (?P<hyp>\d+) "
                     r"ref_len = (?P<ref>\d+)\)")  # fmt: skip


def runs(study: Path) -> list[Path]:
    """The study's run folders, by method (Post-LN first), lr, seed."""
    found = [p for p in (study / "runs").glob("*") if p.is_dir() and RUN_NAME.match(p.name)]
    return sorted(found, key=lambda p: (p.name.split("_lr")[0] != "postln", *_key(p)))


def _key(run: Path) -> tuple[str, float, int]:
    m = RUN_NAME.match(run.name)
    assert m is not None
    return m["method"], float(m["lr"]), int(m["seed"])


def _newest(run: Path, column: str, suffix: str) -> Path | None:
    """The newest averaged checkpoint's ``.<set>.<suffix>`` file of ``run`` (a run evaluated once has one)."""
    files = sorted((run / "checkpoints").glob(f"checkpoint_avg*.{SETS[column]}.{suffix}"),
                   key=lambda p: p.stat().st_mtime)  # fmt: skip
    return files[-1] if files else None


def score(run: Path, column: str) -> dict[str, Any] | None:
    """The tokenized-BLEU result (score, signature, detail) of one evaluation of ``run``'s last-N average; None
    before it is scored."""
    path = _newest(run, column, "bleu.json")
    return json.loads(path.read_text())["scores"][-1] if path else None  # a data.tokenized run: tokenized BLEU only


def stands(run: Path) -> tuple[int, str]:
    """(updates, how the run stands): its metrics' last step, and ``completed``, ``early stop: ...``, ``diverged``,
    ``stopped by SIGTERM`` (the same command resumes it), ``training`` (no end yet) or ``not started``."""
    path = run / FILENAME
    if not path.exists():
        return 0, "not started"
    records = read_metrics(path)
    step = max((r.get("step", 0) for r in records), default=0)
    return step, end_status(run) or "training"


def _cell(result: dict[str, Any] | None) -> str:
    return f"{result['score']:.2f}" if result else ""


def row(run: Path) -> str:
    method, lr, seed = _key(run)
    updates, status = stands(run)
    test = score(run, "test2016")
    detail = _DETAIL.match(test["detail"]) if test else None
    prec, bp, lens = (detail["prec"], detail["bp"], f"{detail['hyp']}/{detail['ref']}") if detail else ("", "", "")
    cells = [run.name, method, f"{lr:g}", str(seed), str(updates), status, _cell(score(run, "valid")), _cell(test),
             prec, bp, lens, *(_cell(score(run, c)) for c in TESTS[1:])]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def summary_lines(study: Path) -> list[str]:
    """Mean +- std of each (method, lr) over its scored seeds, per test set."""
    groups: dict[tuple[str, float], list[Path]] = {}
    for run in runs(study):
        groups.setdefault(_key(run)[:2], []).append(run)
    lines = []
    for (method, lr), members in groups.items():
        cells = []
        for column in TESTS:
            values = [r["score"] for r in (score(m, column) for m in members) if r]
            if values:
                std = f" +- {statistics.stdev(values):.2f}" if len(values) > 1 else ""
                cells.append(f"{column} {statistics.mean(values):.2f}{std} (n={len(values)})")
        if cells:
            lines.append(f"- {method} lr {lr:g}: " + "; ".join(cells))
    return lines


def table(study: Path, refs: Path | None = None) -> str:
    """The report's table (the anchor's row first), then each setting's mean +- std over its scored seeds, then
    (given the tokenized corpus ``refs``) each run against Post-LN's of its seed by paired bootstrap."""
    lines = [HEADER, ANCHOR, *(row(run) for run in runs(study))]
    if summary := summary_lines(study):
        lines += ["", *summary]
    if refs is not None:
        lines += paired_lines(study, refs)
    return "\n".join(lines)


def hypotheses(run: Path, column: str) -> list[str] | None:
    """The decode ``score`` read the BLEU of, one line a sentence."""
    path = _newest(run, column, "hyp")
    return path.read_text(encoding="utf-8").splitlines() if path else None


def reference(refs: Path, column: str, src: str = "en", tgt: str = "de") -> Path:
    """The tokenized reference of a test column in the pretokenized corpus: ``test.de`` for the run's own
    test2016, ``test_2017_flickr.de`` for ``--src test_2017_flickr.en``."""
    return refs / f"{SETS[column].removesuffix(f'.{src}')}.{tgt}"


def paired_lines(study: Path, refs: Path, baseline: str = "postln") -> list[str]:
    """Each scored run against ``baseline``'s run of the same seed, per test set both decoded: the anchor's metric
    (tokenized BLEU4) and its paired bootstrap (1000 samples, fixed seed). Test-set noise only, one pair of runs."""
    base = {_key(r)[2]: r for r in runs(study) if _key(r)[0] == baseline}
    lines = []
    for run in runs(study):
        method, lr, seed = _key(run)
        if method == baseline or seed not in base:
            continue
        cells = []
        for column in TESTS:
            ours, theirs, ref = hypotheses(run, column), hypotheses(base[seed], column), reference(refs, column)
            if ours is None or theirs is None or not ref.is_file():
                continue
            result = paired_bootstrap(theirs, {method: ours}, ref.read_text(encoding="utf-8").splitlines(),
                                      tokenized=True)[method]  # fmt: skip
            cells.append(f"{column} {result.score:.2f} vs {result.baseline:.2f} "
                         f"({result.score - result.baseline:+.2f}, p = {result.p_value:.3f})")  # fmt: skip
        if cells:
            lines.append(f"- {run.name} against {base[seed].name}: " + "; ".join(cells))
    if not lines:
        return []
    head = (f"Paired bootstrap against {baseline} of the same seed (tokenized BLEU4 of the last-10 average, 1000 "
            "resamples of the test sentences; p: how often a difference this large arises by chance):")  # fmt: skip
    return ["", head, "", *lines]


def best_lr(study: Path, method: str, seed: int = 1) -> tuple[float | None, str]:
    """(the lr of ``method``'s seed-``seed`` runs whose last-N average scores best on valid, or None; why). Diverged
    runs and runs without a valid score are left out; equal scores go to the lower lr."""
    scored = []
    for run in runs(study):
        m, lr, s = _key(run)
        if m != method or s != seed:
            continue
        result, status = score(run, "valid"), stands(run)[1]
        if result and not status.startswith("diverged") and math.isfinite(result["score"]):
            scored.append((result["score"], -lr))
    if not scored:
        return None, f"no {method} seed-{seed} run scored on valid"
    bleu, neg_lr = max(scored)
    return -neg_lr, f"{method} lr {-neg_lr:g}: valid {bleu:.2f}, best of {len(scored)} scored"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfx.studies.anchor_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="the study folder (its runs in runs/)")
    parser.add_argument("--best-lr", metavar="METHOD", help="print the lr of METHOD's seed-1 runs best on valid")
    parser.add_argument("--refs", type=Path, metavar="TOK",
                        help="the pretokenized corpus the runs trained on (python -m tfx.data.pretokenize): adds the "
                        "paired bootstrap of each run against Post-LN's of the same seed")  # fmt: skip
    args = parser.parse_args(argv)
    if args.refs is not None and not (args.refs / "test.de").is_file():
        print(f"error: --refs {args.refs}: no test.de there; give the folder python -m tfx.data.pretokenize wrote",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.best_lr:
        lr, why = best_lr(args.study, args.best_lr)
        print(why, file=sys.stderr)
        if lr is None:
            return 1
        print(f"{lr:g}")
        return 0
    print(table(args.study, args.refs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
