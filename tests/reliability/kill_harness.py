"""``python -m tests.reliability.kill_harness RUN_DIR CACHE_DIR KILLS SEED``: kill -9 a training run
during checkpoint writes, again and again, then let it finish; prints a JSON report.

Children are forked from this process after one warm-up run (lazy imports, data cache), so each
restart costs a fork and a resume rather than a Python start-up: a dozen kills take seconds. Half the kills land the
moment a checkpoint temp file appears (mid-write), half at a random moment after progress.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

from tests.reliability.helpers import tiny_cfg, with_changes
from tfx.train import train

torch.set_num_threads(1)


def temp_files(ckpts: Path) -> set[str]:
    try:
        return {e.name for e in os.scandir(ckpts) if e.name.startswith(".") and e.name.endswith(".tmp")}
    except FileNotFoundError:
        return set()


def last_step(ckpts: Path) -> int | None:
    """checkpoint_last.pt's update, loaded as users load it (weights_only); None before the first save."""
    path = ckpts / "checkpoint_last.pt"
    if not path.exists():
        return None
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


def start(cfg, run_dir: Path) -> int:
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            train(cfg, run_dir)
        finally:
            os._exit(0)
    return pid


def kill_once(cfg, run_dir: Path, rng: random.Random, mid_write: bool, old_temps: set[str]) -> dict:
    ckpts = run_dir / "checkpoints"
    before = (ckpts / "checkpoint_last.pt").stat().st_mtime_ns if (ckpts / "checkpoint_last.pt").exists() else 0
    pid = start(cfg, run_dir)
    deadline = time.time() + 60
    while time.time() < deadline:
        fresh = temp_files(ckpts) - old_temps
        if mid_write and fresh:
            break
        last = ckpts / "checkpoint_last.pt"
        if not mid_write and last.exists() and last.stat().st_mtime_ns != before:
            time.sleep(rng.uniform(0.0, 0.05))
            break
        time.sleep(0.0005)
    survivors = old_temps & temp_files(ckpts)  # the child's start should have removed these
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return {"mid_write": mid_write, "old_temps_left": sorted(survivors), "temps_after_kill": sorted(temp_files(ckpts))}


def main(run_dir: Path, cache_dir: Path, kills: int, seed: int) -> dict:
    rng = random.Random(seed)
    cfg = tiny_cfg(cache_dir, max_updates=1_000_000, save_every_updates=1, validate_every_updates=0,
                   save_every_epochs=0, layer_stats_every_updates=0, keep_last=2)  # fmt: skip
    cfg = with_changes(cfg, model={"encoder_layers": 1, "decoder_layers": 1, "d_model": 16, "ffn_dim": 32})
    train(with_changes(cfg, train={"max_updates": 1}), cache_dir / "warm_up")  # lazy imports, data cache
    report: dict = {"kills": [], "steps": []}
    temps: set[str] = set()
    for i in range(kills):
        kill = kill_once(cfg, run_dir, rng, mid_write=i % 2 == 0, old_temps=temps)
        temps = set(kill["temps_after_kill"])
        report["kills"].append(kill)
        report["steps"].append(last_step(run_dir / "checkpoints"))
    done = report["steps"][-1] or 0
    summary = train(with_changes(cfg, train={"max_updates": done + 3}), run_dir)
    report["final_step"] = summary["step"]
    report["resumed_from"] = done
    report["temps_at_end"] = sorted(temp_files(run_dir / "checkpoints"))
    return report


if __name__ == "__main__":
    run, cache, n, s = sys.argv[1:5]
    print(json.dumps(main(Path(run), Path(cache), int(n), int(s))))
