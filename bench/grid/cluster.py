"""Joining Ray (a local one on 127.0.0.1, or `--address`), probing an address, the resource checks.

Joining Ray for `bench run`: a local Ray on 127.0.0.1, or a cluster at `--address` (`connect`), with every
failure to reach it one line within seconds: nothing listening, something that is not Ray (`probe`: gRPC's HTTP/2
handshake, then Ray's own first call to the head, `gcs_call`, all within `HANDSHAKE_TIMEOUT`), a refused token; and
what the cluster offers (`check_resources`, `cluster_gpus`). `bench.grid.runner` drives the grid on it."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bench.config import UserError


def start_ray(address: str | None, num_cpus: int | None, env: dict[str, str] | None = None) -> bool:
    """Connect to (or start) Ray; return True if this call started it (so the caller shuts it down). `env`: variables
    a cluster's workers get as the job's runtime environment (a local Ray's inherit the driver's)."""
    import ray

    if ray.is_initialized():
        return False
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Ray Tune's own warnings on Ctrl-C suggest Tuner.restore; `bench run` resumes by trial identity instead.
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    # Ray Tune's own experiment state (results/ray) is not how `bench run` resumes: a failure to save it (a full
    # disk) is Ray Tune's concern, the rows are bench's.
    for name in ("ray.tune.execution.experiment_state", "ray.train._internal.syncer"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    if address:
        if env:
            kwargs["runtime_env"] = {"env_vars": dict(env)}
        connect(address, kwargs)
    else:
        # Ray turns a node address of 127.0.0.1 into this machine's network address (so that other nodes could
        # join) unless clusters are off, as on macOS; with them off for this call, a local run's GCS, raylet and
        # workers listen on the loopback interface only, not on every interface without authentication.
        from ray._private import ray_constants

        clusters = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        captured = io.StringIO()
        try:
            with captured_stderr() as captured:
                ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = clusters
            sys.stderr.write(without_signal_dump(captured.read()))
    return True


_DUMP = re.compile(r"(\[[^]]*\] logging\.cc:\d+: )?(\*\*\* SIG[A-Z]+ received at|PC: @ |    @ )")


def without_signal_dump(text: str) -> str:
    """Ray's C++ core, while `ray.init` connects the driver, has its own SIGTERM handler, which prints a stack dump
    ("*** SIGTERM received ...", then Ray's Python handler ends the start: `bench.grid.stop.GridStop.start`); the
    stop is one line, so the dump goes. Anything else Ray said on stderr while starting stays."""
    return "".join(line for line in text.splitlines(keepends=True) if not _DUMP.match(line))


AUTH_HINT = ("a cluster started with `ray start` expects RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN "
             "or ~/.ray/auth_token) on the client, unless it was started with RAY_AUTH_MODE=disabled "
             "(docs/cluster.md, section 4)")


def connect(address: str, kwargs: dict[str, Any]) -> None:
    """Join the cluster at `address`, or fail in one line: within seconds where nothing listens or what listens is
    not Ray (`probe`; Ray would retry for minutes, silently or printing as it goes), and without Ray's own C++ log
    lines, which go to the process's stderr while it connects (read back here to name the cause: a missing or wrong
    token shows only there)."""
    import ray

    probe(address)
    with captured_stderr() as captured:
        try:
            ray.init(address=address, **kwargs)
            failure = None
        except Exception as e:  # noqa: BLE001 - every failure to connect becomes one line
            failure = e
    if failure is None:
        sys.stderr.write(captured.read())
        return
    if "InvalidAuthToken" in captured.read() or "InvalidAuthToken" in str(failure):
        mode = os.environ.get("RAY_AUTH_MODE", "unset")
        raise UserError(f"the Ray cluster at {address} refused this client's token (InvalidAuthToken; RAY_AUTH_MODE "
                        f"is {mode} here): {AUTH_HINT}")
    text = " ".join(str(failure).split())
    raise UserError(f"cannot connect to the Ray cluster at {address}: {type(failure).__name__}: {text[:300]}; check "
                    f"the address and port, and token authentication: {AUTH_HINT}")


# Seconds a Ray head at --address has to answer: the TCP connect, then gRPC's HTTP/2 handshake (Ray itself would retry
# its own for minutes, silently, against a port that is not Ray).
HANDSHAKE_TIMEOUT = 10.0
# The client's HTTP/2 connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client server)
# answers with a SETTINGS frame of its own (frame type 4 in the 4th byte of a 9-byte frame header).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def probe(address: str, timeout: float | None = None) -> None:
    """Raise a `UserError` within `timeout` seconds (default `HANDSHAKE_TIMEOUT`) when nothing accepts a TCP
    connection at HOST:PORT or ray://HOST:PORT, or what does is not a gRPC server as a Ray head is (an HTTP server, a
    silent listener, an SSH banner). `auto` and other forms pass, as does a cluster with TLS (RAY_USE_TLS)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host or "://" in host:
        return
    timeout = HANDSHAKE_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            answer = _handshake(sock, deadline)
    except OSError as e:
        reason = f"no answer in {timeout:g}s" if isinstance(e, TimeoutError) else e.strerror or type(e).__name__
        raise UserError(f"cannot connect to the Ray cluster at {address}: nothing listens there ({reason}); give "
                        "the head node's address and the port of its `ray start --head --port` (or start the "
                        "cluster first)") from None
    if answer is not None and len(answer) >= 9 and answer[3] == 4:
        if not address.startswith("ray://"):  # Ray Client's server (ray://) has no GCS: its HTTP/2 answer must do
            gcs_call(address, max(1.0, deadline - time.monotonic()), timeout)
        return
    what = (f"no answer to a Ray handshake in {timeout:g}s" if answer is None else
            "it closed the connection" if not answer else
            f"it answered {answer[:24].decode('ascii', 'replace')!r}")
    raise UserError(f"nothing at {address} answers as a Ray cluster ({what}); give the head node's address and the "
                    "port of its `ray start --head --port` (default 6379; ray://HOST:10001 for Ray Client)")


