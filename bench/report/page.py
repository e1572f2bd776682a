"""The report's page frame: `leaderboard.md` and `report.html` are the leaderboard's sections followed by each
panel's (`bench.report.panel`, in their declared order); the HTML page is self-contained, its CSS and JS the package
files `bench/report/report.css` and `report.js` inlined, its figures base64 PNG.
"""

from __future__ import annotations

from bench.report.render import asset


def markdown(sections: list[str]) -> str:
    """`leaderboard.md`: the sections one after another (each ends with its own blank lines)."""
    return "".join(sections)


def html(sections: list[str]) -> str:
    """`report.html`: one self-contained page, no external asset."""
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>bench report</title>"
            f"<style>{asset('report.css')}</style></head><body>{''.join(sections)}<script>{asset('report.js')}</script>"
            "</body></html>\n")
