"""MLflow's writer as a process of its own (issue #56, item 2): the runs it logs are those the in-process mirror logs,
a writer that dies is the summary's one MLflow line and `bench sync-mlflow` repairs what it missed, and a grid's
driver never imports MLflow (the store's CPU is the writer's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from bench.cli.main import main
from bench.grid.mlflow_callback import MirrorProcess
from bench.grid.plan import Plan
from bench.grid.progress import Tally, print_summary
from bench.store.mirror import TAG, Mirror
from tests.grid.test_runner import subprocess_env, write_config
from tests.report.test_report import make_row, write


def runs_by_trial(uri: str, experiment: str = "test") -> dict[str, list[dict]]:
    """Each trial's runs in the store: params, latest metrics, tags (MLflow's own left out), artifact names."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    found: dict[str, list[dict]] = {}
    for run in client.search_runs([exp.experiment_id], f"tags.`{TAG}kind` = 'trial'", max_results=1000):
        found.setdefault(run.data.tags[f"{TAG}trial_id"], []).append(dict(
            params=run.data.params, metrics=run.data.metrics, name=run.info.run_name,
            tags={k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
            artifacts=sorted(a.path for a in client.list_artifacts(run.info.run_id))))
    return found


def test_the_writer_process_logs_what_the_mirror_logs_in_process(tmp_path: Path) -> None:
    rows = [make_row("ce", 0.2, seed, 0.5, 70.0 + seed) for seed in range(4)]
    results = write(tmp_path / "results", rows)
    ids = [r["trial_id"] for r in rows]
    tally, lines = Tally(total=3), []
    writer = MirrorProcess(tally, str(results), None, done=ids[:1], grid=ids[1:], out=lines.append)
    writer.put(ids[1:3])
    writer.put(ids[3:])
    assert writer.close(120)
    assert writer.mirror.ok and writer.mirror.embedded and tally.mlflow_logged == 3
    assert lines == ["MLflow: backfilled 1 runs of finished trials"]
    by_process = runs_by_trial(writer.mirror.uri)
    in_process = Mirror(f"sqlite:///{tmp_path / 'other.db'}", results)
    assert in_process.sync(results) == 4
    expected = runs_by_trial(in_process.uri)
    assert sorted(by_process) == sorted(ids) and all(len(runs) == 1 for runs in by_process.values())
    assert by_process == expected


def test_a_writer_that_dies_is_one_summary_line_and_sync_mlflow_repairs_it(tmp_path: Path, capsys) -> None:
    rows = [make_row("ce", 0.4, seed, 0.5, 60.0) for seed in range(2)]
    results = write(tmp_path / "results", rows)
    ids = [r["trial_id"] for r in rows]
    tally = Tally(total=2)
    writer = MirrorProcess(tally, str(results), None, done=[], grid=ids, out=print)
    os.kill(writer.process.pid, signal.SIGKILL)
    writer.put(ids)  # into a pipe nobody reads: no error here
    assert writer.close(60)
    assert not writer.mirror.ok and "exit code -9" in writer.mirror.failed and tally.mlflow_logged == 0
    lines: list[str] = []
    print_summary(SimpleNamespace(name="test"), Plan(experiment=None, trials=[], results=str(results)), tally,
                  writer.mirror, lines.append)
    said = [line for line in lines if "MLflow" in line]
    assert len(said) == 1 and "store FAILED" in said[0] and f"bench sync-mlflow {results}" in said[0], lines
    assert main(["sync-mlflow", str(results)]) == 0
    assert "logged 2 missing runs" in capsys.readouterr().out
    assert {t: len(runs) for t, runs in runs_by_trial(writer.mirror.uri).items()} == dict.fromkeys(ids, 1)


def test_a_grid_driver_never_imports_mlflow_and_its_runs_are_logged(tmp_path: Path) -> None:
    """The driver's CPU with MLflow on: MLflow's import alone was a second or two of it (and Ray Tune's callback
    census imported it again for telemetry); now every MLflow call is the writer process's."""
    config = write_config(tmp_path, name="quiet", r=[0.2], seeds=[0, 1], methods={"ce": {}}, epochs=1,
                          epochs_warmup=1)
    results = tmp_path / "results"
    script = ("import sys; from bench.cli.main import main; code = main(sys.argv[1:]); "
              "print('mlflow imported:', 'mlflow' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "run", str(config), "--results", str(results),
                           "--num-cpus", "1", "--data-root", str(tmp_path), "--yes"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MLflow: 2 runs logged to " in done.stdout and "mlflow imported: False" in done.stdout, done.stdout
    assert len(runs_by_trial(f"sqlite:///{results / 'mlflow.db'}", "quiet")) == 2
