"""`bench report` and `bench leaderboard`: where the output goes, one call into `report/build`.

`bench report RESULTS [RESULTS ...] [--out DIR]` and `bench leaderboard RESULTS [--metric M]`: where the output
goes, one call into `bench.report.build`, and what was written (or the table) printed. The analysis and every
rendering are the report layer's."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.config import UserError
from bench.report.build import build_report, terminal_leaderboard
from bench.store.folder import check_output, is_local, local_path, refuse_links


def cmd_report(args: argparse.Namespace) -> int:
    """One report over one results folder or several (`bench report A B ... --out DIR`: their rows together, a trial
    in two folders once)."""
    folders = [str(r) for r in args.results]
    results = folders[0]
    if args.out is None and len(folders) > 1:
        raise UserError(f"a report over {len(folders)} results folders needs --out DIR: it belongs to none of them")
    if args.out is None and not is_local(results):
        raise UserError("--out DIR is needed when RESULTS is a remote URI")
    out = Path(args.out) if args.out is not None else local_path(results) / "report"
    check_output(out, "report folder", "give another folder with --out")
    # the default folder is the results folder's own: a link there (or in --out) would carry the report elsewhere
    refuse_links(local_path(results) if args.out is None else out, "results folder" if args.out is None else
                 "report folder")
    written = build_report(folders, out)
    for name, path in written.items():
        print(f"{name:28s} {path}")
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    print(terminal_leaderboard(str(args.results), args.metric, bold=sys.stdout.isatty()))
    return 0
