"""The frozen-feature baseline: a linear head on a frozen torchvision backbone (`linear_probe`), the backbone's
features computed once per (dataset, split, backbone, weights) and cached on disk.

A trial with `model: linear_probe` and `model_args: {backbone: resnet18, weights: /path/resnet18.pth}` trains a
linear layer on the backbone's penultimate features: when the data loads (`LinearProbe.prepare_data`) every split
(and Red Mini-ImageNet's per-level splits) is passed once through the dataset's evaluation transform and the frozen
backbone (in evaluation mode, no augmentation), and the trial then trains on those features as it would on any
tensor set, so every method that trains "logits -> loss" runs on it, and its trials pack. The features are written
to `$BENCH_CACHE/features` (else `~/.cache/bench/cache/features`), one file per split, named by a hash of what they
depend on: the dataset and its version, the split's role and contents (its input bytes, or its image list), the
backbone, the weights file's md5 (or `random`) and the input size; a later trial of any method, seed or noise reads
them back. Weights come from a LOCAL file of torchvision's state dict (as Clothing1M's ResNet-50): nothing is ever
downloaded. Random weights only where asked for (`weights: random`, torch seed 0), and the row's `model` column says
so ("linear_probe(backbone=resnet18, weights=random)").

Instance-dependent noise is drawn on the dataset's own inputs, as for every other network, not on the features.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.config import UserError
from bench.data import Dataset, Split, Splits, worker_message
from bench.download import file_md5
from bench.models import Model

RANDOM = "random"
BATCH = 256
FEATURES_VERSION = 1  # bumped when the extraction changes what it computes


class LinearProbe(Model):
    """A linear layer on cached frozen-backbone features (`bench.features`)."""

    name = "linear_probe"
    packable = True
    data_options = ("backbone", "weights", "image_size")

    def __init__(self, num_classes: int, in_features: int) -> None:
        super().__init__()
        self.head = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    @classmethod
    def check_files(cls, options: dict[str, Any]) -> None:
        backbone, weights = options.get("backbone"), options.get("weights")
        if not backbone or not weights:
            raise UserError("linear_probe needs model_args backbone (a torchvision architecture, e.g. resnet18) and "
                            "weights (a local torchvision state-dict file, or `random` for random weights)")
        if weights != RANDOM and not Path(str(weights)).expanduser().is_file():
            raise UserError(f"linear_probe: no weights file at {Path(str(weights)).expanduser()} (a local torchvision "
                            f"{backbone} state dict, e.g. from torchvision's model zoo; or say weights: random)")

    @classmethod
    def prepare_data(cls, dataset: Dataset, splits: Splits, options: dict[str, Any], device: torch.device) -> Splits:
        cls.check_files(options)
        extractor = Extractor(str(options["backbone"]), str(options["weights"]), options.get("image_size"), device)
        return extractor.splits(dataset, splits)


def build_backbone(name: str, weights: str) -> nn.Module:
    """torchvision's `name` without its classification head, from the local state dict `weights` (or random weights,
    drawn with torch seed 0), frozen, in evaluation mode. The state dict may lack the head or hold another one (a
    self-supervised checkpoint such as DINO's ResNet-50, `dino_resnet50_pretrain.pth`): every other weight must be
    there, with its shape."""
    import torchvision  # here, not at the top: the training core imports only torch and numpy

    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            net = torchvision.models.get_model(name, weights=None)
    except ValueError:
        raise UserError(f"linear_probe: unknown backbone {name!r}; use a torchvision classification architecture "
                        f"({', '.join(torchvision.models.list_models(torchvision.models)[:8])}, ...)") from None
    head = next((h for h in ("fc", "heads", "classifier", "head") if isinstance(getattr(net, h, None), nn.Module)),
                None)
    if head is not None:
        setattr(net, head, nn.Identity())
    if weights != RANDOM:
        path = Path(weights).expanduser()
        try:
            loaded = net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=False)
            foreign = [k for k in loaded.unexpected_keys if head is None or not k.startswith(f"{head}.")]
            if loaded.missing_keys or foreign:
                raise ValueError(f"missing {loaded.missing_keys[:3]}, unexpected {foreign[:3]}")
        except Exception as e:  # not a state dict, or one of another network
            raise UserError(f"linear_probe: {path} is not a torchvision {name} state dict ({e})") from None
    return net.eval().requires_grad_(False)


class Extractor:
    """One backbone's features of a dataset's splits, from the cache or computed (and then cached)."""

    def __init__(self, backbone: str, weights: str, image_size: Any, device: torch.device) -> None:
        self.backbone, self.device = backbone, device
        self.weights_id = RANDOM if weights == RANDOM else self.weights_md5(weights)
        self.weights, self.image_size = weights, None if image_size is None else int(image_size)
        self.net: nn.Module | None = None  # built on the first split not in the cache
        self.transform: Callable[[torch.Tensor], torch.Tensor] | None = None  # the dataset's (`splits`)

    @staticmethod
    def weights_md5(weights: str) -> str:
        return file_md5(Path(weights).expanduser())

    def splits(self, dataset: Dataset, splits: Splits) -> Splits:
        # The dataset's own evaluation transform, kept: `keep_inputs` makes the dataset's pass features through, and
        # a level is extracted later (`Levels`).
        self.transform = dataset.eval_transform
        inputs: dict[int, Split] = {}  # a features split's id -> the split it came from (`keep_inputs`)
        done: dict[int, Split] = {}  # one extraction for a split two roles share

        def features(split: Split, role: str) -> Split:
            if id(split) not in done:
                done[id(split)] = Split(self.features(dataset, split, role), split.y)
                inputs[id(done[id(split)])] = split
            return done[id(split)]

        out = Splits(features(splits.train, "train"), features(splits.val, "val"), features(splits.test, "test"),
                     splits.human_labels, model_args={"in_features": int(done[id(splits.train)].x.shape[1])},
                     notes=splits.notes)

        def level(key: tuple[str, float], view: Splits) -> Splits:
            name, r = key
            return Splits(features(view.train, f"{name}{r:g}/train"), features(view.val, f"{name}{r:g}/val"), out.test,
                          view.human_labels, model_args=out.model_args, notes=view.notes)

        out.noise_splits = Levels(splits.noise_splits, level)
        keep_inputs(dataset, inputs)
        return out

    def cache_file(self, dataset: Dataset, split: Split, role: str) -> Path:
        h = hashlib.sha256()
        for part in (FEATURES_VERSION, dataset.name, type(dataset).version, role, len(split), self.backbone,
                     self.weights_id, self.image_size):
            h.update(f"{part}\0".encode())
        h.update(fingerprint(split.x))
        base = os.environ.get("BENCH_CACHE")
        folder = (Path(base).expanduser() if base else Path.home() / ".cache" / "bench" / "cache") / "features"
        return folder / f"{dataset.name}-{role.replace('/', '-')}-{self.backbone}-{h.hexdigest()[:20]}.npy"

    def features(self, dataset: Dataset, split: Split, role: str) -> torch.Tensor:
        path = self.cache_file(dataset, split, role)
        if path.is_file():
            return torch.from_numpy(np.load(path))
        if self.net is None:
            self.net = build_backbone(self.backbone, self.weights).to(self.device)
        try:
            out = torch.cat([self.net(x).float().flatten(1).cpu() for x in self.batches(dataset, split)])
        except UserError as e:  # a streamed image missing or damaged, raised in a DataLoader worker
            raise UserError(worker_message(e)) from None
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".npy.part") as tmp:
            np.save(tmp, out.numpy())
        Path(tmp.name).replace(path)  # atomic: a reader never sees half a file
        return out

    @torch.no_grad()
    def batches(self, dataset: Dataset, split: Split) -> Any:
        """The split's inputs in order, through the dataset's evaluation transform (and resized where asked)."""
        if isinstance(split.x, torch.Tensor):
            chunks = (split.x[i : i + BATCH] for i in range(0, len(split.x), BATCH))
        else:
            workers = min(8, os.cpu_count() or 1)
            chunks = iter(torch.utils.data.DataLoader(split.x, batch_size=BATCH, num_workers=workers))
        for x in chunks:
            x = self.transform(x.to(self.device))
            if x.dim() != 4 or x.shape[1] not in (1, 3):
                raise UserError(f"linear_probe needs images (N x 3 x H x W, or one channel); {dataset.name} gives "
                                f"inputs of shape {tuple(x.shape[1:])}")
            x = x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
            if self.image_size:
                x = nn.functional.interpolate(x, size=self.image_size, mode="bilinear", align_corners=False)
            yield x


class Levels(Mapping[tuple[str, float], Splits]):
    """A dataset's per-level splits (`Splits.noise_splits`: Red Mini-ImageNet's ten) as features, each extracted when
    a trial first asks for its level: a grid of one level passes one level's images through the backbone, not ten."""

    def __init__(self, levels: Mapping[tuple[str, float], Splits],
                 make: Callable[[tuple[str, float], Splits], Splits]) -> None:
        self.levels, self.make = levels, make
        self.made: dict[tuple[str, float], Splits] = {}

    def __getitem__(self, key: tuple[str, float]) -> Splits:
        if key not in self.made:
            self.made[key] = self.make(key, self.levels[key])
        return self.made[key]

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return iter(self.levels)

    def __len__(self) -> int:
        return len(self.levels)


