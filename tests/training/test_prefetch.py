"""The background batch builder: what was prepared for a key comes back for that key, anything else is
built inline; the work runs off the calling thread. CPU only."""

from __future__ import annotations

import threading

from tfx.training.prefetch import Prefetcher


def test_a_prepared_key_is_built_in_the_background_and_another_key_inline() -> None:
    prefetch: Prefetcher[tuple[str, int]] = Prefetcher(enabled=True)
    try:
        caller = threading.get_ident()
        prefetch.prepare(("epoch 1", 4), lambda: ("background", threading.get_ident()))
        built, thread = prefetch.get(("epoch 1", 4), lambda: ("inline", threading.get_ident()))
        assert built == "background" and thread != caller
        prefetch.prepare(("epoch 1", 5), lambda: ("background", threading.get_ident()))
        built, thread = prefetch.get(("epoch 2", 0), lambda: ("inline", threading.get_ident()))
        assert built == "inline" and thread == caller  # a new epoch: the stale batch is not used
        assert prefetch.get(("epoch 1", 5), lambda: ("inline", 0))[0] == "inline"  # consumed once
    finally:
        prefetch.close()


def test_disabled_it_builds_everything_inline() -> None:
    prefetch: Prefetcher[str] = Prefetcher(enabled=False)
    prefetch.prepare("k", lambda: "background")
    assert prefetch.get("k", lambda: "inline") == "inline"
    prefetch.close()
