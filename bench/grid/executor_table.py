"""The planner's table (`executors.csv`, or `$BENCH_EXECUTOR_TABLE`): the executor per model and device, and the row a
model's measured arms make (calibration's winner).

The planner's table: which executor trains the trials of a model on a kind of device, and how many trials at once
(`bench/grid/executors.csv`, or the file `$BENCH_EXECUTOR_TABLE` names). `bench calibrate` and benchmarks write its
rows from what they measured (`write_rows`; `benchmarks/big_models.py --write-table`), each row citing its
measurement; the planner reads them (`choose`) under `--pack auto` instead of deciding by a constant.

The row a model's measured arms make (`table_row`; the arms are timed by `bench.exec.calibrate`): the winner is the
fastest arm timed as a grid runs it (solo fp32, pack K fp32, streams K for K > 1; never a bf16 arm, which only a
`precision: bf16` grid runs, and never a slower arm); its executor and members become the row's executor and trials
a unit, for the device kind as Ray names it (`device_kind`), citing the date, the card, the torch version and every
arm's figure in `source`.

A row matches a trial by its model (`*`: any) and its device: `cpu`, `cuda` (any GPU), or a GPU kind that the GPU's
name contains (`H200` matches Ray's accelerator type `H200` and torch's `NVIDIA H200`). The most specific row wins:
the model's on this GPU kind, the model's on any GPU, any model's on this kind, any model's on any GPU. Where no row
matches, the trials run solo. Imports only the standard library, so that a benchmark on a bare GPU box writes it.
"""

from __future__ import annotations

import csv
import functools
import io
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

from bench.config import UserError, integer, number
from bench.store.folder import replace_file

DEFAULT = Path(__file__).resolve().parent / "executors.csv"
ANY_MODEL, CPU, ANY_GPU = "*", "cpu", "cuda"
TRIALS_MOST = 999_999  # trials a unit at most: a unit of trials on one device


@dataclass(frozen=True)
class Choice:
    """One row: trials of `model` on `device` train with `executor`, `trials` at most in a unit, because of the
    measurement in `source` (`images_per_s` on `measured`)."""

    model: str
    device: str
    executor: str
    trials: int
    images_per_s: str = ""
    measured: str = ""
    source: str = ""

    def describe(self) -> str:
        at_once = f", at most {self.trials} trials a unit" if self.executor != "solo" else ""
        return f"{self.model} on {self.device}: {self.executor}{at_once} ({self.measured}: {self.source})"


COLUMNS = [f.name for f in fields(Choice)]


def table_path() -> Path:
    return Path(os.environ.get("BENCH_EXECUTOR_TABLE") or DEFAULT).expanduser()


def read_table(path: Path | None = None) -> tuple[Choice, ...]:
    path = path or table_path()
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise UserError(f"cannot read the executor table {path} ({e.strerror or e}); point $BENCH_EXECUTOR_TABLE at "
                        f"a CSV file with the columns {', '.join(COLUMNS)}, or unset it") from None
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise UserError(f"the executor table {path}, line {line}: not UTF-8 text (byte {e.object[e.start]:#04x}); "
                        "save it as UTF-8 CSV") from None
    return _parse(text, str(path))


@functools.cache
def _parse(text: str, where: str) -> tuple[Choice, ...]:
    """The table's rows; any malformed line is one `UserError` naming it (a field too many or too few, a count that
    is not plain ASCII digits, a byte the CSV reader refuses)."""
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    try:
        if reader.fieldnames != COLUMNS:
            raise UserError(f"the executor table {where} has the columns {', '.join(reader.fieldnames or [])}; it "
                            f"needs {', '.join(COLUMNS)}")
        return tuple(_choice(row, f"{where}, line {reader.line_num}") for row in reader)
    except csv.Error as e:
        raise UserError(f"{where}, line {reader.line_num + 1}: not a CSV line ({e}); write one row a line with the "
                        f"columns {', '.join(COLUMNS)}") from None


