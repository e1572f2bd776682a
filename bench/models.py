"""The paper's networks, each one class with a `name`, found like methods and datasets (`create("fashion_cnn", 2)`).

Each model reads top to bottom; a dataset names its default model and passes what it needs (vocabulary size).
A new model is one `Model` subclass here, in a dataset's file or in a plug-in file (`$BENCH_PLUGINS`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from bench.config import UserError, discover, lookup, whole_number
from bench.data import Dataset, Splits


class Model(nn.Module):
    """Base class of the registered networks: `name`, and whether trials of it can train as one stacked model."""

    name: ClassVar[str] = ""
    # Packable (`bench.exec.packed`): every member's parameters and buffers (BatchNorm's running statistics) are its
    # own when K copies are stacked, and dropout comes only through `Dropout` below, so that each member draws its own
    # masks. Not so for a network that shares state between its calls or draws from torch's generator itself.
    packable: ClassVar[bool] = False
    # Channels-last on CUDA: cuDNN's tensor-core convolutions for the BatchNorm networks want NHWC (1.2x for
    # ResNet-34, 1.4x for VGG-16-BN on an H100: benchmarks/channels_last.py; `BENCH_CHANNELS_LAST=0` turns it off).
    channels_last: ClassVar[bool] = False
    # Options (a trial's `model_args`) that `prepare_data` reads, not the constructor (the probe's backbone).
    data_options: ClassVar[tuple[str, ...]] = ()
    # Options that name a local weights file the network starts from (ResNet-50's ImageNet weights, the probe's
    # backbone): each file's md5 is part of the trial's identity and its row (`bench.trial.TrialConfig.weights`).
    weights_options: ClassVar[tuple[str, ...]] = ()
    # Bumped when a change to the network changes a trial's numbers with its options unchanged (a probe's backbone
    # built another way): part of trial identity and of the warm start's key where above 1
    # (`bench.trial.TrialConfig.network_version`), so that rows and warm starts made by the old code are not reused.
    version: ClassVar[int] = 1

    @classmethod
    def options(cls) -> set[str]:
        """The options (`model_args`) this network takes: its constructor's and its `data_options`."""
        return set(cls.data_options) | _constructor_options(cls.__init__)

    def shortened(self, x: torch.Tensor) -> torch.Tensor:
        """A batch with what the network would not read cut off (by default all of it is read). A solo trial's
        training pass and `predict` feed each batch through it; a pack's vmapped forward keeps fixed shapes."""
        return x

    @classmethod
    def check_files(cls, options: dict[str, Any]) -> None:
        """Refuse, in one line, before anything runs, a file that `options` name and that is not there."""

    @classmethod
    def prepare_data(cls, dataset: Dataset, splits: Splits, options: dict[str, Any], device: torch.device) -> Splits:
        """The splits this network trains on, from the dataset's (`bench.features`: a frozen backbone's features);
        the dataset's own by default."""
        return splits


@functools.cache
def _constructor_options(init: Callable[..., Any]) -> frozenset[str]:
    """The keyword options of a network's constructor (past `self` and `num_classes`): read once a constructor, not
    once a trial (`inspect.signature` costs a grid's planning more than the rest of a trial's checks)."""
    import inspect

    return frozenset(list(inspect.signature(init).parameters)[2:])


@functools.cache
def registry() -> dict[str, type[Model]]:
    """Every model by name: the classes here, in dataset files and in plug-in files."""
    return discover(Model, ("bench.models", "bench.features", "bench.datasets"))


def get_model(name: str) -> type[Model]:
    return lookup(registry(), "model", name)


IMAGE_SIZES = (32, 1024)  # an `image_size` option's bounds: VGG's five max-pools need 32; 1024 is past any backbone's


def check_args(name: str, args: dict[str, Any]) -> None:
    """Refuse, in one line, an option (`model_args`) that model `name` does not take."""
    model = get_model(name)
    accepted = model.options()
    if unknown := sorted(set(args) - accepted):
        raise UserError(f"model {name} takes no option {unknown[0]!r}; its options: "
                        f"{', '.join(sorted(accepted)) or 'none'}")
    if bad := next((k for k, v in args.items() if not isinstance(v, str | int | float | bool)), None):
        raise UserError(f"model {name}: option {bad!r} must be a single value, got {args[bad]!r}")
    if "image_size" in args:  # 0 read as "no resize", 100000 as an interpolation far past any memory
        whole_number(args["image_size"], f"model {name}: option image_size", *IMAGE_SIZES,
                     "the pixels a side of the images the network sees (e.g. 224); leave it out for the default")


