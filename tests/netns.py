"""A test module that runs wholly inside a network namespace of its own, holding only the loopback device.

Ray 2.60 turns a 127.0.0.1 node address into the machine's network address whenever a cluster of several nodes is
on (it asks the kernel for its route to 8.8.8.8); tests may send traffic only to loopback or to namespaces they made
themselves. In a fresh namespace with only `lo` up there is no such route and no such address: Ray keeps 127.0.0.1,
`hostname -I` prints nothing, and nothing a test starts can listen on or reach another address.

A module opts in with one line, `test_in_its_own_network_namespace = netns.module_in_own_namespace(__file__)`.
Collected outside a namespace (no BENCH_TEST_NETNS), that test is the only one of the module that runs: it re-runs
the module's real tests with `unshare -n` as a pytest of its own, shows that run's output and passes only if every
real test passed (none skipped). Inside (BENCH_TEST_NETNS=1) the real tests run and that test is deselected:
`deselect` below, called by conftest.py's collection hook.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

MARKER = "BENCH_TEST_NETNS"
INSIDE = os.environ.get(MARKER) == "1"
TEST_NAME = "test_in_its_own_network_namespace"
# `unshare -n` runs the command in a new network namespace whose only device, `lo`, starts down. The second loopback
# address is for Slurm: it resolves its listening address with getaddrinfo(AF_INET, AI_ADDRCONFIG), which glibc
# refuses (EAI_NONAME) where the only IPv4 address is 127.0.0.1 itself; 127.0.0.2 on `lo` is still loopback.
SETUP = "ip link set lo up && ip addr add 127.0.0.2/8 dev lo"
ENTER = f'{SETUP} && exec "$0" -m pytest -q -rs -p no:cacheprovider "$@"'


def _cannot_unshare() -> str | None:
    """Why no network namespace can be made here, or None."""
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux, iproute2)"
    if os.geteuid() != 0:
        return "making a network namespace needs root (unshare -n)"
    probe = subprocess.run(["unshare", "-n", "--", "sh", "-c", SETUP], capture_output=True,
                           text=True, timeout=60)
    return f"unshare -n failed: {probe.stderr.strip()}" if probe.returncode else None


def module_in_own_namespace(module_file: str, timeout: float = 3600) -> Callable[[], None]:
    """The test that runs `module_file`'s real tests in a namespace of their own (streamed to stdout: -s shows it
    live) and asserts they all passed."""

    def test(request: pytest.FixtureRequest) -> None:
        why = _cannot_unshare()
        if why:
            pytest.skip(f"the module runs only inside a network namespace of its own: {why}")
        env = {**os.environ, MARKER: "1"}
        shown = ["-s"] if request.config.getoption("capture") == "no" else []  # -s: the tests' figures shown
        cmd = ["unshare", "-n", "--", "sh", "-c", ENTER, sys.executable, module_file, *shown]
        lines = []
        # A session of its own: on a timeout SIGINT reaches the inner pytest, whose fixtures then stop what they
        # started (its nodes and servers are sessions of their own, which a kill of this group would not reach).
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True) as inner:
            timer = _interrupt_after(inner, timeout)
            try:
                for line in inner.stdout:
                    sys.stdout.write(line)
                    lines.append(line)
                inner.wait()
            finally:
                timer.cancel()
                if inner.poll() is None:
                    os.killpg(inner.pid, signal.SIGKILL)
                    inner.wait()
        out = "".join(lines)
        assert inner.returncode == 0, f"the module's run in its own network namespace failed:\n{out[-6000:]}"
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        assert re.search(r"\d+ passed", summary) and not re.search(r"skipped|xfail", summary), summary

    test.__name__ = TEST_NAME
    test.__doc__ = f"{os.path.basename(module_file)}'s tests, run in a network namespace with only loopback."
    return test


def _interrupt_after(process: subprocess.Popen, timeout: float) -> threading.Timer:
    def stop() -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # the inner pytest ends its fixtures, then exits

    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    return timer


def deselect(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside a namespace only the namespaced modules' re-run test runs of them; inside, that test never does."""
    def namespaced(item: pytest.Item) -> bool:
        return hasattr(getattr(item, "module", None), TEST_NAME)

    def wanted(item: pytest.Item) -> bool:
        return not namespaced(item) or (item.name == TEST_NAME) != INSIDE

    dropped = [item for item in items if not wanted(item)]
    if dropped:
        items[:] = [item for item in items if wanted(item)]
        config.hook.pytest_deselected(items=dropped)