# The first call `ray.init` makes to the head: Ray's own GCS client (the C++ one `ray.init` uses, with the token and
# the TLS settings of this environment) asks for the cluster's id. A child process makes it, so that the deadline holds
# whatever answers (Ray's client retries for 30-40 s, and `ray.init` for minutes, where an HTTP/2 server acknowledges
# PING but serves no Ray call: any HTTP/2 server, or a gRPC server with other services or none).
_GCS_CALL = """
import sys
from ray._raylet import GcsClient
try:
    print("ray", GcsClient(address=sys.argv[1], cluster_id=None).cluster_id.hex(), flush=True)
except Exception as e:
    text = " ".join(str(e).split())
    print("ray" if "nauthenticated" in text or "InvalidAuthToken" in text else "error", type(e).__name__, text[:200])
"""


def gcs_call(address: str, timeout: float, bound: float | None = None) -> None:
    """Make Ray's first call to the head at `address` within `timeout` seconds (what is left of the handshake's
    `bound`, the time the error states), or raise a `UserError` naming the
    address and what answered (an HTTP/2 server that is not Ray's GCS). A refused token passes: it is Ray, and
    `connect` names the token's problem."""
    try:
        done = subprocess.run([sys.executable, "-c", _GCS_CALL, address], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "RAY_BACKEND_LOG_LEVEL": "fatal"},
                              start_new_session=True)  # its whole group goes at the deadline (Ray's threads)
        said = (done.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        said = None
    if said is not None and said.startswith("ray"):
        return
    what = (f"no answer to Ray's first call, for its cluster id, in {bound or timeout:g}s" if said is None else
            f"Ray's first call, for its cluster id, failed: {said.removeprefix('error ')}" if said else
            "Ray's client could not run here")
    raise UserError(f"nothing at {address} answers as a Ray cluster (an HTTP/2 server answered, but {what}); give "
                    "the head node's address and the port of its `ray start --head --port` (default 6379; "
                    "ray://HOST:10001 for Ray Client)")


def _handshake(sock: socket.socket, deadline: float) -> bytes | None:
    """Send the HTTP/2 preface; return the first 9 bytes of the answer (fewer where the peer closed, None where
    it said nothing before `deadline`). Where the answer is a SETTINGS frame, a PING must come back acknowledged
    too (every HTTP/2 server, Ray's GCS among them, acknowledges one at once): a service that answers the preface
    and then nothing (Ray would wait on it for minutes) is None."""
    try:
        sock.sendall(_H2_PREFACE)
    except OSError:  # it accepted, then closed or reset the connection
        return b""
    answer = _read(sock, 9, deadline)
    if answer is None or len(answer) < 9 or answer[3] != 4:
        return answer
    if _read(sock, int.from_bytes(answer[:3], "big"), deadline) is None:  # the SETTINGS frame's payload
        return None
    try:
        sock.sendall(_H2_PING)
    except OSError:
        return None
    while (header := _read(sock, 9, deadline)) is not None and len(header) == 9:
        payload = _read(sock, int.from_bytes(header[:3], "big"), deadline)
        if payload is None:
            break
        if header[3] == 6 and header[4] & 1:  # PING with ACK
            return answer
    return None


# The acknowledgement of the server's SETTINGS, then a PING frame (type 6) with an 8-byte payload, which an HTTP/2
# server must acknowledge.
_H2_PING = bytes([0, 0, 0, 4, 1, 0, 0, 0, 0]) + bytes([0, 0, 8, 6, 0, 0, 0, 0, 0]) + b"bench-ok"


def _read(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """`n` bytes from `sock` (fewer where the peer closed or reset), None where they did not come before
    `deadline`."""
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - len(data), 65536))
        except TimeoutError:
            return None
        except OSError:  # reset by the peer
            return data
        if not chunk:
            return data
        data += chunk
    return data


