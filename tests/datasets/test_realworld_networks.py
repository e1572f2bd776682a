"""The real-world sets' networks, augmentations and method settings as their papers ran them: Inception-ResNet-v2
(timm's, DivideMix's network on mini-WebVision) and the input sizes it takes, DivideMix's RandomResizedCrop against
torchvision's definition, and the per-dataset method defaults (DivideMix's WebVision alpha and lambda_u)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.cli.main import main
from bench.config import UserError
from bench.data import get_dataset
from bench.datasets.image_files import random_resized_boxes, resized_crops
from bench.models import INCEPTION_MIN, create
from bench.trial import TrialConfig
from tests.datasets.test_realworld import write_animal10n, write_red, write_webvision


@pytest.fixture(autouse=True)
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_RESNET50_WEIGHTS", raising=False)


# ---------------------------------------------------------------- Inception-ResNet-v2


def test_inception_resnet_v2_is_dividemix_network() -> None:
    pytest.importorskip("timm")
    net = create("inception_resnet_v2", 50).eval()
    blocks = [type(m).__name__ for m in net.modules()]
    # DivideMix's InceptionResNetV2.py: 10 Block35, 20 Block17, 9 Block8 and the last Block8 without ReLU.
    assert (blocks.count("Block35"), blocks.count("Block17"), blocks.count("Block8")) == (10, 20, 10)
    scales = sorted({(type(m).__name__, round(m.scale, 2)) for m in net.modules() if hasattr(m, "scale")})
    assert scales == [("Block17", 0.1), ("Block35", 0.17), ("Block8", 0.2), ("Block8", 1.0)]
    assert all(m.eps == 0.001 for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d))
    (head,) = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert (head.in_features, head.out_features) == (1536, 50)
    with torch.no_grad():
        assert net(torch.zeros(1, 3, 299, 299)).shape == (1, 50)
        assert net(torch.zeros(1, 3, INCEPTION_MIN, INCEPTION_MIN)).shape == (1, 50)
        # One pixel less leaves its last reduction nothing: the bare timm network fails there, ours says so.
        with pytest.raises(RuntimeError):
            net.net(torch.zeros(1, 3, INCEPTION_MIN - 1, INCEPTION_MIN - 1))
        with pytest.raises(UserError, match=rf"needs images of at least {INCEPTION_MIN} pixels, got \(74, 74\)"):
            net(torch.zeros(1, 3, INCEPTION_MIN - 1, INCEPTION_MIN - 1))
    with pytest.raises(UserError, match=rf"at least {INCEPTION_MIN} pixels .*got 64; choose another --model"):
        create("inception_resnet_v2", 10, image_size=64)


def test_inception_resnet_v2_without_timm_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now fails as if it were not installed
    with pytest.raises(UserError, match=r"built by timm, which is not installed: pip install -e '\.\[models\]'"):
        create("inception_resnet_v2", 50)


def test_inception_resnet_v2_on_small_images_is_refused_before_training(tmp_path: Path, capsys) -> None:
    pytest.importorskip("timm")
    write_animal10n(tmp_path)  # 64 x 64 images: ANIMAL-10N passes its image size
    code = main(["trial", "--dataset", "animal10n", "--method", "ce", "--noise", "real", "--r", "0",
                 "--model", "inception_resnet_v2", "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8",
                 "--data-root", str(tmp_path), "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "inception_resnet_v2 needs images of at least 75" in err
    assert not list((tmp_path / "results").rglob("*.parquet"))


def test_inception_resnet_v2_on_red_mini_imagenet_is_refused_when_the_data_loads(tmp_path: Path, capsys) -> None:
    pytest.importorskip("timm")
    write_red(tmp_path, n=10)  # 32-pixel inputs; the dataset passes no image size
    code = main(["trial", "--dataset", "red_mini_imagenet", "--method", "ce", "--noise", "red", "--r", "0.2",
                 "--model", "inception_resnet_v2", "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8",
                 "--data-root", str(tmp_path), "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert ("--model inception_resnet_v2 cannot take red_mini_imagenet's inputs (3, 32, 32): inception_resnet_v2 needs "
            "images of at least 75 pixels" in err)
    assert not list((tmp_path / "results").rglob("*.parquet"))


def test_webvision_defaults_to_inception_resnet_v2() -> None:
    for name in ("webvision_mini", "webvision_mini_ilsvrc12"):
        assert TrialConfig(dataset=name, method="ce", noise="real", r=0.0).network() == "inception_resnet_v2"


# ---------------------------------------------------------------- DivideMix's WebVision augmentation


def test_resized_crops_are_crop_then_bilinear_resize() -> None:
    """Each box cut out and resized as torchvision's tensor resize does it without antialiasing. Tolerance: the
    sampling positions pass through grid_sample's normalised coordinates, a float32 round trip of about 1e-7 x 320
    pixels, so values in [0, 1] move by at most ~3e-5; 1e-4."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(5, 3, 40, 48, generator=generator)
    boxes = torch.tensor([[0, 0, 40, 48], [5, 7, 10, 13], [30, 2, 10, 38], [3, 3, 33, 20], [39, 47, 1, 1]])
    out = resized_crops(x, boxes, 29)
    assert out.shape == (5, 3, 29, 29)
    for k, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = x[k : k + 1, :, top : top + h, left : left + w]
        expected = F.interpolate(crop, size=(29, 29), mode="bilinear", align_corners=False, antialias=False)
        torch.testing.assert_close(out[k : k + 1], expected, rtol=0, atol=1e-4)
    whole = resized_crops(x[:1], torch.tensor([[0, 0, 40, 48]]), 40)[..., :40]  # 48 -> 40 wide: not identity
    assert not torch.allclose(whole, x[:1, :, :, :40])
    square = torch.rand(2, 3, 30, 30, generator=generator)  # the whole image at its own size is the image
    torch.testing.assert_close(resized_crops(square, torch.tensor([[0, 0, 30, 30]] * 2), 30), square, rtol=0,
                               atol=1e-5)


