"""A unit's progress records (`bench.grid.progress.UnitReporter`, issue #56 item 2): each one holds the unit until the
driver has taken it, so a stage's start goes at once only where the unit's epochs are long; where they are short, the
next epoch's record carries the new stage within about `every` seconds. On a clock of the test's own."""

from __future__ import annotations

from types import SimpleNamespace

from bench.exec.events import EpochRecord, StageStart
from bench.grid import progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def epoch(stage: str, number: int, seconds: float) -> EpochRecord:
    return EpochRecord(stage=stage, epoch=number, epochs=3, train_loss=(1.0,), val_loss=(0.5,), val_acc=(60.0,),
                       improved=(True,), active=(True,), seconds=seconds)


def reported(monkeypatch, timeline: list[tuple[float, object]], every: float = 2.0) -> list[tuple[float, str, int]]:
    """(time, stage, epoch) of each record a unit sends for the events of `timeline` (time, event; None: its start)."""
    clock = Clock()
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=clock))
    records: list[tuple[float, str, int]] = []
    reporter = progress.UnitReporter(lambda r: records.append((clock.now, r["stage"], r["epoch"])), every=every)
    for at, event in timeline:
        clock.now = at
        reporter.start() if event is None else reporter.event(event)
    return records


def test_short_epochs_carry_a_stage_start_in_their_next_record(monkeypatch) -> None:
    records = reported(monkeypatch, [
        (0.0, None), (0.5, StageStart("warmup", 1, 1)), (0.6, epoch("warmup", 1, 0.1)),
        (0.7, StageStart("method", 3, 1)), (0.8, epoch("method", 0, 0.05)), (0.9, epoch("method", 1, 0.1)),
        (1.0, epoch("method", 2, 0.1)), (2.6, epoch("method", 3, 0.1))])
    # The start (its node) and the first stage (no epoch measured yet) at once; the method stage with its first
    # record due, `every` after the last one sent.
    assert records == [(0.0, "loading data", None), (0.5, "warmup", 0), (2.6, "method", 3)]


def test_long_epochs_send_a_stage_start_at_once(monkeypatch) -> None:
    records = reported(monkeypatch, [
        (0.0, None), (0.5, StageStart("warmup", 1, 1)), (30.5, epoch("warmup", 1, 30.0)),
        (30.6, StageStart("method", 3, 1)), (30.7, epoch("method", 0, 0.1)), (60.7, epoch("method", 1, 30.0))])
    assert records == [(0.0, "loading data", None), (0.5, "warmup", 0), (30.5, "warmup", 1), (30.6, "method", 0),
                       (60.7, "method", 1)]
