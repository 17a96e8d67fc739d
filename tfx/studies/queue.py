"""A study's runs share ``jobs`` slots (cores, or shares of one GPU), and a free slot goes to the earliest arm.

A study whose arms run their stages one sweep at a time leaves slots idle whenever a stage has fewer runs left
than slots: the long finalist still training while the short ones have stopped. Here every arm's stages go on at
once and each command waits for a slot. A free slot goes to the waiting command of the earliest arm (then the
earliest asked), and never to a later arm while an earlier one is between two stages (nothing running, nothing
waiting: it is choosing what to run next). So the first arm finishes as soon as alone, and later arms train on
the slots it leaves idle.
"""

from __future__ import annotations

import heapq
import itertools
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STOPPED = 130  # the return code of a command that a stop kept from starting

Ticket = tuple[int, int]  # (priority: the arm's place, lower first; the order asked)
Then = Callable[[int, subprocess.CompletedProcess], None]  # what follows command i on its slot (``run_all``)


class RunQueue:
    """At most ``jobs`` commands at once, for ``arms`` arms (priorities 0, 1, ...; each says when it is
    ``done``); ``stop()`` sends SIGTERM to the running ones (tfx.train then writes checkpoint_last.pt) and starts
    no more."""

    def __init__(self, jobs: int, cwd: Path, arms: int = 0) -> None:
        self.cwd = cwd
        self._free = jobs
        self._waiting: list[Ticket] = []  # a heap
        self._tickets = itertools.count()
        self._running: dict[subprocess.Popen, int] = {}  # -> its priority
        self._arms = set(range(arms))  # the priorities of the arms still going
        self._stopping = False
        self._cond = threading.Condition()

    def done(self, priority: int) -> None:
        """The arm ``priority`` runs nothing more: later arms need not wait for it between its stages."""
        with self._cond:
            self._arms.discard(priority)
            self._cond.notify_all()

    def run_all(self, cmds: list[list[str]], priority: int, env: dict[str, str] | None = None,
                capture: bool = False, then: Then | None = None) -> list[subprocess.CompletedProcess]:  # fmt: skip
        """Run ``cmds``, each when a slot is its turn, and wait for all (``capture``: their output as text, else it
        goes to ours). All are queued at once, so a later arm cannot take a slot between two of them. A command
        that a stop kept from starting returns ``STOPPED``. ``then(i, done)`` follows command ``i`` on its slot,
        before the slot is free again (a converged run's decodes, with ``run_here``, before the next run trains)."""
        with self._cond:
            tickets = [(priority, next(self._tickets)) for _ in cmds]
            for ticket in tickets:
                heapq.heappush(self._waiting, ticket)
        with ThreadPoolExecutor(max(len(cmds), 1)) as pool:
            return list(pool.map(lambda i: self._run(cmds[i], tickets[i], env, capture, then, i), range(len(cmds))))

    def run_here(self, cmd: list[str], priority: int, env: dict[str, str] | None = None,
                 capture: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
        """One command on the slot its caller holds (inside ``then``); ``stop()`` signals it like the others."""
        with self._cond:
            if self._stopping:
                return subprocess.CompletedProcess(cmd, STOPPED, "", "")
            proc = self._start(cmd, priority, env, capture)
        return self._wait(proc)

    def run(self, cmd: list[str], priority: int, env: dict[str, str] | None = None,
            capture: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
        """One command, as ``run_all``."""
        return self.run_all([cmd], priority, env, capture)[0]

    def _turn(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` may start now: a free slot, no ticket before it, and no earlier arm between stages."""
        busy = set(self._running.values()) | {p for p, _ in self._waiting}
        between = any(p < ticket[0] and p not in busy for p in self._arms)
        return self._free > 0 and self._waiting[0] == ticket and not between

    def _run(self, cmd: list[str], ticket: Ticket, env: dict[str, str] | None, capture: bool,
             then: Then | None = None, i: int = 0) -> subprocess.CompletedProcess:  # fmt: skip
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or self._turn(ticket))
            self._waiting.remove(ticket)
            heapq.heapify(self._waiting)
            self._cond.notify_all()  # the next ticket may have its turn too
            if self._stopping:
                return subprocess.CompletedProcess(cmd, STOPPED, "", "")
            proc = self._start(cmd, ticket[0], env, capture)
            self._free -= 1
        try:
            done = self._wait(proc)
            if then is not None and not self._stopping:
                then(i, done)
            return done
        finally:
            with self._cond:
                self._free += 1
                self._cond.notify_all()

    def _start(self, cmd: list[str], priority: int, env: dict[str, str] | None, capture: bool) -> subprocess.Popen:
        """Start ``cmd`` (the lock held): it counts as running for ``priority``'s arm until ``_wait`` reaps it."""
        pipe = subprocess.PIPE if capture else None
        proc = subprocess.Popen(cmd, cwd=self.cwd, env=env, stdout=pipe, stderr=pipe, text=True)
        self._running[proc] = priority
        return proc

    def _wait(self, proc: subprocess.Popen) -> subprocess.CompletedProcess:
        try:
            out, err = proc.communicate()
            return subprocess.CompletedProcess(proc.args, proc.returncode, out or "", err or "")
        finally:
            with self._cond:
                del self._running[proc]
                self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Commands waiting for a slot."""
        with self._cond:
            return len(self._waiting)

    @property
    def running(self) -> int:
        """Commands running."""
        with self._cond:
            return len(self._running)

    @property
    def stopped(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Start nothing more and ask the running commands to stop (each finishes its step and saves)."""
        with self._cond:
            self._stopping = True
            for proc in self._running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            self._cond.notify_all()
