"""Calibration, the planner's side: the executor-table row that a model's measured arms (`bench.exec.calibrate`)
make. The winner is the fastest arm timed as a grid runs it (solo fp32, pack K fp32, streams K for K > 1; never a
bf16 arm, which only a `precision: bf16` grid runs, and never a slower arm); its executor and members become the
row's executor and trials a unit, for the device kind as Ray names it, citing the date, the card, the torch version
and every arm's figure in `source`. Imports only the standard library and the table (bench's core, no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bench.grid.executor_table import CPU, Choice


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