@contextlib.contextmanager
def captured_stderr() -> Iterator[io.StringIO]:
    """Everything written to file descriptor 2 inside the block (Ray's C++ core logs there, below Python),
    readable afterwards from the yielded buffer."""
    sys.stderr.flush()
    saved = os.dup(2)
    buffer = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield buffer
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            buffer.write(tmp.read().decode("utf-8", "replace"))
            buffer.seek(0)


def check_resources(demands: dict[str, list[dict[str, float]]]) -> None:
    """Fail at once when no node of the cluster can ever hold a unit (Ray would wait for ever). `demands`: what
    each kind of unit asks (its Ray bundles), by the words that name it ("each trial", "a pack of 4 trials")."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for who, bundles in demands.items():
        for bundle in bundles:
            cpu, gpu = bundle.get("CPU", 0), bundle.get("GPU", 0)
            if any(res.get("CPU", 0) >= cpu and res.get("GPU", 0) >= gpu for res in nodes):
                continue
            have = ", ".join(f"{res.get('CPU', 0):g} CPU / {res.get('GPU', 0):g} GPU" for res in nodes) or "no nodes"
            what = f"{cpu:g} CPU" + (f" and {gpu:g} GPU" if gpu else "")
            fix = ("run on a cluster with GPUs, or set device: cpu and resources.gpu: 0 (--gpus-per-trial 0)"
                   if gpu and not any(res.get("GPU", 0) for res in nodes) else
                   "lower resources.cpu (--cpus-per-trial)" if cpu > max((r.get("CPU", 0) for r in nodes), default=0)
                   else "lower resources.gpu (--gpus-per-trial) or add a node with that many GPUs")
            raise UserError(f"{who} asks for {what} but no node of this Ray cluster can ever provide it "
                            f"(nodes: {have}); {fix}")


def cluster_gpus() -> int:
    """GPUs of the Ray cluster this driver is connected to, logical ones included: what Ray schedules by."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def gpus_to_plan(address: str | None) -> tuple[int, str | None]:
    """For `--dry-run`, the GPUs a grid would run on and their kind (`gpu_kind`). With `address` the cluster's: the
    dry run connects as `bench run` does (failing with its error) and leaves. Else this machine's, as the local Ray
    of `bench run` counts them (torch counts them without creating a CUDA context; nvidia-smi names them)."""
    if address is None:
        import torch

        count = torch.cuda.device_count()
        return count, local_gpu_kind() if count else None
    import ray

    started = start_ray(address, None)
    try:
        return cluster_gpus(), cluster_gpu_kind()
    finally:
        if started:
            ray.shutdown()


def cluster_gpu_kind() -> str | None:
    """The kind of the connected cluster's GPUs as Ray names them ("H200"), or None where it has none, several
    kinds, or Ray could not tell: the executor table then applies its rows for any GPU."""
    import ray

    kinds = {key.split(":", 1)[1] for key in ray.cluster_resources() if key.startswith("accelerator_type:")}
    return kinds.pop() if len(kinds) == 1 else None


