"""One study's life cycle: its record (``study.json``), its ``tfx.train`` runs, train-or-replot.

A study is one Hydra multirun of ``tfx.train`` (joblib launcher), or single runs (``train_command``) on the
slots of a ``tfx.studies.queue.RunQueue`` when its stages depend on each other, with its runs in ``<out>/runs/``;
``study.json`` records the shared overrides and wall time, so a later invocation with the same
settings adds arms to it and ``--replot`` redraws table and figure from the run folders alone.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from tfx.config import CONF_DIR
from tfx.files.atomic import atomic_open
from tfx.files.environment import Remedy, environment_errors
from tfx.studies.arms import searchpath_entries, write_arms

CHECKOUT = CONF_DIR.parent  # the folder holding conf/ and tfx/: runs start there, as from a checkout


def multirun(out: Path, arms: list[str], jobs: int, subdir: str, overrides: list[str]) -> int:
    """One ``tfx.train`` multirun (joblib, ``jobs`` runs at once) with the ``arms`` configs on Hydra's search path,
    each run in ``out/runs/<subdir>``; ``overrides`` (in their order) sweep the arms and whatever else."""
    write_arms(out / "arms", arms)
    search, overrides = searchpath(out / "arms", overrides)
    cmd = [
        sys.executable, "-m", "tfx.train", "-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}",
        search, f"hydra.sweep.dir={out / 'runs'}", f"hydra.sweep.subdir={subdir}", *overrides,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=CHECKOUT).returncode


_ONE_LINE_AT_A_TIME = threading.Lock()


def write_line(line: str, stream: TextIO) -> None:
    """``line`` whole on ``stream``: studies run their runs and decodes in threads, and print's text and its newline
    are two writes another thread's line can fall between (a study log read "by seed: 38.87[2026-12-07 00:08:14]
    study: rezero")."""
    with _ONE_LINE_AT_A_TIME:
        stream.write(line + "\n")
        stream.flush()


def train_command(out: Path, run: Path, overrides: list[str]) -> list[str]:
    """One ``tfx.train`` run in the folder ``run``, with the configs that ``write_arms`` wrote to ``out/arms`` (the
    arms, a study's tuned settings) on Hydra's search path."""
    search, overrides = searchpath(out / "arms", overrides)
    return [sys.executable, "-m", "tfx.train", f"hydra.run.dir={run}", search, *overrides]


def searchpath(folder: Path, overrides: list[str]) -> tuple[str, list[str]]:
    """(one ``hydra.searchpath`` override: ``folder``, a study's arms, then the folders of the user's own
    ``hydra.searchpath=[...]`` among ``overrides``, where methods from outside tfx live; the other overrides).
    One override, as Hydra keeps only the last."""
    entries = [f"file://{folder}", *searchpath_entries(overrides)]
    rest = [o for o in overrides if o.split("=", 1)[0] != "hydra.searchpath"]
    return f"hydra.searchpath=[{','.join(entries)}]", rest


def open_study(path: Path, fresh: dict[str, Any], arms: list[str]) -> dict[str, Any] | None:
    """The study record at ``path`` (``fresh`` when there is none) with ``arms`` added; None, after saying why,
    when it holds a study with other settings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    study = json.loads(path.read_text()) if path.exists() else fresh
    if study["overrides"] != fresh["overrides"]:
        print(f"{path} holds a study with other settings: use another --out", file=sys.stderr)
        return None
    study["arms"] += [a for a in arms if a not in study["arms"]]
    return study


def train_or_replot(args: argparse.Namespace, train: Callable[[argparse.Namespace], int],
                    report: Callable[[Path], str]) -> int:  # fmt: skip
    """A study's main: train (unless ``--replot``), then print the table written from ``<out>``; a failure of the
    machine (full disk, no permission, out of memory) is one line and exit 1 (``tfx.files.environment``)."""
    remedy = Remedy({"--out": args.out}, memory="lower --jobs (runs and decodes at once)")
    with environment_errors(Path(sys.argv[0]).name, remedy):
        if not args.replot:
            if code := train(args):
                return code
        elif not (args.out / "study.json").exists():
            print(f"--replot: {args.out / 'study.json'} not found; run the study first", file=sys.stderr)
            return 2
        print(report(args.out))
    return 0


def missing_files(data_dir: Path, names: list[str], langs: tuple[str, ...] = ("de", "en")) -> str | None:
    """Why ``data_dir`` cannot be a study's corpus (the ``{name}.{lang}`` files it lacks), or None."""
    missing = [f"{n}.{lang}" for n in names for lang in langs if not (data_dir / f"{n}.{lang}").exists()]
    return f"{data_dir}: missing {', '.join(missing)} (--data-dir: Multi30k as raw text files)" if missing else None


def run_recorded(path: Path, study: dict[str, Any], work: Callable[[], tuple[int, int]]) -> int:
    """``work()`` -> (exit code of the runs, failed decodes), its wall time added to ``study.json`` at ``path``
    even when interrupted; a stopped study says how to go on (the same command resumes it)."""
    save_study(path, study)
    tic = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _interrupted)  # a study stopped by SIGTERM records its time too
    try:
        code, failed = work()
    except KeyboardInterrupt:
        code, failed = 130, 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    study["wall_seconds"] += time.perf_counter() - tic
    save_study(path, study)
    if code or failed:
        print(f"stopped (exit {code}, {failed} decodes failed); re-run the same command to finish", file=sys.stderr)
        return code or 1
    return 0


def save_study(path: Path, study: dict[str, Any]) -> None:
    """``study.json``, whole or as it was: a full disk must not cut the record of a long study short."""
    with atomic_open(path, "w") as f:
        f.write(json.dumps(study, indent=1))


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def running_mean(values: list[float], window: int) -> list[float]:
    """The plotted curves: the mean of the last ``window`` values at each point (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]
