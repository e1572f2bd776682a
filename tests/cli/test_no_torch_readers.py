"""Commands that touch no tensor import no torch (issue #56): `bench results` (its compact table, --wide, --by-node,
--out), `bench status` and every command's `--help`, each in a fresh interpreter on a small real results folder, and
what each printed is what it prints with torch loaded first (the same rows and lines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli.main import build_parser
from bench.exec.trainer import run_trial
from bench.store import grids
from bench.trial import TrialConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real rows (CE and L_DMI on the synthetic set) and their grid's record. A grid that lacks trials names
    their methods by label, which the method registry (torch modules) gives: not yet torch-free."""
    folder = tmp_path_factory.mktemp("results")
    trials = [TrialConfig("synthetic", method, "case3", 0.2, epochs=1, epochs_warmup=1, experiment="light")
              for method in ("ce", "dmi")]
    for trial in trials:
        run_trial(trial, "unused", results=folder, log=lambda s: None)
    grids.record(folder, "light", "name: light\n", trials)
    return folder


def run(args: list[str], torch_first: bool = False) -> tuple[bool, str, int]:
    """(whether torch was imported, stdout, exit code) of `bench ARGS` in a fresh interpreter."""
    code = ("import io, json, sys, contextlib\n" + ("import torch\n" if torch_first else "") +
            "from bench.cli.main import main\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n"
            "    try:\n        rc = main(json.loads(sys.argv[1]))\n    except SystemExit as e:\n"
            "        rc = e.code\n"
            "print(json.dumps(['torch' in sys.modules, out.getvalue(), rc]))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=True)
    return tuple(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("flags", [[], ["--wide"], ["--by-node"]])
def test_bench_results_imports_no_torch_and_prints_what_it_printed(results: Path, flags: list[str]) -> None:
    torch, out, rc = run(["results", str(results), *flags])
    assert (torch, rc) == (False, 0)
    assert "Grid light: all 2 trials have a usable row." in out and out.count("\n") > 3
    assert run(["results", str(results), *flags], torch_first=True)[1:] == (out, rc)


def test_bench_results_out_and_status_import_no_torch(results: Path, tmp_path: Path) -> None:
    import polars as pl

    from bench.store.folder import read_table

    assert run(["results", str(results), "--out", str(tmp_path / "all.parquet")])[::2] == (False, 0)
    assert pl.read_parquet(tmp_path / "all.parquet").equals(read_table(results), null_equal=True)
    torch, out, rc = run(["status", str(results)])
    assert (torch, rc) == (False, 0) and out.startswith("light: 2 of 2 trials have a usable row")


def test_every_help_imports_no_torch() -> None:
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices  # noqa: SLF001
    for command in ["", *commands]:
        torch, out, rc = run([command, "--help"] if command else ["--help"])
        assert (torch, rc) == (False, 0) and out.startswith("usage: bench"), command
