"""``python -m tfx.train [+experiment=NAME] [key=value ...]``: the Hydra entry point.

Order: data -> model -> init -> optimizer (``tfx.training.build``). Adam without warmup (T-Fixup) or with it
(Post-LN baseline), label-smoothed cross-entropy, BLEU validation (``tfx.evaluation.validate``), metrics.jsonl and
TensorBoard under ``<run>/tb`` (``tfx.reporting.reporter``), checkpoints under ``<run>/checkpoints``
(``tfx.checkpoints.manager``; what they hold: ``tfx.checkpoints.train_state``). The loop itself is ``tfx.training``
(``Trainer``, ``train``, re-exported here). Runs as is on one device or under ``torchrun
--nproc_per_node=K`` (DDP, or FSDP with ``train.strategy=fsdp``: ``tfx.runtime.sharding``; rank 0 alone logs
and writes).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from tfx.checkpoints.load import CheckpointError
from tfx.checkpoints.train_state import TrainingDiverged
from tfx.config import CONF_DIR, Config, register_configs, to_config, unknown_key
from tfx.data import DataError
from tfx.files.environment import Remedy, environment_errors
from tfx.runtime.distributed import DeviceError, launch_info
from tfx.runtime.precision import PrecisionError
from tfx.runtime.sharding import ShardingError
from tfx.training.launch import Launch, command_line, discard_failed_start, resume_unfinished
from tfx.training.schedule import Action, Every
from tfx.training.trainer import StopSignal, Trainer, UpdateHook, train

# what callers import from here (the loop moved to tfx.training)
__all__ = ["Action", "Every", "StopSignal", "Trainer", "TrainingDiverged", "UpdateHook", "main", "train"]

log = logging.getLogger("tfx.train")


register_configs()


def _run_context() -> tuple[Path, bool, bool]:
    """This job's run folder, whether it is one point of a multirun sweep, and whether Hydra named it by the time
    (no ``hydra.run.dir`` given): only such a folder is new to this command, to be swapped or removed."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    named_by_time = not sweeping and not any(o.startswith("hydra.run.dir=") for o in hydra_cfg.overrides.hydra)
    return Path(hydra_cfg.runtime.output_dir), sweeping, named_by_time


def _main(cfg_node: Any) -> float:
    run_dir, sweeping, new_folder = _run_context()
    new_folder = new_folder and launch_info(os.environ)[0].is_main  # rank 0 decides the folder (Trainer)
    try:
        try:
            cfg: Config = to_config(cfg_node)
        except ValueError as e:
            log.error("config error: %s", e)
            sys.exit(2)
        launch = Launch(None if sweeping else command_line(sys.argv[1:]))
        if new_folder:
            run_dir, launch, resumed = resume_unfinished(run_dir, cfg, sys.argv[1:])
            new_folder = not resumed
        with environment_errors("tfx.train", _remedy(cfg, run_dir), report=_log_line):
            return _train_reporting_errors(cfg, run_dir, sweeping, launch)
    except BaseException:
        if new_folder:  # a start that failed before its first update leaves no folder
            discard_failed_start(run_dir)
        raise


def _remedy(cfg: Config, run_dir: Path) -> Remedy:
    """What a user can change when the machine fails the run: where it writes, what takes host memory."""
    folders = {
        "hydra.run.dir": run_dir,
        "data.cache_dir": cfg.data.cache_dir,
        "data.hub_cache_dir": cfg.data.hub_cache_dir,
    }
    return Remedy(folders, memory="lower data.max_tokens, data.num_workers or train.threads")


def _log_line(line: str) -> None:
    """``log.error``, without logging's own traceback when the log file cannot take the line (a full disk)."""
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        log.error("%s", line)
    finally:
        logging.raiseExceptions = raise_exceptions


def _train_reporting_errors(cfg: Config, run_dir: Path, sweeping: bool, launch: Launch) -> float:
    """``train``, its user errors as one line and exit 1 (a diverged sweep point as nan); the best BLEU."""
    try:
        summary = train(cfg, run_dir, launch=launch)
    except TrainingDiverged as e:
        log.error("%s", e)
        if sweeping:  # a finding, not a failure: SystemExit in a launcher's worker would abort every other point
            return math.nan  # the run's metrics.jsonl ends with status "diverged"
        sys.exit(1)
    except (DataError, CheckpointError, DeviceError, ShardingError, PrecisionError) as e:
        log.error("%s", e)
        sys.exit(1)
    except RuntimeError as e:
        if not (cfg.train.deterministic and "deterministic" in str(e)):
            raise
        log.error("train.deterministic=true: %s; set train.deterministic=false", str(e).splitlines()[0].rstrip("."))
        sys.exit(1)
    return summary["best_bleu"]


def refuse_unknown_overrides(argv: list[str]) -> None:
    """Exit 2 with one line for a command-line ``key=value`` (``+``/``++``/``~`` too) that names no config key, with
    the closest known ones: Hydra's own refusal is eight lines without a suggestion, and with ``+`` it accepts it."""
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if arg.startswith("-") or "=" not in arg or "." not in key:
            continue  # an option, or a config group choice (method=preln, +experiment=iwslt)
        if (why := unknown_key(key)) is not None:
            print(f"config error: {why}", file=sys.stderr)
            sys.exit(2)


def main() -> None:
    import hydra

    refuse_unknown_overrides(sys.argv[1:])
    try:
        hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(_main)()
    except KeyboardInterrupt:  # SIGINT before the loop took the stop signals over (from then on it saves, exits 0)
        print("tfx.train: interrupted by SIGINT before the first update: nothing to save", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
