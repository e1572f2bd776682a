"""MLflow as a team reads it (issue 44): real trials, logged by `bench sync-mlflow`, served by `bench ui` on 127.0.0.1
and rendered by headless Chromium. The experiment link `bench ui` prints opens on the runs table (not MLflow 3's GenAI
overview), every trial a flat row whose Duration is its wall time; MLflow's compare page shows each trial's protocol,
selection rule and training subset; and docs/running.md's Python compare recipe runs as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench.cli import main as cli
from bench.store import mirror
from bench.store.folder import read_table
from bench.store.mirror import run_name
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
BENCH = str(Path(sys.executable).parent / "bench")
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="renders MLflow's UI in headless Chromium, which is not "
                                    "installed (apt-get install chromium)")


def trials(results: Path) -> list[dict]:
    """Two real trials on the synthetic data that differ in method, protocol-free settings and training subset."""
    common = ["--dataset", "synthetic", "--noise", "case3", "--r", "0.4", "--seed", "0", "--epochs", "2",
              "--epochs-warmup", "2", "--results", str(results)]
    assert cli.main(["trial", "--method", "dmi", *common]) == 0
    assert cli.main(["trial", "--method", "ce", "--train-subset", "300", *common]) == 0
    assert cli.main(["sync-mlflow", str(results)]) == 0
    return read_table(results).to_dicts()


class _Cells(HTMLParser):
    """The runs table (ag-grid: each row's cells under its `row-id`, the run id, by `col-id`) and the compare page's
    tables (a <th> heading each row of <td> values)."""

    def __init__(self) -> None:
        super().__init__()
        self.grid: dict[str, dict[str, str]] = {}
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self._cell: str | None = None
        self._th: str | None = None
        self._text: list[str] = []
        self._depth = 0
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if a.get("role") == "row" and a.get("row-id"):
            self._row = a["row-id"]
        if a.get("role") == "gridcell" and self._row:
            self._cell, self._text = a.get("col-id"), []
        value = tag == "td" or tag == "th" and "data-value" in (a.get("class") or "")  # the run ids' row: <th>s
        if tag == "th" and not value:
            self._th, self._text = "", []
        elif value and self._th is not None:
            self._in_td, self._text = True, []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self._text).strip()
        if tag in ("td", "th") and self._in_td:
            self.rows[self._th].append(text)
            self._in_td = False
        elif tag == "th" and self._th == "":
            self._th = text.rstrip(":")
            self.rows.setdefault(self._th, [])
        elif tag == "tr":
            self._th = None
        elif tag == "div" and self._cell is not None and text:
            self.grid.setdefault(self._row, {}).setdefault(self._cell, text)
            self._cell = None


def seconds(text: str) -> float:
    """MLflow's Duration cell ("850ms", "10.1s", "1.6min", "2.3h") in seconds."""
    number, unit = re.fullmatch(r"([\d.]+)\s*(ms|s|min|h)", text).groups()
    return float(number) * {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}[unit]


def render(url: str) -> _Cells:
    """The page after its scripts ran, parsed."""
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--window-size=1600,1000", "--virtual-time-budget=30000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=180)
    parser = _Cells()
    parser.feed(out.stdout)
    return parser


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """The two trials, trained and logged to MLflow once for the module: their results folder and rows."""
    results = tmp_path_factory.mktemp("ui") / "results"
    return results, trials(results)


@pytest.fixture(scope="module")
def ui(synced: tuple[Path, list[dict]]) -> Iterator[tuple[subprocess.Popen, int, list[str]]]:
    """One `bench ui` on the trials for the module (started by a shell without MLFLOW_SERVER_ENABLE_JOB_EXECUTION):
    its process, its port and the lines it printed up to the experiment's link, which it prints last."""
    results, _ = synced
    port = free_port()
    ui = subprocess.Popen([BENCH, "ui", str(results), "--port", str(port)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                          env={k: v for k, v in os.environ.items() if k != "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"})
    try:
        lines = [ui.stdout.readline()]
        while not lines[-1].startswith("MLflow UI for"):  # the server's own start-up lines come first
            assert lines[-1], "bench ui ended"
            lines.append(ui.stdout.readline())
        lines.append(ui.stdout.readline())  # "  adhoc: http://..."
        yield ui, port, lines
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=60)
        ui.stdout.close()


