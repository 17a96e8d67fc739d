"""A study's arms: a ``method`` (conf/method/) plus what the arm sets besides it, as Hydra configs.

Methods compare on one optimizer, so an arm such as ``tfixup_radam`` is an override of the study,
not a method. ``write_arms`` turns each arm into ``<folder>/arm/<name>.yaml``; with that folder on
Hydra's search path one multirun sweeps every arm as ``+arm=NAME``.
"""

from __future__ import annotations

from pathlib import Path

# name -> (method, what the arm sets besides it). Each arm becomes <out>/arms/arm/<name>.yaml, swept as +arm=...
ARMS: dict[str, tuple[str, list[str]]] = {
    "tfixup": ("tfixup", []),
    "tfixup_radam": ("tfixup", ["optim.name=radam"]),
    "postln": ("postln", []),
    "postln_nowarmup": ("postln_nowarmup", []),
    "preln": ("preln", []),
    "deepnorm": ("deepnorm", []),
    "admin": ("admin", []),
    "xavier_noln": ("xavier_noln", []),
    "dyt": ("dyt", []),
    "rezero": ("rezero", []),
    "fixup": ("fixup", []),
    # Post-LN's warmup, then T-Fixup's decay (scripts/budget_study.py: separates the init from the schedule)
    "postln_tfixup_lr": ("postln", ["optim.offset_decay=true"]),
    # the large-batch recipe for GPU throughput (issue 25): 32k target tokens per update, 16x the multi30k
    # experiment's; its lr is the study's to choose (scripts/converged_study.py --lrs)
    "tfixup_32k": ("tfixup", ["data.max_tokens=32768"]),
}


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
