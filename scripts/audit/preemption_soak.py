"""Interrupt one training run again and again with SIGKILL, SIGTERM and SIGINT, relaunch it by the same command
each time, and compare its end bit for bit with an uninterrupted run of the same command (issue 69).

    python scripts/audit/preemption_soak.py OUT                     # 20 interruptions, signals mixed
    python scripts/audit/preemption_soak.py OUT --interruptions 3   # the short version the tests run

Each launch is a fresh ``python -m tfx.train`` process with the identical command line (a tiny toy model, one
thread, fp32, frequent validation and saves, so that signals land in updates, validations and saves). Each
interruption waits until the relaunched run has logged an update past its resume point (so every one costs
work), then a random delay, then a random signal. After the last one the run goes on to its end. Compared
with the uninterrupted run: checkpoint_last.pt's weights, Adam moments, RNG streams and counters; the set of
checkpoint files and the update each holds; every update's logged loss in metrics.jsonl. Prints one line per
interruption and a verdict; exits 1 on any difference. Not a timed test: CI runs the short version
(tests/scripts/audit/test_preemption_soak.py).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import _require_tfx  # noqa: F401  (one-line error when tfx is not installed)
import torch

from tfx.checkpoints.load import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
VALIDATE_EVERY = 15
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
RUN = [  # toy task, 2+2 layers d 32: 19 updates an epoch; validation (400 sentences, about as long as 15 updates)
    # every 15 updates, so that about a third of the signals land in one; a save every 10
    "model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=32", "model.ffn_dim=64",
    "data.toy_train_size=600", "data.toy_valid_size=400", "train.valid_max_sentences=0", "train.progress=false",
    "train.threads=1", "data.max_tokens=256", "train.precision=fp32", "train.max_updates=600",
    f"train.validate_every_updates={VALIDATE_EVERY}", "train.save_every_updates=10", "train.save_every_epochs=0",
    "train.keep_last=4", "train.log_every_updates=5",
]  # fmt: skip


def command(run_dir: Path, cache: Path, max_updates: int) -> list[str]:
    overrides = [o for o in RUN if not o.startswith("train.max_updates=")] + [f"train.max_updates={max_updates}"]
    return [sys.executable, "-m", "tfx.train", f"hydra.run.dir={run_dir}", f"data.cache_dir={cache}", *overrides]


def logged_updates(run_dir: Path) -> list[tuple[int, float]]:
    """(update, loss) of every update record in metrics.jsonl (a resumed run rewrites it to its start)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by SIGKILL (the resumed run rewrites the file)
        if record.get("event") == "update":
            records.append((record["step"], record["train/loss"]))
    return records


def interrupt_once(cmd: list[str], run_dir: Path, rng: random.Random) -> dict:
    """Launch, wait for an update past the resume point plus a random delay, send a random signal."""
    start = max((s for s, _ in logged_updates(run_dir)), default=0)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if max((s for s, _ in logged_updates(run_dir)), default=0) > start:
            break
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 1.0))  # about 15 updates a second: a signal within the next ~15
    sig = rng.choice(SIGNALS)
    ended_before = proc.poll() is not None
    if not ended_before:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    # 0: it saved and exited; killed by the signal itself: SIGKILL, or SIGTERM before the loop took the signals
    # over (nothing to save yet) or after it ended; 130: SIGINT then (tfx.train's one line, no traceback)
    if proc.returncode not in (0, -sig, 130 if sig == signal.SIGINT else 0):
        sys.exit(f"error: the run exited {proc.returncode} after {sig.name}:\n{err[-2000:]}")
    last = run_dir / "checkpoints" / "checkpoint_last.pt"
    saved = load_checkpoint(last) if last.exists() else {"step": 0, "train_state": {"validated_step": 0}}
    step, validated = saved["step"], saved["train_state"]["validated_step"]
    in_validation = sig != signal.SIGKILL and step % VALIDATE_EVERY == 0 and validated < step  # saved unvalidated
    return {"signal": sig.name, "from": start, "saved": step, "in_validation": in_validation,
            "ended_first": ended_before, "rc": proc.returncode}  # fmt: skip


def final_state(run_dir: Path) -> dict:
    ckpts = run_dir / "checkpoints"
    last = torch.load(ckpts / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    files = {p.name: load_checkpoint(p)["step"] for p in sorted(ckpts.glob("checkpoint_*.pt"))}
    return {"last": last, "files": files, "losses": logged_updates(run_dir)}


def differences(a: object, b: object, where: str = "") -> list[str]:
    """Every place where two checkpoint trees differ, tensors bit for bit."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]


def comparable(state: dict) -> dict:
    """What must match: not the training clock (wall time differs) nor the path names."""
    last = dict(state["last"])
    last["train_state"] = {k: v for k, v in last["train_state"].items() if k not in ("train_seconds",)}
    return {"last": last, "files": state["files"], "losses": state["losses"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/audit/preemption_soak.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out", type=Path, help="a new folder for the two runs and the data cache")
    parser.add_argument("--interruptions", type=int, default=20)
    parser.add_argument("--max-updates", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng, cache = random.Random(args.seed), args.out / "cache"
    reference, run = args.out / "uninterrupted", args.out / "interrupted"
    tic = time.perf_counter()
    subprocess.run(command(reference, cache, args.max_updates), cwd=REPO, check=True, capture_output=True)
    print(f"uninterrupted: {time.perf_counter() - tic:.0f} s", flush=True)
    cmd = command(run, cache, args.max_updates)
    counts: dict[str, int] = {}
    inside = 0
    for i in range(args.interruptions):
        kill = interrupt_once(cmd, run, rng)
        counts[kill["signal"]] = counts.get(kill["signal"], 0) + 1
        inside += kill["in_validation"]
        where = ", inside a validation" if kill["in_validation"] else ""
        ended = ", the run had ended" if kill["ended_first"] else ""
        print(f"interruption {i + 1}: {kill['signal']} (logged to update {kill['from']} at launch; checkpoint_last.pt "
              f"at {kill['saved']}{where}{ended})", flush=True)  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    diffs = differences(comparable(final_state(run)), comparable(final_state(reference)))
    mix = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    print(f"{args.interruptions} interruptions ({mix}; {inside} inside a validation), "
          f"{time.perf_counter() - tic:.0f} s in all")  # fmt: skip
    if diffs:
        print(f"DIFFERENT from the uninterrupted run at: {', '.join(diffs[:20])}")
        return 1
    final = final_state(run)
    step, files, losses = final["last"]["step"], len(final["files"]), len(final["losses"])
    print(f"identical to the uninterrupted run: weights, Adam moments, RNG and counters at update {step}, "
          f"{files} checkpoint files, {losses} logged losses")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
