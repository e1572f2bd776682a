"""The lower bounds of pyproject.toml are true (issue 55): constraints-oldest.txt pins each core dependency at its lower
bound, and bench installs and runs there.

- `test_the_oldest_pins_are_the_lower_bounds`: the file and pyproject.toml say the same versions.
- `test_bench_runs_on_the_oldest_light_dependencies`: a fresh venv gets the light dependencies (all but torch and
  torchvision) at those versions from PyPI, for real; torch comes from this environment through a folder of links
  (a CUDA build of gigabytes is not downloaded again), as a research environment's own torch would be seen. bench
  installs there without a newer version of any of them, and a trial, a grid on Ray with its MLflow mirror, the
  results and the report run.
- `test_a_venv_with_the_oldest_torch_and_numpy_keeps_them`: a venv holding the oldest supported torch, torchvision
  and numpy, installed for real; `pip install --dry-run --report` of bench replaces none of them. It skips where
  torch 2.13 would be a download (this machine keeps a CPU build on disk).

Both install from PyPI (slow, and skipped where it cannot be reached)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.system.test_install_beside import installs, pypi_reachable

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
REPO = Path(__file__).resolve().parents[2]
OLDEST = REPO / "constraints-oldest.txt"
HEAVY = ("torch", "torchvision")  # a CUDA build's gigabytes: taken from this environment, not downloaded
ENV = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1", "RAY_USAGE_STATS_ENABLED": "0",
       "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
needs_pypi = pytest.mark.skipif(not pypi_reachable(), reason="installs from PyPI, which cannot be reached")


def oldest_pins() -> dict[str, Version]:
    pins = {}
    for line in OLDEST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def lower_bounds() -> dict[str, Version]:
    """Each core dependency's lower bound (its `>=`), from pyproject.toml."""
    found = {}
    for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(text)
        found[canonicalize_name(req.name)] = next(Version(s.version) for s in req.specifier if s.operator == ">=")
    return found


def test_the_oldest_pins_are_the_lower_bounds() -> None:
    assert oldest_pins() == lower_bounds()


def fresh_venv(folder: Path) -> tuple[Path, Path]:
    """A venv without pip (this interpreter's pip installs into it, `--python`): (its python, its site-packages)."""
    venv.create(folder, with_pip=False, system_site_packages=False)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return python, Path(site)


def torch_links(folder: Path) -> Path:
    """A folder of links to this environment's torch and torchvision with what they bring (their CUDA libraries,
    Triton): nothing of bench's light dependencies."""
    folder.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = canonicalize_name(entry.name.split("-")[0].removesuffix(".libs"))
        if name in ("torch", "torchvision", "functorch", "torchgen", "triton") or name.startswith(("nvidia", "cuda")):
            (folder / entry.name).symlink_to(entry)
    return folder


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *args],
                          capture_output=True, text=True, env=ENV, timeout=900)


def run(python: Path, *args: str, cwd: Path) -> str:
    out = subprocess.run([python.parent / "bench", *args], capture_output=True, text=True, env=ENV, timeout=900,
                         cwd=cwd)
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


READ_RUNS = """import sys
from mlflow import MlflowClient
client = MlflowClient(sys.argv[1])
runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
print(len(runs), all(r.data.tags.get("bench.complete") == "true" and r.data.params for r in runs))
"""
GRID = """name: oldest
dataset: synthetic
noise: case3
r: [0.2]
seeds: [0]
epochs: 1
epochs_warmup: 1
resources: {cpu: 1}
methods: {ce: {}, dmi: {lr: 0.001}}
"""


@pytest.mark.slow
@pytest.mark.install
@needs_pypi
def test_bench_runs_on_the_oldest_light_dependencies(tmp_path: Path) -> None:
    python, site = fresh_venv(tmp_path / "oldest")
    (site / "torch_of_this_env.pth").write_text(f"{torch_links(tmp_path / 'torch')}\n")
    light = {n: v for n, v in oldest_pins().items() if n not in HEAVY}
    constraints = tmp_path / "light.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in light.items()))
    report = tmp_path / "report.json"
    out = pip(python, "-c", str(constraints), "--report", str(report), "-e", str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    installed = installs(report)
    assert {n: Version(installed[n]) for n in light} == light  # each at its lower bound
    assert not set(installed) & set(HEAVY)  # this environment's torch kept

    run(python, "trial", "--dataset", "synthetic", "--method", "dmi", "--noise", "case3", "--r", "0.2", "--epochs",
        "1", "--epochs-warmup", "1", "--results", str(tmp_path / "trial"), cwd=tmp_path)
    (tmp_path / "oldest.yaml").write_text(GRID)
    results = tmp_path / "results"
    lines = run(python, "run", str(tmp_path / "oldest.yaml"), "--results", str(results), "--num-cpus", "2",
                cwd=tmp_path)
    assert "oldest: 2 of 2 trials finished" in lines and "MLflow: 2 runs logged" in lines, lines[-2000:]
    assert "2 rows" in run(python, "results", str(results), cwd=tmp_path)
    run(python, "report", str(results), cwd=tmp_path)
    # sync-mlflow writes its batches into MLflow's own tables: a new store of the oldest MLflow takes them, and its
    # client reads both runs back complete.
    store = f"sqlite:///{tmp_path / 'synced.db'}"
    assert "logged 2 missing runs" in run(python, "sync-mlflow", str(results), "--mlflow-uri", store, cwd=tmp_path)
    read = subprocess.run([python, "-c", READ_RUNS, store], capture_output=True, text=True, env=ENV, timeout=300)
    assert read.stdout.split() == ["2", "True"], read.stderr[-3000:]
    assert (results / "report" / "report.html").stat().st_size > 0


def local_file(report: Path, name: str) -> bool:
    """Whether pip's report takes `name` from a file on this machine (not a download)."""
    return any(canonicalize_name(i["metadata"]["name"]) == name and i["download_info"]["url"].startswith("file:")
               for i in json.loads(report.read_text())["install"])


@pytest.mark.slow
@pytest.mark.install
@needs_pypi
def test_a_venv_with_the_oldest_torch_and_numpy_keeps_them(tmp_path: Path) -> None:
    pins = oldest_pins()
    held = [f"{n}=={pins[n]}" for n in ("torch", "torchvision", "numpy")]
    python, _ = fresh_venv(tmp_path / "research")
    plan = tmp_path / "plan.json"
    assert pip(python, "--dry-run", "--report", str(plan), *held).returncode == 0
    if not local_file(plan, "torch"):
        pytest.skip(f"torch {pins['torch']} would be a download of gigabytes here (no build of it on disk)")
    out = pip(python, *held)
    assert out.returncode == 0, out.stderr[-3000:]
    report = tmp_path / "report.json"
    out = pip(python, "--dry-run", "--report", str(report), "-e", str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    installed = installs(report)
    assert not {"torch", "torchvision", "numpy", "triton"} & set(installed), installed
    assert not [n for n in installed if n.startswith("nvidia")], installed  # no CUDA wheels pulled in
    assert "bench-ldmi" in installed
