"""No script imports another: what scripts share lives in the package (``tfx.studies``, ``tfx.bench``), so each
script is a command line over package code (issue 54). Read from every scripts/**/*.py's imports, anywhere in it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

SCRIPTS = REPO / "scripts"
GUARD = "_require_tfx"  # the one-line "install tfx" check: a copy in each folder, imported first by design
LOADS_BY_PATH = ("spec_from_file_location", "run_path", "SourceFileLoader")  # an import by another name


def imported_tops(path: Path) -> set[str]:
    """The top-level names of every absolute ``import`` / ``from ... import`` in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def script_imports(root: Path) -> dict[str, set[str]]:
    """Script (path under ``root``) -> the other scripts it imports or loads from a file."""
    scripts = sorted(root.rglob("*.py"))
    stems = {p.stem for p in scripts} - {GUARD}
    found = {}
    for path in scripts:
        text = path.read_text()
        hits = (imported_tops(path) & stems) - {path.stem}
        hits |= {f"<{how}>" for how in LOADS_BY_PATH if how in text}
        if hits:
            found[str(path.relative_to(root))] = hits
    return found


def test_no_script_imports_another() -> None:
    assert len(list(SCRIPTS.rglob("*.py"))) >= 15, "the glob found too few scripts: the test would check nothing"
    assert script_imports(SCRIPTS) == {}


def test_an_import_between_scripts_is_found(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "lib.py").write_text("X = 1\n")
    (tmp_path / "a" / f"{GUARD}.py").write_text("")
    (tmp_path / "a" / "one.py").write_text(f"import {GUARD}\n\ndef f():\n    from lib import X\n    return X\n")
    (tmp_path / "two.py").write_text("import importlib.util\nimportlib.util.spec_from_file_location('x', 'a/lib.py')\n")
    (tmp_path / "three.py").write_text("import os\nfrom tfx.studies import arms\n")
    assert script_imports(tmp_path) == {"a/one.py": {"lib"}, "two.py": {"<spec_from_file_location>"}}
