"""A study's arms: a ``method`` (conf/method/) plus what the arm sets besides it, as Hydra configs.

Every method YAML is an arm of the same name: a new method is an arm without a line here. Methods compare on one
optimizer, so an arm such as ``tfixup_radam`` is an override of the study, not a method: those are
``EXTRA_ARMS``. ``write_arms`` turns each arm into ``<folder>/arm/<name>.yaml``; with that folder on Hydra's
search path one multirun sweeps every arm as ``+arm=NAME``. A method from outside tfx lives in a config folder
of its own (``DIR/method/NAME.yaml``) that a study's ``hydra.searchpath=[file://DIR]`` override names:
``add_conf_dirs`` makes its methods arms too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from tfx.config import CONF_DIR

Arm = tuple[str, list[str]]  # (method, what the arm sets besides it)

# The arms that are a method and more. Each arm becomes <out>/arms/arm/<name>.yaml, swept as +arm=...
EXTRA_ARMS: dict[str, Arm] = {
    "tfixup_radam": ("tfixup", ["optim.name=radam"]),
    # Post-LN's warmup, then T-Fixup's decay (scripts/studies/budget_study.py: separates the init from the schedule)
    "postln_tfixup_lr": ("postln", ["optim.offset_decay=true"]),
    # the large-batch recipe for GPU throughput (issue 25): 32k target tokens per update, 16x the multi30k
    # experiment's; its lr is the study's to choose (scripts/studies/converged_study.py --lrs)
    "tfixup_32k": ("tfixup", ["data.max_tokens=32768"]),
}

# What the converged and budget studies train when no arms are named, in launch order (T-Fixup, the reference
# every arm is tested against, first): every method but the ablations, and Post-LN on T-Fixup's decay
DEFAULT_ARMS = ["tfixup", "postln", "postln_tfixup_lr", "preln", "deepnorm", "admin", "xavier_noln", "dyt", "rezero",
                "fixup"]  # fmt: skip

METHODS: dict[str, Path] = {}  # method -> its YAML (conf/method/<method>.yaml, or a folder's that add_conf_dirs added)
ARMS: dict[str, Arm] = {}  # arm -> (method, its overrides): T-Fixup first, the other methods by name, EXTRA_ARMS


def add_conf_dirs(folders: Sequence[Path]) -> None:
    """Make each method of these config folders (``<folder>/method/*.yaml``) an arm; a name taken stays taken, as
    Hydra reads tfx's conf/ before its search path."""
    for folder in folders:
        for path in sorted((folder / "method").glob("*.yaml"), key=lambda p: (p.stem != "tfixup", p.stem)):
            METHODS.setdefault(path.stem, path)
            ARMS.setdefault(path.stem, (path.stem, []))


add_conf_dirs([CONF_DIR])
ARMS.update(EXTRA_ARMS)


def conf_dirs(overrides: Sequence[str]) -> list[Path]:
    """The config folders (``file://`` entries) that a ``hydra.searchpath=[...]`` override among ``overrides``
    names: where methods from outside tfx live."""
    return [
        Path(entry.removeprefix("file://")) for entry in searchpath_entries(overrides) if entry.startswith("file://")
    ]


def searchpath_entries(overrides: Sequence[str]) -> list[str]:
    """The entries of the last ``hydra.searchpath=[a,b]`` override in ``overrides`` (Hydra keeps the last)."""
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "hydra.searchpath"]
    if not values:
        return []
    return [entry.strip().strip("'\"") for entry in values[-1].strip().strip("[]").split(",") if entry.strip()]


@functools.cache
def warmup_free(method: str) -> bool:
    """Whether a method's YAML sets ``warmup_free: true``: trained without warmup by definition (T-Fixup and its
    ablations), so a study's grid keeps warmup 0 for it. A method that merely starts at warmup 0 (Pre-LN, ReZero)
    or warms up (DyT, Fixup) has its warmup chosen by the grid."""
    from omegaconf import OmegaConf

    return bool(OmegaConf.load(METHODS[method]).get("warmup_free", False))


def write_arms(folder: Path, arms: list[str]) -> None:
    """One config per arm, ``folder/arm/<arm>.yaml`` (added to Hydra's search path), so one multirun sweeps them
    all as ``+arm=NAME``."""
    for arm in arms:
        write_arm(folder / "arm" / f"{arm}.yaml", arm)


def write_arm(path: Path, arm: str, settings: list[str] | None = None) -> None:
    """The config of ``arm`` at ``path``, with ``settings`` (``key=value``: a study's tuned lr, dropout, warmup,
    which a cartesian sweep cannot give each arm its own of) on top of what the arm sets."""
    from omegaconf import OmegaConf

    method, extra = ARMS[arm]
    body = OmegaConf.create({"defaults": [{"override /method": method}]})
    body = OmegaConf.merge(body, OmegaConf.from_dotlist([*extra, *(settings or [])]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# @package _global_\n# study arm {arm}\n{OmegaConf.to_yaml(body)}")