def fingerprint(x: torch.Tensor | torch.utils.data.Dataset) -> bytes:
    """What a split's inputs are, for the cache's key: the bytes of a tensor, or the root and image list of a streamed
    set (`ImageFiles`); a stream of another kind by its type and length (its cache entry could outlive a change)."""
    if isinstance(x, torch.Tensor):
        return hashlib.sha256(x.detach().cpu().contiguous().numpy().tobytes()).digest()
    keys, root = getattr(x, "keys", None), getattr(x, "root", None)
    if isinstance(keys, np.ndarray):
        return hashlib.sha256(str(root).encode() + b"\0" + keys.tobytes()).digest()
    return f"{type(x).__name__}:{len(x)}".encode()


def keep_inputs(dataset: Dataset, inputs: dict[int, Split]) -> None:
    """The dataset, now handing out features: its transforms pass them through, and instance-dependent noise still
    reads each split's own inputs (`inputs`: a features split's id -> the split it came from)."""
    identity: Callable[..., torch.Tensor] = lambda x, generator=None: x  # noqa: E731
    own_features = type(dataset).noise_features

    def noise_features(split: Split) -> np.ndarray:
        return own_features(dataset, inputs.get(id(split), split))

    dataset.train_transform = identity  # type: ignore[method-assign]
    dataset.eval_transform = identity  # type: ignore[method-assign]
    dataset.noise_features = noise_features  # type: ignore[method-assign]

