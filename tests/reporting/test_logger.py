"""The progress line (``tfx.reporting.logger.Progress``): a total, units, a rate that settles, time left,
logs above the bar."""

from __future__ import annotations

import io
import logging

import pytest

from tfx.reporting.logger import SETTLE_UPDATES, Budget, Progress

METRICS = {"train/loss": 4.1234, "train/lr": 5e-4}


def progress(budget: Budget) -> Progress:
    return Progress(enabled=True, budget=budget, initial=0, every=1)


def test_the_line_names_its_units_and_shows_no_rate_before_it_settles() -> None:
    p = progress(Budget(updates=100))
    p.update(1, 1, METRICS, train_seconds=6.0)  # the first update carries start-up: 6 s
    assert p.status(1, 1, METRICS, 6.0) == "loss 4.123 bits/tok | lr 5.00e-04 | epoch 1"
    for step in range(2, SETTLE_UPDATES + 1):
        p.update(step, 1, METRICS, train_seconds=6.0 + 0.5 * (step - 1))
    settled = 6.0 + 0.5 * (SETTLE_UPDATES - 1)
    # 10 updates after the rate settled, at 0.5 s each: 2 updates/s, and 85 updates left take 42.5 s
    assert (
        p.status(15, 1, METRICS, settled + 5.0)
        == "loss 4.123 bits/tok | lr 5.00e-04 | epoch 1 | 2.00 upd/s | 0:42 left"
    )


def test_time_left_is_the_nearer_of_the_time_budget_and_the_updates_left() -> None:
    p = progress(Budget(updates=1000, seconds=600.0))
    p._settled = (10, 10.0)
    rate = p.rate(110, 60.0)  # 100 updates in 50 s
    assert rate == 2.0
    assert p.seconds_left(110, 60.0, rate) == 445.0  # 890 updates at 2/s, before the 540 s of budget left
    assert p.seconds_left(110, 500.0, 100 / 490) == 100.0  # slower: the time budget ends it first
    assert progress(Budget(seconds=600.0)).seconds_left(0, 30.0, None) == 570.0  # no rate yet: the budget alone


def test_max_epochs_sets_the_total_once_an_epoch_is_planned() -> None:
    p = progress(Budget(epochs=3))
    assert p.total is None
    p.epoch_planned(step=0, epoch=1, updates_per_epoch=40)
    assert p.total == 120
    p = progress(Budget(updates=100, epochs=3))
    p.epoch_planned(step=40, epoch=2, updates_per_epoch=40)  # 120 by epochs, 100 by updates
    assert p.total == 100


def test_a_time_budget_sets_the_total_the_bar_counts_to() -> None:
    p = progress(Budget(updates=1000, seconds=100.0))
    p._settled = (10, 10.0)
    assert p._time_bound_total(110, 60.0) == 190  # 40 s left at 2 upd/s, before update 1000
    assert progress(Budget(updates=150, seconds=100.0))._time_bound_total(110, 60.0) is None  # the limit is nearer


def test_log_lines_print_above_the_bar_not_glued_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, a log record during the loop goes on its own line (tqdm clears the bar, writes, redraws)."""
    screen = io.StringIO()
    screen.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stdout", screen)
    monkeypatch.setattr("sys.stderr", screen)
    handler = logging.StreamHandler(screen)  # the console handler Hydra installs
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    level = root.level
    root.setLevel(logging.INFO)  # (setLevel, not an attribute: it clears the loggers' cached answers)
    p = progress(Budget(updates=50))
    with p.shown():
        for step in range(1, 4):
            p.update(step, 1, METRICS, train_seconds=float(step))
        p.bar.refresh()
        logging.getLogger("tfx.train").info("validation at update 3")
    root.setLevel(level)
    lines = screen.getvalue().replace("\r", "\n").splitlines()
    assert any(line.startswith("train ") and "/50 updates" in line for line in lines)
    assert "validation at update 3" in lines  # a line of its own