def create(name: str, num_classes: int, device: torch.device | str = "cpu", **kwargs: Any) -> nn.Module:
    """Model `name` on `device` (initialised on the CPU, so the weights are the same everywhere), in the memory
    layout it trains fastest in there."""
    device = torch.device(device)
    net = get_model(name)(num_classes=num_classes, **kwargs).to(device)
    if trains_channels_last(net, device):
        net = net.to(memory_format=torch.channels_last)
    return net


def trains_channels_last(net: nn.Module, device: torch.device) -> bool:
    """Whether `net` trains in channels-last on `device`: a model that asks for it, on CUDA, unless
    BENCH_CHANNELS_LAST=0 (a pack lays out its fused inputs and kernels by the same rule)."""
    return (device.type == "cuda" and getattr(net, "channels_last", False)
            and os.environ.get("BENCH_CHANNELS_LAST", "1") != "0")


class Dropout(nn.Module):
    """Inverted dropout whose mask is drawn from an explicit generator, or handed in.

    Drawn: `bernoulli_(1 - p)` scaled by 1 / (1 - p) from `generator` (None: torch's default one), the very bits
    `nn.Dropout` draws on the CPU, so a solo trial's numbers do not change. Handed in (`mask`, set by
    `bench.exec.packed` for the length of one vmapped forward pass): each member of a pack draws its masks from its own
    generator, so that its numbers do not depend on its pack-mates."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p
        self.generator: torch.Generator | None = None
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.mask is not None:
            return x * self.mask
        return x * self.draw(x.shape, x.device, self.generator).to(x.dtype)

    def draw(self, shape: torch.Size, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
        """One mask, already scaled by 1 / (1 - p)."""
        noise = torch.empty(shape, device=device).bernoulli_(1 - self.p, generator=generator)
        return noise.div_(1 - self.p)


class MLP(Model):
    """A small two-layer perceptron for synthetic data and tests."""

    name = "mlp"
    packable = True

    def __init__(self, num_classes: int, in_features: int = 2, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class FashionCNN(Model):
    """The paper's two-layer CNN for 28x28 Fashion-MNIST: conv 1->16 5x5, pool, conv 16->32 5x5, pool,
    dropout 0.5, linear 512 -> C."""

    name = "fashion_cnn"
    packable = True

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.dropout = Dropout(0.5)
        self.classifier = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.features(x).flatten(1)))


class WordCNN(Model):
    """Kim's (2014) sentence CNN: random 128-d embeddings, filters of width 3/4/5 x 100, ReLU,
    max-over-time pooling, dropout 0.5, linear 300 -> C. Token 0 is padding.

    The random embeddings start as in Kim's CNN-rand, uniform in [-0.25, 0.25] (the variance of pre-trained
    word2vec vectors), not torch's N(0, 1): on MR at r = 0, N(0, 1) measured 67-69% clean test accuracy at the
    selected CE epoch, Kim's initialisation 76-78% (the paper reports 72%)."""

    name = "word_cnn"
    packable = True

    def __init__(
        self, num_classes: int, vocab_size: int, embed_dim: int = 128,
        widths: tuple[int, ...] = (3, 4, 5), filters: int = 100,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        nn.init.uniform_(self.embedding.weight, -0.25, 0.25)
        with torch.no_grad():
            self.embedding.weight[0].zero_()
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, filters, w) for w in widths)
        self.dropout = Dropout(0.5)
        self.classifier = nn.Linear(filters * len(widths), num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_embedded(self.embedding(tokens))

    def forward_embedded(self, embedded: torch.Tensor) -> torch.Tensor:
        """From word embeddings (N, L, D): the entry point for perturbing embeddings (VAT on text)."""
        h = embedded.transpose(1, 2)
        pooled = [torch.relu(conv(h)).amax(dim=2) for conv in self.convs]
        return self.classifier(self.dropout(torch.cat(pooled, dim=1)))


class WordCNNAuthors(Model):
    """The WordCNN as the paper's MR scripts build it (github.com/Newbeeer/L_DMI, MR/models/WordCNN, commit 7d5e4bc):
    embeddings N(0, 1) (torch's default) with no padding index, so the padding vector is learnt like a word's; tanh
    after each convolution; max over time (`max`, whose gradient goes to one position where values tie, as theirs);
    dropout 0.5; linear 300 -> C; and their log-softmax on top, so that it returns what theirs returns: the same
    predictions and, up to float rounding, the same losses as the logits (softmax(log_softmax(z)) = softmax(z)), and
    under `script_stream` the script's very bits. The `authors` protocol's `script_model` on MR.

    Their loader pads each batch to its longest sentence (at least 5 tokens, `MR/dataloaders.py` `_collate_fn`), so a
    filter never slides past that length. Here sentences are padded to one fixed length and the positions past the
    longest sentence of the batch are masked out of the max: the same numbers, with fixed shapes (packs, no
    recompilation). A training forward is one batch; in evaluation the scripts' loaders give batches of
    `eval_group` = 128 in split order, and each consecutive 128 rows of the input count as one batch (`predict`'s
    chunks are multiples of 128)."""

    name = "word_cnn_authors"
    packable = True
    eval_group: ClassVar[int] = 128
    min_length: ClassVar[int] = 5

    def __init__(
        self, num_classes: int, vocab_size: int, embed_dim: int = 128,
        widths: tuple[int, ...] = (3, 4, 5), filters: int = 100,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, filters, w) for w in widths)
        self.dropout = Dropout(0.5)
        self.classifier = nn.Linear(filters * len(widths), num_classes)

    def batch_length(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each row's padded length in the scripts' loader: the longest sentence of its batch, at least 5."""
        n = tokens.shape[0]
        lengths = (tokens != 0).sum(dim=1).clamp(min=self.min_length)
        group = n if self.training else self.eval_group
        padded = torch.nn.functional.pad(lengths, (0, (-n) % group))
        return padded.view(-1, group).amax(dim=1, keepdim=True).expand(-1, group).reshape(-1)[:n]

    def shortened(self, tokens: torch.Tensor) -> torch.Tensor:
        """The batch cut after its longest sentence (at least `min_length` tokens), as the scripts' loader pads it:
        `forward` masks the positions past that out of the max, so the logits are the same, with shorter
        convolutions (on MR 46 positions a batch of 128 instead of 56). Evaluation feeds one `eval_group` at a time."""
        return tokens[:, : max(int((tokens != 0).sum(dim=1).max()), self.min_length)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embedding(tokens).transpose(1, 2)
        length = self.batch_length(tokens)
        pooled = []
        for conv in self.convs:
            features = torch.tanh(conv(h))
            valid = torch.arange(features.shape[-1], device=tokens.device) <= (length - conv.kernel_size[0])[:, None]
            pooled.append(features.masked_fill(~valid[:, None, :], float("-inf")).max(dim=2).values)
        return torch.log_softmax(self.classifier(self.dropout(torch.cat(pooled, dim=1))), dim=1)


class _BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv + BN, ReLU between and after the residual sum; a 1x1 conv + BN on the
    shortcut where the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet34CIFAR(Model):
    """ResNet-34 for 32x32 images: the CIFAR stem (one 3x3 conv, stride 1, no max-pool), then 3/4/6/3 basic blocks
    of 64/128/256/512 channels (stride 2 at each stage change), global average pooling, linear 512 -> C.
    `blocks` and `width` (the stem's channels) shrink it for tests and CPU benchmarks."""

    name = "resnet34_cifar"
    packable = True
    channels_last = True

    def __init__(self, num_classes: int, blocks: tuple[int, ...] = (3, 4, 6, 3), width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers: list[nn.Module] = []
        in_channels = width
        for stage, count in enumerate(blocks):
            out_channels = width * 2**stage
            for i in range(count):
                layers.append(_BasicBlock(in_channels, out_channels, 2 if stage > 0 and i == 0 else 1))
                in_channels = out_channels
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.layers(self.stem(x)).mean(dim=(2, 3)))


def vgg_features(plan: tuple, in_channels: int, width: int) -> tuple[nn.Sequential, int]:
    """VGG's convolutional body with batch norm: a number in `plan` is a 3x3 conv + BN + ReLU of that many channels
    (scaled by width / 64), "M" a 2x2 max-pool; with the channels it ends on."""
    layers: list[nn.Module] = []
    for item in plan:
        if item == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            channels = int(item) * width // 64
            layers += [nn.Conv2d(in_channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()]
            in_channels = channels
    return nn.Sequential(*layers), in_channels


class VGG16BN(Model):
    """VGG-16 with batch norm: 13 3x3 conv + BN + ReLU layers in five blocks, each closed by a 2x2 max-pool, then,
    as in the L_DMI authors' Dogs vs Cats network, one linear layer on the flattened features. Its width follows the
    image size: 512 x floor(size / 32)^2, each max-pool flooring as torch's do (64-pixel images: 2048; the authors'
    150: 8192). `width` (the first block's channels, 64) shrinks every layer in proportion, for tests and CPU
    benchmarks."""

    name = "vgg16_bn"
    packable = True
    channels_last = True

    LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, num_classes: int, image_size: int = 64, in_channels: int = 3, width: int = 64) -> None:
        super().__init__()
        if image_size < 32:
            raise UserError(f"vgg16_bn needs images of at least 32 pixels (five 2x2 max-pools), got {image_size}")
        self.features, in_channels = vgg_features(self.LAYERS, in_channels, width)
        self.classifier = nn.Linear(in_channels * (image_size // 32) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class VGG19BN(Model):
    """VGG-19 with batch norm as PLC trains it from scratch on ANIMAL-10N's 64 x 64 images (github.com/pxiangwu/PLC
    animal10/vgg.py, 8c2bcfd: torchvision's VGG, `vgg19_bn(pretrained=False)` in animal10/train.py line 90): 16 3x3
    conv + BN + ReLU layers (2/2/4/4/4 in five blocks, each closed by a 2x2 max-pool), average pooling to 7 x 7
    (vgg.py line 39; a 64-pixel image's 2 x 2 features are each repeated), then the head of lines 40-48: linear
    25088 -> 4096, ReLU, dropout 0.5, linear 4096 -> 4096, ReLU, dropout 0.5, linear 4096 -> C; initialised as lines
    59-70: convolutions Kaiming-normal (fan_out) with zero biases, BN weights 1 and biases 0, linear layers N(0, 0.01)
    with zero biases. SELFIE's VGG-19 (github.com/kaist-dmlab/SELFIE SELFIE/network/VGG/VGG19.py lines 133-145,
    b99f8cf) has the same 4096-4096-C head, with batch norm and leaky ReLU before each dropout (keep 0.5); bench follows
    PLC, whose schedule ANIMAL-10N runs. Any image of at least 32 pixels fits (the pooling fixes the head's width).
    `width` (the first block's channels, 64) and `hidden` (4096) shrink it for tests and CPU benchmarks."""

    name = "vgg19_bn"
    packable = False  # BatchNorm and dropout: the fused BatchNorm packs (bench.exec.grouped) take no dropout
    channels_last = True

    LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")

    def __init__(self, num_classes: int, image_size: int = 64, width: int = 64, hidden: int = 4096) -> None:
        super().__init__()
        if image_size < 32:
            raise UserError(f"vgg19_bn needs images of at least 32 pixels (five 2x2 max-pools), got {image_size}")
        self.features, in_channels = vgg_features(self.LAYERS, 3, width)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(in_channels * 7 * 7, hidden), nn.ReLU(), Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(), Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def inception_side(size: int) -> int:
    """The side of Inception-ResNet-v2's last features for a `size`-pixel input: its unpadded 3x3 convolutions and
    poolings (conv2d_1a, conv2d_2a, maxpool_3a, conv2d_4a, maxpool_5a, and the stride-2 branches of mixed_6a and
    mixed_7a) each take their pixels off."""
    for stride in (2, 1, 2, 1, 2, 2, 2):
        size = (size - 3) // stride + 1
    return size


INCEPTION_MIN = next(size for size in range(3, 1000) if inception_side(size) >= 1)  # 75


class InceptionResNetV2(Model):
    """Inception-ResNet-v2 (Szegedy et al., AAAI 2017), the network DivideMix and ELR train from scratch on
    mini-WebVision (github.com/LiJunnan1992/DivideMix InceptionResNetV2.py, d9d3058, `InceptionResNetV2(num_classes=
    args.num_class)` in Train_webvision.py line 205; github.com/shengliu66/ELR ELR_plus/model/InceptionResNetV2.py).
    Its layers are timm's `inception_resnet_v2` with `pretrained=False` (random weights; nothing is downloaded),
    the same network: both are ports of Cadene's pretrained-models one, with the same stem, 10 / 20 / 9 blocks scaled
    0.17 / 0.10 / 0.20, BatchNorm eps 0.001 and a 1536 -> C linear head. DivideMix's pools the 8 x 8 features of a
    299-pixel input with AvgPool2d(8) (line 275), timm's globally: the same there. timm is an optional dependency
    (`pip install -e '.[models]'`); without it the model is refused in one line. Its valid convolutions need inputs
    of at least 75 pixels (`image_size`, checked when it is built, and each batch's size)."""

    name = "inception_resnet_v2"
    channels_last = True

    def __init__(self, num_classes: int, image_size: int = 299) -> None:
        super().__init__()
        if image_size < INCEPTION_MIN:
            raise UserError(f"inception_resnet_v2 needs images of at least {INCEPTION_MIN} pixels (its "
                            f"convolutions are unpadded), got {image_size}; choose another --model")
        try:
            import timm  # here: an optional dependency, and the training core imports only torch and numpy
        except ImportError:
            raise UserError("inception_resnet_v2 is built by timm, which is not installed: pip install -e "
                            "'.[models]' in the repository (or pip install timm), or choose another --model "
                            "(resnet50)") from None
        self.net = timm.create_model("inception_resnet_v2", pretrained=False, num_classes=num_classes)

    @classmethod
    def prepare_data(cls, dataset: Dataset, splits: Splits, options: dict[str, Any], device: torch.device) -> Splits:
        """Refuse, before anything trains, a dataset whose inputs (one test example through its evaluation transform)
        are not images of at least `INCEPTION_MIN` pixels (`--model inception_resnet_v2` on Red Mini-ImageNet's 32)."""
        x = dataset.eval_transform(torch.as_tensor(splits.test.x[0])[None])
        if x.ndim != 4 or min(x.shape[-2:]) < INCEPTION_MIN:
            raise UserError(f"--model inception_resnet_v2 cannot take {dataset.name}'s inputs {tuple(x.shape[1:])}: "
                            f"inception_resnet_v2 needs images of at least {INCEPTION_MIN} pixels; choose another "
                            "--model for this dataset")
        return splits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < INCEPTION_MIN:
            raise UserError(f"inception_resnet_v2 needs images of at least {INCEPTION_MIN} pixels, got "
                            f"{tuple(x.shape[-2:])}; choose another --model for this dataset")
        return self.net(x)


class ResNet18CIFAR(ResNet34CIFAR):
    """ResNet-18 for 32 x 32 images: `ResNet34CIFAR` with 2/2/2/2 basic blocks (Red Mini-ImageNet at 32 pixels)."""

    name = "resnet18_cifar"

    def __init__(self, num_classes: int, blocks: tuple[int, ...] = (2, 2, 2, 2), width: int = 64) -> None:
        super().__init__(num_classes, blocks, width)


def load_problem(error: Exception, limit: int = 200) -> str:
    """Why a weights file did not load, in one line: torch's refusal of another network's state dict spans a line
    per mismatched key (6 to 26 lines of a ResNet-50's)."""
    return " ".join(str(error).split())[:limit]


class ResNet50(Model):
    """torchvision's ResNet-50 with a fresh linear 2048 -> C head. `weights`: a LOCAL file holding torchvision's
    ImageNet state dict (e.g. resnet50-11ad3fa6.pth) to start from, as the paper does on Clothing1M; nothing is
    ever downloaded. Its layers are torchvision's own (same names, so the same state dicts)."""

    name = "resnet50"
    packable = True
    channels_last = True
    weights_options = ("weights",)

    def __init__(self, num_classes: int, weights: str | None = None) -> None:
        super().__init__()
        from pathlib import Path

        import torchvision  # here, not at the top: the training core imports only torch and numpy

        net = torchvision.models.resnet50(weights=None)
        if weights:
            path = Path(weights).expanduser()
            if not path.is_file():
                raise UserError(f"resnet50: no ImageNet weights file at {path}")
            try:
                net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            except Exception as e:  # not a state dict, or one of another network
                raise UserError(f"resnet50: {path} is not a torchvision ResNet-50 state dict "
                                f"({load_problem(e)})") from None
        net.fc = nn.Linear(net.fc.in_features, num_classes)
        for layer, module in net.named_children():
            self.add_module(layer, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
