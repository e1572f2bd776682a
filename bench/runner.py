"""`bench run CONFIG`: fan an experiment grid out with Ray Tune. This module only drives Ray.

    experiment file --validate/expand--> TrialConfigs --skip those with a result row--> Ray Tune grid search
    (basic variant generator, no scheduler, no early stopping, reuse_actors) --each trial--> bench.trainer.run_trial
    (writes its own parquet row; CE warm start from the shared cache) --driver callback--> progress line + MLflow

Trial identity is `TrialConfig.trial_id`, a hash of the trial's own config: a relaunch runs only the trials without
a result row (rows with status "failed" run again), so a killed grid resumes and a grid can grow. Ray retries a
crashed trial (`--retries`); the method stage checkpoints after every epoch, so a retried trial (or one re-run
after the driver was killed) resumes from its last finished epoch, and its warm start comes from the cache.
Locally Ray starts in-process (`ray.init(address="local")`, never attaching to another Ray on the machine), its
services listening on 127.0.0.1 only; `--address` joins a cluster.

Before Ray starts, the driver checks every trial (`bench.validate`), the data files and the results folder, and takes
the folder's lock (one driver per folder). A `UserError` that only a worker meets is reported to the driver once,
not raised, so that Ray does not retry what retrying cannot fix.

The plan and `--dry-run` are `bench.plan`'s; the progress lines and the closing summary `bench.progress`'s; every
file in the results folder goes through `bench.store`; the command's arguments are defined in `bench.cli`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import store
from bench.config import EXIT_USAGE, TrialConfig, UserError
from bench.experiment import Experiment, load_experiment
from bench.plan import Plan, describe_units, parse_pack, plan_units, print_plan, print_size, unit_id
from bench.progress import Tally, make_callback, print_summary
from bench.validate import GRID_LIMIT, check_data, check_grid_size, check_results

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no status table from Ray Tune


# -- the trial, in a Ray worker ---------------------------------------------------------------------------------
def ray_unit(config: dict[str, Any], units: dict[str, list[TrialConfig]], data_root: str, results: str,
             threads: int) -> None:
    """Run one unit of the grid in a Ray worker: a solo trial, or a pack of trials trained as one stacked model
    (`bench.packed`); report its status and warm-start cache use."""
    import torch
    from ray import tune

    from bench.packed import run_pack
    from bench.trainer import run_trial
    from bench.warmstart import WarmStartCache

    torch.set_num_threads(threads)
    unit = config["unit"]
    trials = units[unit]
    log_path = store.Store(results).log_path(unit)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log_file:
        def log(line: str) -> None:
            log_file.write(line + "\n")
            log_file.flush()

        cache = WarmStartCache(results, log=log)
        checkpoints = store.Checkpoints(results, unit, log)
        try:
            if len(trials) > 1:
                rows = run_pack(trials, data_root, results=results, log=log, warm_cache=cache,
                                checkpoints=checkpoints)
            else:
                rows = [run_trial(trials[0], data_root, results=results, log=log, warm_cache=cache,
                                  checkpoints=checkpoints)]
        except UserError as e:
            # Bad input that only the worker could see (a data file damaged after the driver's check, a row that
            # could not be written): retrying cannot help, so report it once to the driver instead of raising.
            log(f"bench: error: {e}")
            tune.report({"unit": unit, "status": "rejected", "error": str(e), **cache.stats()})
            return
        checkpoints.clear()
    tune.report({"unit": unit, "status": ",".join(sorted({r["status"] for r in rows})), **cache.stats()})


# -- the driver -------------------------------------------------------------------------------------------------
def start_ray(address: str | None, num_cpus: int | None) -> bool:
    """Connect to (or start) Ray; return True if this call started it (so the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Ray Tune's own warnings on Ctrl-C suggest Tuner.restore; `bench run` resumes by trial identity instead.
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - name the usual causes
            text = " ".join(str(e).split())
            # A token mismatch shows only in Ray's own log lines (InvalidAuthToken); the exception is a plain
            # ConnectionError, so name that cause whenever the connection fails.
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            hint = (f" Check the address and port; and token authentication (RAY_AUTH_MODE is {mode} here): a "
                    "cluster started with `ray start` expects RAY_AUTH_MODE=token and the cluster's token "
                    "(RAY_AUTH_TOKEN or ~/.ray/auth_token) on the client, unless it was started with "
                    "RAY_AUTH_MODE=disabled (see docs/cluster.md).")
            raise UserError(f"cannot connect to the Ray cluster at {address}: {type(e).__name__}: {text[:400]}"
                            f"{hint}") from None
    else:
        # Ray turns a node address of 127.0.0.1 into this machine's network address (so that other nodes could
        # join) unless clusters are off, as on macOS; with them off for this call, a local run's GCS, raylet and
        # workers listen on the loopback interface only, not on every interface without authentication.
        from ray._private import ray_constants

        clusters = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        try:
            ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = clusters
    return True


def check_resources(cpu: float, gpu: float) -> None:
    """Fail at once when no node of the cluster can ever hold one trial (Ray would wait for ever)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(res.get("CPU", 0) >= cpu and res.get("GPU", 0) >= gpu for res in nodes):
        return
    have = ", ".join(f"{res.get('CPU', 0):g} CPU / {res.get('GPU', 0):g} GPU" for res in nodes) or "no nodes"
    what = f"{cpu:g} CPU" + (f" and {gpu:g} GPU" if gpu else "")
    fix = ("run on a cluster with GPUs, or set device: cpu and resources.gpu: 0 (--gpus-per-trial 0)"
           if gpu and not any(res.get("GPU", 0) for res in nodes) else "lower resources.cpu (--cpus-per-trial)")
    raise UserError(f"each trial asks for {what} but no node of this Ray cluster can ever provide it "
                    f"(nodes: {have}); {fix}")


@dataclass
class Settings:
    results: str
    data_root: Path
    address: str | None = None
    max_concurrent: int | None = None
    mlflow_uri: str | None = None
    mlflow: bool = True
    cpus_per_trial: float | None = None
    gpus_per_trial: float | None = None
    retries: int = 2
    num_cpus: int | None = None
    pack: str | int = "auto"  # "auto" (packs on CUDA), "off", or members per pack


def run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None] = print) -> Tally:
    """Run the pending trials of an experiment; return the tally. Raises UserError on an impossible request, and
    when another driver holds the results folder."""
    results = store.absolute(s.results)
    check_results(results)
    with store.Store(results).hold():
        return _run_experiment(exp, s, out)


def _run_experiment(exp: Experiment, s: Settings, out: Callable[[str], None]) -> Tally:
    from ray import tune

    from bench import tracking

    cpu = s.cpus_per_trial if s.cpus_per_trial is not None else exp.resources.cpu
    gpu = s.gpus_per_trial if s.gpus_per_trial is not None else exp.resources.gpu
    device = None if s.gpus_per_trial is None else ("cuda" if gpu > 0 else "cpu")
    if device == "cpu" and exp.device.startswith("cuda"):
        out("note: --gpus-per-trial 0 runs this grid on the CPU")
    results = store.absolute(s.results)
    for moved, problem in store.Store(results).set_aside_damaged():
        out(f"set aside the result file {moved} ({problem}): its trial runs again")
    plan = Plan.make(exp, results, device=device)
    if note := plan.unmatched_note():
        out(note)
    pending = plan.pending
    by_id = {t.trial_id: t for t in plan.trials}

    mirror = tracking.open_mirror(results, s.mlflow_uri) if s.mlflow else None
    if mirror is not None and plan.done:
        backfilled = mirror.sync(results, trial_ids=set(plan.done))
        if backfilled:
            out(f"MLflow: backfilled {backfilled} runs of finished trials")

    tally = Tally(total=len(pending))
    if not pending:
        out(f"{exp.name}: all {len(plan.trials)} trials already have a result row in {results}; nothing to run")
        return tally
    if s.address is None:
        check_data({t.dataset for t in pending}, s.data_root)
    w = plan.work(pending)
    out(f"{exp.name}: running {len(pending)} of {len(plan.trials)} trials ({len(plan.done)} already done); "
        f"{w['method_epochs']} method-stage epochs + {w['warm_epochs']} warm-start epochs "
        f"({w['warm_starts']} warm starts)")

    units = {unit_id(u): u for u in plan_units(pending, s.pack, s.data_root)}
    if line := describe_units(list(units.values()), s.pack, s.data_root):
        out(line)
    started_here = start_ray(s.address, s.num_cpus)
    try:
        check_resources(cpu, gpu)
        trainable = tune.with_parameters(
            ray_unit, units=units,
            data_root=str(Path(s.data_root).expanduser().resolve()), results=results,
            threads=max(1, int(cpu)),
        )
        # A pack takes its members' GPU shares together, at most one whole GPU (it runs on one device).
        trainable = tune.with_resources(
            trainable, lambda spec: {"cpu": cpu, "gpu": min(1.0, gpu * len(units[spec["unit"]])) if gpu else 0})
        tuner = tune.Tuner(
            trainable,
            param_space={"unit": tune.grid_search(list(units))},
            tune_config=tune.TuneConfig(
                reuse_actors=True, max_concurrent_trials=s.max_concurrent or exp.max_concurrent
            ),
            run_config=tune.RunConfig(
                name=f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=store.Store(results).ray_storage(),
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=s.retries),
                callbacks=[make_callback(tally, results, by_id, {k: [t.trial_id for t in u] for k, u in units.items()},
                                         mirror, out)],
            ),
        )
        tally.started = time.monotonic()  # progress and ETA count from the first trial, not Ray's start-up
        tuner.fit()
    finally:
        if started_here:
            import ray

            ray.shutdown()
    print_summary(exp, plan, tally, mirror, out)
    return tally


# -- commands ---------------------------------------------------------------------------------------------------
def default_results(exp: Experiment) -> str:
    return str(Path("results") / exp.name)


def cmd_run(args: argparse.Namespace) -> int:
    exp = load_experiment(args.config)
    results = args.results or default_results(exp)
    for flag, value in (("--max-concurrent", args.max_concurrent), ("--retries", args.retries)):
        if value is not None and value < (1 if flag == "--max-concurrent" else 0):
            raise UserError(f"{flag} must be {'>= 1' if flag == '--max-concurrent' else '>= 0'}, got {value}")
    if args.cpus_per_trial is not None and not (math.isfinite(args.cpus_per_trial) and args.cpus_per_trial > 0):
        raise UserError(f"--cpus-per-trial must be a finite number > 0, got {args.cpus_per_trial}")
    if args.gpus_per_trial is not None and not (math.isfinite(args.gpus_per_trial) and args.gpus_per_trial >= 0):
        raise UserError(f"--gpus-per-trial must be a finite number >= 0, got {args.gpus_per_trial}")
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UserError(f"--num-cpus must be >= 1, got {args.num_cpus}")
    check_results(store.absolute(results))
    if args.dry_run:
        if exp.size() > GRID_LIMIT:
            print_size(exp)
            return 0
        device = None if args.gpus_per_trial is None else ("cuda" if args.gpus_per_trial > 0 else "cpu")
        print_plan(Plan.make(exp, store.absolute(results), device=device), pack=parse_pack(args.pack),
                   data_root=args.data_root)
        if args.address is None:  # on a cluster the data lives on the nodes
            try:
                check_data([exp.dataset], args.data_root)
                print(f"data: {exp.dataset} present and intact under {args.data_root}")
            except UserError as e:
                print(f"data: {e} (`bench run` stops here)")
        return 0
    check_grid_size(exp.size(), args.yes)
    settings = Settings(
        results=results, data_root=args.data_root, address=args.address, max_concurrent=args.max_concurrent,
        mlflow_uri=args.mlflow_uri, mlflow=not args.no_mlflow, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial, retries=2 if args.retries is None else args.retries,
        num_cpus=args.num_cpus, pack=parse_pack(args.pack),
    )
    tally = run_experiment(exp, settings, out=lambda line: print(line, flush=True))
    if tally.rejected:
        return EXIT_USAGE
    return 0 if tally.done == tally.total and not tally.statuses.get("failed") else 1
