"""What the training core tells the world while a stage trains, as values rather than text.

The stage loop (`bench.exec.stage.run_stage`) emits one `StageStart`, then a `Resumed` (it continued from a
checkpoint) or the method stage's `EpochRecord` of epoch 0 (the warm-started model), one `EpochRecord` per trained
epoch, and a `StageEnd`; the same for a solo trial (one member) and a pack (K members side by side). Whoever needs
progress (the grid's live status, `bench.grid.progress.UnitReporter`) reads these values, so nothing parses the log
back; the log's per-epoch line is one more consumer, written from the same record by `log_line` (as benchopt's
terminal output and airbench's training details format one row of values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

INITIAL_SHOWN = 8  # members whose epoch-0 validation loss the log line shows (a pack may have hundreds)


@dataclass(frozen=True)
class StageStart:
    stage: str  # "warmup", "warmup1" (a second network's), "method"
    epochs: int
    members: int  # trials (a pack's method stage) or cells (a packed warm start) trained side by side


@dataclass(frozen=True)
class Resumed:
    stage: str
    epoch: int  # the last epoch the checkpoint holds; training goes on from the next


@dataclass(frozen=True)
class EpochRecord:
    """One epoch of a stage, every member's figures (index m: member m). Epoch 0 is the method stage's initial
    state: no training loss, no accuracy in the epoch table. A member frozen after its training loss diverged is
    not `active`: the epoch table has no row of it, its figures here are those of its frozen state."""

    stage: str
    epoch: int
    epochs: int
    train_loss: tuple[float | None, ...]
    val_loss: tuple[float, ...]
    val_acc: tuple[float | None, ...]
    improved: tuple[bool, ...]  # its selection score beat its best so far (this is its new best state)
    active: tuple[bool, ...]
    seconds: float  # training and validation, not the diagnostics
    test_acc: tuple[float | None, ...] = ()  # clean test accuracy % where the epoch's diagnostics measured it

    @property
    def members(self) -> int:
        return len(self.val_loss)

    def member_row(self, m: int) -> dict[str, Any]:
        """Member m's row of the epoch table (`bench.store.columns`), before the diagnostics."""
        return dict(stage=self.stage, epoch=self.epoch, train_loss=self.train_loss[m], val_loss=self.val_loss[m],
                    val_acc=self.val_acc[m], seconds=self.seconds)

    def lowest_val_loss(self) -> float | None:
        """The members' lowest finite validation loss (None: none is finite)."""
        finite = [v for v in self.val_loss if np.isfinite(v)]
        return min(finite) if finite else None


@dataclass(frozen=True)
class StageEnd:
    stage: str
    epoch: int  # the last epoch trained (lower than the stage's epochs where every member diverged)
    seconds: float


Event = StageStart | Resumed | EpochRecord | StageEnd
Events = Callable[[Event], None]


def floats(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def log_line(event: Event) -> str | None:
    """The log's line for an event; None where the log has none (the start and the end of a stage)."""
    if isinstance(event, Resumed):
        return f"resumed from the checkpoint of epoch {event.epoch}"
    if not isinstance(event, EpochRecord):
        return None
    e, k = event, event.members
    if e.epoch == 0:
        return (f"{e.stage}: epoch 0 (initial state) val loss "
                + " ".join(f"{v:.4f}" for v in e.val_loss[:INITIAL_SHOWN]) + (" ..." if k > INITIAL_SHOWN else ""))
    if k == 1:
        label = "epoch" if e.stage == "method" else e.stage
        test = f"  test acc {e.test_acc[0]:.2f}%" if e.test_acc and e.test_acc[0] is not None else ""
        return (f"{label} {e.epoch}/{e.epochs}  train {e.train_loss[0]:.4f}  val {e.val_loss[0]:.4f}  "
                f"noisy val acc {e.val_acc[0]:5.1f}%{test}{'  *' if e.improved[0] else ''}  {e.seconds:.1f}s")
    return (f"{e.stage} {e.epoch}/{e.epochs}  {sum(e.active)} of {k} members training, {sum(e.improved)} "
            f"improved; val loss min {np.nanmin(e.val_loss):.4f} max {np.nanmax(e.val_loss):.4f}  {e.seconds:.1f}s")
