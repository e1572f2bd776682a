"""`pip install -e .` into a research environment that already holds numpy and pandas at other patch versions than
constraints.txt's (issue 44): pip installs bench and replaces neither, and bench imports and runs there.

What is real and what is borrowed: numpy and pandas are installed into a fresh venv from PyPI at the patch release
below the tested one (2.4.6 -> 2.4.5), and bench is installed into that venv by pip for real, from this checkout.
torch (a CUDA build of gigabytes) and bench's other dependencies are not downloaded: the venv sees them, at the tested
versions, through a folder of links to this environment's packages (numpy, pandas and bench left out), as a research
environment's own torch would be seen. pip resolves against all of them, as it would there.
Skips without PyPI (pip's index unreachable)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
OWN = ("numpy", "pandas")  # the research environment's own versions, other than the tested ones


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def constraint_versions() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def nearby(version: Version) -> str:
    """The patch release beside a tested version: the one below, or the one above a .0."""
    major, minor, patch = (list(version.release) + [0, 0])[:3]
    return f"{major}.{minor}.{patch - 1 if patch > 0 else patch + 1}"


def borrowed(folder: Path) -> Path:
    """A folder of links to this environment's installed packages, less numpy, pandas and bench: what a research
    environment would already hold (torch among them)."""
    folder.mkdir()
    own = {canonicalize_name(n) for n in (*OWN, "bench-ldmi")}
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = canonicalize_name(entry.name.split("-")[0].removesuffix(".libs").removesuffix(".pth"))
        if name in own or entry.name.startswith(("__editable__", "bench", "distutils-precedence")):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def installs(report: Path) -> dict[str, str]:
    """What a pip report says pip installed (or would): name -> version."""
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}


PROBE = """
import importlib.metadata as md, json, sys
import bench, numpy, pandas
print(json.dumps({"numpy": md.version("numpy"), "pandas": md.version("pandas"), "numpy_file": numpy.__file__,
                  "numpy_loaded": numpy.__version__, "pandas_loaded": pandas.__version__, "bench": bench.__file__}))
"""


@pytest.mark.skipif(not pypi_reachable(), reason="installs numpy and pandas from PyPI, which cannot be reached")
def test_pip_install_beside_other_patch_versions_replaces_nothing(tmp_path: Path) -> None:
    pins = constraint_versions()
    own = {name: nearby(pins[name]) for name in OWN}
    assert all(Version(v) != pins[n] for n, v in own.items())
    env_dir = tmp_path / "research"
    venv.create(env_dir, with_pip=False, system_site_packages=False)  # this pip installs into it (--python)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the packages it shares come after its own on sys.path (a .pth adds its folder at the end)
    (site / "research_packages.pth").write_text(f"{borrowed(tmp_path / 'packages')}\n")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run([*pip, *(f"{n}=={v}" for n, v in own.items())], check=True, env=env, timeout=300)

    report = tmp_path / "report.json"
    out = subprocess.run([*pip, "--report", str(report), "-e", str(REPO)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    installed = installs(report)
    assert installed == {"bench-ldmi": "0.1.0"}, installed  # nothing replaced, nothing added: torch & co. were there
    # The same check sees a replacement: asked for the tested numpy too, pip's report names it.
    replacing = tmp_path / "replacing.json"
    subprocess.run([*pip, "--dry-run", "--report", str(replacing), "-e", str(REPO), f"numpy=={pins['numpy']}"],
                   check=True, env=env, timeout=300)
    assert installs(replacing) == {"bench-ldmi": "0.1.0", "numpy": str(pins["numpy"])}

    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300,
                           cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.splitlines()[-1])
    assert (seen["numpy"], seen["pandas"]) == (own["numpy"], own["pandas"])
    assert (seen["numpy_loaded"], seen["pandas_loaded"]) == (own["numpy"], own["pandas"])  # the venv's, not ours
    assert Path(seen["numpy_file"]).is_relative_to(site)
    assert Path(seen["bench"]).resolve() == REPO / "bench" / "__init__.py"
    # bench runs there: a trial of the generated dataset, with the environment's numpy
    trial = subprocess.run([env_dir / "bin" / "bench", "trial", "--dataset", "synthetic", "--method", "ce",
                            "--noise", "case3", "--r", "0.2", "--epochs", "1", "--epochs-warmup", "1",
                            "--results", str(tmp_path / "results")],
                           capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert trial.returncode == 0, trial.stderr[-3000:]
    assert "clean test accuracy" in trial.stdout
