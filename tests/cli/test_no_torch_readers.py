"""Commands that touch no tensor import no torch (issue #56, item 4): `bench results` (its compact table, --wide,
--by-node, --out), `bench status`, `bench leaderboard`, `bench report`, `bench sync-mlflow`, `bench ui` and every
command's `--help`, each in a fresh interpreter on a small results folder made by a real grid (`bench run`), and on
the same folder with one of its grid's rows gone (an incomplete grid, whose missing trials are named by their methods'
titles); what each printed (and wrote) is what it prints with torch loaded first."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
GRID = """name: light
dataset: synthetic
noise: case3
r: [0.2]
seeds: [0]
epochs: 1
epochs_warmup: 1
resources: {cpu: 1}
methods: {ce: {}, dmi: {}}
"""


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"complete": a folder `bench run` filled (CE and L_DMI on the synthetic set, with its MLflow store and its
    grid's record), "incomplete": its copy less L_DMI's row}."""
    folder = tmp_path_factory.mktemp("grid")
    (folder / "light.yaml").write_text(GRID)
    complete, incomplete = folder / "complete", folder / "incomplete"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-m", "bench.cli.main", "run", str(folder / "light.yaml"), "--results",
                           str(complete), "--num-cpus", "2", "--yes"], env=env, cwd=folder, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.copytree(complete, incomplete, ignore=shutil.ignore_patterns("index", "mlflow.db", "mlartifacts"))
    import polars as pl

    (dmi,) = pl.read_parquet(incomplete / "trials").filter(method="dmi")["trial_id"]
    for table in ("trials", "epochs"):
        (incomplete / table / f"{dmi}.parquet").unlink()
    return {"complete": complete, "incomplete": incomplete}


def run(args: list[str], torch_first: bool = False, prelude: str = "") -> tuple[bool, str, int]:
    """(whether torch was imported, stdout, exit code) of `bench ARGS` in a fresh interpreter (`prelude` run first)."""
    code = ("import io, json, sys, contextlib\n" + ("import torch\n" if torch_first else "") + prelude +
            "from bench.cli.main import main\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n"
            "    try:\n        rc = main(json.loads(sys.argv[1]))\n    except SystemExit as e:\n"
            "        rc = e.code\n"
            "print(json.dumps(['torch' in sys.modules, out.getvalue(), rc]))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=True)
    return tuple(json.loads(done.stdout.splitlines()[-1]))


HEADLINE = {"complete": "Grid light: all 2 trials have a usable row.",
            "incomplete": "Grid light: 1 of 2 trials missing (no row): L_DMI 1 of 1"}


@pytest.mark.parametrize("state", ["complete", "incomplete"])
@pytest.mark.parametrize("flags", [[], ["--wide"], ["--by-node"]])
def test_bench_results_imports_no_torch_and_prints_what_it_printed(grid, state, flags) -> None:
    torch, out, rc = run(["results", str(grid[state]), *flags])
    assert (torch, rc) == (False, 0)
    assert HEADLINE[state] in out and out.count("\n") > 3
    assert run(["results", str(grid[state]), *flags], torch_first=True)[1:] == (out, rc)


@pytest.mark.parametrize("state", ["complete", "incomplete"])
def test_bench_results_out_and_status_import_no_torch(grid, state, tmp_path: Path) -> None:
    import polars as pl

    from bench.store.folder import read_table

    results = grid[state]
    assert run(["results", str(results), "--out", str(tmp_path / "all.parquet")])[::2] == (False, 0)
    assert pl.read_parquet(tmp_path / "all.parquet").equals(read_table(results), null_equal=True)
    torch, out, rc = run(["status", str(results)])
    usable = {"complete": 2, "incomplete": 1}[state]
    assert (torch, rc) == (False, 0) and out.startswith(f"light: {usable} of 2 trials have a usable row")
    assert run(["status", str(results)], torch_first=True)[1:] == (out, rc)


@pytest.mark.parametrize("state", ["complete", "incomplete"])
def test_bench_leaderboard_imports_no_torch(grid, state) -> None:
    torch, out, rc = run(["leaderboard", str(grid[state])])
    assert (torch, rc) == (False, 0) and HEADLINE[state] in out and "L_DMI" in out and "CE" in out
    assert run(["leaderboard", str(grid[state])], torch_first=True)[1:] == (out, rc)


@pytest.mark.parametrize("state", ["complete", "incomplete"])
def test_bench_report_imports_no_torch_and_writes_what_it_wrote(grid, state, tmp_path: Path) -> None:
    torch, out, rc = run(["report", str(grid[state]), "--out", str(tmp_path / "alone")])
    assert (torch, rc) == (False, 0) and "report.html" in out
    assert HEADLINE[state] in (tmp_path / "alone" / "report.html").read_text()
    assert run(["report", str(grid[state]), "--out", str(tmp_path / "torch")], torch_first=True)[1:] == (
        out.replace(str(tmp_path / "alone"), str(tmp_path / "torch")), rc)
    tables = sorted(p.name for p in (tmp_path / "alone").glob("*.[cm][sd]*"))
    assert "leaderboard.md" in tables
    for name in tables:  # the tables and the leaderboard as Markdown: the same bytes
        assert (tmp_path / "alone" / name).read_bytes() == (tmp_path / "torch" / name).read_bytes(), name


@pytest.mark.parametrize("state", ["complete", "incomplete"])
def test_bench_sync_mlflow_imports_no_torch_and_logs_what_it_logged(grid, state, tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    args = ["sync-mlflow", str(grid[state]), "--mlflow-uri", f"sqlite:///{store}"]
    torch, out, rc = run(args)
    logged = {"complete": 2, "incomplete": 1}[state]
    assert (torch, rc) == (False, 0) and out.endswith(f"logged {logged} missing runs (the others were already there)\n")
    alone = mlflow_runs(store)
    store.unlink()
    assert run(args, torch_first=True)[1:] == (out, rc) and mlflow_runs(store) == alone
    # The selection rules in words (read from the dataset's file), as a grid with torch loaded logged them.
    assert {r[1]["selection"] for r in alone.values()} == {"lowest loss on the whole validation set, strict"}


def mlflow_runs(store: Path) -> dict[str, tuple[dict, dict, dict]]:
    """trial id -> (tags less MLflow's own, params, metrics) of each trial run in a store."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("light").experiment_id
    return {r.data.tags["bench.trial_id"]: ({k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.")},
                                            r.data.params, r.data.metrics)
            for r in client.search_runs([experiment]) if r.data.tags.get("bench.kind") == "trial"}


def test_bench_ui_imports_no_torch(grid) -> None:
    """`bench ui` up to its server's start: the port is taken after `bench ui` found it free (its check made to
    pass), so the server stops at once, and so does the command."""
    taken_after_the_check = "import bench.cli.mlflow\nbench.cli.mlflow.port_free = lambda port: True\n"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = ["ui", str(grid["complete"]), "--port", str(taken.getsockname()[1])]
        torch, out, rc = run(args, prelude=taken_after_the_check)
        assert torch is False and out.startswith("starting MLflow's server for sqlite:///") and "UI for" not in out
        assert rc != 0
        assert run(args, torch_first=True, prelude=taken_after_the_check)[1:] == (out, rc)


def test_every_help_imports_no_torch() -> None:
    """`bench --help` answers at once: building the parser imports no torch (a top-level import of the trial
    configuration once pulled in the registries, and torch with them)."""
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices  # noqa: SLF001
    for command in ["", *commands]:
        torch, out, rc = run([command, "--help"] if command else ["--help"])
        assert (torch, rc) == (False, 0) and out.startswith("usage: bench"), command
