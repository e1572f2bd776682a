"""Fault injection, third round (issue #29): every failure one line, never a hang. A worker's deterministic error is
not retried by Ray, `--address` to a port that is not Ray answers in seconds, seed counts and long names are refused
before anything is built, a pack's memory bound is checked, unwritable outputs are named up front, a reader that
leaves loses no rows, and damaged CIFAR files are one line. Each test fails on the code before that issue."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from bench import models
from bench.data import registry as datasets
from bench.grid.files import load_experiment
from bench.grid.runner import Settings, run_experiment
from bench.methods import registry as methods
from bench.store.folder import read_table

GRID = dict(name="last", dataset="synthetic", noise="case3", r=[0.2], seeds=[0], epochs=1, epochs_warmup=1,
            resources={"cpu": 1}, methods={"ce": {}})

# A method plug-in with a bug: its loss raises, the same way on every try.
CRASHY = '''
from bench.methods import Method


class Crashy(Method):
    name = "crashy"
    title = "Crashy"
    paper = "a method whose loss has a bug (tests)"
    reference = "none"

    def loss(self, logits, labels):
        raise ValueError("a bug in the loss,\\n  on two lines")
'''


def write_config(folder: Path, **changes) -> Path:
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, **changes}, sort_keys=False))
    return path


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1, err
    assert err[0].startswith("bench: error:"), err
    return err[0]


def _clear_registries() -> None:
    for registry in (datasets, methods, models.registry):
        registry.cache_clear()


@pytest.fixture(scope="module")
def plugin_ray(tmp_path_factory):
    """A local Ray whose workers see a plug-in folder with the `crashy` method (the folder is set before Ray starts,
    so that the workers inherit it)."""
    import ray

    folder = tmp_path_factory.mktemp("plugins")
    (folder / "crashy.py").write_text(CRASHY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_PLUGINS", str(folder))
        _clear_registries()
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            yield ray
        finally:
            ray.shutdown()
    _clear_registries()


# -- 4. a worker's own error is not retried ----------------------------------------------------------------------------
def test_a_deterministic_error_in_a_worker_fails_its_trial_once_and_the_others_go_on(plugin_ray, tmp_path):
    config = write_config(tmp_path, name="crash", methods={"ce": {}, "crashy": {}})
    results = tmp_path / "results"
    lines: list[str] = []
    started = time.monotonic()
    tally = run_experiment(load_experiment(config), Settings(results=str(results), data_root=tmp_path, mlflow=False,
                                                             retries=2), lines.append)
    assert time.monotonic() - started < 60
    assert tally.statuses == {"ok": 1, "failed": 1}
    rows = {row["method"]: row for row in read_table(results).iter_rows(named=True)}
    assert rows["ce"]["status"] == "ok" and rows["crashy"]["status"] == "failed"
    reason = "ValueError: a bug in the loss, on two lines"
    assert rows["crashy"]["error"] == reason
    log = (results / "logs" / f"{rows['crashy']['trial_id']}.log").read_text()
    assert log.count(f"trial {rows['crashy']['trial_id']}:") == 1  # one attempt: Ray did not retry it
    assert "Traceback" in log  # the whole story stays in the trial's log
    text = "\n".join(lines)
    assert "Ray retries" not in text and "Traceback" not in text
    assert f"      error: {reason}" in text.splitlines()
    assert "1 failed trials keep a row with status failed" in text
