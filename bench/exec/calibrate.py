"""Calibration, the device side: how fast this device trains a model's trials in each executor's unit. For each
model, K trials of its dataset (CE and L_DMI alternating) train through the code a grid runs (`SoloStage`,
`PackedStage`, the streams executor's `Baton`) in arms: `solo fp32` (one trial), `pack K fp32` (K trials fused into
one network, where the model packs), `streams K` (K solo trials in threads, each on its own CUDA stream, taking turns
after each optimiser step), and on CUDA `solo bf16 + CL` and `pack K bf16`, which a grid runs only under `precision:
bf16` (reported, never a table row of an fp32 grid). Each arm trains one untimed epoch, then interleaved rounds of
one epoch each; the best round counts; images/s = members x images an epoch / seconds. `bench calibrate` and
`benchmarks/big_models.py` time with this module; `bench.grid.calibration` turns the rates into executor-table rows.

Data: the model's dataset's own files where they are present under the data root; else a stand-in in the published
format (CIFAR-10's python batches of random images, for ResNet-34 at 32 x 32 and VGG-16-BN at 64 x 64); the MLP's
`synthetic` set is generated. Only the first `steps x batch` training images are used.
"""

from __future__ import annotations

import contextlib
import pickle
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.config import UserError
from bench.data import Dataset, Split, Splits, get_dataset, registry
from bench.datasets.cifar10 import BATCHES, CLASSES, PixelNormalisation
from bench.exec.executors.streams import Baton
from bench.exec.packed import PackedStage, device_generator
from bench.exec.packing import why_solo
from bench.exec.prepare import Prepared, build_model, method_seed, prepare, seed_everything
from bench.exec.stage import SoloStage
from bench.exec.turns import ALONE, Turns
from bench.methods import Batch, get_method
from bench.trial import TrialConfig

TORCH_VERSION = torch.__version__
# Models with a stand-in when their dataset's files are absent: the dataset whose format the stand-in takes.
STAND_INS = {"resnet34_cifar": "cifar10", "vgg16_bn": "dogs_vs_cats"}


@dataclass(frozen=True)
class Arm:
    """One way to train `members` trials at once: `executor`'s unit; `as_run`: timed as a grid runs it (fp32), so
    that it may become a table row."""

    name: str
    executor: str
    members: int
    as_run: bool
    run: Callable[[], object] = field(compare=False, repr=False)


@dataclass(frozen=True)
class Rate:
    """What an arm measured: images/s, the best of `rounds` interleaved rounds."""

    arm: str
    executor: str
    members: int
    as_run: bool
    images_per_s: float
    rounds: int


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


def cifar_stand_in(network: str, root: Path, tiny: bool = False) -> tuple[Dataset, Splits]:
    """(dataset, splits) for `network` from CIFAR-10 files under `root`: CIFAR-10 itself for ResNet-34, or for
    VGG-16-BN the same images scaled to 64 x 64 (32 x 32 with `tiny`) under Dogs vs Cats' transforms (two
    classes). `tiny` shrinks the networks (width 8; ResNet two stages of one block) for a CPU check."""
    cifar = get_dataset("cifar10")(root, verify=False)
    splits = cifar.load()
    args = {"width": 8, "blocks": (1, 1)} if tiny else {}
    if network == "resnet34_cifar":
        return cifar, Splits(train=splits.train, val=splits.val, test=splits.test, model_args=args)
    dataset = get_dataset("dogs_vs_cats")(root)
    scale = 1 if tiny else 2
    for split in (splits.train, splits.val, splits.test):
        split.x = split.x.repeat_interleave(scale, 2).repeat_interleave(scale, 3)
        split.y = split.y % 2
    dataset.normalise = PixelNormalisation(splits.train.x)
    args = {"image_size": 32 * scale, **({"width": 8} if tiny else {})}
    return dataset, Splits(train=splits.train, val=splits.val, test=splits.test, model_args=args)


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
    if model in STAND_INS:
        return STAND_INS[model], "bench", True
    name = pairs[0][0]
    raise UserError(f"cannot calibrate {model}: {name}'s files are missing under {data_root} and it has no stand-in "
                    f"(those of {', '.join(STAND_INS)} are generated); get them with `bench datasets --download "
                    f"{name}` or pass --data-root")


def load(model: str, name: str, stand_in: bool, data_root: str | Path, device: torch.device, images: int,
         tmp: Path) -> tuple[Dataset, Splits]:
    """(dataset, splits) of `name` (`find_data`) for `model`: `images` training inputs (on `device`), a few
    batches held out."""
    if stand_in:
        write_cifar_files(tmp, images, 256)
        dataset, splits = cifar_stand_in(model, tmp)
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


def half_each(ps: list[Prepared], k: int) -> list[Prepared]:
    """K of the (sorted) members, CE and L_DMI half each."""
    return ps[: k // 2] + ps[len(ps) // 2 : len(ps) // 2 + k - k // 2]


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def solo_arm(p: Prepared, fast: bool) -> Callable[..., object]:
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

    stage = SoloStage(p, [net], p.method_stage, method_seed(p), step_loss, method.validation_loss, method)

    def epoch(turns: Turns = ALONE) -> object:
        stage.turns = turns  # a streams arm's member takes its turns after each step
        return stage.train_steps(0)

    return epoch


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


def arms(ps: list[Prepared], ks: list[int], extras: bool, compile: str | None = None) -> list[Arm]:
    """The arms over the members `ps` (at least max(ks) of them): solo, and per K a pack (where the model packs)
    and a streams unit (`streams 1`: the mechanism's own cost, never a row). `extras`: the fast solo arm (channels-
    last, under bf16 autocast on CUDA) and on CUDA the bf16 packs; `compile`: bf16 packs compiled in that mode."""
    packs = why_solo(ps[0].config) is None
    bf16 = extras and ps[0].device.type == "cuda"
    out = [Arm("solo fp32", "solo", 1, True, solo_arm(ps[0], False))]
    if extras:
        out.append(Arm(f"solo {'bf16' if bf16 else 'fp32'} + CL", "solo", 1, False, solo_arm(ps[0], True)))
    for k in ks:
        mix = half_each(ps, k)
        if packs and k > 1:
            out.append(Arm(f"pack {k} fp32", "pack", k, True, pack_arm(mix, False)))
            if bf16:
                out.append(Arm(f"pack {k} bf16", "pack", k, False, pack_arm(mix, True)))
            if compile and bf16:
                out.append(Arm(f"pack {k} bf16 + compile", "pack", k, False, pack_arm(mix, True, compile)))
        out.append(Arm(f"streams {k}", "streams", k, k > 1, streams_arm(mix)))
    return out


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
            data = load(model, name, stand_in, data_root, device, steps * bs, Path(tmp) / model)
            ps = members(name, proto, max(ks), data, device, bs, data_root)
            images = ps[0].train.size // bs * bs  # an epoch drops the last partial batch
            # budget: this model's share of what is left, so that later models get theirs
            share = time.perf_counter() + (deadline - time.perf_counter()) / (len(models) - i)
            out.rates[model] = timed(arms(ps, ks, extras=device.type == "cuda"), images, rounds, device,
                                     share, progress)
    out.seconds = time.perf_counter() - start
    return out
