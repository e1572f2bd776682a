"""`bench calibrate`: its arguments and its body. It checks the command line (models, device, members, budget, output
files) before anything is measured, hands the timing to the device side (`bench.exec.calibrate.calibrate`) and the
rows to the planner's side (`bench.grid.executor_table.table_row`, `write_rows`). torch and
the layers load when the command runs (inside its functions), so that `bench --help` stays light."""

from __future__ import annotations

import argparse
import csv
import datetime
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.config import UserError, integer, number, whole_number
from bench.store.folder import replace_file

if TYPE_CHECKING:
    import torch

    from bench.exec.calibrate import Calibration

# Bounds of the command's numbers: a value past them is a typo, and would run far past any budget.
MAX_BUDGET_S = 86_400
MAX_STEPS, MAX_ROUNDS, MAX_BATCH = 100_000, 100, 65_536

FIGURE_COLUMNS = ["model", "device", "arm", "executor", "members", "as_run", "images_per_s", "vs_solo", "rounds"]


def add_calibrate(sub: argparse._SubParsersAction, add_data_root: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("calibrate", help="time this device training models solo, in packs and in streams units; "
                       "write the fastest as executor-table rows (BENCH_EXECUTOR_TABLE=FILE bench run plans by them)",
                       description="For each model: one trial solo, K trials as a pack and K in a streams unit, "
                       "images/s of each (the best of interleaved rounds); the fastest that a grid runs becomes the "
                       "model's row of the executor table for this device kind.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", help="calibrate the models the trials of this experiment file train")
    which.add_argument("--models", metavar="A,B", help="calibrate these models, e.g. mlp,resnet34_cifar")
    p.add_argument("--device", default="cuda", help="cpu or cuda (default: cuda)")
    p.add_argument("--members", default=None, metavar="K,K",
                   help="trials a unit to time packs and streams units at (default: 2,4,8,16 on CUDA, 2,4 on a CPU)")
    p.add_argument("--budget-s", type=number, default=300.0,
                   help="seconds to measure for (default 300): rounds are cut to fit and models skipped once it is "
                        "spent (never the first); the command says what it skipped")
    p.add_argument("--steps", type=integer, default=20, help="optimiser steps an epoch (default 20)")
    p.add_argument("--rounds", type=integer, default=3, help="timed rounds at most, the best counts (default 3)")
    p.add_argument("--batch", type=integer, default=None, help="batch size (default: the dataset's method stage's)")
    p.add_argument("--out", default=None, help="put the rows into this executor table (made from the table in "
                   "force when absent); default: print them")
    p.add_argument("--figures", default=None, help="also write every arm's images/s to this CSV file")
    add_data_root(p)
    p.set_defaults(func=cmd_calibrate)


def models_of(args: argparse.Namespace) -> list[str]:
    """The models to calibrate: --models, else those the trials of --config train (in the order they first come)."""
    # torch and the layers load when the command runs, so that `bench --help` stays light
    from bench import models
    from bench.grid import files

    if args.models is not None:  # given, even empty (`--models ''`: one line, not the --config path)
        names = [m.strip() for m in args.models.split(",") if m.strip()]
        if not names:
            raise UserError(f"--models names no model: {args.models!r}; give e.g. --models mlp,fashion_cnn")
        for name in names:
            models.get_model(name)  # unknown: one line naming the models
        return list(dict.fromkeys(names))
    return list(dict.fromkeys(t.network() for t in files.load_experiment(args.config).trials()))


def pack_most() -> int:
    # the layers load when the command runs, so that `bench --help` stays light
    from bench.exec.executors.pack import Pack

    return Pack.most


def members_of(text: str | None, device: torch.device) -> list[int]:
    if text is None:
        return [2, 4, 8, 16] if device.type == "cuda" else [2, 4]
    # at most a pack's most: every member's data and weights are held at once, so 1,000,000 ran out of memory
    most = pack_most()
    return sorted({whole_number(k, f"--members (trials a unit, separated by commas: {text[:40]!r})", 2, most,
                                f"a grid packs at most {most} trials a unit") for k in text.split(",")})


def check_args(args: argparse.Namespace) -> tuple[list[str], torch.device, list[int]]:
    """Everything that can be wrong with the command line, as one line, before anything is measured or written."""
    # torch and the layers load when the command runs, so that `bench --help` stays light
    from bench.exec import calibrate, prepare
    from bench.grid import executor_table
    from bench.store import folder

    if not 0 < args.budget_s <= MAX_BUDGET_S:
        raise UserError(f"--budget-s must be a number of seconds > 0 and at most {MAX_BUDGET_S:,} (a day), got "
                        f"{args.budget_s:g}")
    for flag, value, most in (("--steps", args.steps, MAX_STEPS), ("--rounds", args.rounds, MAX_ROUNDS),
                              ("--batch", args.batch or 1, MAX_BATCH)):
        whole_number(value, flag, 1, most)
    device = prepare.resolve_device(args.device)
    models = models_of(args)
    ks = members_of(args.members, device)
    for flag, path in (("--out", args.out), ("--figures", args.figures)):
        if path is not None:
            folder.check_output(path, f"{flag} file", f"give another file to {flag}", kind="file")
    if args.out is not None and Path(args.out).exists():
        executor_table.read_table(Path(args.out))  # a table to update must be one: else one line, nothing written
    for model in models:
        calibrate.find_data(model, args.data_root)
    return models, device, ks


def cmd_calibrate(args: argparse.Namespace) -> int:
    # torch and the layers load when the command runs, so that `bench --help` stays light
    from bench.exec.calibrate import TORCH_VERSION, calibrate
    from bench.grid import executor_table
    from bench.grid.executor_table import device_kind, table_row

    models, device, ks = check_args(args)
    say = lambda line: print(line, flush=True)  # noqa: E731 - progress while it measures
    say(f"bench calibrate: {', '.join(models)} on {device} (torch {TORCH_VERSION}), members {ks}, "
        f"{args.steps} steps an epoch, best of up to {args.rounds} rounds, budget {args.budget_s:g} s")
    cal = calibrate(models, device, ks, args.data_root, args.budget_s, steps=args.steps, rounds=args.rounds,
                    batch=args.batch, progress=say)
    command = (f"bench calibrate --device {device.type} --models {','.join(models)} --members "
               f"{','.join(map(str, ks))} --steps {args.steps}")
    today = datetime.date.today().isoformat()
    rows = [table_row(model, rates, cal.device_name, today, TORCH_VERSION, command)
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
        write_figures(cal, device_kind(cal.device_name), Path(args.figures))
        say(f"figures of every arm -> {args.figures}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        executor_table.write_rows(rows, Path(args.out), base=executor_table.table_path())
        say(f"{len(rows)} rows -> {args.out}; plan from them with BENCH_EXECUTOR_TABLE={args.out} bench run GRID")
    else:
        print(executor_table.table_text(rows), end="")
    skipped = f"; skipped (budget spent): {', '.join(cal.skipped)}" if cal.skipped else ""
    over = " (over it: the first model always gets its warm-up epoch and one round)" \
        if cal.seconds > args.budget_s else ""
    say(f"measured {len(cal.rates)} of {len(models)} models in {cal.seconds:.0f} s of a {args.budget_s:g} s "
        f"budget{over}{skipped}")
    return 0


def write_figures(cal: Calibration, kind: str, path: Path) -> None:
    """Every arm's figure on the device `kind`, one CSV row each (a table row keeps only the winner)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIGURE_COLUMNS)
    for model, rates in cal.rates.items():
        for r in rates:
            writer.writerow([model, kind, r.arm, r.executor, r.members, r.as_run,
                             f"{r.images_per_s:.1f}", f"{r.images_per_s / rates[0].images_per_s:.3f}", r.rounds])
    replace_file(path, lambda tmp: tmp.write_text(out.getvalue()))
