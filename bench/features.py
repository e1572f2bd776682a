"""The frozen-feature baseline: a linear head on a frozen backbone, its features computed once and cached.

The frozen-feature baseline: a linear head on a frozen torchvision backbone (`linear_probe`), the backbone's
features computed once per (dataset, split, backbone, weights) and cached on disk.

A trial with `model: linear_probe` and `model_args: {backbone: resnet18, weights: /path/resnet18.pth}` trains a
linear layer on the backbone's penultimate features: when the data loads (`LinearProbe.prepare_data`) every split
(and Red Mini-ImageNet's per-level splits) is passed once through the dataset's evaluation transform and the frozen
backbone (in evaluation mode, no augmentation), and the trial then trains on those features as it would on any
tensor set, so every method that trains "logits -> loss" runs on it, and its trials pack. The features are written
to `$BENCH_CACHE/features` (else `~/.cache/bench/cache/features`), one file per split, named by a hash of what they
depend on: the dataset and its version, the split's role and contents (its input bytes, or its image list with each
image's size and modification time), the evaluation transform (by the bytes it makes of the split's first inputs) and
the trial's protocol switches, the backbone and the probe's `version`, the weights file's md5 (or `random`) and the
input size; a later trial of any method, seed or noise reads them back, and a changed image, transform or protocol
computes them again. Files are written atomically (a unique temporary file, then `os.replace`), readable by the
owner's group; a damaged one is set aside with a warning and recomputed. Weights come from a LOCAL file of
torchvision's state dict (as Clothing1M's ResNet-50): nothing is ever downloaded. Random weights only where asked for
(`weights: random`, torch seed 0), and the row's `model` column says so ("linear_probe(backbone=resnet18,
weights=random)"); a file's md5 is in its `weights` column and its trial id.

Instance-dependent noise is drawn on the dataset's own inputs, as for every other network, not on the features.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.config import UserError
from bench.data import Dataset, Split, Splits, worker_message
from bench.download import weights_md5
from bench.models import Model, load_problem

RANDOM = "random"
BATCH = 256
# Bumped when the cache's key or files change (2: keyed by content and transform); a change to what the features are
# bumps `LinearProbe.version`, which is part of the key too.
FEATURES_VERSION = 2


class LinearProbe(Model):
    """A linear layer on cached frozen-backbone features (`bench.features`)."""

    name = "linear_probe"
    packable = True
    data_options = ("backbone", "weights", "image_size")
    weights_options = ("weights",)
    version = 2  # 2: CLIP's QuickGELU and DINOv2's own interpolation of positions (issue 53)

    def __init__(self, num_classes: int, in_features: int) -> None:
        super().__init__()
        self.head = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    @classmethod
    def check_files(cls, options: dict[str, Any]) -> None:
        backbone, weights = options.get("backbone"), options.get("weights")
        if not backbone or not weights:
            raise UserError("linear_probe needs model_args backbone (a torchvision architecture, e.g. resnet18, or "
                            f"{' or '.join(TIMM_BACKBONES)}) and weights (a local state-dict file, or `random` for "
                            "random weights)")
        if weights != RANDOM and not Path(str(weights)).expanduser().is_file():
            raise UserError(f"linear_probe: no weights file at {Path(str(weights)).expanduser()} (a local {backbone} "
                            "state dict: docs/realworld.md says where to get one; or say weights: random)")

    @classmethod
    def prepare_data(cls, dataset: Dataset, splits: Splits, options: dict[str, Any], device: torch.device) -> Splits:
        cls.check_files(options)
        extractor = Extractor(str(options["backbone"]), str(options["weights"]), options.get("image_size"), device)
        return extractor.splits(dataset, splits)


# The frozen encoders the field now compares against, built by timm (the optional extra `bench[probe]`) with no hub
# access, from a local weights file: backbone name -> (timm architecture, its options). Their features are the class
# token after the final norm (timm's `num_classes=0`); CLIP's projection (timm's head) is left out. OpenAI's CLIP
# computes its MLPs with QuickGELU, x * sigmoid(1.702 x) (openai/CLIP clip/model.py), hence timm's `_quickgelu`
# builds: its plain CLIP builds take GELU, 0.04 off in the features of an official ViT-B/32 file
# (tests/datasets/test_official_weights.py). Any size of input is taken (the image padded to whole patches; positions
# interpolated, DINOv2's as its own code does: `official_dinov2_positions`).
TIMM_BACKBONES: dict[str, tuple[str, dict[str, Any]]] = {
    "dinov2_vits14": ("vit_small_patch14_dinov2", {}),
    "dinov2_vitb14": ("vit_base_patch14_dinov2", {}),
    "dinov2_vitl14": ("vit_large_patch14_dinov2", {}),
    "clip_vit_b32": ("vit_base_patch32_clip_quickgelu_224", {}),
    "clip_vit_b16": ("vit_base_patch16_clip_quickgelu_224", {}),
    "clip_vit_l14": ("vit_large_patch14_clip_quickgelu_224", {}),
}


def build_timm_backbone(name: str, weights: str) -> nn.Module:
    """A DINOv2 or CLIP image encoder (`TIMM_BACKBONES`), frozen, in evaluation mode: timm's architecture with random
    weights (torch seed 0), then the local file `weights` (a state dict, `.pth` or `.safetensors`: the official
    release's, which timm's converter reads, or timm's own), every weight but the head's present with its shape."""
    try:
        import timm
        from timm.models.vision_transformer import checkpoint_filter_fn
    except ImportError:
        raise UserError(f"linear_probe: backbone {name} is built by timm, which is not installed here: pip install "
                        "'bench-ldmi[probe]' (or pip install timm)") from None
    architecture, options = TIMM_BACKBONES[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = timm.create_model(architecture, pretrained=False, num_classes=0, dynamic_img_size=True,
                                dynamic_img_pad=True, **options)
    if weights != RANDOM:
        path = Path(weights).expanduser()
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
            loaded = net.load_state_dict(checkpoint_filter_fn(state, net), strict=False)
            foreign = [k for k in loaded.unexpected_keys if not k.startswith("head.")]
            if loaded.missing_keys or foreign:
                raise ValueError(f"missing {loaded.missing_keys[:3]}, unexpected {foreign[:3]}")
        except Exception as e:  # not a state dict (OpenAI's TorchScript archive: docs/realworld.md), or another net's
            raise UserError(f"linear_probe: {path} is not a {name} ({architecture}) state dict ({load_problem(e)}); "
                            "docs/realworld.md says which file to use") from None
    if name.startswith("dinov2_"):
        official_dinov2_positions(net)
    return net.eval().requires_grad_(False)


def official_dinov2_positions(net: nn.Module) -> None:
    """Position embeddings of a timm DINOv2 `net` interpolated to the image's patch grid as DINOv2's own model does
    (facebookresearch/dinov2 dinov2/models/vision_transformer.py `interpolate_pos_encoding`, and hub/backbones.py:
    bicubic by the scale factor (grid + 0.1) / 37 of its 37 x 37 positions, no antialiasing), in place of timm's
    (antialiased bicubic to the grid): at 224 pixels, timm's way moves the features of an official ViT-S/14 file by
    0.1 (tests/datasets/test_official_weights.py). At 518 pixels neither interpolates."""

    def pos_embed(x: torch.Tensor) -> torch.Tensor:  # timm's `_pos_embed`: patches (B, H, W, C) -> tokens
        batch, rows, cols, width = x.shape
        cls_position, positions = net.pos_embed[:, :1], net.pos_embed[:, 1:]
        side = math.isqrt(positions.shape[1])
        if (rows, cols) != (side, side):
            grid = positions.float().reshape(1, side, side, width).permute(0, 3, 1, 2)
            grid = nn.functional.interpolate(grid, scale_factor=((rows + 0.1) / side, (cols + 0.1) / side),
                                             mode="bicubic", antialias=False)
            positions = grid.permute(0, 2, 3, 1).reshape(1, rows * cols, width).to(x.dtype)
        tokens = torch.cat([net.cls_token.expand(batch, -1, -1), x.reshape(batch, rows * cols, width)], dim=1)
        return net.pos_drop(tokens + torch.cat([cls_position, positions], dim=1))

    net._pos_embed = pos_embed


def build_backbone(name: str, weights: str) -> nn.Module:
    """A DINOv2 or CLIP encoder by timm (`build_timm_backbone`), else torchvision's `name` without its classification
    head, from the local state dict `weights` (or random weights, drawn with torch seed 0), frozen, in evaluation mode.
    The state dict may lack the head or hold another one (a self-supervised checkpoint such as DINO's ResNet-50,
    `dino_resnet50_pretrain.pth`): every other weight must be there, with its shape."""
    import torchvision  # here, not at the top: the training core imports only torch and numpy

    if name in TIMM_BACKBONES:
        return build_timm_backbone(name, weights)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            net = torchvision.models.get_model(name, weights=None)
    except ValueError:
        some = ", ".join(torchvision.models.list_models(torchvision.models)[:8])
        raise UserError(f"linear_probe: unknown backbone {name!r}; use {', '.join(TIMM_BACKBONES)} or a torchvision "
                        f"classification architecture ({some}, ...)") from None
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
            raise UserError(f"linear_probe: {path} is not a torchvision {name} state dict "
                            f"({load_problem(e)})") from None
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
        return weights_md5(weights)

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
        """The features' file, named by a hash of all they depend on (`fingerprint`: the inputs by content; the
        transform and the protocol; the backbone, the probe's version and its weights by md5; the input size)."""
        h = hashlib.sha256()
        switches = sorted((name, repr(s.setting)) for name, s in dataset.trial_protocol.switches.items())
        for part in (FEATURES_VERSION, LinearProbe.version, dataset.name, type(dataset).version, role, len(split),
                     self.backbone, self.weights_id, self.image_size, switches):
            h.update(f"{part}\0".encode())
        h.update(fingerprint(split.x))
        h.update(self.transform_fingerprint(dataset, split))
        base = os.environ.get("BENCH_CACHE")
        folder = (Path(base).expanduser() if base else Path.home() / ".cache" / "bench" / "cache") / "features"
        return folder / f"{dataset.name}-{role.replace('/', '-')}-{self.backbone}-{h.hexdigest()[:20]}.npy"

    def transform_fingerprint(self, dataset: Dataset, split: Split) -> bytes:
        """The evaluation transform by what it does: its class and the bytes it makes of the split's first inputs
        (a changed normalisation, crop or `script_transform` gives other bytes), on the CPU in float64 so that the
        key is the same on every device."""
        h = hashlib.sha256(f"{type(dataset).__module__}.{type(dataset).__qualname__}".encode())
        if len(split):
            x = split.x[:2] if isinstance(split.x, torch.Tensor) else torch.stack([split.x[i]
                                                                                  for i in range(min(2, len(split)))])
            try:
                out = self.transform(x.cpu())
            except UserError:
                raise
            except Exception as e:  # noqa: BLE001 - a transform that runs on its device only: keyed by its class
                h.update(f"not on the CPU: {type(e).__name__}".encode())
                return h.digest()
            h.update(str(tuple(out.shape)).encode())
            h.update(out.detach().to(torch.float64).contiguous().numpy().round(6).tobytes())
        return h.digest()

    def features(self, dataset: Dataset, split: Split, role: str) -> torch.Tensor:
        path = self.cache_file(dataset, split, role)
        if (cached := read_cache(path, len(split))) is not None:
            return cached
        if self.net is None:
            self.net = build_backbone(self.backbone, self.weights).to(self.device)
        try:
            out = torch.cat([self.net(x).float().flatten(1).cpu() for x in self.batches(dataset, split)])
        except UserError as e:  # a streamed image missing or damaged, raised in a DataLoader worker
            raise UserError(worker_message(e)) from None
        write_cache(path, out.numpy())
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
    """What a split's inputs are, for the cache's key: the bytes of a tensor; for a streamed set of image files
    (`ImageFiles`), its root, its image list and each image's size and modification time (an image changed in place
    is another input; hashing every image's bytes would read the whole set for each trial); a stream of another kind
    by its type and length (its cache entry could outlive a change)."""
    if isinstance(x, torch.Tensor):
        return hashlib.sha256(x.detach().cpu().contiguous().numpy().tobytes()).digest()
    keys, root = getattr(x, "keys", None), getattr(x, "root", None)
    if isinstance(keys, np.ndarray):
        h = hashlib.sha256(str(root).encode() + b"\0" + keys.tobytes() + f"\0{getattr(x, 'size', '')}".encode())
        stats = np.zeros((len(keys), 2), dtype=np.int64)
        for i, key in enumerate(keys):
            try:
                stat = os.stat(Path(root) / key.decode())
                stats[i] = stat.st_size, stat.st_mtime_ns
            except OSError:
                stats[i] = -1  # missing: decoding it says so, in one line
        return h.digest() + hashlib.sha256(stats.tobytes()).digest()
    return f"{type(x).__name__}:{len(x)}".encode()


def read_cache(path: Path, rows: int) -> torch.Tensor | None:
    """Cached features of `rows` examples, or None where there are none; a damaged file (cut short, not an array,
    the wrong number of rows) is set aside under another name, said in one warning line, and recomputed."""
    if not path.is_file():
        return None
    try:
        array = np.load(path, allow_pickle=False)
        if not isinstance(array, np.ndarray) or array.ndim != 2 or len(array) != rows:
            raise ValueError(f"shape {getattr(array, 'shape', None)}, not {rows} rows of features")
        return torch.from_numpy(array)
    except (OSError, ValueError, EOFError) as e:
        aside = path.with_name(f"{path.name}.damaged-{os.getpid()}-{time.time_ns()}")
        with contextlib.suppress(OSError):
            path.replace(aside)
        print(f"bench: warning: feature cache {path} is damaged ({' '.join(str(e).split())[:120]}); moved it to "
              f"{aside.name} and computing the features again", file=sys.stderr, flush=True)
        return None


def write_cache(path: Path, array: np.ndarray) -> None:
    """Write features atomically: a unique temporary file beside `path`, then `os.replace`, so that a reader (or a
    concurrent writer) never sees half a file, and a planted link at `path` is replaced, never written through. The
    file is readable by the owner's group (0o640 at least, more where the umask allows): a shared cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=f".{path.name}.", suffix=".part") as tmp:
        try:
            np.save(tmp, array)
            tmp.flush()
            os.fchmod(tmp.fileno(), 0o640 | (0o644 & ~umask()))
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    os.replace(tmp.name, path)


def umask() -> int:
    """The process's umask, read without changing it (`os.umask` sets it while reading: a race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


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

