"""MR, Movie Review sentence polarity v1.0 (Pang & Lee, 2005), as the paper uses it with Kim's (2014) WordCNN.

Reads `DATA_ROOT/MR/rt-polaritydata/rt-polarity.{pos,neg}` (5,331 sentences each, one a line, cp1252 bytes).
Class 0 = negative, 1 = positive (the paper's noise flips positive -> negative). Sentences get Kim's cleaning; the
vocabulary is built from the training split only (index 0 pads, 1 stands for words never seen in training),
numbered by frequency (`authors`: alphabetically, as the paper's code).

The split is the paper's own, checked against its code (github.com/Newbeeer/L_DMI, `MR/main.py` and
`MR/preprocessors.py`, commit c6e3d6d2ff25e52fb287052eda1e66e64f97e161, unchanged at 7d5e4bc): `main.py` seeds
NumPy's global generator with 0; `MRPreprocessor.preprocess` reads the lines of `rt-polarity.pos`, then of
`rt-polarity.neg`, in text mode with undecodable bytes ignored, and calls scikit-learn's
`train_test_split(test_size=0.1)`, then `train_test_split(test_size=0.2)` on what is left. Each call draws one
`permutation` of its input from that global generator (ShuffleSplit with random_state=None): the first
ceil(size * n) of it are held out, the rest, in permutation order, are kept. `paper_split` is that rule with NumPy's
legacy `RandomState(0)`, without scikit-learn: 7,676 / 1,919 / 1,067 sentences, the test split holding 557 negatives
(52.20%, the paper's collapsed CE accuracy at r = 0.9), validation 921, training 3,853 (confirmed against
scikit-learn 1.9.1's `train_test_split` on the published files).

Reading as the paper's code does: a line is what text mode calls one (a newline, a carriage return or both end it,
as `bytes.splitlines` splits), decoded as UTF-8 with undecodable bytes dropped. The files are cp1252: 229 lines hold
such bytes, and dropping them rather than decoding them as latin-1 changes the words of 124 sentences ("clichés"
is "clichs", not "clich s"). Kept from Kim's cleaning where the paper's copy differs: lower-casing (a no-op on these
files, which hold no capital letter) and the parentheses and question mark as tokens (the paper's copy writes them
with a backslash before them: the same vocabulary, renamed; under `authors` that spelling places them in the
script's alphabetical numbering, `vocabulary_order`).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import torch

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits
from bench.protocol import Selection, Switch, titan_xp_float32

PAD, UNKNOWN = 0, 1
MIN_LENGTH = 5  # the widest filter: shorter sentences are padded up to it
LONGEST_LINE = 269  # bytes: the longest line of the published rt-polarity.pos (267 in .neg)
TEST_FRACTION, VALIDATION_FRACTION = 0.1, 0.2  # the paper's two train_test_split calls

_CLEANING = [
    (re.compile(r"[^A-Za-z0-9(),!?'`]"), " "),
    (re.compile(r"'s"), " 's"),
    (re.compile(r"'ve"), " 've"),
    (re.compile(r"n't"), " n't"),
    (re.compile(r"'re"), " 're"),
    (re.compile(r"'d"), " 'd"),
    (re.compile(r"'ll"), " 'll"),
    (re.compile(r","), " , "),
    (re.compile(r"!"), " ! "),
    (re.compile(r"\("), " ( "),
    (re.compile(r"\)"), " ) "),
    (re.compile(r"\?"), " ? "),
    (re.compile(r"\s{2,}"), " "),
]


def clean_sentence(text: str) -> str:
    """Kim's (2014) sentence cleaning: keep letters, digits and a little punctuation, split clitics, lower-case."""
    for pattern, replacement in _CLEANING:
        text = pattern.sub(replacement, text)
    return text.strip().lower()


# How the paper's code spells the three tokens Kim's cleaning writes otherwise: its copy puts a backslash before each
# parenthesis and the question mark (MR/preprocessors.py:106-108), which decides where they fall in an alphabetical
# order.
SCRIPT_SPELLING = {"(": "\\(", ")": "\\)", "?": "\\?"}


