"""tfx/studies/queue.py: at most ``jobs`` commands at once, a free slot to the earliest arm (and never to a later
one while an earlier arm is between stages), a stop that lets the running commands save and starts no more. Real
subprocesses (Python one-liners), CPU."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tfx.studies.queue import STOPPED, RunQueue


def _until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _queued(queue: RunQueue, cmd: list[str], priority: int, codes: dict[str, int], key: str) -> threading.Thread:
    thread = threading.Thread(target=lambda: codes.__setitem__(key, queue.run(cmd, priority).returncode))
    thread.start()
    return thread


def test_a_free_slot_goes_to_the_lowest_priority_then_the_first_asked(tmp_path: Path) -> None:
    log, go = tmp_path / "order.txt", tmp_path / "go"
    queue, codes = RunQueue(1, tmp_path), {}
    blocker = ["import os, time", f"while not os.path.exists({str(go)!r}): time.sleep(0.01)"]
    threads = [_queued(queue, [sys.executable, "-c", "\n".join(blocker)], 5, codes, "blocker")]
    _until(lambda: queue.running == 1)
    for key, priority in [("late arm", 2), ("first arm", 0), ("second arm", 1), ("first arm again", 0)]:
        write = f"open({str(log)!r}, 'a').write({key!r} + '\\n')"
        threads.append(_queued(queue, [sys.executable, "-c", write], priority, codes, key))
        queued = len(threads) - 1
        _until(lambda: queue.waiting == queued)  # noqa: B023 (called before the next round)
    go.touch()
    for thread in threads:
        thread.join(30)
    assert log.read_text().splitlines() == ["first arm", "first arm again", "second arm", "late arm"]
    assert set(codes.values()) == {0}


def test_no_more_than_jobs_commands_run_at_once(tmp_path: Path) -> None:
    queue, codes = RunQueue(2, tmp_path), {}
    spans = [tmp_path / f"span{i}" for i in range(5)]
    cmd = "import time, sys; a = time.time(); time.sleep(0.3); open(sys.argv[1], 'w').write(f'{a} {time.time()}')"
    threads = [_queued(queue, [sys.executable, "-c", cmd, str(span)], 0, codes, span.name) for span in spans]
    for thread in threads:
        thread.join(60)
    intervals = [tuple(map(float, span.read_text().split())) for span in spans]
    most = max(sum(start <= t < end for start, end in intervals) for t, _ in intervals)
    assert most == 2 and set(codes.values()) == {0}


def test_stop_signals_the_running_commands_and_starts_no_more(tmp_path: Path) -> None:
    saved, never, ready = tmp_path / "saved", tmp_path / "never", tmp_path / "ready"
    queue, codes = RunQueue(1, tmp_path), {}
    running = _queued(queue, _saves_when_stopped(ready, saved, 0), 0, codes, "running")
    _until(ready.exists)
    waiting = _queued(queue, [sys.executable, "-c", f"open({str(never)!r}, 'w')"], 0, codes, "waiting")
    _until(lambda: queue.waiting == 1)
    queue.stop()
    running.join(30)
    waiting.join(30)
    assert codes == {"running": 0, "waiting": STOPPED} and queue.stopped
    assert saved.read_text() == "checkpoint" and not never.exists()


def _saves_when_stopped(ready: Path, saved: Path, code: int) -> list[str]:
    """A command that writes ``ready``, then waits; on SIGTERM it writes ``saved`` and exits with ``code``."""
    handler = [
        "import signal, sys, time",
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(saved)!r}, 'w').write('checkpoint'), sys.exit({code})))",
        f"open({str(ready)!r}, 'w')",
        "time.sleep(60)",
    ]
    return [sys.executable, "-c", "\n".join(handler)]


def _writer(log: Path, key: str) -> list[str]:
    return [sys.executable, "-c", f"open({str(log)!r}, 'a').write({key!r} + '\\n')"]


def test_a_later_arm_waits_while_an_earlier_one_is_between_stages(tmp_path: Path) -> None:
    log, codes = tmp_path / "order.txt", {}
    queue = RunQueue(1, tmp_path, arms=2)  # the slot is free, arm 0 choosing its next stage
    late = _queued(queue, _writer(log, "arm 1"), 1, codes, "arm 1")
    _until(lambda: queue.waiting == 1)
    time.sleep(1.0)
    assert not log.exists() and queue.running == 0  # the free slot is kept for arm 0
    first = _queued(queue, _writer(log, "arm 0, next stage"), 0, codes, "arm 0")
    first.join(30)
    time.sleep(1.0)  # arm 0 between stages again
    assert log.read_text().splitlines() == ["arm 0, next stage"]
    queue.done(0)  # arm 0 has finished: arm 1 may go
    late.join(30)
    assert log.read_text().splitlines() == ["arm 0, next stage", "arm 1"] and codes == {"arm 0": 0, "arm 1": 0}


def test_a_later_arm_takes_the_slot_that_an_earlier_arms_last_run_leaves_idle(tmp_path: Path) -> None:
    log, go, codes = tmp_path / "order.txt", tmp_path / "go", {}
    queue = RunQueue(2, tmp_path, arms=2)
    finalist = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)"
    long = _queued(queue, [sys.executable, "-c", finalist], 0, codes, "arm 0's long finalist")
    _until(lambda: queue.running == 1)
    _queued(queue, _writer(log, "arm 1's grid run"), 1, codes, "arm 1").join(30)  # while arm 0's still trains
    assert log.read_text().splitlines() == ["arm 1's grid run"] and long.is_alive()
    go.touch()
    long.join(30)
    assert set(codes.values()) == {0}


def test_then_follows_each_command_on_its_slot_before_the_next_waiting_command(tmp_path: Path) -> None:
    """A converged run's decodes (``then``, with ``run_here``) run on its slot before the slot goes to the next
    waiting run: one slot, three runs, each run's decode right after it."""
    log = tmp_path / "order.txt"
    queue = RunQueue(1, tmp_path)

    def decode(i: int, done: subprocess.CompletedProcess) -> None:
        assert done.returncode == 0 and log.read_text().splitlines()[-1] == f"train {i}"  # run i has just ended
        assert queue.run_here(_writer(log, f"decode {i}"), 0).returncode == 0

    done = queue.run_all([_writer(log, f"train {i}") for i in range(3)], 0, then=decode)
    assert [d.returncode for d in done] == [0, 0, 0]
    assert log.read_text().splitlines() == ["train 0", "decode 0", "train 1", "decode 1", "train 2", "decode 2"]


def test_stop_signals_a_command_that_then_runs_and_starts_no_more(tmp_path: Path) -> None:
    ready, saved, log = tmp_path / "ready", tmp_path / "saved", tmp_path / "order.txt"
    queue, codes = RunQueue(1, tmp_path), []

    def decode(i: int, done: subprocess.CompletedProcess) -> None:
        codes.append(queue.run_here(_saves_when_stopped(ready, saved, 3), 0).returncode)
        codes.append(queue.run_here(_writer(log, "never"), 0).returncode)

    thread = threading.Thread(target=lambda: queue.run_all([_writer(log, "train"), _writer(log, "next")], 0,
                                                           then=decode))  # fmt: skip
    thread.start()
    _until(ready.exists)
    queue.stop()
    thread.join(30)
    assert codes == [3, STOPPED] and saved.read_text() == "checkpoint"
    assert log.read_text().splitlines() == ["train"]  # neither the second decode nor the next run started
