"""Issue 20: every method's fidelity record, and the methods made to follow their authors' released code (DivideMix,
T-revision, MentorNet, VAT, VolMinNet, FW, LCCN, GCE, L_DMI), each against an independent computation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.cli import main
from bench.methods import fidelity_record, registry

REPO = Path(__file__).resolve().parents[1]

# One reference: "owner/repo, a path to a file (path/file.ext, possibly more words), release or commit <id>".
REFERENCE = re.compile(r"[\w.-]+/[\w.-]+, [^,;]*[\w-]+/?[\w./-]*\.\w+[^;]*, (release|commit) [\w.-]+")


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_method_names_the_released_code_it_was_checked_against(name: str) -> None:
    """Every registered method (all of them: no exception list) names a repository, a file in it and a release or
    commit; its differences, if any, each say what differs and why ("what — why")."""
    cls = registry()[name]
    assert cls.reference, f"{name}: no reference"
    for part in cls.reference.split("; "):
        assert REFERENCE.fullmatch(part), f"{name}: {part!r} is not 'owner/repo, path/file.ext, commit <sha>'"
    for difference in cls.differences:
        assert " — " in difference, f"{name}: {difference!r} does not say why (what — why)"


def test_docs_fidelity_page_is_the_generated_record(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/fidelity.md is exactly `bench methods --references --markdown`: it cannot drift from the code."""
    assert main(["methods", "--references", "--markdown"]) == 0
    page = capsys.readouterr().out
    assert page == fidelity_record(markdown=True)
    assert (REPO / "docs" / "fidelity.md").read_text() == page, \
        "docs/fidelity.md is stale: run `bench methods --references --markdown > docs/fidelity.md`"
    for name, cls in registry().items():
        assert f"## `{name}`: {cls.title}" in page


def test_the_terminal_record_lists_each_method_with_its_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "--references"]) == 0
    out = capsys.readouterr().out
    for name, cls in registry().items():
        assert f"{name}  {cls.title}" in out
        assert f"    reference: {cls.reference or '(none)'}" in out
        for difference in cls.differences:
            assert f"    - {difference}" in out


def test_markdown_alone_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "--markdown"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench: error: --markdown formats the fidelity record: use it with --references"]
