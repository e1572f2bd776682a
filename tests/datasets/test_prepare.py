"""`bench datasets --prepare`: what users must assemble themselves, built from the published parts. Red
Mini-ImageNet's web images fetched from the annotations' URLs (a real HTTP server on 127.0.0.1; file:// URLs refused),
resumed and checked by sha256; ILSVRC-2012's validation images of mini-WebVision's 50 classes sorted by the devkit's
ground truth. Each result is checked against the files written, and the datasets then load."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.cli.main import main
from bench.data import get_dataset
from bench.download import MANIFEST, Fetched, fetch_many
from tests.conftest import http_folder
from tests.datasets.test_realworld import write_image, write_red, write_webvision


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """A real HTTP server on 127.0.0.1 serving `served/`; yields its base URL, the folder and the paths requested."""
    served = tmp_path / "served"
    served.mkdir()
    with http_folder(served) as (base, requested):
        yield base, served, requested


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_many_resumes_and_checks(tmp_path: Path, server) -> None:
    base, served, requested = server
    payloads = {f"img{i}.jpg": bytes([i]) * (100 + i) for i in range(5)}
    for name, data in payloads.items():
        if name != "img3.jpg":  # not served yet: its URL fails
            (served / name).write_bytes(data)
    local = tmp_path / "local.jpg"
    local.write_bytes(b"from a file url")
    items = {name: f"{base}/{name}" for name in payloads} | {"sub/local.jpg": local.as_uri()}
    folder = tmp_path / "images"

    first = fetch_many(items, folder, workers=3)
    assert first == Fetched(fetched=["img0.jpg", "img1.jpg", "img2.jpg", "img4.jpg"], kept=[],
                            failed={"img3.jpg": "http", "sub/local.jpg": "scheme"})  # http(s) addresses only
    for name, data in payloads.items():
        assert (folder / name).exists() == (name != "img3.jpg")
        if name != "img3.jpg":
            assert (folder / name).read_bytes() == data
    assert not (folder / "sub" / "local.jpg").exists()
    manifest = {line.split("\t")[0]: line.split("\t")[1:] for line in (folder / MANIFEST).read_text().splitlines()}
    assert manifest["img1.jpg"] == [str(len(payloads["img1.jpg"])), sha256(payloads["img1.jpg"])]
    failed = (folder / ".failed.tsv").read_text().splitlines()
    assert len(failed) == 2 and failed[0].startswith(f"img3.jpg\t{base}/img3.jpg\t") and "404" in failed[0]
    assert not list(folder.rglob("*.part"))

    # Resumed: the failed image is served now; a fetched one was changed on disk since (its sha256 no longer
    # matches): exactly those two are fetched again, the others kept without a request.
    (served / "img3.jpg").write_bytes(payloads["img3.jpg"])
    (folder / "img0.jpg").write_bytes(bytes([9]) * 100)  # same size, other content
    requested.clear()
    second = fetch_many(items, folder, workers=3)
    assert second == Fetched(fetched=["img0.jpg", "img3.jpg"], kept=["img1.jpg", "img2.jpg", "img4.jpg"],
                             failed={"sub/local.jpg": "scheme"})
    assert sorted(requested) == ["/img0.jpg", "/img3.jpg"]
    assert (folder / "img0.jpg").read_bytes() == payloads["img0.jpg"]
    assert (folder / ".failed.tsv").read_text().startswith(f"sub/local.jpg\t{local.as_uri()}\t")


def test_fetch_many_refuses_a_name_outside_the_folder(tmp_path: Path) -> None:
    from bench.config import UserError

    with pytest.raises(UserError, match=r"a name must be a path inside the folder"):
        fetch_many({"../escape.jpg": "file:///dev/null"}, tmp_path / "images")


def test_red_mini_imagenet_prepare_fetches_the_web_images(tmp_path: Path, server, capsys) -> None:
    base, served, _ = server
    root = tmp_path / "data"
    written = write_red(root, n=10)
    all_images = root / "mini-imagenet" / "all_images"
    web = sorted({key for rows in written["levels"].values() for key, _ in rows if not key.startswith("n")})
    assert web  # the levels above 0 name web images
    contents = {}
    for key in web:  # the web images move to the server; the annotations list their URLs (and one more)
        (served / key).write_bytes((all_images / key).read_bytes())
        contents[key] = (all_images / key).read_bytes()
        (all_images / key).unlink()
    annotations = {"data": [[{"image/id": Path(key).stem, "image/uri": f"{base}/{key}",
                              "image/class/label": 0, "image/class/label/is_clean": 0}] for key in web]
                   + [[{"image/id": "ffffffffffffffff", "image/uri": f"{base}/unused.jpg"}]]}
    listing = tmp_path / "mini-imagenet-annotations.json"
    listing.write_text(json.dumps(annotations))

    assert main(["datasets", "--prepare", "red_mini_imagenet", "--from", str(listing), "--data-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{len(web)} web images in {all_images}: {len(web)} fetched, 0 already there and intact, 0 failed" in out
    for key in web:
        assert (all_images / key).read_bytes() == contents[key]
    assert not (all_images / "ffffffffffffffff.jpg").exists()  # only what the split files name
    splits = get_dataset("red_mini_imagenet")(root).load()
    view = splits.for_noise("red", 0.8)
    assert view.train.x[0].shape == (3, 32, 32)

    assert main(["datasets", "--prepare", "red_mini_imagenet", "--from", str(listing), "--data-root", str(root)]) == 0
    assert f"0 fetched, {len(web)} already there and intact" in capsys.readouterr().out


def test_prepare_refusals_are_one_line(tmp_path: Path, capsys) -> None:
    write_red(tmp_path, n=10)
    (tmp_path / "bad.json").write_text("{}")
    for argv, words in ((["--prepare", "red_mini_imagenet"], "needs --from PATH"),
                        (["--prepare", "red_mini_imagenet", "--from", str(tmp_path / "bad.json")],
                         "cannot read the web images' URLs"),
                        (["--prepare", "animal10n", "--from", str(tmp_path)], "animal10n has nothing to prepare")):
        assert main(["datasets", *argv, "--data-root", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err


def write_devkit(source: Path, synsets: list[str], labels: list[int]) -> None:
    """ILSVRC2012_devkit_t12/data/meta.mat (1000 leaf synsets with ids in a shuffled order, as the real file's ids
    are not alphabetical, plus a parent entry) and the ground truth (image n's id on line n)."""
    from scipy.io import savemat

    data = source / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    order = np.random.default_rng(0).permutation(1000)  # id i + 1 is synset order[i]
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images"]
    rows = np.zeros((1001, 1), dtype=[(f, "O") for f in fields])
    for i in range(1000):
        rows[i, 0] = (i + 1, synsets[order[i]], "w", "g", 0, np.zeros(0), 0, 1300)
    rows[1000, 0] = (1001, "n99999999", "parent", "g", 2, np.array([1, 2]), 1, 0)
    savemat(data / "meta.mat", {"synsets": rows})
    id_of = {int(s): i + 1 for i, s in enumerate(order)}
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{id_of[lab]}\n" for lab in labels))


def test_webvision_ilsvrc12_prepare_sorts_by_the_ground_truth(tmp_path: Path, capsys) -> None:
    root, source = tmp_path / "data", tmp_path / "ilsvrc"
    write_webvision(root)
    val = root / "webvision" / "imagenet" / "val"
    import shutil

    shutil.rmtree(val)
    synsets = [line.split()[0] for line in (root / "webvision" / "info" / "synsets.txt").read_text().splitlines()]
    labels = [(7 * n) % 120 for n in range(30)]  # image n + 1's class: some of the 50, some beyond
    write_devkit(source, synsets, labels)
    for n, label in enumerate(labels, 1):
        write_image(source / "ILSVRC2012_img_val" / f"ILSVRC2012_val_{n:08d}.JPEG", label, (40, 40))

    assert main(["datasets", "--prepare", "webvision_mini_ilsvrc12", "--from", str(source),
                 "--data-root", str(root)]) == 0
    mine = [(n, label) for n, label in enumerate(labels, 1) if label < 50]
    assert f"{len(mine)} placed, 0 already there" in capsys.readouterr().out
    placed = sorted(p.relative_to(val).as_posix() for p in val.rglob("*.JPEG"))
    assert placed == sorted(f"{synsets[label]}/ILSVRC2012_val_{n:08d}.JPEG" for n, label in mine)
    assert sorted(p.name for p in val.iterdir()) == sorted(synsets[:50])  # every class a folder, even empty
    test = get_dataset("webvision_mini_ilsvrc12")(root).load().test
    assert sorted(test.y.tolist()) == sorted(label for _, label in mine)

    assert main(["datasets", "--prepare", "webvision_mini_ilsvrc12", "--from", str(source),
                 "--data-root", str(root)]) == 0
    assert f"0 placed, {len(mine)} already there" in capsys.readouterr().out
