"""A grid planned once (issue #56, item 3): each trial's id hashed once and its schedules built once, each setting
checked once for all its seeds, and the same trials and ids as the grid expanded, then moved to the run's device
trial by trial (the planner before that issue). tests/grid/test_runner.py counts one `Plan.make` a run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.datasets.synthetic import Synthetic
from bench.grid.files import load_experiment
from bench.grid.plan import Plan
from bench.grid.validate import check_trials
from bench.trial import TrialConfig, TrialError

GRID = dict(name="once", dataset="synthetic", noise="case3", r=[0.0, 0.3], seeds=[0, 1, 2], epochs=1,
            epochs_warmup=1, resources={"cpu": 1},
            methods={"ce": {}, "dmi": {"lr": [1e-3, 1e-4]}, "gce": {"q": [0.5, 0.7], "batch_size": [64, 128]}})


def grid(tmp_path: Path) -> Any:
    path = tmp_path / "once.yaml"
    path.write_text(yaml.safe_dump(GRID, sort_keys=False))
    return load_experiment(path)


def fresh_id(t: TrialConfig) -> str:
    """A trial's id from a new object of the same fields (nothing cached), hashed here."""
    identity = dataclasses.replace(t).identity()
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


@pytest.mark.parametrize("device", [None, "cuda"])
def test_the_plan_has_the_trials_and_ids_of_the_grid_moved_trial_by_trial(tmp_path, device):
    exp = grid(tmp_path)
    plan = Plan.make(exp, str(tmp_path / "results"), device=device)
    before = [t if device is None else dataclasses.replace(t, device=device) for t in exp.trials()]
    assert len(before) == exp.size() == 42
    assert plan.trials == before  # every field, the order too
    assert [t.trial_id for t in plan.trials] == [fresh_id(t) for t in before]
    assert len({t.trial_id for t in plan.trials}) == 42
    assert [t.schedules() for t in plan.trials] == [dataclasses.replace(t).schedules() for t in before]


def counting(calls: Counter, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)
    return counted


def test_planning_hashes_each_trial_once_and_checks_each_setting_once(tmp_path, monkeypatch):
    exp = grid(tmp_path)
    calls: Counter = Counter()
    monkeypatch.setattr(TrialConfig, "identity", counting(calls, "identity", TrialConfig.identity))
    monkeypatch.setattr(TrialConfig, "check", counting(calls, "check", TrialConfig.check))
    monkeypatch.setattr(Synthetic, "stage_schedule",
                        classmethod(counting(calls, "stage", Synthetic.stage_schedule.__func__)))
    plan = Plan.make(exp, str(tmp_path / "results"), device="cpu")
    trials = len(plan.trials)
    settings = len({dataclasses.replace(t, seed=0) for t in plan.trials})
    assert (trials, settings) == (42, 14)
    assert calls["identity"] == trials and calls["stage"] == trials  # once a trial (its check reuses them)
    # Every setting is checked, and each seed; no more (a trial whose setting and seed were both checked is not).
    assert settings <= calls["check"] <= settings + len(GRID["seeds"]) < trials


def test_checking_each_setting_once_refuses_what_checking_each_trial_refuses():
    ok = TrialConfig("synthetic", "ce", "case3", 0.2, seed=0, epochs=1, epochs_warmup=1)
    check_trials([ok, dataclasses.replace(ok, seed=1), dataclasses.replace(ok, r=0.3),
                  dataclasses.replace(ok, r=0.3, seed=1)])
    with pytest.raises(TrialError, match="--lr"):  # a new setting with a seed already seen
        check_trials([ok, dataclasses.replace(ok, seed=1), dataclasses.replace(ok, seed=1, lr=-1.0)])
    with pytest.raises(TrialError, match="--seed"):  # a new seed with a setting already seen
        check_trials([ok, dataclasses.replace(ok, r=0.3), dataclasses.replace(ok, r=0.3, seed=-1)])