def _choice(row: dict[str | None, str | None], where: str) -> Choice:
    if None in row or None in row.values():  # a field more, or fewer, than the header's
        count = len(COLUMNS) + len(row[None] or []) if None in row else sum(v is not None for v in row.values())
        raise UserError(f"{where}: {count} fields where the header has {len(COLUMNS)} ({', '.join(COLUMNS)}); quote "
                        "a field that holds a comma")
    trials = row["trials"] or ""
    if not trials.isdigit() or _count(trials[:9]) < 1:  # unsigned, and ASCII ('²' and '٣' are digits to isdigit)
        raise UserError(f"{where}: trials must be a whole number >= 1, got {trials[:40]!r}")
    if len(trials) > len(str(TRIALS_MOST)):
        raise UserError(f"{where}: trials must be at most {TRIALS_MOST} (a unit of trials on one device), got "
                        f"{trials[:40]!r}")
    if not row["model"] or not row["device"] or not row["executor"]:
        raise UserError(f"{where}: model, device and executor must each be given")
    if (rate := row["images_per_s"] or "") and not 0 < _rate(rate) < float("inf"):
        raise UserError(f"{where}: images_per_s must be a number > 0 (the measured rate) or empty, got {rate[:40]!r}")
    return Choice(**{**row, "trials": int(trials)})  # type: ignore[arg-type]


def _count(text: str) -> int:
    try:
        return integer(text)
    except ValueError:
        return 0


def _rate(text: str) -> float:
    try:
        return number(text)
    except ValueError:
        return float("nan")


def choose(model: str, device: str, gpu_kind: str | None, table: tuple[Choice, ...] | None = None) -> Choice | None:
    """The row for trials of `model` on `device` ("cpu" or "cuda..."), on GPUs named `gpu_kind` (None: unknown)."""
    table = read_table() if table is None else table
    if not device.startswith("cuda"):
        wanted = [(model, CPU), (ANY_MODEL, CPU)]
    else:
        wanted = [(model, "kind"), (model, ANY_GPU), (ANY_MODEL, "kind"), (ANY_MODEL, ANY_GPU)]
    for want_model, want_device in wanted:
        for row in table:
            if row.model != want_model:
                continue
            if want_device == "kind":
                if gpu_kind and row.device not in (CPU, ANY_GPU) and row.device.lower() in gpu_kind.lower():
                    return row
            elif row.device == want_device:
                return row
    return None


class Measured(Protocol):
    """An arm's figure (`bench.exec.calibrate.Rate`)."""

    arm: str
    executor: str
    members: int
    as_run: bool
    images_per_s: float


def winner(rates: Sequence[Measured]) -> Measured:
    """The fastest arm that a grid runs as it was timed; on a tie, the first (solo before the units)."""
    candidates = [r for r in rates if r.as_run]
    if not candidates:
        raise ValueError("no arm was timed as a grid runs it")
    best = candidates[0]
    for r in candidates[1:]:
        if r.images_per_s > best.images_per_s:
            best = r
    return best


def device_kind(name: str) -> str:
    """The table's device for a device named `name` ("NVIDIA H100 80GB HBM3" -> "H100", as Ray names its
    accelerator type): its first word with a digit, up to a dash; "cpu" stays."""
    if name.lower() == CPU:
        return CPU
    words = [w.split("-")[0] for w in name.split() if any(c.isdigit() for c in w)]
    return words[0] if words else name


def table_row(model: str, rates: Sequence[Measured], device_name: str, date: str, torch_version: str,
              command: str) -> Choice:
    """The executor-table row of `model` on this device from its measured `rates`."""
    best = winner(rates)
    trials = 1 if best.executor == "solo" else best.members
    figures = "; ".join(f"{r.arm} {r.images_per_s:,.0f}" for r in rates if r.as_run)
    return Choice(model, device_kind(device_name), best.executor, trials, f"{best.images_per_s:.0f}",
                  f"{date} {device_name}",
                  f"{command} (torch {torch_version}): {best.arm} fastest; images/s {figures}")


def write_row(choice: Choice, path: Path | None = None) -> None:
    """Put `choice` into the table: in place of the row for its model and device, else at the end."""
    write_rows([choice], path)


def write_rows(choices: list[Choice], path: Path | None = None, base: Path | None = None) -> None:
    """Put `choices` into the table at `path` (each in place of the row for its model and device, else at the end),
    in one atomic write; a `path` that does not exist yet starts from the rows of `base` (none: empty)."""
    path = path or table_path()
    start = path if path.exists() else base
    rows = list(read_table(start)) if start is not None else []
    for choice in choices:
        at = next((i for i, r in enumerate(rows) if (r.model, r.device) == (choice.model, choice.device)), None)
        if at is None:
            rows.append(choice)
        else:
            rows[at] = choice
    replace_file(path, lambda tmp: tmp.write_text(table_text(rows)))


def table_text(rows: list[Choice]) -> str:
    """`rows` as the table's CSV text."""
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(asdict(r) for r in rows)
    return out.getvalue()
