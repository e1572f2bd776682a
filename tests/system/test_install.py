"""Installing beside a research environment (issue 44): compatible ranges in pyproject.toml around the tested versions
of constraints.txt, an install that replaces nothing already there, and a core that logs to MLflow with
mlflow-skinny alone (the full `mlflow` package, the UI, is the `ui` extra)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
REPO = Path(__file__).resolve().parents[2]


def core_requirements() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]


def pinned() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_the_ranges_hold_the_tested_versions_and_their_other_patch_releases() -> None:
    pins = pinned()
    for req in core_requirements():
        version = pins[canonicalize_name(req.name)]  # every core dependency has its tested version
        major, minor, patch = (list(version.release) + [0, 0])[:3]
        nearby = [Version(f"{major}.{minor}.{p}") for p in (patch - 1, patch + 1) if p >= 0]
        for v in [version, *nearby]:
            assert req.specifier.contains(v, prereleases=False), (str(req), str(v))
        assert not any(s.operator == "==" for s in req.specifier), str(req)  # a range, never one version
    # The core logs with mlflow-skinny; the full package (the UI) is the `ui` extra only.
    assert "mlflow" not in {r.name for r in core_requirements()}
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [Requirement(r).name for r in extras["ui"]] == ["mlflow"]


def test_installing_into_this_environment_replaces_nothing(tmp_path: Path) -> None:
    """pip's own resolver, offline: what `pip install -e .` would install or replace here (the tested versions in
    the ranges: nothing but bench itself)."""
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--no-index",
                          "--quiet", "--report", str(report), "-e", str(REPO)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    installs = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installs == ["bench-ldmi"]


def _closure(requirements: list[Requirement]) -> set[str]:
    """The distributions `requirements` need, transitively, with the extras they name (as pip installs them)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for r in requirements]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        names.add(name)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return names


def full_mlflow_only() -> tuple[set[str], set[str]]:
    """(top-level modules, mlflow submodules) that only the full mlflow package brings: the modules of its
    requirements that bench's core does not need, and the files of its wheel that mlflow-skinny's lacks."""
    core = _closure(core_requirements())
    only = {canonicalize_name(Requirement(r).name) for r in md.distribution("mlflow").requires or []} - core
    modules = {m for m, dists in md.packages_distributions().items()
               if dists and all(canonicalize_name(d) in only for d in dists)}

    def files(dist: str) -> set[str]:
        return {str(f) for f in md.distribution(dist).files or [] if str(f).endswith(".py")}

    extra = files("mlflow") - files("mlflow-skinny") - files("mlflow-tracing")
    submodules = {f.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for f in extra}
    return modules, submodules


BLOCKED_RUN = textwrap.dedent("""
    import importlib.abc, importlib.machinery, json, sys
    blocked, blocked_sub = map(set, json.loads(sys.argv[1]))

    class Absent(importlib.abc.Loader):
        # An import of a module that only full mlflow brings fails as it would without it (a probe that only
        # looks for it, as torch's do, finds it).
        def create_module(self, spec):
            raise ModuleNotFoundError(f"No module named {spec.name!r} (only full mlflow has it)", name=spec.name)

        def exec_module(self, module):
            pass

    class OnlyFullMlflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked or name in blocked_sub:
                return importlib.machinery.ModuleSpec(name, Absent())
            return None

    sys.meta_path.insert(0, OnlyFullMlflow())
    from bench.cli.main import main
    results = sys.argv[2]
    common = ["--dataset", "synthetic", "--noise", "case3", "--r", "0.4", "--seed", "0", "--epochs", "1",
              "--epochs-warmup", "1", "--results", results]
    assert main(["trial", "--method", "dmi", *common]) == 0
    assert main(["sync-mlflow", results]) == 0
    from mlflow import MlflowClient
    client = MlflowClient(f"sqlite:///{results}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("adhoc").experiment_id])
    print("RUNS", len(runs), runs[0].data.params["protocol"], runs[0].data.metrics["test_acc"])
    print("UI", main(["ui", results]))
    print("LOADED", json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in blocked or m in blocked_sub)))
""")


def test_the_core_trains_and_logs_with_mlflow_skinny_alone(tmp_path: Path) -> None:
    modules, submodules = full_mlflow_only()
    assert "flask" in modules  # the UI's server: what bench's core must never need
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": ""}
    out = subprocess.run([sys.executable, "-c", BLOCKED_RUN, json.dumps([sorted(modules), sorted(submodules)]),
                          str(tmp_path / "results")], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.split()
             and line.split()[0] in ("RUNS", "UI", "LOADED")}
    assert lines["RUNS"][:2] == ["1", "bench"]
    assert lines["UI"] == ["2"] and "pip install 'bench-ldmi[ui]'" in out.stderr  # the UI: one line, the extra
    assert json.loads(" ".join(lines["LOADED"])) == []
