"""Shared pieces of the reliability tests: a tiny run config, read-only folders, the CLI command."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_train import REPO, TINY_OVERRIDES, tiny_cfg
from tfx.config import Config

__all__ = ["REPO", "TINY_OVERRIDES", "cli", "read_only", "tiny_cfg", "with_changes"]


def with_changes(cfg: Config, **sections: dict) -> Config:
    """``cfg`` with fields replaced per section: ``with_changes(cfg, optim={"eps": 1e-6})``."""
    return dataclasses.replace(
        cfg, **{name: dataclasses.replace(getattr(cfg, name), **fields) for name, fields in sections.items()}
    )


def _writable(folder: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` (created) made read-only: chmod for ordinary users; as root, where permission bits
    do not bind, a read-only tmpfs mounted over it when the machine allows; otherwise skip."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    mounted = False
    if _writable(folder):
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
        mounted = done.returncode == 0
        if not mounted or _writable(folder):
            folder.chmod(0o755)
            pytest.skip("cannot make a read-only folder here (root without mount permission)")
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=False)
        folder.chmod(0o755)


def cli(*overrides: str, timeout: float = 180, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m tfx.train OVERRIDES`` (tiny model, one thread), output captured."""
    cmd = [sys.executable, "-m", "tfx.train", *TINY_OVERRIDES, *overrides]
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
