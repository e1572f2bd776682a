"""Calibration, the device side: how fast this device trains a model's trials in each executor's unit. For each
model, K trials of its dataset (CE and L_DMI alternating) train in the arms that each registered executor offers
(`Executor.calibration_arms`, through the code its units run; a plug-in's from `$BENCH_PLUGINS` too). The built-in
ones: `solo fp32` (one trial), `pack K fp32` (K trials fused into one network, where the model packs), `streams K`
(K solo trials in threads, each on its own CUDA stream, taking turns after each optimiser step), and on CUDA `solo
bf16 + CL` and `pack K bf16`, which a grid runs only under `precision: bf16` (reported, never a table row of an fp32
grid). Arms come in order of their members (solo first: the others are read against it). Each arm trains one
untimed epoch, then interleaved rounds of one epoch each; the best round counts; images/s = members x images an
epoch / seconds. `bench calibrate` and `benchmarks/big_models.py` time with this module; `bench.grid.executor_table`
turns the rates into executor-table rows.

Data: the model's dataset's own files where they are present under the data root (the MLP's `synthetic` set is
generated); else the stand-in of a dataset of the model that offers one (`Dataset.stand_in`: random examples in its
published format, written to a temporary folder: CIFAR-10's for ResNet-34, Dogs vs Cats' for VGG-16-BN). Only the
first `steps x batch` training images are used.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.config import UserError
from bench.data import Dataset, Split, Splits, get_dataset, registry
from bench.exec.executor import Arm, executors
from bench.exec.prepare import Prepared, prepare
from bench.trial import TrialConfig

TORCH_VERSION = torch.__version__


@dataclass(frozen=True)
class Rate:
    """What an arm measured: images/s, the best of `rounds` interleaved rounds."""

    arm: str
    executor: str
    members: int
    as_run: bool
    images_per_s: float
    rounds: int


def datasets_of(model: str) -> list[tuple[str, str]]:
    """(dataset, protocol) pairs whose trials train `model`: its default model under `bench`, or its scripts' model
    under `authors`."""
    found = [(name, "bench") for name, cls in registry().items() if cls.model == model]
    for name, cls in registry().items():
        if "script_model" in cls.switches() and cls.protocol("authors").setting("script_model", cls.model) == model:
            found.append((name, "authors"))
    return found


def find_data(model: str, data_root: str | Path) -> tuple[str, str, bool]:
    """(dataset, protocol, stand-in?) to calibrate `model` on: a dataset of it whose files are present, else the
    stand-in's; a `UserError` where there is neither."""
    pairs = datasets_of(model)
    if not pairs:
        raise UserError(f"no dataset trains the model {model!r}: its trials cannot be calibrated")
    for name, proto in pairs:
        if not get_dataset(name)(data_root, verify=False).missing_files():  # present, or generated (no files)
            return name, proto, False
    stand_ins = [(name, proto) for name, proto in pairs if get_dataset(name).offers_stand_in()]
    if stand_ins:
        return *stand_ins[0], True
    name = pairs[0][0]
    raise UserError(f"cannot calibrate {model}: {name}'s files are missing under {data_root} and no dataset of "
                    f"{model} offers a stand-in (generated files); get them with `bench datasets --download {name}` "
                    f"or pass --data-root")


def load(name: str, stand_in: bool, data_root: str | Path, device: torch.device, images: int,
         tmp: Path) -> tuple[Dataset, Splits]:
    """(dataset, splits) of `name` (`find_data`): `images` training inputs (on `device`), a few
    batches held out; with `stand_in`, from the dataset's stand-in written under `tmp`."""
    if stand_in:
        get_dataset(name).stand_in(tmp, images)
        with cache_in(tmp):
            dataset = get_dataset(name)(tmp, verify=False)
            splits = dataset.load()
    else:
        dataset = get_dataset(name)(data_root, verify=False)
        splits = dataset.load()
    held = min(256, len(splits.val), len(splits.test))
    splits = Splits(train=cut(splits.train, images), val=cut(splits.val, held), test=cut(splits.test, held),
                    model_args=splits.model_args)
    for split in (splits.train, splits.val, splits.test):
        if isinstance(split.x, torch.Tensor):
            split.x = split.x.to(device)
    return dataset, splits


@contextlib.contextmanager
def cache_in(folder: Path) -> Iterator[None]:
    """$BENCH_CACHE at `folder/cache` meanwhile: what a loader caches of a stand-in (Dogs vs Cats' decoded images)
    goes with the stand-in, not into the user's cache."""
    before = os.environ.get("BENCH_CACHE")
    os.environ["BENCH_CACHE"] = str(folder / "cache")
    try:
        yield
    finally:
        if before is None:
            del os.environ["BENCH_CACHE"]
        else:
            os.environ["BENCH_CACHE"] = before