def local_gpu_kind() -> str | None:
    """This machine's GPU name from nvidia-smi ("NVIDIA H200"), which opens no CUDA context; None without it or
    with several kinds."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    names = {line.strip() for line in out.stdout.splitlines() if line.strip()}
    return names.pop() if out.returncode == 0 and len(names) == 1 else None


def node_lost(node_id: str | None, timeout: float = 2.0) -> bool:
    """Whether a node of the connected cluster is gone: the cluster lists it dead, or its raylet no longer takes a
    connection (refused: its processes died; silent for `timeout`: its machine is off or cut off). A trial's worker
    that died alone (an out-of-memory kill) leaves its raylet answering. Ray's own verdict comes later: the head
    marks a node dead only after a run of missed health checks (some 30 seconds by default). `node_id` None (a
    unit that died before its first report named its node): whether any node the cluster still lists as alive has
    just stopped answering."""
    import ray

    for node in ray.nodes():
        if node_id is None and node["Alive"] or node["NodeID"] == node_id:
            if not node["Alive"]:
                return True
            try:
                socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout).close()
            except OSError:
                return True
    return False


def retry_units_lost_in_reset() -> None:
    """Let Ray Tune retry a unit whose reused actor died while being reset for it (called before the grid).

    With `reuse_actors`, a unit that starts on the actor kept from a finished one waits, PENDING, for the actor's
    `reset`. Where that actor dies then (its node lost just after a row landed there), Ray Tune 2.60 hears of it
    twice: the actor's death (`_actor_failed`, which marks the unit RUNNING and retries it, requeued PENDING), then
    the reset task's error, which `_process_trial_failure` took for a second failure of a unit not running and ended
    it `failed` without a row, whatever `--retries` said. Here the first report of the death retries the unit,
    whichever comes first, and it leaves Ray Tune's set of units being reset (else it would wait on that reset for
    ever); a later report for the requeued unit is the same death, dropped."""
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    task_failure = TuneController._trial_task_failure
    if getattr(task_failure, "retries_resets", False):
        return

    def trial_task_failure(self: Any, trial: Any, exception: Exception) -> None:
        if trial in self._resetting_trials:  # the first report of its actor's death in the reset
            self._resetting_trials.discard(trial)
            if trial.status == Trial.PENDING:  # as `_actor_failed` does for a unit whose actor died starting
                self._set_trial_status(trial, Trial.RUNNING)
                self._unstage_trial_with_resources(trial)
        elif trial.status == Trial.PENDING:  # no task runs for a waiting unit: the same death, reported again
            return
        task_failure(self, trial, exception)

    trial_task_failure.retries_resets = True  # type: ignore[attr-defined]
    TuneController._trial_task_failure = trial_task_failure


# Seconds the head's GCS may go without taking a connection before the driver calls the head lost. Ray's own clients
# wait 60 s (RAY_gcs_rpc_server_reconnect_timeout_s), then end the driver's process with one C++ line and nothing of
# bench's: the driver decides well before, and has the rest of that minute to count the rows and log them to MLflow.
HEAD_GRACE = 20.0


class HeadWatch:
    """Watches the head of the cluster this driver joined (its GCS, where Ray keeps the cluster's state): a thread
    tries a TCP connection to it every `every` seconds, and `lost` becomes a line saying what happened once none was
    taken for `grace` seconds (refused: the head's processes died; silent: its machine is off or cut off). Ray Tune
    says nothing meanwhile: its calls wait on the GCS."""

    def __init__(self, address: str | None, grace: float = HEAD_GRACE, every: float = 2.0) -> None:
        import threading

        import ray

        self.address, self.grace, self.every = address, grace, every
        # None: a local Ray, this driver's own (its GCS dies only with the driver's machine), not watched
        self.gcs = ray.get_runtime_context().gcs_address if address else None
        self.lost: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-head-watch", daemon=True)

    def __enter__(self) -> HeadWatch:
        if self.gcs is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _answers(self) -> bool:
        host, _, port = str(self.gcs).rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=self.every).close()
        except OSError:
            return False
        return True

    def _watch(self) -> None:
        answered = time.monotonic()
        while not self._done.wait(self.every):
            if self._answers():
                answered = time.monotonic()
            elif time.monotonic() - answered >= self.grace:
                self.lost = (f"bench: lost the Ray cluster's head node (its GCS at {self.gcs} took no connection for "
                             f"{self.grace:g} s: its processes died, or its machine is off or cut off); the trials in "
                             "flight are lost with it: restart the cluster, then run the same command again "
                             f"(--address of the new head, if not {self.address}): it runs only the trials without a "
                             "row, from their last epoch checkpoints")
                return
