"""Big models: training throughput (images/s on one device) of ResNet-34 and VGG-16-BN, solo and packed, on
synthetic files in the CIFAR-10 format, and the GPU-hours of the paper's CIFAR-10 table at those rates.

    python benchmarks/big_models.py --device cuda [--members 2,4,8,16 --steps 20 --rounds 3 --batch 128]
                                    [--compile default] [--write-table [PATH]] [--trace DIR]
    python benchmarks/big_models.py --device cpu --tiny --members 2 --steps 2 --rounds 1   (runs anywhere)

Data: CIFAR-10 python batches of random images written to a temporary folder (or `--data-root`), read by the
CIFAR-10 dataset module; ResNet-34 trains on them at 32 x 32 with CIFAR-10's crops and flips, VGG-16-BN on the same
images scaled 2x to Dogs vs Cats' 64 x 64 with its augmentation. Arms, through the code a grid runs
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
members x steps x batch / seconds. `--tiny` shrinks both networks (width 8; ResNet two stages of one block; VGG on
32 x 32) so that a CPU runs every arm in seconds: its figures say nothing about a GPU.

The projection applies the issue's arithmetic: the CIFAR-10 table (`tune_configs/cifar10.yaml`: the paper's `pairs`
noise x 10 rates x 5 seeds, 12 trials a cell, 100 method-stage epochs each and one 120-epoch CE warm start a cell, over
40,000 training images) in training image-steps, divided by a measured rate; the trials that cannot pack
(`bench.exec.packed.why_solo`: LCCN, VAT) at the solo rate. Training passes only (no evaluation; VAT's extra passes
counted as one), as the issue counts; a streams unit runs any trial, so its projection puts every trial at its rate.
Imports only torch and numpy (and bench's core): it runs on a bare GPU box.

`--write-table` writes each network's fastest arm that a grid runs as it was timed (solo fp32, pack K fp32, streams
K) as that network's row of the executor table (`bench.grid.executor_table.write_row`; default the shipped
`bench/grid/executors.csv`), for this device kind: the planner then picks it under `--pack auto`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.data import Split, Splits, get_dataset
from bench.datasets.cifar10 import BATCHES, CLASSES, PixelNormalisation
from bench.exec.executors.streams import Baton
from bench.exec.packed import PackedStage, device_generator, why_solo
from bench.exec.prepare import Prepared, build_model, method_seed, prepare, resolve_device, seed_everything
from bench.exec.stage import SoloStage
from bench.grid import executor_table
from bench.methods import Batch, get_method
from bench.trial import TrialConfig

# The paper's CIFAR-10 table as tune_configs/cifar10.yaml runs it (tests/test_packed_bn.py checks the two agree).
TABLE_CELLS = 1 * 10 * 5  # `pairs` only: the paper's CIFAR-10 noise (the grid's comment says why)
TABLE_METHODS = {"ce": 1, "fw": 1, "gce": 1, "lccn": 1, "mentornet": 1, "vat": 1, "dmi": 6}
NETWORKS = {"resnet34_cifar": "cifar10", "vgg16_bn": "dogs_vs_cats"}


def write_cifar_files(root: Path, train: int, held_out: int, seed: int = 0) -> None:
    """CIFAR-10's python batches (`data_batch_1..5`, `test_batch`, `batches.meta`) of random images: `train`
    images over batches 1-4, `held_out` in batch 5 and in the test batch."""
    rng = np.random.default_rng(seed)
    folder = root / BATCHES
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {f"data_batch_{i}": train // 4 for i in range(1, 5)} | {"data_batch_5": held_out, "test_batch": held_out}
    for name, n in sizes.items():
        entry = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": (np.arange(n) % 10).tolist()}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [c.encode() for c in CLASSES]}, protocol=2))


def load(network: str, root: Path, device: torch.device, tiny: bool) -> tuple:
    """(dataset, splits) for `network`: CIFAR-10 from the files, or for VGG-16 the same images scaled to 64 x 64
    (32 x 32 with --tiny) under Dogs vs Cats' transforms (two classes)."""
    cifar = get_dataset("cifar10")(root, verify=False)
    splits = cifar.load()
    args = {"width": 8, "blocks": (1, 1)} if tiny else {}
    if network == "resnet34_cifar":
        dataset = cifar
    else:
        dataset = get_dataset("dogs_vs_cats")(root)
        scale = 1 if tiny else 2
        for split in (splits.train, splits.val, splits.test):
            split.x = split.x.repeat_interleave(scale, 2).repeat_interleave(scale, 3)
            split.y = split.y % 2
        dataset.normalise = PixelNormalisation(splits.train.x)
        args = {"image_size": 32 * scale, **({"width": 8} if tiny else {})}
    for split in (splits.train, splits.val, splits.test):
        split.x = split.x.to(device)
    return dataset, Splits(train=splits.train, val=Split(splits.val.x, splits.val.y),
                           test=Split(splits.test.x, splits.test.y), model_args=args)