def cut(split: Split, n: int) -> Split:
    return split.subset(min(n, len(split)))


def members(dataset: str, protocol: str, k: int, data: tuple, device: torch.device, batch: int | None,
            data_root: str | Path) -> list[Prepared]:
    """K trials: CE and L_DMI alternating, the dataset's own noise (else uniform) at r 0 to 0.8, seeds 0, 1, ..."""
    cls = get_dataset(dataset)
    noise = cls.paper_noise or "uniform"
    ps = [prepare(TrialConfig(dataset, ("ce", "dmi")[i % 2], noise, round(0.1 * (i % 9), 1), seed=i, lr=1e-3,
                              batch_size=batch, epochs=1, epochs_warmup=1, device=str(device), protocol=protocol),
                  data_root, data=data, log=lambda s: None) for i in range(k)]
    return sorted(ps, key=lambda p: p.config.method)  # equal methods side by side, as run_pack orders them


def arms(ps: list[Prepared], ks: list[int], extras: bool, compile: str | None = None) -> list[Arm]:
    """The arms over the members `ps` (at least max(ks) of them) that every registered executor offers
    (`Executor.calibration_arms`), in order of their members, each kind's in its own order within (the kinds by
    name). `extras`: also the arms a grid runs only under bf16, or that only explain others; `compile`: a mode for
    the arms that compile."""
    offered = [arm for kind in executors().values() for arm in kind().calibration_arms(ps, ks, extras, compile)]
    return sorted(offered, key=lambda arm: arm.members)


def epoch_seconds(run: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def timed(to_time: list[Arm], images: int, rounds: int, device: torch.device, deadline: float | None = None,
          progress: Callable[[str], None] = lambda line: None) -> list[Rate]:
    """images/s of each arm (`images` an epoch and member): one untimed epoch each, then up to `rounds` interleaved
    rounds, as many as fit before `deadline` (`time.perf_counter()`; at least one); the best round counts."""
    warm = [epoch_seconds(arm.run, device) for arm in to_time]
    progress(f"  warm-up epoch of {len(to_time)} arms: {sum(warm):.1f} s")
    if deadline is not None:
        rounds = max(1, min(rounds, int((deadline - time.perf_counter()) / max(sum(warm), 1e-9))))
    best = [float("inf")] * len(to_time)
    for i in range(rounds):
        for j, arm in enumerate(to_time):
            best[j] = min(best[j], epoch_seconds(arm.run, device))
        progress(f"  round {i + 1} of {rounds}: best so far " + ", ".join(
            f"{arm.name} {arm.members * images / b:,.0f}" for arm, b in zip(to_time, best, strict=True)) + " images/s")
    return [Rate(arm.name, arm.executor, arm.members, arm.as_run, arm.members * images / b,
                 rounds) for arm, b in zip(to_time, best, strict=True)]


@dataclass
class Calibration:
    """What `calibrate` measured within its budget: each model's rates, the models it skipped, how long it took."""

    device: torch.device
    rates: dict[str, list[Rate]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def device_name(self) -> str:
        """The device as torch names it ("NVIDIA H100 80GB HBM3"), or "cpu"."""
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"


def calibrate(models: list[str], device: torch.device, ks: list[int], data_root: str | Path, budget_s: float,
              steps: int = 20, rounds: int = 3, batch: int | None = None,
              progress: Callable[[str], None] = lambda line: None) -> Calibration:
    """Time every arm of each model in turn, within `budget_s` seconds: the first model always, each later one only
    while the budget lasts (the rest are skipped), and as many rounds as fit (at least one)."""
    start = time.perf_counter()
    deadline = start + budget_s
    out = Calibration(device)
    with tempfile.TemporaryDirectory() as tmp:
        for i, model in enumerate(models):
            if i and time.perf_counter() >= deadline:
                out.skipped = models[i:]
                progress(f"budget of {budget_s:g} s spent: skipping {', '.join(out.skipped)}")
                break
            name, proto, stand_in = find_data(model, data_root)
            bs = batch or get_dataset(name).method_stage.batch_size  # one batch size for every member
            progress(f"{model}: {name}{' stand-in' if stand_in else ''} data, {max(ks)} members, {steps} steps of "
                     f"{bs} an epoch")
            data = load(name, stand_in, data_root, device, steps * bs, Path(tmp) / model)
            ps = members(name, proto, max(ks), data, device, bs, data_root)
            images = ps[0].train.size // bs * bs  # an epoch drops the last partial batch
            # budget: this model's share of what is left, so that later models get theirs
            share = time.perf_counter() + (deadline - time.perf_counter()) / (len(models) - i)
            out.rates[model] = timed(arms(ps, ks, extras=device.type == "cuda"), images, rounds, device,
                                     share, progress)
    out.seconds = time.perf_counter() - start
    return out
