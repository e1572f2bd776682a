"""Formatting shared by the renderers: numbers as the paper prints them, escaping, HTML cells and tables.

The report's formatting, shared by its renderers (`bench.report.leaderboard`, `bench.report.diagnostics`):
numbers as the paper prints them, text from the data escaped for Markdown, LaTeX and HTML, HTML cells and tables,
inlined figures and package assets.
"""

from __future__ import annotations

import base64
import html
import math
import re
import sys
from pathlib import Path
from typing import Any

from bench.report import analysis
from bench.report.analysis import MISSING, fmt


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pm(mean: float | None, std: float | None, digits: int = 2) -> str:
    return fmt(mean, digits) + ("" if std is None or math.isnan(std) else f" ± {fmt(std, digits)}")


def fmt_whole(x: float | None, digits: int = 1) -> str:
    """A mean of whole numbers (epochs, counts): an integer where it is one ("3", not "3.0"), else `digits` decimals."""
    if x is not None and not math.isnan(x) and float(x).is_integer():
        return str(int(x))
    return fmt(x, digits)


def fmt_r(r: float) -> str:
    """A noise level as the paper prints it: 0.0, 0.3, 0.25."""
    return f"{r:.1f}" if round(r, 1) == r else f"{r:g}"


def md(s: object) -> str:
    """Text from the data (names, noise patterns) as literal Markdown: no emphasis, links, HTML or cell breaks."""
    return re.sub(r"([\\`*_\[\]<>|~])", r"\\\1", str(s))


TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "†": r"$^\dagger$", "±": r"$\pm$", "—": "--"}


def tex(s: str) -> str:
    return "".join(TEX.get(ch, ch) for ch in s)


def asset(name: str) -> str:
    """`bench/report/report.css` or `report.js` (package data), inlined into the page."""
    return analysis.package_text(name)


def td(text: Any, cls: str = "", value: float | None = None, title: str = "") -> str:
    attrs = (f' class="{cls}"' if cls else "") + (f' data-v="{value}"' if value is not None else "")
    attrs += f' title="{html.escape(title)}"' if title else ""
    return f"<td{attrs}>{html.escape(MISSING if text is None else str(text))}</td>"


def html_table(header: list[str], rows: list[str], left: int = 1) -> str:
    ths = "".join(f'<th class="l">{html.escape(h)}</th>' if i < left else f"<th>{html.escape(h)}</th>"
                  for i, h in enumerate(header))
    return f'<table class="sortable"><thead><tr>{ths}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def png(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'
