"""Every converged row that README.md and docs/ publish is one command away: ``+experiment=multi30k method=NAME``.

One source: the ``tuned`` table of conf/experiment/multi30k.yaml, one row per method (peak lr, dropout, warmup
updates, as the converged study chose them on valid, each citing its docs/converged.md section). It is what that
command runs, so the docs are checked against it here, not against a copy of it:

- every row the docs publish is its method's row of the table, or the row it names ("T-Fixup's (lr 5e-4, dropout
  0.3)"). Read from README.md's two converged tables (the "chosen setting" column; the "(lr / dropout / warmup)"
  at the end of the "3+3 converged (setting)" column), converged.md's "arm (setting)" tables and its "**NAME,
  tuned and converged (...)**: lr X, dropout Y, no warmup" statements, and "NAME lr X, dropout Y[, warmup N | ,
  no warmup]" in README.md, methods.md and training.md (converged.md's prose is a dated log: its interim settings
  stay as they were). A row that names no warmup is checked on lr and dropout;
- every method with a published row, composed as ``+experiment=multi30k method=NAME``, trains at it: optim.lr,
  model.dropout and optim.warmup_updates, what the schedule reads (``tfx.optim.optimizers.lr_at``). The table's
  ``warmup`` reaches it through optim.budget_warmup for a method whose YAML warms up (postln, deepnorm, admin, dyt,
  fixup); a method whose YAML fixes its warmup at 0 (preln, rezero) must have a row that agrees;
- every row of the table is published in the README, and the GPU preset of the converged study trains the rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from tests.conftest import REPO, load_script
from tfx.config import Config, TunedSetting, compose_config
from tfx.studies.arms import METHODS

PRESET = "+experiment=multi30k"
PROSE_DOCS = ("README.md", "docs/methods.md", "docs/training.md")  # the pages that say what method=NAME runs

NUMBER = r"\d+(?:\.\d+)?(?:e-?\d+)?"
WARMUP = r"(?:warmup (?P<warmup>\d+)|(?P<no_warmup>no warmup))"
# "lr 1e-3, dropout 0.1, warmup 400"; "Post-LN's (lr 1e-3, dropout 0.1, warmup 400)": another method's row
WORDS = re.compile(rf"(?:(?P<owner>[\w-]+)'s \()?lr (?P<lr>{NUMBER}), dropout (?P<dropout>{NUMBER})(?:, {WARMUP})?")
TRIPLE = re.compile(rf"\((?P<lr>{NUMBER}) / (?P<dropout>{NUMBER}) / (?P<warmup>\d+)\)")  # "(5e-4 / 0.3 / 0)"
PROSE = re.compile(rf"\b(?P<name>[A-Z][\w-]*) lr (?P<lr>{NUMBER}), dropout (?P<dropout>{NUMBER})(?:, {WARMUP})?")
BOLD = re.compile(
    rf"\*\*(?P<name>[\w-]+), tuned and converged[^*]*\*\*: lr (?P<lr>{NUMBER}), dropout (?P<dropout>{NUMBER}), {WARMUP}"
)


@dataclass(frozen=True)
class Row:
    """A setting a doc publishes for a method."""

    place: str  # the file and the kind of statement ("README.md, chosen setting")
    text: str  # what it says, for the failure message
    method: str  # `method=NAME` must reproduce it
    owner: str  # whose row of the table it is: ``method``'s, or the one it names ("T-Fixup's (...)")
    lr: float
    dropout: float
    warmup: int | None  # None: the statement names no warmup


def method_name(name: str) -> str | None:
    """The conf/method/ name of a method as the docs write it ("T-Fixup" -> tfixup), or None if it is none."""
    name = name.removesuffix("'s").lower().replace("-", "")
    return name if name in METHODS else None


# What the parsers found but could not read as a row (a test fails on it; an assert here would stop collection)
UNREAD: list[str] = []


def leading_method(label: str) -> str | None:
    """The method a table row is about: its first cell's first word ("admin, 2 seeds" -> admin)."""
    name = re.match(r"[a-z_]+", label)
    return name[0] if name and name[0] in METHODS else None


def add_row(rows: list[Row], place: str, method: str | None, match: re.Match, label: str = "") -> None:
    """The row ``match`` reads, of ``method`` (a table row's ``label`` goes into its text)."""
    fields, text = match.groupdict(), f"{label}: {match[0]}" if label else match[0]
    warmup = 0 if fields.get("no_warmup") else int(fields["warmup"]) if fields.get("warmup") else None
    owner = method_name(fields["owner"]) if fields.get("owner") else method
    if method and owner:
        rows.append(Row(place, text, method, owner, float(match["lr"]), float(match["dropout"]), warmup))
    else:
        UNREAD.append(f"{place}: {text!r} names no method")


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each markdown table in ``text``: its header's cells and its body rows' cells."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif block:
            found.append((block[0], block[2:]))
            block = []
    return found


