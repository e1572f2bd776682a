"""A SIGTERM or SIGINT is never lost to a library that swallows the KeyboardInterrupt it raises (Cython's module
init writes it as "Exception ignored" and goes on): the command exits 128 + signal, not 0 (bench.cli.main). In the
suite a dry run signalled while pyarrow imported printed its plan and exited 0."""

from __future__ import annotations

import os
import signal

import pytest

from bench.cli import main as cli
from bench.grid.stop import Interrupted


@pytest.fixture
def sigint_as_python_sets_it():
    """SIGINT as Python sets it in a foreground process, whatever started the tests (a shell script's background
    job has it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_command_imports_is_raised_once_the_imports_are_done(sig, sigint_as_python_sets_it):
    imported_on = []
    with cli._terminable(), pytest.raises(Interrupted) as stopped:
        with cli._holding_signals():
            os.kill(os.getpid(), sig)  # the handler runs here, inside the "imports"
            imported_on.append(True)  # ... which are not cut where a library could swallow the exception
    assert imported_on == [True] and stopped.value.signum == sig
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is Python's again


def test_a_signal_a_library_swallowed_still_ends_the_command_as_stopped(monkeypatch, capsys):
    def swallowing(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:  # as Cython's module init does with any exception
            pass
        return 0

    monkeypatch.setattr(cli, "cmd_datasets", swallowing)
    assert cli.main(["datasets"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip() == "bench: interrupted (SIGTERM); run the same command again to go on"
