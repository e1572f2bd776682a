"""MR, Movie Review sentence polarity v1.0 (Pang & Lee, 2005), as the paper uses it with Kim's (2014) WordCNN.

Reads `DATA_ROOT/MR/rt-polaritydata/rt-polarity.{pos,neg}` (5,331 sentences each, one a line, cp1252/latin-1).
Class 0 = negative, 1 = positive (the paper's noise flips positive -> negative). The paper's split of the 10,662
sentences into 7,676 / 1,919 / 1,067 is drawn once by a fixed permutation. Sentences get Kim's cleaning; the
vocabulary is built from the training split only (index 0 pads, 1 stands for words never seen in training).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import torch

from bench import noise
from bench.config import Schedule, UserError
from bench.data import Dataset, Split, Splits, deterministic_permutation

PAD, UNKNOWN = 0, 1
MIN_LENGTH = 5  # the widest filter: shorter sentences are padded up to it

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


def build_vocabulary(sentences: list[list[str]]) -> dict[str, int]:
    """Words of the training sentences, most frequent first (ties alphabetical), after PAD and UNKNOWN."""
    counts = Counter(word for sentence in sentences for word in sentence)
    ordered = sorted(counts, key=lambda w: (-counts[w], w))
    return {word: i + 2 for i, word in enumerate(ordered)}


def encode(sentences: list[list[str]], vocabulary: dict[str, int], length: int) -> torch.Tensor:
    tokens = torch.zeros((len(sentences), length), dtype=torch.int64)
    for i, sentence in enumerate(sentences):
        ids = [vocabulary.get(word, UNKNOWN) for word in sentence[:length]]
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return tokens


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
    method_stage = Schedule("adam", 1e-4, epochs=50, batch_size=128)
    folder = "MR"
    files = {
        "rt-polaritydata/rt-polarity.pos": "674ca95d7fa6547818f1cb30daa7eafe",
        "rt-polaritydata/rt-polarity.neg": "7d312d2c8eacbb57b0074c59b910756a",
    }
    urls = {
        "https://www.cs.cornell.edu/people/pabo/movie-review-data/rt-polaritydata.tar.gz":
            "rt-polaritydata.tar.gz",
    }
    # The archive has no published checksum; the two files it unpacks are verified against theirs.
    source = "https://www.cs.cornell.edu/people/pabo/movie-review-data/ (sentence polarity dataset v1.0)"

    def load(self) -> Splits:
        self.check_files()
        folder = self.root / "rt-polaritydata"
        # Split on b"\n" only: str.splitlines would also split on the \x85 and \x0c bytes inside sentences.
        neg, pos = (
            [line for line in folder.joinpath(f"rt-polarity.{kind}").read_bytes().split(b"\n") if line.strip()]
            for kind in ("neg", "pos")
        )
        sentences = [clean_sentence(s.decode("latin-1")).split() for s in neg + pos]
        labels = np.array([0] * len(neg) + [1] * len(pos), dtype=np.int64)
        n = len(sentences)
        if n < 20:
            raise UserError(f"mr: only {n} sentences in {folder}; is the release complete?")
        notes = []
        expected = sum(self.split_sizes)
        if n != expected:
            notes.append(f"mr: {n} sentences instead of the published {expected}: proportional splits")
        # The paper's 7,676 / 1,919 / 1,067 (proportionally for another number of sentences).
        n_train = n * self.split_sizes[0] // expected
        n_val = n * self.split_sizes[1] // expected
        order = deterministic_permutation(n, "mr-split")
        parts = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
        vocabulary = build_vocabulary([sentences[i] for i in parts["train"]])
        length = max(MIN_LENGTH, max(len(s) for s in sentences))

        def split(idx: np.ndarray) -> Split:
            return Split(encode([sentences[i] for i in idx], vocabulary, length), labels[idx])

        return Splits(
            train=split(parts["train"]), val=split(parts["val"]), test=split(parts["test"]),
            model_args={"vocab_size": len(vocabulary) + 2}, notes=notes,
        )
