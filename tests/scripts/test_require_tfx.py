"""scripts/*/_require_tfx.py: a script run by a Python without tfx says so in one line and exits non-zero, before
any traceback. Scripts run as files, with only their own folder on the path, so each folder has its copy.
`python -S` (no site-packages) stands in for an environment where `pip install -e .` was never run.
CPU; no tensors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
USING_TFX = sorted(p for p in SCRIPTS.rglob("[!_]*.py") if "from tfx" in p.read_text() or "import tfx" in p.read_text())
GUARDS = sorted(SCRIPTS.rglob("_require_tfx.py"))


def test_every_script_that_uses_tfx_checks_for_it_first() -> None:
    assert len(USING_TFX) >= 9, "the glob found too few scripts: the test would check nothing"
    missing = [p.name for p in USING_TFX if "import _require_tfx" not in p.read_text()]
    assert not missing, f"these scripts import tfx without `import _require_tfx` first: {missing}"
    unguarded = [p.name for p in USING_TFX if not (p.parent / "_require_tfx.py").exists()]
    assert not unguarded, f"these scripts' folders have no _require_tfx.py to import: {unguarded}"


def test_every_folders_copy_of_the_check_is_the_same() -> None:
    assert len(GUARDS) >= 3 and len({p.read_bytes() for p in GUARDS}) == 1, [str(p) for p in GUARDS]


@pytest.mark.parametrize("script", USING_TFX, ids=lambda p: p.stem)
def test_a_script_without_tfx_installed_exits_with_one_line(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-S", str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot import tfx" in lines[0] and "pip install -e ." in lines[0], done.stderr
