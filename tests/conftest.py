"""Shared fixtures: small files in the datasets' published formats, and the optional real data."""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from bench.numerics import PINS, machine_problem

# The whole suite computes under the portable numerics' pins (`bench.numerics`), set here before torch computes
# anything and inherited by every process a test starts: every figure a test holds (the authors' scripts' digits, the
# docs' samples) is then the same on any x86-64 CPU, whatever kernels the machine would pick. A test of native
# numerics runs its own process without them (tests/exec/test_numerics.py).
PORTABLE_SUITE = machine_problem("portable") is None  # x86-64: elsewhere the pins are not defined
if PORTABLE_SUITE:
    os.environ.update(PINS)

import numpy as np  # noqa: E402 - after the pins
import pytest  # noqa: E402

from bench.config import UserError  # noqa: E402
from bench.datasets.fashion_mnist import write_idx  # noqa: E402 - the published format's writer, shared
from tests import netns  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Every Ray of the tests is a private one on loopback, without token authentication, for the whole session: Ray 2.60
# enables tokens for a new local `ray.init()` when RAY_AUTH_MODE is unset (and writes ~/.ray/auth_token), while a
# process keeps the mode it first connected with; so one test connecting under RAY_AUTH_MODE=disabled made every
# later local Ray of the session refuse its own driver (InvalidAuthToken). A test of tokens sets them in its own
# subprocesses' environment (tests/grid/test_cluster_path.py).
os.environ["RAY_AUTH_MODE"] = "disabled"
# The data root the README documents for every command ($BENCH_DATA), else the team's copy beside the checkout.
SHARED_DATA = Path(os.environ.get("BENCH_DATA") or REPO.parent / "shared" / "data").expanduser()


@pytest.fixture
def portable_figures() -> None:
    """For a test holding figures taken under the portable numerics: it skips on a CPU where they are not defined."""
    if not PORTABLE_SUITE:
        pytest.skip(f"its figures were taken under the portable numerics' x86-64 pins: {machine_problem('portable')}")


@pytest.fixture
def shared_data() -> Path:
    """The real data sets ($BENCH_DATA, else ../shared/data); a test using it skips cleanly when the folder, or
    the data set it reads, is absent (`pytest_runtest_call` below)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not available at {SHARED_DATA} (set BENCH_DATA)")
    return SHARED_DATA


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A real-data test whose data set is missing from the data root skips (a user's $BENCH_DATA may hold only the
    data sets they use); any other error stays an error."""
    try:
        return (yield)
    except (UserError, FileNotFoundError) as e:
        if "shared_data" in getattr(item, "fixturenames", ()) and _missing_data(e):
            pytest.skip(f"real data set not under {SHARED_DATA}: {e}")
        raise


def _missing_data(error: Exception) -> bool:
    if isinstance(error, FileNotFoundError):
        return str(SHARED_DATA) in str(error)
    return ": missing " in str(error) and str(SHARED_DATA) in str(error)


@contextlib.contextmanager
def http_folder(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on 127.0.0.1 serving `folder` while the block runs: its base URL and the paths requested
    (in order)."""
    requested: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def do_GET(self) -> None:  # noqa: N802 (the base class's name)
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requested
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def published(tmp_path: Path) -> Iterator[Callable[[Path], str]]:
    """A real HTTP server on 127.0.0.1 serving the test's `tmp_path`, where a test puts the files a dataset
    publishes: a file there -> its http:// address (bench fetches only http and https)."""
    with http_folder(tmp_path) as (base, _):
        yield lambda path: f"{base}/{path.relative_to(tmp_path).as_posix()}"


@pytest.fixture
def tiny_fashion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with a 120 + 60 image Fashion-MNIST in torchvision's raw layout (checksums off)."""
    rng = np.random.default_rng(0)
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", 120), ("t10k", 60)):
        labels = rng.integers(0, 10, n)
        labels[:: 5] = 8  # enough bags
        images = rng.integers(0, 50, (n, 28, 28))
        images[labels == 8, 10:18, 10:18] = 250  # bags are visibly different
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", labels)
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    return tmp_path


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for a test module (stopped by this process; never `ray stop`)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def repo_script(relative: str) -> ModuleType:
    """A script of the repository that is no package's module (`docs/make_samples.py`, `benchmarks/...`), loaded
    under its file's stem (registered, as its dataclasses look their module up)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_pids(session: int) -> list[int]:
    """The live processes of a session (its leader's pid is the session id); zombies do not count."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":  # after ")": state, ppid, pgrp, session
                pids.append(int(entry.name))
    return pids


def stop_session(session: int, grace: float = 0) -> list[int]:
    """The processes of a session these tests started still alive after `grace` seconds, SIGKILLed then (by their own
    ids), so that nothing is left behind whatever the test says."""
    deadline = time.monotonic() + grace
    while session_pids(session) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = session_pids(session)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def answers(url: str) -> bool:
    """Whether `url` answers 200 within two seconds."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def held_by_another_process(results: Path) -> Iterator[int]:
    """The results folder held (`Store.hold`) by another live process while the block runs: that process's pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from bench.store.folder import Store\n"
         f"with Store({str(results)!r}).hold():\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait()


def method_that_raises(folder: Path, name: str, error: str) -> Path:
    """A method plug-in in `folder` (a $BENCH_PLUGINS folder) whose loss raises `error` (Python source: an exception,
    which may be `UserError`) the same way on every try: its file."""
    path = folder / f"{name}.py"
    path.write_text("from bench.config import UserError\n"
                    "from bench.methods import Method\n\n\n"
                    f"class Raises(Method):\n    name = {name!r}\n    title = {name.title()!r}\n"
                    f"    paper = 'a method whose loss raises {name} (tests)'\n    reference = 'none'\n\n"
                    f"    def loss(self, logits, labels):\n        raise {error}\n")
    return path


def crashing_checkpoints(after_epoch: int = 2) -> type:
    """Epoch checkpoints that raise "node lost" right after saving `after_epoch`: a worker killed mid-stage."""
    from bench.store.folder import Checkpoints

    class CrashAfterEpoch(Checkpoints):
        def save(self, state):
            super().save(state)
            if state["epoch"] == after_epoch:
                raise RuntimeError("node lost")

    return CrashAfterEpoch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules that run in a network namespace of their own (tests/netns.py): one test outside, the real ones in."""
    netns.deselect(config, items)
