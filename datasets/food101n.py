"""Food-101N (Lee et al., CVPR 2018, "CleanNet: Transfer learning for scalable image classifier training with label
noise"): 310,009 web images of Food-101's 101 classes, labelled by their search query, tested on Food-101's test set.

The published layouts, side by side under the data root (https://kuanghuei.github.io/Food-101N; Food-101 from
https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/):
`Food-101N_release/meta/classes.txt` (a `class_name` header, then the 101 classes), `meta/imagelist.tsv` (a
`class_name/key` header, then one `class/key.jpg` a line: the noisy label is the folder), `meta/verified_train.tsv`
and `meta/verified_val.tsv` (a `class_name/key<TAB>verification_label` header, then one verified image a line: 1 =
the class is right for the image, 0 = wrong), `images/<class>/<key>.jpg` (shorter side 320, the release's README);
`food-101/meta/test.txt` (one `class/id` a line, 25,250) and `food-101/images/<class>/<id>.jpg`. PLC reads the same
files the same way (github.com/pxiangwu/PLC food101/dataset.py, 8c2bcfd): `gen_train_list` (lines 79-112) numbers
classes.txt's lines from 0, its `class_name` header included, so the 101 classes are 1-101, and gives every image of
imagelist.tsv its folder's class; `gen_test_list` (115-137) does the same for Food-101's test split; the loader
subtracts 1 from every label (line 49), so the labels are 0-100, ours, and the network has 101 outputs
(food101/train.py line 75). Each image is read with its shorter side resized to 256, bicubic (dataset.py lines
11-34, 56).

Split: training = imagelist.tsv less the images of verified_val.tsv, whose images (with their noisy labels) are the
noisy validation set; test = Food-101's test split (clean). The clean label of an image is known where a human
verified it: the label itself where verification_label is 1, `noise.WRONG` where it is 0 (the right class is not
named), unknown elsewhere; so the realised noise rate in the row counts the verified training images (about 20% in
the paper's estimate). Model and schedule as PLC ran it (food101/train.py, 8c2bcfd): ResNet-50 from ImageNet weights
(line 93; set BENCH_RESNET50_WEIGHTS as for Clothing1M), SGD without momentum (96), weight decay 1e-3 (45), lr 0.005
as PLC's README runs it (food101/readme.md: `--lr 0.005`; the argparse default, line 198, is 0.002), batch 32, 30
epochs (195-196), lr x 0.1 at epochs 10 and 20 (41, 46); a random 224 crop and flip for training, the centre 224
for testing (54-65). PLC's warm-up (4 epochs, line 192 and the README's `--warm_up 4`) is our warm start, the method
stage the remaining 26 epochs (milestones shifted by 4). Differences: images are stored at 256 (shorter side,
bilinear) and the centre 256 x 256 is kept, where PLC keeps the whole resized image (bicubic) and crops 224 anywhere
in it; every 224 crop here lies in the centre square.

Checksums: only of the archives, which unpacking leaves behind: Food-101N_release.zip md5
596b41b48de43342ef1efbb2fd508e06 (as DeepMind's dm_nevis records it, github.com/deepmind/dm_nevis,
datasets_storage/handlers/food101n.py), food-101.tar.gz md5 85eeb15f3717b99a5da872d97d918f87 (torchvision's Food101);
none of the unpacked files. The images are decoded from disk on demand, like Clothing1M's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits
from bench.datasets.image_files import WEIGHTS_ENV, ImageCrops, ImageFiles, check_key, read_lines, resnet50_weights

CLASSES = (  # Food-101's meta/classes.txt: alphabetical
    "apple_pie", "baby_back_ribs", "baklava", "beef_carpaccio", "beef_tartare", "beet_salad", "beignets",
    "bibimbap", "bread_pudding", "breakfast_burrito", "bruschetta", "caesar_salad", "cannoli", "caprese_salad",
    "carrot_cake", "ceviche", "cheese_plate", "cheesecake", "chicken_curry", "chicken_quesadilla",
    "chicken_wings", "chocolate_cake", "chocolate_mousse", "churros", "clam_chowder", "club_sandwich",
    "crab_cakes", "creme_brulee", "croque_madame", "cup_cakes", "deviled_eggs", "donuts", "dumplings", "edamame",
    "eggs_benedict", "escargots", "falafel", "filet_mignon", "fish_and_chips", "foie_gras", "french_fries",
    "french_onion_soup", "french_toast", "fried_calamari", "fried_rice", "frozen_yogurt", "garlic_bread",
    "gnocchi", "greek_salad", "grilled_cheese_sandwich", "grilled_salmon", "guacamole", "gyoza", "hamburger",
    "hot_and_sour_soup", "hot_dog", "huevos_rancheros", "hummus", "ice_cream", "lasagna", "lobster_bisque",
    "lobster_roll_sandwich", "macaroni_and_cheese", "macarons", "miso_soup", "mussels", "nachos", "omelette",
    "onion_rings", "oysters", "pad_thai", "paella", "pancakes", "panna_cotta", "peking_duck", "pho", "pizza",
    "pork_chop", "poutine", "prime_rib", "pulled_pork_sandwich", "ramen", "ravioli", "red_velvet_cake", "risotto",
    "samosa", "sashimi", "scallops", "seaweed_salad", "shrimp_and_grits", "spaghetti_bolognese",
    "spaghetti_carbonara", "spring_rolls", "steak", "strawberry_shortcake", "sushi", "tacos", "takoyaki",
    "tiramisu", "tuna_tartare", "waffles",
)
RELEASE, FOOD101 = "Food-101N_release", "food-101"
META = ("classes.txt", "imagelist.tsv", "verified_train.tsv", "verified_val.tsv")


class Food101N(ImageCrops, Dataset):
    """Food-101N, real web noise, tested on Food-101."""

    name = "food101n"
    title = "Food-101N (real web noise, ~20%; tested on Food-101)"
    num_classes = 101
    class_names = CLASSES
    split_sizes = (305_268, 4_741, 25_250)  # nominal; the files decide (a note says where they differ)
    model = "resnet50"
    noise_patterns = {"real": None}  # each image's search query (its folder)
    paper_noise = "real"  # its published results (bench/report/literature_results.csv) are our cells (real, 0)
    warmup = Schedule("sgd", 0.005, epochs=4, batch_size=32, weight_decay=1e-3)
    method_stage = Schedule("sgd", 0.005, epochs=26, batch_size=32, weight_decay=1e-3, milestones=(6, 16))
    folder = ""
    files = {**{f"{RELEASE}/meta/{name}": None for name in META}, f"{RELEASE}/images/": None,
             f"{FOOD101}/meta/test.txt": None, f"{FOOD101}/images/": None}
    epoch_eval = False  # a pass over 305,000 decoded images per epoch would double the cost
    instance_noise = False
    clean_labels = False  # its clean training labels are unknown: its own noise only (`Dataset.accepted_noise`)
    weights_env = {"weights": WEIGHTS_ENV}  # the ResNet-50's ImageNet weights (`resnet50_weights`)
    source = ("https://kuanghuei.github.io/Food-101N (Food-101N, under Microsoft's research licence: not "
              "downloadable without accepting it) and https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/ "
              "(Food-101, for its test split); unpack both under the data root (DATA_ROOT/Food-101N_release/, "
              "DATA_ROOT/food-101/)")

    def classes(self) -> list[str]:
        names = read_lines(self.root / RELEASE / "meta" / "classes.txt", self.name)
        names = names[1:] if names and names[0] == "class_name" else names
        if tuple(names) != CLASSES:
            raise UserError(f"{self.name}: {self.root / RELEASE / 'meta' / 'classes.txt'} does not list Food-101's "
                            f"101 classes in order ({len(names)} lines); get the file again")
        return names

    def keyed(self, path: Path, index: dict[str, int], header: str) -> list[tuple[str, int, int]]:
        """A list file's lines as (key, noisy label, verification or -1), checked against the classes."""
        rows = []
        for number, line in enumerate(read_lines(path, self.name), 1):
            if number == 1 and line.startswith(header):
                continue
            key, *rest = line.split("\t")
            label = index.get(key.split("/")[0])
            if label is None or "/" not in key or rest not in ([], ["0"], ["1"]):
                raise UserError(f"{self.name}: {path}, line {number}: expected `class/key` of one of the 101 classes"
                                f"{' and a 0/1 verification label' if rest else ''}, got {line!r}")
            rows.append((check_key(key, path, number, self.name), label, int(rest[0]) if rest else -1))
        return rows

    def describe(self) -> list[str]:
        """`bench datasets`: what is missing, or the realised noise rate over the human-verified images."""
        if lines := super().describe():
            return lines
        index = {name: i for i, name in enumerate(self.classes())}
        rows = [v for name in ("verified_train.tsv", "verified_val.tsv")
                for _, _, v in self.keyed(self.root / RELEASE / "meta" / name, index, "class_name")]
        return [f"real, realised noise rate: {100 * rows.count(0) / max(1, len(rows)):.2f}% of the {len(rows):,} "
                "human-verified images"]

    def load(self) -> Splits:
        self.check_files()
        names = self.classes()
        index = {name: i for i, name in enumerate(names)}
        meta = self.root / RELEASE / "meta"
        listed = self.keyed(meta / "imagelist.tsv", index, "class_name")
        verified = {key: v for name in ("verified_train.tsv", "verified_val.tsv")
                    for key, _, v in self.keyed(meta / name, index, "class_name")}
        val_keys = {key for key, _, _ in self.keyed(meta / "verified_val.tsv", index, "class_name")}
        test = [(line, index.get(line.split("/")[0])) for line in read_lines(self.root / FOOD101 / "meta" / "test.txt",
                                                                            self.name)]
        if bad := next((line for line, label in test if label is None), None):
            raise UserError(f"{self.name}: {self.root / FOOD101 / 'meta' / 'test.txt'}: {bad!r} is not `class/id` of "
                            "one of the 101 classes")

        def part(rows: list[tuple[str, int, int]]) -> tuple[ImageFiles, np.ndarray, np.ndarray]:
            noisy = np.array([label for _, label, _ in rows], dtype=np.int64)
            state = np.array([verified.get(key, -1) for key, _, _ in rows])
            clean = np.where(state == 1, noisy, np.where(state == 0, noise.WRONG, -1)).astype(np.int64)
            return ImageFiles(self.root / RELEASE / "images", [key for key, _, _ in rows], self.stored, self.name), \
                noisy, clean

        train_x, train_noisy, train_clean = part([row for row in listed if row[0] not in val_keys])
        val_x, val_noisy, val_clean = part([row for row in listed if row[0] in val_keys])
        test_x = ImageFiles(self.root / FOOD101 / "images", [f"{line}.jpg" for line, _ in test], self.stored,
                            self.name)
        notes = [f"{self.name}: {len(train_noisy):,} / {len(val_noisy):,} / {len(test):,} images "
                 f"(verified: {np.sum(train_clean != -1):,} training, {np.sum(val_clean != -1):,} validation)"]
        model_args = resnet50_weights(self.name, notes)
        return Splits(
            train=Split(train_x, train_clean), val=Split(val_x, val_clean),
            test=Split(test_x, np.array([label for _, label in test], dtype=np.int64)),
            human_labels={"real": (train_noisy, val_noisy)}, model_args=model_args, notes=notes,
        )