def one_line(text: str) -> str:
    """``text`` as one line: statements wrap, in prose and in a command block's comments."""
    return re.sub(r"\s*\n[\s#]*", " ", text)


def readme_rows() -> list[Row]:
    rows = []
    for header, body in tables((REPO / "README.md").read_text()):
        for column, title in enumerate(header):
            if title == "chosen setting":
                place, pattern = "README.md, chosen setting", WORDS
            elif "converged (setting)" in title:
                place, pattern = "README.md, 3+3 converged (setting)", TRIPLE
            else:
                continue
            for cells in body:
                if match := pattern.search(cells[column]):  # "admin, for scale" has a score alone
                    add_row(rows, place, leading_method(cells[0]), match, cells[0])
    return rows


def converged_rows() -> list[Row]:
    text = (REPO / "docs" / "converged.md").read_text()
    rows = []
    for header, body in tables(text):
        if header[0] == "arm (setting)":
            for cells in body:
                if match := TRIPLE.search(cells[0]):
                    add_row(rows, "docs/converged.md, arm (setting)", leading_method(cells[0]), match)
                else:
                    UNREAD.append(f"docs/converged.md: arm (setting) row {cells[0]!r} has no (lr / dropout / warmup)")
    for match in BOLD.finditer(one_line(text)):
        add_row(rows, "docs/converged.md, tuned and converged", method_name(match["name"]), match)
    return rows


def prose_rows() -> list[Row]:
    rows = []
    for doc in PROSE_DOCS:
        for match in PROSE.finditer(one_line((REPO / doc).read_text())):
            if method := method_name(match["name"]):  # "Adam lr ..." is no method's row
                add_row(rows, f"{doc}, prose", method, match)
    return rows


PUBLISHED = readme_rows() + converged_rows() + prose_rows()


@pytest.fixture(scope="module")
def preset() -> Config:
    return compose_config([PRESET])


def setting(tuned: TunedSetting) -> tuple[float, float, int]:
    return tuned.lr, tuned.dropout, tuned.warmup


def test_every_kind_of_statement_is_read() -> None:
    """A renamed column or a reworded statement would otherwise leave its rows unchecked."""
    assert not UNREAD
    assert {r.place for r in PUBLISHED} == {
        "README.md, chosen setting",
        "README.md, 3+3 converged (setting)",
        "docs/converged.md, arm (setting)",
        "docs/converged.md, tuned and converged",
        *(f"{doc}, prose" for doc in PROSE_DOCS),
    }


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda r: f"{r.place}: {r.text}")
def test_a_published_row_is_the_presets_row(published: Row, preset: Config) -> None:
    where = f"{published.place}: {published.text!r}"
    tuned = preset.tuned.get(published.owner)
    assert tuned, f"{where}, but conf/experiment/multi30k.yaml has no {published.owner} row"
    assert (published.lr, published.dropout) == (tuned.lr, tuned.dropout), where
    if published.warmup is not None:
        assert published.warmup == tuned.warmup, where


@pytest.mark.parametrize("method", sorted({r.method for r in PUBLISHED}))
def test_method_on_the_preset_trains_at_its_published_row(method: str, preset: Config) -> None:
    owners = {r.owner for r in PUBLISHED if r.method == method}
    assert len(owners) == 1, f"the docs publish {method} at the rows of {sorted(owners)}"
    owner = owners.pop()
    cfg = compose_config([PRESET, f"method={method}"])
    runs = cfg.optim.lr, cfg.model.dropout, cfg.optim.warmup_updates
    assert owner in preset.tuned, f"conf/experiment/multi30k.yaml has no {owner} row; method={method} runs {runs}"
    assert runs == setting(preset.tuned[owner])


def test_every_row_of_the_preset_is_published_in_the_readme(preset: Config) -> None:
    assert set(preset.tuned) == {r.owner for r in PUBLISHED if r.place.startswith("README.md")}


def test_the_gpu_preset_trains_the_presets_rows(preset: Config) -> None:
    """``converged_study.py --preset gpu`` trains the arms the CPU studies tuned at their rows (``TUNED_ON_CPU``)."""
    gpu = load_script("studies/converged_study").TUNED_ON_CPU
    assert gpu == {arm: setting(preset.tuned[arm]) for arm in gpu}