def build_vocabulary(sentences: list[list[str]], order: str = "frequency") -> dict[str, int]:
    """Words of the training sentences after PAD and UNKNOWN: most frequent first, ties alphabetical (bench), or
    `order="alphabetical"`, as the paper's code numbers them (MR/dictionaries.py:113-125: sorted by code point as it
    spells them, `SCRIPT_SPELLING`; its cap of 50,000 words is never reached)."""
    counts = Counter(word for sentence in sentences for word in sentence)
    if order == "alphabetical":
        ordered = sorted(counts, key=lambda w: SCRIPT_SPELLING.get(w, w))
    elif order == "frequency":
        ordered = sorted(counts, key=lambda w: (-counts[w], w))
    else:
        raise ValueError(f"vocabulary order is 'frequency' or 'alphabetical', got {order!r}")
    return {word: i + 2 for i, word in enumerate(ordered)}


def renumbering(vocabulary: dict[str, int], order: str) -> torch.Tensor:
    """The token map from `vocabulary`'s numbering to `order`'s over the same words (PAD and UNKNOWN kept)."""
    words = sorted(vocabulary, key=vocabulary.__getitem__)
    target = build_vocabulary([words], order) if order != "frequency" else vocabulary
    new = torch.arange(len(vocabulary) + 2, dtype=torch.int64)
    new[torch.tensor([vocabulary[w] for w in words], dtype=torch.int64)] = torch.tensor([target[w] for w in words])
    return new


def paper_split(n: int) -> dict[str, np.ndarray]:
    """The paper's split of n sentences (positive lines first, then negative): indices of train, val and test, each in
    the order the paper's code lists them. Two draws from the generator NumPy's `seed(0)` leaves, as the paper's two
    `train_test_split` calls make them: the first ceil(0.1 n) of a permutation of all n are the test split; of a
    second permutation over the other m, the first ceil(0.2 m) index the validation split, the rest training."""
    rng = np.random.RandomState(0)  # the legacy generator: what np.random.seed(0) seeds and the paper draws from
    first = rng.permutation(n)
    n_test = math.ceil(TEST_FRACTION * n)  # scikit-learn's size of a fractional test split, float product included
    test, rest = first[:n_test], first[n_test:]
    second = rng.permutation(len(rest))
    n_val = math.ceil(VALIDATION_FRACTION * len(rest))
    return {"train": rest[second[n_val:]], "val": rest[second[:n_val]], "test": test}


def encode(sentences: list[list[str]], vocabulary: dict[str, int], length: int) -> torch.Tensor:
    tokens = torch.zeros((len(sentences), length), dtype=torch.int64)
    for i, sentence in enumerate(sentences):
        ids = [vocabulary.get(word, UNKNOWN) for word in sentence[:length]]
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return tokens


# FW's method stage in the paper's code, which fw_oracle (FW with the true T) shares.
FW_STAGE = Schedule("adam", 1e-4, epochs=50, batch_size=128)


