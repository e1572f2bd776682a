"""The report's panel contract (bench.report.panel): the panels are found by the registry in their declared order, the
leaderboard first at order 0, and a panel is one file: a plug-in file alone (no other file edited) puts its CSV table,
figure, Markdown and HTML sections into `bench report`, where its `order` says (before the leaderboard too), handed
both every protocol's rows and the headline's."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from bench.config import UserError
from bench.report.build import build_report
from bench.report.leaderboard import Leaderboard
from bench.report.panel import Panel, panels
from tests.report.test_protocols_panel import rows
from tests.report.test_report import write

PLUGIN = '''
from pathlib import Path

import polars as pl
import pytest

from bench.report.panel import Panel


class Counts(Panel):
    """Between the protocol panel (10) and the noise-kind panel (20)."""

    name = "counts"
    order = 15

    def analyse(self, ctx):
        return pl.DataFrame({"every": [ctx.every.height], "headline": [ctx.df.height], "cells": [ctx.grid.height],
                             "epochs": [ctx.epochs.height], "settings": [ctx.settings.height],
                             "protocols": [",".join(sorted(set(ctx.df["protocol"])))]})

    def tables(self, data):
        return {"counts": data}

    def figures(self, data, ctx):
        ctx.folder.mkdir(parents=True, exist_ok=True)
        path = ctx.folder / "counts.png"
        path.write_bytes(b"\\x89PNG\\r\\n\\x1a\\n")
        return {"counts": path}

    def markdown(self, data, ctx):
        return f"## Counts\\n\\n{data['every'][0]} trials, {data['headline'][0]} shown\\n\\n"

    def html(self, data, figures, ctx):
        return f"<h2>Counts</h2><p>{sorted(figures)}</p>"


class First(Panel):
    name = "first"
    order = -1  # before the leaderboard

    def analyse(self, ctx):
        return pl.DataFrame({"cells": [ctx.grid.height]})

    def tables(self, data):
        return {"first": data}

    def markdown(self, data, ctx):
        return "## First\\n\\n"

    def html(self, data, figures, ctx):
        return f"<h2>First: {data['cells'][0]} cells</h2>"


class Coda(Panel):
    """After every built-in panel, the failed trials (90) included."""

    name = "coda"
    order = 99

    def analyse(self, ctx):
        return None

    def markdown(self, data, ctx):
        return "## Coda\\n"

    def html(self, data, figures, ctx):
        return "<h2>Coda</h2>"
'''


def test_the_built_in_panels_come_in_their_declared_order() -> None:
    found = panels()
    assert [(p.order, p.name) for p in found] == sorted((p.order, p.name) for p in found)
    assert isinstance(found[0], Leaderboard) and (found[0].name, found[0].order) == ("leaderboard", 0)
    assert all(p.order > 0 for p in found[1:])
    assert len({p.name for p in found}) == len(found) and all(isinstance(p, Panel) for p in found)
    # The ones docs/extending.md names, with the orders it gives (a new built-in panel needs no edit here).
    assert {(p.name, p.order) for p in found} >= {("protocols", 10), ("noise_kinds", 20), ("diagnostics", 30),
                                                   ("failures", 90)}


def test_a_panel_is_one_plug_in_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "counts_panel.py").write_text(PLUGIN, encoding="utf-8")
    built_in = [(p.order, p.name) for p in panels()]
    monkeypatch.setenv("BENCH_PLUGINS", str(tmp_path / "plugins"))
    assert [p.name for p in panels()] == [name for _, name in sorted(built_in + [(-1, "first"), (15, "counts"),
                                                                             (99, "coda")])]
    written = build_report(write(tmp_path / "r", rows()), tmp_path / "report", log=lambda s: None)
    # A panel may stand before the leaderboard: its table, Markdown and HTML come first.
    assert [name for name in written if name.endswith(" csv")][:2] == ["first csv", "cells csv"]
    assert pl.read_csv(written["first csv"])["cells"].to_list() == [2]
    assert written["leaderboard.md"].read_text(encoding="utf-8").startswith("## First\n\n# Leaderboard\n")
    assert re.findall(r"<h[12]>(.*?)</h[12]>", written["report.html"].read_text(encoding="utf-8"))[:2] == [
        "First: 2 cells", "bench report"]
    # 9 bench trials (the headline, 2 CE settings and 1 L_DMI: 3 settings, 2 cells) and 7 authors' trials, each with
    # one epoch row.
    counts = pl.read_csv(written["counts csv"])
    assert counts.to_dicts() == [dict(every=16, headline=9, cells=2, epochs=16, settings=2, protocols="bench")]
    assert written["plot counts"] == tmp_path / "report" / "plots" / "counts.png"
    md = written["leaderboard.md"].read_text(encoding="utf-8")
    assert md.index("## Protocol effect") < md.index("## Counts\n\n16 trials, 9 shown\n") < md.index("## Noisy labels")
    assert md.endswith("## Coda\n")
    page = written["report.html"].read_text(encoding="utf-8")
    assert page.index("<h2>Protocol effect</h2>") < page.index("<h2>Counts</h2><p>['counts']</p>")
    assert page.index("<h2>Counts</h2>") < page.index("<h2>Noisy labels</h2>")
    # No trial failed: that panel is one line, still in its place.
    assert page.index("Diverged and failed trials: none") < page.index("<h2>Coda</h2>")
    assert "<h2>Diverged and failed" not in page
    assert page.endswith("</script></body></html>\n")


def test_a_panel_may_not_overwrite_another_table(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "clash.py").write_text(PLUGIN.replace('{"counts": data}', '{"cells": data}'),
                                                   encoding="utf-8")
    monkeypatch.setenv("BENCH_PLUGINS", str(tmp_path / "plugins"))
    with pytest.raises(UserError, match=r"panel 'counts' \(.*clash\) writes cells.csv, which the report already"):
        build_report(write(tmp_path / "r", rows()), tmp_path / "report", log=lambda s: None)
