"""docs/failures.md shows what each failure prints: every `bench: error:` line in its blocks comes from a real run
of the command shown above it (a sample docs/make_samples.py records and tests/system/test_docs.py runs again),
unless the block says why it is not re-run (a full disk, a cluster, a server that answers as a broken one did)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import repo_script

REPO = Path(__file__).resolve().parents[2]
FAILURES = REPO / "docs" / "failures.md"
FENCE = re.compile(r"^(<!-- not re-run: [^\n]+ -->\n)?```\w*\n(.*?)^```", re.S | re.M)


def unrecorded(text: str) -> list[str]:
    """The `bench: error:` lines of a page's blocks that neither a sample block holds nor a `not re-run` note
    explains."""
    samples = repo_script("docs/make_samples.py")
    outside = samples.BLOCK.sub("", text)  # what is left once the recorded samples are cut out
    return [line for m in FENCE.finditer(outside) if m.group(1) is None
            for line in m.group(2).splitlines() if "bench: error:" in line]


def test_every_error_line_shown_comes_from_a_recorded_run() -> None:
    text = FAILURES.read_text(encoding="utf-8")
    assert unrecorded(text) == []
    samples = repo_script("docs/make_samples.py")
    shown = samples.readme_samples(text)
    assert set(shown) == samples.ERRORS, "each error sample is shown in docs/failures.md"
    lines = [line for name in shown for line in (REPO / "docs" / "samples" / f"{name}.txt").read_text().splitlines()]
    errors = [line for line in lines if line.startswith("bench: error: ")]
    commands = [line for line in lines if line.startswith("$ ")]
    # one command, then its one line; the commands are those the samples name
    assert len(errors) == len(commands) >= 20 and len(lines) == 2 * len(commands)
    assert all(line.startswith(("$ bench ", "$ BENCH_")) for line in lines[::2]), lines[::2]
    assert commands == ["$ " + " ".join(argv) for name in shown for argv in samples.SAMPLES[name][0]]


def test_the_check_fails_on_an_error_line_typed_by_hand() -> None:
    """A copy of the page with one more block of a hand-written line is caught; the same block with a reason why it
    is not re-run passes; a line typed into a sample block no longer equals its file's excerpt."""
    text = FAILURES.read_text(encoding="utf-8")
    typed = "```\nbench: error: grid.yaml: r: must be a finite number in [0, 1], got 1.5\n```\n"
    assert unrecorded(text + "\n" + typed) == ["bench: error: grid.yaml: r: must be a finite number in [0, 1], got 1.5"]
    assert unrecorded(text + "\n<!-- not re-run: a reason -->\n" + typed) == []
    samples = repo_script("docs/make_samples.py")
    changed = text.replace("got 1.5\n", "got 2.5\n", 1)
    assert changed != text and samples.readme_samples(changed)["bad_input"] != samples.readme_block("bad_input")
