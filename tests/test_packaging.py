"""A regular (non-editable) install runs: ``conf/`` travels inside the wheel as ``tfx/conf``.

Builds the wheel from this checkout, installs it with ``pip install --target`` (no dependencies:
the test's own environment provides torch, hydra, ...), and runs the entry points from an empty
folder with only that copy of tfx importable. CPU, fp32 (``auto`` on the toy job's tiny model either way).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=600)
    said = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{said}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(an empty working folder, an environment whose only tfx is the wheel's)."""
    root = tmp_path_factory.mktemp("install")
    wheels, site = root / "wheels", root / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    _run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)], cwd=root, env=dict(os.environ))
    (wheel,) = wheels.glob("tfx-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        packed = {n for n in zf.namelist() if n.startswith("tfx/conf/")}
    shipped = {f"tfx/conf/{p.relative_to(REPO / 'conf').as_posix()}" for p in (REPO / "conf").rglob("*.yaml")}
    assert shipped and shipped <= packed, f"the wheel lacks {sorted(shipped - packed)[:5]}"
    _run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], cwd=root, env=dict(os.environ))
    env = {**os.environ, "PYTHONPATH": str(site)}
    work = root / "work"
    work.mkdir()
    return work, env


def test_the_default_job_and_the_tools_run_from_an_empty_folder_after_a_wheel_install(
    installed: tuple[Path, dict[str, str]],
) -> None:
    work, env = installed
    which = "import tfx, tfx.config as c; print(tfx.__file__); print(c.CONF_DIR)"
    where = _run([sys.executable, "-c", which], work, env)
    module_file, conf_dir = where.stdout.split()
    assert Path(module_file).is_relative_to(Path(env["PYTHONPATH"])), f"tfx came from {module_file}, not the wheel"
    assert Path(conf_dir) == Path(env["PYTHONPATH"]) / "tfx" / "conf"

    _run([sys.executable, "-m", "tfx.train", "train.max_updates=4", "hydra.run.dir=run"], work, env)
    ckpt = work / "run" / "checkpoints" / "checkpoint_last.pt"
    assert ckpt.is_file()

    out = _run([sys.executable, "-m", "tfx.translate", str(ckpt), "--quiet"], work, env, stdin="a b c\n")
    assert len(out.stdout.splitlines()) == 1
    avg = work / "avg.pt"
    _run([sys.executable, "-m", "tfx.average", "--inputs", str(ckpt), str(ckpt), "--output", str(avg)], work, env)
    assert avg.is_file()
    scored = _run([sys.executable, "-m", "tfx.evaluate", str(work / "run"), "--quiet"], work, env)
    assert "BLEU" in scored.stdout + scored.stderr
