"""A unit whose reused actor dies while Ray Tune resets it for that unit is retried (issue 54).

`bench run` reuses actors: a unit that starts on the actor of a finished one waits, PENDING, for the actor's `reset`.
A worker node lost in that moment (right after a row landed there) killed the actor in its reset; Ray Tune 2.60 heard
of it twice, retried the unit on the actor's death, then took the reset's error for a second failure of a unit not
running and ended it `failed` without a row, whatever `--retries` said
(`bench.grid.cluster.retry_units_lost_in_reset` drops the second report). Here the actor dies in its first reset by
its own hand (`os._exit`, as a SIGKILLed node's worker ends), in a local Ray, one trial at a time: every trial ends
without error, the one whose reset killed the actor retried. Without the fix that trial ends in error
(ActorDiedError). `tests/grid/test_node_loss.py` loses a real node at that moment and four others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.grid.cluster import retry_units_lost_in_reset, start_ray


@pytest.fixture
def local_ray() -> Iterator[None]:
    """A Ray of one CPU in this process, on 127.0.0.1 only, as `bench run` starts it."""
    import ray

    assert start_ray(None, 1)
    try:
        yield
    finally:
        ray.shutdown()


def test_a_unit_whose_reused_actor_dies_in_its_reset_is_retried(local_ray: None, tmp_path: Path) -> None:
    from ray import tune

    class DiesInItsFirstReset(tune.Trainable):
        def setup(self, config: dict) -> None:
            self.x = config["x"]

        def step(self) -> dict:
            return {"x": self.x, "done": True}

        def save_checkpoint(self, checkpoint_dir: str) -> dict:  # Ray Tune saves each trial as it ends
            return {"x": self.x}

        def load_checkpoint(self, checkpoint: dict) -> None:
            self.x = checkpoint["x"]

        def reset_config(self, new_config: dict) -> bool:
            died = Path(new_config["folder"]) / "died"
            if not died.exists():
                died.write_text(str(new_config["x"]))
                os._exit(1)  # the actor's process ends mid-reset, as on a node SIGKILLed then
            self.x = new_config["x"]
            return True

    retry_units_lost_in_reset()
    tuner = tune.Tuner(
        DiesInItsFirstReset,
        param_space={"x": tune.grid_search([0, 1, 2]), "folder": str(tmp_path)},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    grid = tuner.fit()
    died_in = int((tmp_path / "died").read_text())  # the trial whose reset killed the actor
    assert died_in in (1, 2)  # a reset happens only for a trial after the first
    assert grid.num_errors == 0, [r.error for r in grid]
    assert sorted(r.metrics["x"] for r in grid) == [0, 1, 2]