def test_random_resized_boxes_follow_torchvision_bounds() -> None:
    """RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)): every box inside the image, its area between 8% and
    100% and its aspect ratio within [3/4, 4/3] up to the rounding of w and h to pixels."""
    boxes = random_resized_boxes(20_000, 320, 320, torch.Generator().manual_seed(1))
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 320).all() and (left + w <= 320).all()
    area, aspect = (h * w).double() / 320**2, w.double() / h.double()
    assert area.min() >= 0.08 - 2 * 320 / 320**2 and area.max() <= 1
    slack = 1 / 0.08**0.5 / 320 * 2  # one pixel of rounding on the smallest side (~90 pixels)
    assert aspect.min() >= 3 / 4 - slack and aspect.max() <= 4 / 3 + slack
    assert area.min() < 0.1 and area.max() > 0.95  # the whole range is drawn
    # Placement: uniform over the positions that fit, so a box's centre is on average the image's centre.
    assert abs(float((top + h / 2).double().mean()) - 160) < 2 and abs(float((left + w / 2).double().mean()) - 160) < 2


def test_webvision_train_transform_is_random_resized_crop(tmp_path: Path) -> None:
    write_webvision(tmp_path)
    ds = get_dataset("webvision_mini")(tmp_path)
    splits = ds.load()
    batch = torch.stack([splits.train.x[i] for i in range(4)])
    out = ds.train_transform(batch, torch.Generator().manual_seed(3))
    assert out.shape == (4, 3, 299, 299)
    # DivideMix's transform_train order: a RandomResizedCrop box of the stored image (the functions tested above),
    # resized to 299, then a flip with probability 1/2, then the normalisation; drawn from the generator in that order.
    generator = torch.Generator().manual_seed(3)
    boxes = random_resized_boxes(4, 320, 320, generator)
    flip = torch.rand(4, generator=generator) < 0.5
    crops = resized_crops(batch, boxes, 299)
    expected = ds.normalise(torch.where(flip[:, None, None, None], crops.flip(-1), crops))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert (boxes[:, 2] < 320).any()  # a resized crop, not the whole image
    plain = ds.normalise(batch)
    # Evaluation: the centre 299 of the stored 320 (DivideMix's Resize(320) + CenterCrop(299)).
    torch.testing.assert_close(ds.eval_transform(batch), plain[:, :, 10:309, 10:309])


# ---------------------------------------------------------------- per-dataset method settings


def test_dividemix_runs_its_webvision_settings_there() -> None:
    """DivideMix's Train_webvision.py runs alpha 0.5 and lambda_u 0 (its CIFAR defaults: 4 and 25): the dataset's
    `method_defaults`, in the trial's parameters and identity; an explicit value still wins."""
    on = {name: TrialConfig(dataset=name, method="dividemix", noise=noise, r=r).effective_params()
          for name, noise, r in (("webvision_mini", "real", 0.0), ("webvision_mini_ilsvrc12", "real", 0.0),
                                 ("cifar10", "symmetric", 0.5))}
    assert (on["webvision_mini"]["alpha"], on["webvision_mini"]["lambda_u"]) == (0.5, 0.0)
    assert (on["webvision_mini_ilsvrc12"]["alpha"], on["webvision_mini_ilsvrc12"]["lambda_u"]) == (0.5, 0.0)
    assert (on["cifar10"]["alpha"], on["cifar10"]["lambda_u"]) == (4.0, 25.0)
    assert {k: v for k, v in on["webvision_mini"].items() if k not in ("alpha", "lambda_u")} == \
        {k: v for k, v in on["cifar10"].items() if k not in ("alpha", "lambda_u")}
    explicit = TrialConfig(dataset="webvision_mini", method="dividemix", noise="real", r=0.0,
                           method_params=(("alpha", 4.0), ("lambda_u", 25.0)))
    assert (explicit.effective_params()["alpha"], explicit.effective_params()["lambda_u"]) == (4.0, 25.0)
    default = TrialConfig(dataset="webvision_mini", method="dividemix", noise="real", r=0.0)
    assert default.trial_id != explicit.trial_id
    assert np.isclose(default.effective_params()["p_threshold"], 0.5)


def test_a_weights_file_of_another_architecture_is_one_line_on_every_path(tmp_path: Path) -> None:
    """A ResNet-18 state dict where a ResNet-50's belongs: the network's weights (`resnet50`, Clothing1M's and
    Food-101N's `$BENCH_RESNET50_WEIGHTS`) and a torchvision backbone of `linear_probe` refuse it in one line; torch's
    own text was a line per mismatched tensor (#54)."""
    import torchvision

    from bench import features

    other = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), other)
    refusals = []
    for build in (lambda: create("resnet50", 10, weights=str(other)),
                  lambda: features.build_backbone("resnet50", str(other))):
        with pytest.raises(UserError) as refused:
            build()
        refusals.append(str(refused.value))
    assert all("\n" not in text and f"{other} is not a torchvision" in text and "state dict" in text
               for text in refusals), refusals
