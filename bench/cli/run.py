"""`bench run CONFIG`: the command's body. It checks the command line, then hands the grid to its layer: the dry run
to the planner (`bench.grid.describe.print_plan`), the run to the runner (`bench.grid.runner.run_experiment`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import replace
from pathlib import Path

from bench.cli.output import Unwritable, silence_stdout
from bench.config import EXIT_USAGE
from bench.exec.memory import memory_budget
from bench.exec.packed import check_no_pack_precision
from bench.grid.cluster import gpus_to_plan, probe
from bench.grid.describe import print_plan, print_size
from bench.grid.experiment import Experiment
from bench.grid.files import Overrides, load_experiment
from bench.grid.plan import Plan, parse_executor
from bench.grid.runner import Settings, cpu_slots, run_experiment, trial_device
from bench.grid.validate import check_data, check_grid_size, check_results
from bench.schema import GRID_LIMIT
from bench.store import folder
from bench.store.mirror import tracking_uri


def default_results(exp: Experiment) -> str:
    return str(Path("results") / exp.name)


class Lines:
    """`bench run`'s lines on stdout. Where the reader leaves (`bench run GRID | head -1`) or stdout refuses writes
    (`> /dev/full`: `bench.cli.output`), the grid goes on with its lines discarded and its rows written, and one
    warning on stderr says so (it used to stop at the next line and exit 0 without a row, or with a traceback)."""

    def __init__(self) -> None:
        self.reader_left = False

    def __call__(self, line: str) -> None:
        if self.reader_left:
            return
        try:
            print(line, flush=True)
        except (BrokenPipeError, Unwritable) as e:
            self.reader_left = True
            silence_stdout()  # everything still bound for stdout (Python's buffer, Ray's, the live status) goes nowhere
            why = ("the reader of this command's output left" if isinstance(e, BrokenPipeError) else
                   f"standard output cannot be written ({e})")
            with contextlib.suppress(OSError):
                print(f"bench: warning: {why}; the grid goes on without printing, writing every row (see them with "
                      "`bench results`)", file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    numerics = (f"numerics={args.numerics}",) if args.numerics else ()  # another computation: a grid of its own
    overrides = Overrides(tuple(args.sets) + numerics, args.methods, args.seeds)
    exp = load_experiment(args.config, overrides=overrides)
    if args.cpus_per_trial is not None:  # checked with the flags (`bench.cli.main`)
        # A trial's CPUs are its intra-op threads (`bench.trial.grid_threads`): its trials are those of that many.
        exp = replace(exp, resources=replace(exp.resources, cpu=args.cpus_per_trial))
    results = args.results or default_results(exp)
    out = Lines()
    if exp.overrides:
        out(f"{' '.join(exp.overrides)} changed the grid of {exp.base_name}: it runs as experiment {exp.name}"
              f"{'' if overrides.names() else ' (--set name=NAME names it)'}, results in {results}, which keeps it "
              f"as {exp.name}.yaml")
    spec = parse_executor(args.executor, args.pack)  # a bad --executor or --pack is one line, before anything
    memory_budget()  # a bad $BENCH_PACK_MEMORY_GB is one line here, before Ray, not an error in every pack
    check_no_pack_precision()  # likewise the retired $BENCH_PACK_PRECISION
    check_results(folder.absolute(results))
    if not args.no_mlflow:  # a folder name MLflow's URI cannot carry: one line here, before anything is written
        tracking_uri(folder.absolute(results), args.mlflow_uri)
    if args.address:  # before anything is written: a wrong address is one line in seconds
        probe(args.address)
    if args.dry_run:
        gpus, gpu_kind = gpus_to_plan(args.address)
        if exp.size() > GRID_LIMIT:
            print_size(exp)
            return 0
        gpu, device = trial_device(exp, args.gpus_per_trial)
        plan = Plan.make(exp, folder.absolute(results), device=device)
        print_plan(plan, pack=spec, data_root=args.data_root, gpus=gpus if gpu > 0 else None, gpu=gpu,
                   gpu_kind=gpu_kind, at_once=None if args.address or gpu > 0 else cpu_slots(
                       exp, args.num_cpus, args.cpus_per_trial, args.max_concurrent))
        if args.address is None:  # on a cluster the data lives on the nodes
            # Missing data ends the dry run as it ends the run: its one line, exit 2, after the plan.
            check_data([exp.dataset], args.data_root, plan.trials[:1])
            print(f"data: {exp.dataset} present and intact under {args.data_root}")
        return 0
    check_grid_size(exp.size(), args.yes)
    settings = Settings(
        results=results, data_root=args.data_root, address=args.address, max_concurrent=args.max_concurrent,
        mlflow_uri=args.mlflow_uri, mlflow=not args.no_mlflow, cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial, retries=2 if args.retries is None else args.retries,
        num_cpus=args.num_cpus, pack=spec,
        live=sys.stdout.isatty() and os.environ.get("TERM") != "dumb",
    )
    tally = run_experiment(exp, settings, out=out)
    if tally.interrupted is not None:  # stopped by a signal: 143 for SIGTERM, 130 for SIGINT (docs/failures.md)
        if tally.ray_left:  # Ray did not stop (the signal reached its processes too): its exit hooks would wait
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(128 + tally.interrupted)
        return 128 + tally.interrupted
    if tally.head_lost:  # Ray's client still waits on the dead head: its exit hooks would too (docs/failures.md)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(1)
    if tally.rejected:
        return EXIT_USAGE
    return 0 if tally.done == tally.total and not tally.statuses.get("failed") else 1
