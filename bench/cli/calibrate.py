"""`bench calibrate`: the command's body. It checks the command line (models, device, members, budget, output files)
before anything is measured, hands the timing to the device side (`bench.exec.calibrate.calibrate`) and the rows to
the planner's side (`bench.grid.calibration.table_row`, `bench.grid.executor_table.write_rows`)."""

from __future__ import annotations

import argparse
import csv
import datetime
import io
from pathlib import Path

import torch

from bench.config import UserError
from bench.exec.calibrate import Calibration, calibrate, find_data
from bench.exec.prepare import resolve_device
from bench.grid import executor_table
from bench.grid.calibration import device_kind, table_row
from bench.grid.files import load_experiment
from bench.grid.plan import trial_model
from bench.models import get_model
from bench.store.folder import check_output

FIGURE_COLUMNS = ["model", "device", "arm", "executor", "members", "as_run", "images_per_s", "vs_solo", "rounds"]


def models_of(args: argparse.Namespace) -> list[str]:
    """The models to calibrate: --models, else those the trials of --config train (in the order they first come)."""
    if args.models:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
        if not names:
            raise UserError(f"--models names no model: {args.models!r}; give e.g. --models mlp,fashion_cnn")
        for name in names:
            get_model(name)  # unknown: one line naming the models
        return list(dict.fromkeys(names))
    return list(dict.fromkeys(trial_model(t) for t in load_experiment(args.config).trials()))


def members_of(text: str | None, device: torch.device) -> list[int]:
    if text is None:
        return [2, 4, 8, 16] if device.type == "cuda" else [2, 4]
    try:
        ks = sorted({int(k) for k in text.split(",")})
    except ValueError:
        ks = []
    if not ks or ks[0] < 2:
        raise UserError(f"--members must be whole numbers >= 2 separated by commas (trials a unit), got {text!r}")
    return ks


def check_args(args: argparse.Namespace) -> tuple[list[str], torch.device, list[int]]:
    """Everything that can be wrong with the command line, as one line, before anything is measured or written."""
    if not args.budget_s > 0:
        raise UserError(f"--budget-s must be a number of seconds > 0, got {args.budget_s:g}")
    for flag, value in (("--steps", args.steps), ("--rounds", args.rounds), ("--batch", args.batch or 1)):
        if value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    device = resolve_device(args.device)
    models = models_of(args)
    ks = members_of(args.members, device)
    for flag, path in (("--out", args.out), ("--figures", args.figures)):
        if path is not None:
            check_output(path, f"{flag} file", f"give another file to {flag}", kind="file")
    if args.out is not None and Path(args.out).exists():
        executor_table.read_table(Path(args.out))  # a table to update must be one: else one line, nothing written
    for model in models:
        find_data(model, args.data_root)
    return models, device, ks


def cmd_calibrate(args: argparse.Namespace) -> int:
    models, device, ks = check_args(args)
    say = lambda line: print(line, flush=True)  # noqa: E731 - progress while it measures
    say(f"bench calibrate: {', '.join(models)} on {device} (torch {torch.__version__}), members {ks}, "
        f"{args.steps} steps an epoch, best of up to {args.rounds} rounds, budget {args.budget_s:g} s")
    cal = calibrate(models, device, ks, args.data_root, args.budget_s, steps=args.steps, rounds=args.rounds,
                    batch=args.batch, progress=say)
    command = (f"bench calibrate --device {device.type} --models {','.join(models)} --members "
               f"{','.join(map(str, ks))} --steps {args.steps}")
    today = datetime.date.today().isoformat()
    rows = [table_row(model, rates, cal.device_name, today, torch.__version__, command)
            for model, rates in cal.rates.items()]
    for model, rates in cal.rates.items():
        solo = rates[0].images_per_s
        say(f"\n{model}: arm | images/s | vs solo fp32")
        for r in rates:
            say(f"  {r.arm} | {r.images_per_s:,.0f} | {r.images_per_s / solo:.2f}x"
                + ("" if r.as_run else "  (not a table row: a grid runs it only under precision: bf16)"
                   if "bf16" in r.arm else ""))
    say("")
    for row in rows:
        say(f"row: {row.describe()}")
    if args.figures:
        write_figures(cal, Path(args.figures))
        say(f"figures of every arm -> {args.figures}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        executor_table.write_rows(rows, Path(args.out), base=executor_table.table_path())
        say(f"{len(rows)} rows -> {args.out}; plan from them with BENCH_EXECUTOR_TABLE={args.out} bench run GRID")
    else:
        print(table_text(rows), end="")
    skipped = f"; skipped (budget spent): {', '.join(cal.skipped)}" if cal.skipped else ""
    say(f"measured {len(cal.rates)} of {len(models)} models in {cal.seconds:.0f} s of a {args.budget_s:g} s "
        f"budget{skipped}")
    return 0


def table_text(rows: list[executor_table.Choice]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, executor_table.COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(vars(r) for r in rows)
    return out.getvalue()


def write_figures(cal: Calibration, path: Path) -> None:
    """Every arm's figure, one CSV row each (the table rows keep only the winner's executor)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIGURE_COLUMNS)
    for model, rates in cal.rates.items():
        for r in rates:
            writer.writerow([model, device_kind(cal.device_name), r.arm, r.executor, r.members, r.as_run,
                             f"{r.images_per_s:.1f}", f"{r.images_per_s / rates[0].images_per_s:.3f}", r.rounds])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(out.getvalue())
    tmp.replace(path)
