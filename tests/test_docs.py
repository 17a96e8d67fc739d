"""README.md and docs/*.md point at things that exist: files they link, scripts and modules their command
blocks run, and the experiments, methods and other config-group options they name.

Docs rot silently when code moves; these checks make a rename that forgets the docs fail here. Relative
links must be anchor-free (a ``#section`` is not checked, so it would rot unseen).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
COMMAND_LANGUAGES = ("bash", "sh", "shell", "console")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"(?<![\w./-])(scripts/[\w./-]*[\w])")
MODULE = re.compile(r"(?<![\w.-])-m\s+(tfx(?:\.\w+)*)")
# group=NAME (or +experiment=NAME, --experiment NAME); not after a dot (optim.name=) or a slash (hydra/launcher=)
GROUP = re.compile(r"(?<![\w./-])\+?(experiment|method|data|model|init|optim|train)=([\w,]+)")
EXPERIMENT_ARG = re.compile(r"--experiment\s+(\w+)")


def doc_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def outside_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def command_blocks(text: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang in COMMAND_LANGUAGES]


def is_placeholder(name: str) -> bool:
    """``NAME``, ``DIR``: an upper-case word stands for a value the reader chooses."""
    return name.isupper()


def link_problems(doc: Path) -> list[str]:
    """Relative links that carry an anchor or point at nothing (paths are relative to the linking file)."""
    problems = []
    for target in LINK.findall(outside_code_blocks(doc.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        if "#" in target:
            problems.append(f"{doc.name}: link {target} has an anchor (not checked; link the file)")
        elif not (doc.parent / target).exists():
            problems.append(f"{doc.name}: link {target} points at nothing")
    return problems


def module_exists(name: str, repo: Path) -> bool:
    path = repo.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def command_problems(doc: Path, repo: Path = REPO) -> list[str]:
    """Scripts and ``-m tfx.X`` modules in the file's command blocks that do not exist."""
    problems = []
    for block in command_blocks(doc.read_text()):
        problems += [f"{doc.name}: no file {p}" for p in SCRIPT.findall(block) if not (repo / p).is_file()]
        problems += [f"{doc.name}: no module {m}" for m in MODULE.findall(block) if not module_exists(m, repo)]
    return problems


def config_problems(doc: Path, repo: Path = REPO) -> list[str]:
    """``+experiment=NAME``, ``method=NAME`` (and the other groups) naming no ``conf/<group>/NAME.yaml``."""
    text = doc.read_text()
    named = [(group, name) for group, names in GROUP.findall(text) for name in names.split(",")]
    named += [("experiment", name) for name in EXPERIMENT_ARG.findall(text)]
    return [
        f"{doc.name}: {group}={name} but no conf/{group}/{name}.yaml"
        for group, name in named
        if name and not is_placeholder(name) and not (repo / "conf" / group / f"{name}.yaml").is_file()
    ]


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_commands_and_config_names_exist(doc: Path) -> None:
    assert link_problems(doc) + command_problems(doc) + config_problems(doc) == []


def test_every_docs_page_is_in_the_index() -> None:
    index = (REPO / "docs" / "README.md").read_text()
    pages = [p.name for p in doc_files()[1:] if p.name != "README.md"]
    assert pages and [p for p in pages if f"]({p})" not in index] == []


def test_the_readme_keeps_the_ci_test_command_and_its_length() -> None:
    """``.ci/run`` runs the README's test command: it stays exactly ``python -m pytest -q``."""
    readme = (REPO / "README.md").read_text()
    commands = [line.split("#")[0].strip() for block in command_blocks(readme) for line in block.split("\n")]
    assert "python -m pytest -q" in commands
    ci_lines = (REPO / ".ci" / "run").read_text().split("\n")
    assert "python -m pytest -q" in [line.split("||")[0].strip() for line in ci_lines]  # its status kept
    assert readme.count("\n") <= 220


def test_the_checks_see_what_the_docs_name() -> None:
    """The patterns find the real names (an empty match would pass the checks above for nothing)."""
    texts = [p.read_text() for p in doc_files()]
    blocks = "\n".join(b for t in texts for b in command_blocks(t))
    named_scripts = {"scripts/studies/depth_study.py", "scripts/eval_bleu.sh", "scripts/gpu/gpu_check.sh"}
    assert named_scripts <= set(SCRIPT.findall(blocks))
    assert {"tfx.train", "tfx.average", "tfx.evaluate", "tfx.diagnostics"} <= set(MODULE.findall(blocks))
    named = {(g, n) for t in texts for g, names in GROUP.findall(t) for n in names.split(",")}
    assert {("experiment", "iwslt14_reference"), ("experiment", "deep_postln"), ("method", "deepnorm")} <= named


def write_repo(root: Path, doc: str) -> Path:
    """A made-up checkout: one script, one module, one experiment and one method, and ``doc`` as docs/page.md."""
    for name, text in {
        "scripts/run.sh": "",
        "tfx/__init__.py": "",
        "tfx/train.py": "",
        "conf/experiment/real.yaml": "",
        "conf/method/tfixup.yaml": "",
        "docs/other.md": "",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "docs" / "page.md").write_text(doc)
    return root / "docs" / "page.md"


def test_the_checks_find_broken_links_and_missing_names(tmp_path: Path) -> None:
    page = write_repo(
        tmp_path,
        "[ok](other.md) [gone](missing.md) [anchored](other.md#a-section) [web](https://example.org/x#y)\n"
        "```bash\nscripts/run.sh\npython scripts/gone.py --x\npython -m tfx.train +experiment=real\n"
        "torchrun -m tfx.nothing\n```\n"
        "`+experiment=real,fake` and `method=tfixup`, `method=NAME`, `method=wrong`, `optim.name=radam`,\n"
        "`python bench.py --experiment nope`; `[inside](code.md)` is a link too.\n",
    )
    assert link_problems(page) == [
        "page.md: link missing.md points at nothing",
        "page.md: link other.md#a-section has an anchor (not checked; link the file)",
        "page.md: link code.md points at nothing",
    ]
    assert command_problems(page, tmp_path) == ["page.md: no file scripts/gone.py", "page.md: no module tfx.nothing"]
    assert config_problems(page, tmp_path) == [
        "page.md: experiment=fake but no conf/experiment/fake.yaml",
        "page.md: method=wrong but no conf/method/wrong.yaml",
        "page.md: experiment=nope but no conf/experiment/nope.yaml",
    ]


def test_a_link_inside_a_code_block_is_not_a_link(tmp_path: Path) -> None:
    page = write_repo(tmp_path, "```\nsee [x](nowhere.md)\n```\n")
    assert link_problems(page) == []


def test_the_knob_lists_name_every_residual_kind_and_init_scheme() -> None:
    """docs/training.md's `model.norm` (`a|b|...`) and `init.name` (`...`) lists are the registries' keys (issue 67:
    the norm list stopped at admin, and fixup was missing from both)."""
    from tfx.init import SCHEMES
    from tfx.model.residual import RESIDUALS

    text = " ".join((REPO / "docs" / "training.md").read_text().split())
    lists = re.findall(r"`(model\.norm|init\.name)` \(`([\w|]+)`\)", text)
    listed = {key: set(names.split("|")) for key, names in lists}
    assert listed == {"model.norm": set(RESIDUALS), "init.name": set(SCHEMES)}