def members(network: str, k: int, data: tuple, args: argparse.Namespace) -> list[Prepared]:
    """K trials: CE and L_DMI alternating, the dataset's own noise at r 0 to 0.8, seeds 0, 1, ..."""
    ds = NETWORKS[network]
    noise = get_dataset(ds).paper_noise
    ps = [prepare(TrialConfig(ds, ("ce", "dmi")[i % 2], noise, round(0.1 * (i % 9), 1), seed=i, lr=1e-3,
                              batch_size=args.batch, epochs=1, epochs_warmup=1, device=args.device),
                  args.data_root, data=data, log=lambda s: None) for i in range(k)]
    return sorted(ps, key=lambda p: p.config.method)  # equal methods side by side, as run_pack orders them


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def solo_arm(p: Prepared, fast: bool) -> Callable[[], object]:
    """One epoch of a solo trial (`SoloStage`); `fast`: in channels-last, under bf16 autocast on CUDA."""
    seed_everything(method_seed(p))
    net = build_model(p)
    method = get_method(p.config.method)(p.dataset.num_classes)
    step_loss = method.train_loss
    if fast:
        net = net.to(memory_format=torch.channels_last)

        def step_loss(nets: list[torch.nn.Module], batch: Batch) -> torch.Tensor:
            with autocast(p.device):
                return method.train_loss(nets, batch)

    stage = SoloStage(p, [net], p.method_stage, method_seed(p), step_loss, method.validation_loss,
                      method)
    return lambda: stage.train_steps(0)


def pack_arm(ps: list[Prepared], bf16: bool, compile: str | None = None) -> Callable[[], object]:
    """One epoch of a pack (`PackedStage`), float32 or bf16 autocast, compiled with `compile` (a mode)."""
    nets, generators = [], []
    for p in ps:
        seed_everything(method_seed(p))
        nets.append(build_model(p))
        generators.append(device_generator(p.device, method_seed(p)))
    methods = [get_method(p.config.method)(p.dataset.num_classes) for p in ps]
    stage = PackedStage(ps, nets, generators, ps[0].method_stage, [p.method_stage.lr for p in ps],
                        [method_seed(p) for p in ps], methods, precision="bf16" if bf16 else "fp32",
                        compile=compile)
    return lambda: stage.train_steps(0)


def streams_arm(ps: list[Prepared]) -> Callable[[], object]:
    """One epoch of each of K solo fp32 trials, in turns on their own streams (`Baton`, as a streams unit)."""
    epochs = [solo_arm(p, False) for p in ps]

    def epoch() -> None:
        baton = Baton(len(epochs), ps[0].device)
        failed = [o for o in baton.run(epochs) if isinstance(o, BaseException)]
        if baton.cure is not None or failed:
            raise baton.cure or failed[0]

    return epoch


