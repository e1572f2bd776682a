"""The grid's MLflow mirror as a Ray Tune callback of its own: each finished trial's result row and curves go to
MLflow (`bench.store.mirror.Mirror`) when its unit ends. Parquet is the record and MLflow a view of it, so this sink
stands apart from the driver's lines (`bench.grid.progress`): a store that is down costs the mirror only, and
`bench sync-mlflow` backfills it from the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.grid.progress import Tally
from bench.store.folder import Store
from bench.store.mirror import Mirror


class MlflowMirroring:
    """Mirrors the rows of each finished unit's trials (a pack: each member's), counting them in
    `Tally.mlflow_logged` for the closing summary. Shaped as Ray Tune's `LoggerCallback` (`log_trial_end`);
    `make_mlflow_callback` makes it one. `mirror` is the mirror, or a function that waits for it to open (None: it
    could not): the grid's units start without waiting for MLflow (`bench.grid.runner.mirror_ready`), and the
    first unit to end waits for it, if it is still opening."""

    def __init__(self, tally: Tally, results: str, units: dict[str, list[str]],
                 mirror: Mirror | Callable[[], Mirror | None]) -> None:
        self.tally, self.units, self.results = tally, units, results
        self._mirror = mirror
        self.store = Store(results)

    def __getstate__(self) -> dict[str, Any]:
        # Ray Tune pickles its callbacks into its experiment state (for `Tuner.restore`, which bench does not use:
        # a grid resumes by its rows); a mirror still opening (a thread's future) cannot be, and is left out.
        return {**self.__dict__, "_mirror": None if callable(self._mirror) else self._mirror}

    @property
    def mirror(self) -> Mirror | None:
        if callable(self._mirror):
            self._mirror = self._mirror()
        return self._mirror

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        if (mirror := self.mirror) is None:
            return
        # Each member's row as it is on disk: a unit that a worker's check refused may still have written some (the
        # streams executor's members that finished before one met bad input).
        for trial_id in self.units[trial.config["unit"]]:
            row, epochs = self.store.read_row(trial_id)
            if row is not None and mirror.log_row(row, epochs):
                self.tally.mlflow_logged += 1

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """A store that failed during the grid (a server restarted, a network cut) is tried once more when the grid
        ends: the grid's rows it lacks are backfilled (a partial run of a trial is replaced, never doubled); where it
        fails again, the summary says how to backfill."""
        if self.mirror is None or self.mirror.ok:
            return
        self.mirror.retry()
        trial_ids = {trial_id for members in self.units.values() for trial_id in members}
        self.tally.mlflow_backfilled = self.mirror.sync(self.results, trial_ids=trial_ids)


def make_mlflow_callback(tally: Tally, results: str, units: dict[str, list[str]],
                         mirror: Mirror | Callable[[], Mirror | None]) -> Any:
    from ray.tune.logger import LoggerCallback  # Ray is the run's, not the module's (as `progress.make_callback`)

    class MirrorToMlflow(MlflowMirroring, LoggerCallback):
        pass

    return MirrorToMlflow(tally, results, units, mirror)
