"""Big models: training throughput (images/s on one device) of ResNet-34 and VGG-16-BN, solo and packed, on
synthetic files in the CIFAR-10 format, and the GPU-hours of the paper's CIFAR-10 table at those rates.

    python benchmarks/big_models.py --device cuda [--members 2,4,8,16 --steps 20 --rounds 3 --batch 128]
                                    [--compile default] [--write-table [PATH]] [--trace DIR]
    python benchmarks/big_models.py --device cpu --tiny --members 2 --steps 2 --rounds 1   (runs anywhere)

Data: each network's dataset's stand-in (`Dataset.stand_in`: random images in the published format) written to a
temporary folder, or its files under `--data-root`, read by the dataset's module: ResNet-34 trains on CIFAR-10's at
32 x 32 with its crops and flips, VGG-16-BN on Dogs vs Cats' at 64 x 64 with its augmentation. Arms, those that the
executors offer (`bench.exec.executor.Executor.calibration_arms`), through the code a grid runs
(`bench.exec.stage.SoloStage`, `bench.exec.packed.PackedStage`), members alternating CE and L_DMI:

  solo fp32        one trial as `bench trial` trains it (on CUDA: TF32 and channels-last, `bench.models.create`)
  solo bf16 + CL   the same under bf16 autocast, in channels-last
  pack K fp32      K trials fused into one network (`bench.exec.grouped`, HFTA's layout; channels-last on CUDA)
  pack K bf16      the same under bf16 autocast (`precision: bf16` in a grid)
  pack K bf16 + compile   with --compile MODE on CUDA: the fused pass compiled (`BENCH_PACK_COMPILE=MODE`)
  streams K        K solo fp32 trials in threads of one process, each on its own CUDA stream, taking turns after
                   each optimiser step (`bench.exec.executors.streams.Baton`, the `streams` executor's mechanism);
                   `streams 1` (one trial in its thread and stream) against `solo fp32` is the mechanism's own cost

bf16 autocast is CUDA-only here: on a CPU the solo arm runs channels-last in float32 and the bf16 packs are left
out. Each arm trains one untimed
epoch of --steps steps, then --rounds interleaved rounds of one epoch each; the best round counts. images/s =
members x steps x batch / seconds. `--tiny` shrinks both networks (width 8; ResNet two stages of one block) so that
a CPU runs every arm in seconds: its figures say nothing about a GPU.

The projection applies the issue's arithmetic: the CIFAR-10 table (`tune_configs/cifar10.yaml`: the paper's `pairs`
noise x 10 rates x 5 seeds, 12 trials a cell, 100 method-stage epochs each and one 120-epoch CE warm start a cell, over
40,000 training images) in training image-steps, divided by a measured rate; the trials that cannot pack
(`bench.exec.packing.why_solo`: LCCN, VAT) at the solo rate. Training passes only (no evaluation; VAT's extra passes
counted as one), as the issue counts; a streams unit runs any trial, so its projection puts every trial at its rate.
Imports only torch and numpy (and bench's core): it runs on a bare GPU box.

The arms and their timing are `bench calibrate`'s (`bench.exec.calibrate`); this script adds the CIFAR-10 table's
projection, `--compile` and `--trace`. `--write-table` writes each network's fastest arm that a grid runs as it was
timed (solo fp32, pack K fp32, streams K) as that network's row of the executor table, as `bench calibrate` does
(`bench.grid.executor_table.table_row`; default the shipped `bench/grid/executors.csv`), for this device kind: the
planner then picks it under `--pack auto`. `bench calibrate --models resnet34_cifar,vgg16_bn --out FILE` measures the
same rows for any card without this script.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from bench.data import get_dataset
from bench.exec import calibrate
from bench.exec.packing import why_solo
from bench.exec.prepare import Prepared, resolve_device
from bench.grid import executor_table
from bench.grid.executor_table import table_row
from bench.trial import TrialConfig

# The paper's CIFAR-10 table as tune_configs/cifar10.yaml runs it (tests/exec/test_packed_bn.py checks the two agree).
TABLE_CELLS = 1 * 10 * 5  # `pairs` only: the paper's CIFAR-10 noise (the grid's comment says why)
TABLE_METHODS = {"ce": 1, "fw": 1, "gce": 1, "lccn": 1, "mentornet": 1, "vat": 1, "dmi": 6}
NETWORKS = {"resnet34_cifar": "cifar10", "vgg16_bn": "dogs_vs_cats"}
TINY = {"resnet34_cifar": {"width": 8, "blocks": (1, 1)}, "vgg16_bn": {"width": 8}}  # --tiny's networks


def members(network: str, k: int, data: tuple, args: argparse.Namespace) -> list[Prepared]:
    """K trials of `network`'s dataset: CE and L_DMI alternating (`bench.exec.calibrate.members`)."""
    return calibrate.members(NETWORKS[network], "bench", k, data, args.device_, args.batch, args.data_root)


