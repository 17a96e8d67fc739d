"""scripts/audit/planted_bugs.py's command line: --help and --list run nothing; a word no bug's id contains is refused
in one line (it used to be taken as a filter that chose no bug, so the audit "passed" having planted nothing)."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


def test_help_list_and_a_word_that_matches_no_bug(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("audit/planted_bugs")
    with pytest.raises(SystemExit) as done:
        script.main(["--help"])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out
    assert script.main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in listed] == [bug.id for bug in script.BUGS]
    first = script.BUGS[0].id
    assert script.main([first, "--list"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"{first}:")
    assert script.main(["no-such-bug", "--list"]) == 2
    assert capsys.readouterr().err.strip() == "no planted bug's id contains no-such-bug (--list shows them)"
