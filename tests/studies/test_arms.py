"""tfx.studies.arms: every method YAML is an arm, its warmup-free label read from the YAML, one DEFAULT_ARMS."""

from __future__ import annotations

from pathlib import Path

from tfx.config import CONF_DIR
from tfx.studies.arms import ARMS, DEFAULT_ARMS, EXTRA_ARMS, METHODS, conf_dirs, warmup_free
from tfx.studies.harness import searchpath


def test_every_method_yaml_is_an_arm_of_that_method_tfixup_first() -> None:
    methods = {path.stem for path in (CONF_DIR / "method").glob("*.yaml")}
    assert {arm: ARMS[arm] for arm in methods} == {method: (method, []) for method in methods}
    assert set(ARMS) == methods | set(EXTRA_ARMS) and next(iter(ARMS)) == "tfixup"
    assert all(method in METHODS for method, _ in EXTRA_ARMS.values())
    assert DEFAULT_ARMS[0] == "tfixup" and set(DEFAULT_ARMS) <= set(ARMS)
    assert {"dyt", "rezero", "fixup"} <= set(DEFAULT_ARMS)


def test_warmup_free_methods_are_t_fixup_and_its_ablations() -> None:
    """What scripts/converged_runs.py's WARMUP_FREE held, now each method's own YAML line; Pre-LN and ReZero start
    at warmup 0 but their grid decides, and DyT and Fixup warm up."""
    assert {m for m in METHODS if warmup_free(m)} >= {"tfixup", "xavier_noln", "postln_nowarmup", "tfixup_postln",
                                                      "tfixup_preln"}  # fmt: skip
    assert not any(warmup_free(m) for m in ("preln", "rezero", "dyt", "fixup", "postln", "admin", "deepnorm"))


def test_a_users_search_path_joins_the_studys_arms_folder() -> None:
    overrides = ["train.seed=1", "hydra.searchpath=[file:///a/conf, pkg://b.conf]", "model.dropout=0.1"]
    assert conf_dirs(overrides) == [Path("/a/conf")]
    assert searchpath(Path("/out/arms"), overrides) == (
        "hydra.searchpath=[file:///out/arms,file:///a/conf,pkg://b.conf]",
        ["train.seed=1", "model.dropout=0.1"],
    )
    assert searchpath(Path("/out/arms"), ["x=1"]) == ("hydra.searchpath=[file:///out/arms]", ["x=1"])