def table_image_steps() -> tuple[float, float]:
    """Training image-steps of the CIFAR-10 table: (those of trials that pack, incl. the warm starts; the solo ones)."""
    ds = get_dataset("cifar10")
    images, epochs = ds.split_sizes[0], ds.method_stage.epochs
    packed = TABLE_CELLS * ds.warmup.epochs * images
    solo = 0.0
    for method, count in TABLE_METHODS.items():
        steps = TABLE_CELLS * count * epochs * images
        if why_solo(TrialConfig("cifar10", method, "pairs", 0.2, device="cuda")):
            solo += steps
        else:
            packed += steps
    return packed, solo


def projection(rates: dict[str, float], out: Callable[[str], None] = print) -> dict[str, float]:
    """The CIFAR-10 table's GPU-hours at ResNet-34's measured rates: all solo fp32 (today), packed (the best pack
    of each precision) with the trials that cannot pack solo, and every trial in the best streams unit."""
    packed, solo = table_image_steps()
    solo_rate = rates["solo fp32"]
    hours = {"today: every trial solo fp32": (packed + solo) / solo_rate / 3600}
    for precision in ("fp32", "bf16"):
        packs = {name: r for name, r in rates.items() if name.startswith("pack") and precision in name}
        if packs:
            best = max(packs, key=packs.get)
            hours[f"{best}, LCCN and VAT solo fp32"] = (packed / packs[best] + solo / solo_rate) / 3600
    units = {name: r for name, r in rates.items() if name.startswith("streams")}
    if units:  # any trial runs in a streams unit, LCCN and VAT too
        best = max(units, key=units.get)
        hours[f"{best}, every trial"] = (packed + solo) / units[best] / 3600
    out(f"CIFAR-10 table: {packed + solo:.3g} training image-steps ({packed:.3g} in packable trials and warm starts, "
        f"{solo:.3g} solo)")
    for name, h in hours.items():
        out(f"  {name}: {h:,.1f} device-hours")
    return hours


def trace(network: str, run: Callable[[], object], folder: Path, device: torch.device) -> Path:
    """A `torch.profiler` Chrome trace of one epoch of `run`: on CUDA each stream's kernels on a row of their own
    (CUPTI records the whole process), so Perfetto shows whether the members' kernels overlap. The members' CPU
    operators are not in it: the profiler records the thread that started it."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{network}-streams.json"
    profile.export_chrome_trace(str(path))
    return path


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--members", default="2,4,8,16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--data-root", help="the networks' datasets' files (default: their stand-ins, random images "
                                            "in the published formats, in a temporary folder)")
    parser.add_argument("--tiny", action="store_true", help="shrunk networks, for a CPU check")
    parser.add_argument("--compile", help="also time bf16 packs compiled with torch.compile in this mode (CUDA)")
    parser.add_argument("--write-table", nargs="?", const=str(executor_table.DEFAULT), metavar="PATH",
                        help="write each network's fastest arm as its row of the executor table (default: the "
                             "shipped bench/grid/executors.csv)")
    parser.add_argument("--trace", metavar="DIR", help="write a profiler trace of one epoch of each network's "
                                                       "largest streams arm to DIR")
    args = parser.parse_args(argv)
    device = args.device_ = resolve_device(args.device)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), torch "
          f"{torch.__version__}, batch {args.batch}, {args.steps} steps an epoch, best of {args.rounds} rounds"
          + (", tiny networks" if args.tiny else ""))
    results: dict[str, dict[str, float]] = {}
    ks = [int(k) for k in args.members.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        stand_in, args.data_root = args.data_root is None, args.data_root or tmp
        for network in args.networks.split(","):
            dataset, splits = calibrate.load(NETWORKS[network], stand_in, args.data_root, device,
                                             args.steps * args.batch, Path(tmp))
            if args.tiny:
                splits.model_args = {**splits.model_args, **TINY[network]}
            ps = members(network, max(ks), (dataset, splits), args)
            arms = calibrate.arms(ps, [*ks, 1], extras=True, compile=args.compile)
            timed = calibrate.timed(arms, args.steps * args.batch, args.rounds, device)
            results[network] = rates = {r.arm: r.images_per_s for r in timed}
            print(f"\n{network}: arm | images/s | vs solo fp32")
            for name, rate in rates.items():
                print(f"  {name} | {rate:,.0f} | {rate / rates['solo fp32']:.2f}x")
            if network == "resnet34_cifar":
                print("\nprojection" + (" (tiny networks: not ResNet-34's rates)" if args.tiny else "") + ":")
                projection(rates)
            if args.trace:
                largest = next(a for a in arms if a.name == f"streams {max(ks)}")
                print(f"trace of one epoch of {largest.name}: {trace(network, largest.run, Path(args.trace), device)}")
            if args.write_table:
                name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
                command = "benchmarks/big_models.py " + " ".join(sys.argv[1:] if argv is None else argv)
                row = table_row(network, timed, name, datetime.date.today().isoformat(), torch.__version__, command)
                executor_table.write_row(row, Path(args.write_table))
                print(f"executor table {args.write_table}: {row.describe()}")
    return results


if __name__ == "__main__":
    main()