def timed(arms: dict[str, tuple[int, Callable[[], object]]], args: argparse.Namespace,
          device: torch.device) -> dict[str, float]:
    """images/s of each arm: one untimed epoch, then the best of --rounds interleaved epochs."""

    def epoch(run: Callable[[], object]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _, run in arms.values():
        epoch(run)
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(args.rounds):
        for name, (_, run) in arms.items():
            best[name] = min(best[name], epoch(run))
    return {name: k * args.steps * args.batch / best[name] for name, (k, _) in arms.items()}


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


def best_row(network: str, rates: dict[str, float], device: torch.device, argv: list[str]) -> executor_table.Choice:
    """The executor table's row for `network` on this device kind: its fastest arm that a grid runs as timed."""
    as_run = {name: rate for name, rate in rates.items()
              if name == "solo fp32" or (name.startswith("pack") and name.endswith(" fp32")) or
              (name.startswith("streams") and name != "streams 1")}
    best = max(as_run, key=as_run.get)
    executor, trials = ("solo", 1) if best.startswith("solo") else (best.split()[0], int(best.split()[1]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return executor_table.Choice(
        network, device_kind(name), executor, trials, f"{as_run[best]:.0f}",
        f"{datetime.date.today().isoformat()} {name}",
        f"benchmarks/big_models.py {' '.join(argv)}: {best} {as_run[best]:,.0f} images/s, solo fp32 "
        f"{rates['solo fp32']:,.0f}")


def device_kind(name: str) -> str:
    """The table's device for a GPU named `name` ("NVIDIA H100 80GB HBM3" -> "H100", as Ray names its type): its
    first word with a digit, up to a dash; "cpu" stays."""
    words = [w.split("-")[0] for w in name.split() if any(c.isdigit() for c in w)]
    return words[0] if words else name


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--members", default="2,4,8,16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--data-root", help="CIFAR-10 python batches (default: random ones in a temporary folder)")
    parser.add_argument("--tiny", action="store_true", help="shrunk networks, for a CPU check")
    parser.add_argument("--compile", help="also time bf16 packs compiled with torch.compile in this mode (CUDA)")
    parser.add_argument("--write-table", nargs="?", const=str(executor_table.DEFAULT), metavar="PATH",
                        help="write each network's fastest arm as its row of the executor table (default: the "
                             "shipped bench/grid/executors.csv)")
    parser.add_argument("--trace", metavar="DIR", help="write a profiler trace of one epoch of each network's "
                                                       "largest streams arm to DIR")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    precisions = (False, True) if device.type == "cuda" else (False,)  # bf16 autocast: CUDA only here
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), torch "
          f"{torch.__version__}, batch {args.batch}, {args.steps} steps an epoch, best of {args.rounds} rounds"
          + (", tiny networks" if args.tiny else ""))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.data_root is None:
            args.data_root = tmp
            write_cifar_files(Path(tmp), args.steps * args.batch, 2 * args.batch)
        for network in args.networks.split(","):
            data = load(network, Path(args.data_root), device, args.tiny)
            ks = [int(k) for k in args.members.split(",")]
            ps = members(network, max(ks), data, args)
            arms = {"solo fp32": (1, solo_arm(ps[0], False)),
                    f"solo {'bf16' if True in precisions else 'fp32'} + CL": (1, solo_arm(ps[0], True))}
            for k in ks:
                mix = ps[: k // 2] + ps[len(ps) // 2 : len(ps) // 2 + k - k // 2]  # CE and L_DMI, half each
                for bf16 in precisions:
                    arms[f"pack {k} {'bf16' if bf16 else 'fp32'}"] = (k, pack_arm(mix, bf16))
                if args.compile and device.type == "cuda":
                    arms[f"pack {k} bf16 + compile"] = (k, pack_arm(mix, True, args.compile))
                arms[f"streams {k}"] = (k, streams_arm(mix))
            arms["streams 1"] = (1, streams_arm(ps[:1]))  # the mechanism's own cost: against solo fp32
            results[network] = rates = timed(arms, args, device)
            print(f"\n{network}: arm | images/s | vs solo fp32")
            for name, rate in rates.items():
                print(f"  {name} | {rate:,.0f} | {rate / rates['solo fp32']:.2f}x")
            if network == "resnet34_cifar":
                print("\nprojection" + (" (tiny networks: not ResNet-34's rates)" if args.tiny else "") + ":")
                projection(rates)
            if args.trace:
                largest = f"streams {max(ks)}"
                print(f"trace of one epoch of {largest}: {trace(network, arms[largest][1], Path(args.trace), device)}")
            if args.write_table:
                row = best_row(network, rates, device, sys.argv[1:] if argv is None else argv)
                executor_table.write_row(row, Path(args.write_table))
                print(f"executor table {args.write_table}: {row.describe()}")
    return results


if __name__ == "__main__":
    main()