class MovieReview(Dataset):
    """MR sentence polarity (rt-polarity v1.0)."""

    name = "mr"
    title = "MR (movie review polarity)"
    num_classes = 2
    class_names = ("negative", "positive")
    split_sizes = (7_676, 1_919, 1_067)
    model = "word_cnn"
    noise_patterns = {"pos_to_neg": noise.flip({1: 0})}  # [[1, 0], [r, 1-r]]
    paper_noise = "pos_to_neg"
    warmup = Schedule("adam", 1e-3, epochs=50, batch_size=128)
    # The method stage of a method the paper's code has no function for (MentorNet, VAT, the newer methods), as the
    # paper's section 5.2 states it.
    method_stage = Schedule("adam", 1e-4, epochs=50, batch_size=128)
    # The methods the paper's code trains, each as its function in github.com/Newbeeer/L_DMI MR/main.py (c6e3d6d,
    # unchanged at 7d5e4bc) trains it, 50 epochs at batch size 128: main_dmi, main_gce and main_fw with Adam at lr 1e-4,
    # main_lccn (train_lccn) with SGD, momentum 0.9, weight decay 1e-4, lr 1e-4. (Its main_ce is the warm start.)
    method_stages = {
        "dmi": Schedule("adam", 1e-4, epochs=50, batch_size=128),
        "gce": Schedule("adam", 1e-4, epochs=50, batch_size=128),
        "fw": FW_STAGE,
        "fw_oracle": FW_STAGE,  # FW with the true T (not in the paper's code) trains as FW
        "lccn": Schedule("sgd", 1e-4, epochs=50, batch_size=128, momentum=0.9, weight_decay=1e-4),
    }
    # How the paper's MR script ran it (github.com/Newbeeer/L_DMI at 7d5e4bc): the `authors` protocol.
    authors_protocol = (
        Switch("warmup_by_accuracy", "Newbeeer/L_DMI, MR/main.py:188-203, commit 7d5e4bc",
               "main_ce saves the model whenever noisy-validation accuracy >= the best so far (from 0)"),
        Switch("first_batch_selection", "Newbeeer/L_DMI, MR/main.py:143-164, 205-224, 341-403, commit 7d5e4bc",
               "validate() stops after the first batch (i == 1: break) of the unshuffled validation loader: main_dmi, "
               "main_gce and main_fw keep an epoch whose loss there is < the best, the warm-started model first; "
               "train_lccn keeps one whose accuracy on the whole validation set is > the best",
               {"*": Selection("loss", first=128), "lccn": Selection("accuracy")}),
        Switch("optimizer_per_epoch", "Newbeeer/L_DMI, MR/main.py:194-195, 216-217, 357-358, commit 7d5e4bc",
               "every main_* builds a new Adam (train_lccn a new SGD) at the start of each epoch"),
        Switch("fixed_torch_seed", "Newbeeer/L_DMI, MR/main.py:20-22, commit 7d5e4bc",
               "np.random.seed(0) and torch.manual_seed(0) at the top: every run has the same initial weights, data "
               "order and dropout; --seed only reaches the noise", 0),
        Switch("script_noise", "Newbeeer/L_DMI, MR/dataloaders.py:25-29 and MR/main.py:82-87, commit 7d5e4bc",
               "TextDataset re-seeds np.random with the seed and calls np.random.choice per sentence, for training "
               "and again for validation", {"validation": "reseed"}),
        Switch("script_model", "Newbeeer/L_DMI, MR/models/WordCNN:19-65 and MR/dataloaders.py:55-66, commit 7d5e4bc",
               "nn.Embedding with N(0, 1) rows and no padding index, tanh after each convolution, batches padded "
               "to their longest sentence (at least 5 tokens)", "word_cnn_authors"),
        Switch("ce_is_warm_start", "Newbeeer/L_DMI, MR/main.py:417, 422, commit 7d5e4bc",
               "the CE result is evaluate('./model_ce_...'): the warm start itself"),
        Switch("dmi_script_form", "Newbeeer/L_DMI, MR/main.py:99-107, commit 7d5e4bc",
               "DMI_loss: -log(|det(onehot^T softmax)| + 0.001), the matrix summed over the batch, in float32", "sum"),
        Switch("vocabulary_order", "Newbeeer/L_DMI, MR/dictionaries.py:113-125 and MR/preprocessors.py:106-108, "
               "commit 7d5e4bc",
               "WordDictionary numbers the training words after <PAD> and <UNK> in sorted order, the parentheses "
               "and the question mark spelt \\(, \\) and \\?: each word's embedding row is the N(0, 1) draw at that "
               "number", "alphabetical"),
        Switch("ce_summed", "Newbeeer/L_DMI, MR/main.py:96, 196, commit 7d5e4bc",
               "main_ce trains with nn.CrossEntropyLoss(size_average=False): the sum over the batch"),
        Switch("script_stream", "Newbeeer/L_DMI, MR/main.py:20-22, 84-93, 126, 150, 173, 417-418, commit 7d5e4bc",
               "torch.manual_seed(0) once; each `enumerate(loader)` makes an iterator, which takes its base seed "
               "from the global generator, the shuffled training loader then its RandomSampler's seed for a "
               "randperm (torch/utils/data/dataloader.py, sampler.py); dropout draws from the same generator; "
               "main_dmi continues the stream main_ce left"),
        titan_xp_float32("Newbeeer/L_DMI, MR/main.py:104, 187, commit 7d5e4bc"),
    )
    authors_differences = (
        "the method stages of GCE, FW and LCCN continue the stream the warm start left, as main_dmi does — the script "
        "runs main_dmi, main_gce, main_fw and main_lccn in that order in one process (main.py:417-421), each "
        "continuing the stream the one before left, and FW's and LCCN's estimates iterate a loader too (main.py:255, "
        "315): only ce (the warm start) and dmi draw exactly the script's numbers, the others the same law with other "
        "draws, since a trial must not depend on which methods ran before it",
        "GCE, FW and LCCN are bench's (their records) — the script's GCE loops over examples (main.py:111-121) and "
        "its FW and LCCN estimate from the shuffled training loader; the formulas are the same",
        "VAT and DivideMix are refused under script_model — they perturb or mix word embeddings through "
        "forward_embedded, which the scripts' WordCNN has not (its padding depends on the tokens); the scripts run "
        "neither",
        "float order: the script ran on CUDA with cuDNN's non-deterministic kernels — on a CPU at one thread bench "
        "computes the script's very bits where both run with the same kernels: under --numerics portable on any "
        "x86-64 CPU (tests/protocol/test_mr_authors_exact.py holds the script's figures under its pins), natively "
        "on one CPU kind; across kernels and thread counts its numbers agree within float order (tests/tolerances.py)",
    )
    folder = "MR"
    files = {
        "rt-polaritydata/rt-polarity.pos": "674ca95d7fa6547818f1cb30daa7eafe",
        "rt-polaritydata/rt-polarity.neg": "7d312d2c8eacbb57b0074c59b910756a",
    }
    # bytes, and bytes of the longest line as `bytes.splitlines` cuts them (bench.data), of the published files
    published_sizes = {"rt-polaritydata/rt-polarity.pos": (626_168, LONGEST_LINE),
                       "rt-polaritydata/rt-polarity.neg": (612_290, 267)}
    urls = {
        "https://www.cs.cornell.edu/people/pabo/movie-review-data/rt-polaritydata.tar.gz":
            "rt-polaritydata.tar.gz",
    }
    # The archive has no published checksum; the two files it unpacks are verified against theirs.
    source = "https://www.cs.cornell.edu/people/pabo/movie-review-data/ (sentence polarity dataset v1.0)"

    def load(self) -> Splits:
        self.check_files()
        folder = self.root / "rt-polaritydata"
        pos, neg = (folder.joinpath(f"rt-polarity.{kind}").read_bytes().splitlines() for kind in ("pos", "neg"))
        sentences = [clean_sentence(s.decode("utf-8", errors="ignore")).split() for s in pos + neg]
        labels = np.array([1] * len(pos) + [0] * len(neg), dtype=np.int64)
        n = len(sentences)
        if n < 20:
            raise UserError(f"mr: only {n} sentences in {folder}; is the release complete?")
        parts = paper_split(n)
        notes = []
        if n != sum(self.split_sizes):
            notes.append(f"mr: {n:,} sentences instead of the published {sum(self.split_sizes):,}: the paper's split "
                         f"rule gives {len(parts['train']):,} / {len(parts['val']):,} / {len(parts['test']):,}")
        vocabulary = self.vocabulary = build_vocabulary([sentences[i] for i in parts["train"]])
        length = max(MIN_LENGTH, max(len(s) for s in sentences))

        def split(idx: np.ndarray) -> Split:
            return Split(encode([sentences[i] for i in idx], vocabulary, length), labels[idx])

        splits = Splits(
            train=split(parts["train"]), val=split(parts["val"]), test=split(parts["test"]),
            model_args={"vocab_size": len(vocabulary) + 2}, notes=notes,
        )
        # The token ids in the numbering of the trial's `vocabulary_order` (bench's, by frequency, without it).
        order = self.trial_protocol.setting("vocabulary_order", "frequency")
        if order != "frequency":
            new = renumbering(vocabulary, order)
            for part in (splits.train, splits.val, splits.test):
                part.x = new[part.x]
        return splits

    def noise_features(self, split: Split) -> np.ndarray:
        """Instance-dependent noise projects each sentence's bag of words (not an embedding, which is learnt): its
        count of every vocabulary entry, words unseen in training counted as UNKNOWN, padding not counted."""
        tokens = split.x.cpu().numpy()
        # A count is at most the padded length: bytes hold it unless sentences are padded past 255 tokens.
        dtype = np.uint8 if tokens.shape[1] <= np.iinfo(np.uint8).max else np.uint16
        counts = np.zeros((len(tokens), int(tokens.max(initial=UNKNOWN)) + 1), dtype=dtype)
        np.add.at(counts, (np.arange(len(tokens))[:, None], tokens), 1)
        counts[:, PAD] = 0
        return counts