def test_the_ui_prints_its_link_once_the_server_answers_and_runs_no_job_runner(synced, ui) -> None:
    """#55: the link came at once, up to two minutes before the server answered it; and MLflow's GenAI job runner
    started with the server. Now: a "starting" line, then the link when /health answers; the server's environment
    turns the job runner off."""
    (results, _), (ui, port, lines) = synced, ui
    assert lines[0].startswith(f"starting MLflow's server for sqlite:///{results / 'mlflow.db'}")
    # The server's own start-up lines, then ours, which waits until it answers (a minute at most, loaded).
    title = next(i for i, line in enumerate(lines) if line.startswith("MLflow UI for"))
    assert title == len(lines) - 2 and not any("http://" in line for line in lines[:title]), lines
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:  # at once, no retry
        assert answer.status == 200
    children = Path(f"/proc/{ui.pid}/task/{ui.pid}/children").read_text().split()
    (server,) = [pid for pid in children if b"server" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    assert b"MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in environ


def test_a_port_in_use_is_one_line_and_exit_2_before_any_server_starts(synced, ui, capsys) -> None:
    """A second `bench ui` on the first's port: MLflow's server, started there, logged a traceback and exited 0, so
    `bench ui` said nothing was wrong."""
    (results, _), (_, port, _) = synced, ui
    assert cli.main(["ui", str(results), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"port {port} on 127.0.0.1 is in use" in err and "--port" in err


def test_a_server_that_ends_before_it_answers_is_a_failure(synced, capsys) -> None:
    """The port taken after the check (a listener that never answers HTTP): the server cannot bind and ends, and
    `serve` says so and returns non-zero, never printing the link."""
    results, _ = synced
    answered = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = mirror.serve(f"sqlite:///{results / 'mlflow.db'}", taken.getsockname()[1], lambda: answered.append(1))
    err = capsys.readouterr().err
    assert code != 0 and not answered, err[-2000:]
    assert "MLflow's server ended" in err and "before it answered" in err


@needs_chromium
@pytest.mark.slow
def test_the_ui_opens_an_experiment_on_its_runs_with_each_trials_params_and_time(synced, ui) -> None:
    (results, rows), (_, port, lines) = synced, ui
    rows = {r["trial_id"]: r for r in rows}
    link = lines[-1].split(": ", 1)[1].strip()  # "  adhoc: http://127.0.0.1:PORT/#/experiments/1/runs?..."
    assert lines[-1].strip().startswith("adhoc: ") and link.endswith("?workflowType=machine_learning")
    from mlflow import MlflowClient

    runs = MlflowClient(f"sqlite:///{results / 'mlflow.db'}").search_runs(
        [re.search(r"/experiments/(\w+)/", link).group(1)])
    by_run = {r.info.run_id: rows[r.data.tags["bench.trial_id"]] for r in runs}
    assert len(by_run) == 2  # flat: the two trials, no parent run

    page = render(link)
    assert set(page.grid) == set(by_run), page.grid  # the runs table, one row per trial
    for run_id, row in by_run.items():
        cells = page.grid[run_id]
        assert cells["attributes.`Run Name`"].endswith(run_name(row))  # after its colour chip's text
        # Duration shows 3 significant digits of the trial's wall time (not the mirror's ms of logging).
        assert seconds(cells["duration"]) == pytest.approx(row["wall_s"], rel=0.05)
    ids = list(by_run)
    compare = render(f"http://127.0.0.1:{port}/#/compare-runs?"
                     + urllib.parse.urlencode({"runs": json.dumps(ids), "experiments": json.dumps(
                         [runs[0].info.experiment_id])}))
    order = compare.rows["Run ID"]
    assert sorted(order) == sorted(ids)
    for i, run_id in enumerate(order):
        row = by_run[run_id]
        assert compare.rows["protocol"][i] == "bench"
        assert compare.rows["selection"][i] == "lowest loss on the whole validation set, strict"
        assert compare.rows["train_subset"][i] == ("none" if row["train_subset"] is None else
                                                  str(row["train_subset"]))
        assert compare.rows["method"][i] == row["method"]
        assert seconds(compare.rows["Duration"][i]) == pytest.approx(row["wall_s"], rel=0.05)
    assert sorted(compare.rows["train_subset"]) == ["300", "none"]


def test_the_compare_recipe_runs_as_written(synced, capsys) -> None:
    results, rows = synced
    text = (REPO / "docs" / "running.md").read_text(encoding="utf-8")
    (recipe,) = re.findall(r"```python\n(from mlflow import MlflowClient\n.*?)```", text, re.S)
    assert 'RESULTS, EXPERIMENT = "results/demo", "demo"\n' in recipe
    # The demo's folder and experiment here: the trials of `bench trial` land in experiment "adhoc" at r = 0.4.
    recipe = recipe.replace('"results/demo", "demo"', f'"{results}", "adhoc"').replace("'0.6'", "'0.4'")
    exec(compile(recipe, "docs/running.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(rows) == 2
    ranked = sorted(rows, key=lambda r: -r["test_acc"])
    for line, row in zip(lines, ranked, strict=True):
        assert line.split()[0] == row["method"] and f"test {row['test_acc']:.2f}%" in line
        assert f"subset={'none' if row['train_subset'] is None else row['train_subset']}" in line
        assert "protocol=bench" in line
        assert float(re.search(r"([\d.]+) s$", line).group(1)) == pytest.approx(row["wall_s"], abs=0.05)
