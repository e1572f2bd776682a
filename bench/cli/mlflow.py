"""`bench sync-mlflow` and `bench ui`: which MLflow store a results folder uses, one call into `store/`.

`bench sync-mlflow RESULTS` and `bench ui RESULTS`: which MLflow store a results folder uses and whether it can
be written or read, one call into the store layer (`bench.store.mlflow_batches.backfill`, `bench.store.mirror.serve`),
and what it did printed. Neither imports torch (tests/cli/test_no_torch_readers.py)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import socket
from pathlib import Path

from bench.config import UserError
from bench.store import folder, mirror, mlflow_batches


def cmd_sync_mlflow(args: argparse.Namespace) -> int:
    results = folder.absolute(args.results)
    uri = mirror.tracking_uri(results, args.mlflow_uri)
    if uri is not None and uri.startswith("sqlite:///"):  # a store MLflow would retry for minutes to write
        folder.check_output(Path(uri.removeprefix("sqlite:///")), "MLflow store", "name a store you can write with "
                            "--mlflow-uri (e.g. sqlite:////tmp/mlflow.db)", kind="file")
    # After the store's check: reading the rows refreshes the folder's compact copy (index/), and a refused command
    # writes nothing.
    if folder.read_table(results, columns=("trial_id",)).is_empty():
        raise UserError(f"no result rows under {args.results}/trials")
    synced = mlflow_batches.backfill(results, args.mlflow_uri)
    if synced is None:
        return 1
    uri, count = synced
    print(f"MLflow {uri}: logged {count} missing runs (the others were already there)")
    return 0


def ui_missing() -> str | None:
    """Why `bench ui` cannot serve here (None: it can): the UI is the full `mlflow` package's (its server, Flask,
    the page's scripts), and bench's core installs `mlflow-skinny`, which logs only."""
    try:
        importlib.metadata.distribution("mlflow")
        server = importlib.import_module("flask") is not None  # the UI's server, which only full mlflow brings
    except (importlib.metadata.PackageNotFoundError, ImportError):
        server = False
    if not server:
        return ("`bench ui` serves MLflow's UI, which the full mlflow package has (bench's core installs "
                "mlflow-skinny, which logs only): pip install 'bench-ldmi[ui]'")
    return None


def port_free(port: int) -> bool:
    """Whether a server may listen on 127.0.0.1:`port` now (MLflow's own server, finding it taken, logs a traceback
    and under some versions exits 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: TIME_WAIT is no obstacle
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cmd_ui(args: argparse.Namespace) -> int:
    if why := ui_missing():
        raise UserError(why)
    uri = mirror.tracking_uri(folder.absolute(args.results), args.mlflow_uri)
    if uri is None:
        raise UserError(f"{args.results} is not a local folder: name the MLflow store with --mlflow-uri")
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise UserError(f"no MLflow store at {uri}; run `bench run` (or `bench sync-mlflow {args.results}`) first")
    if not port_free(args.port):
        raise UserError(f"port {args.port} on 127.0.0.1 is in use (another `bench ui` or server?): "
                        "pick another with --port")
    address = f"http://127.0.0.1:{args.port}"
    links = mirror.runs_links(uri, address)
    print(f"starting MLflow's server for {uri} (seconds; a minute on a loaded machine) ...", flush=True)

    def answered() -> None:  # the links once they open a page, not a refused connection
        print(f"MLflow UI for {uri} on {address} (Ctrl-C stops it)", flush=True)
        for line in links:
            print(f"  {line}", flush=True)

    return mirror.serve(uri, args.port, answered)
