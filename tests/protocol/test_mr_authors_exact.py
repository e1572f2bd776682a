"""MR under `--protocol authors` is the paper's script's computation bit for bit (issue #36 item 1).

Three switches make it so, each checked here as a property against an independent computation: the script's
alphabetical vocabulary (`vocabulary_order`), its summed CE (`ce_summed`), and its data order, dropout and loader
draws from torch's one global generator, the method stage continuing the warm start's stream (`script_stream`):
a trial on a tiny MR corpus against the script's loop written out here with torch's own DataLoader. The last test
holds figures printed by the authors' MR script itself (Newbeeer/L_DMI, MR/main.py, commit 7d5e4bc, run under the
portable numerics' pins at one thread with the shims docs/fidelity.md lists: the same on any x86-64 CPU) and runs
bench on the real MR files against them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from bench import models
from bench.datasets.mr import build_vocabulary
from bench.exec.packing import why_solo
from bench.exec.prepare import prepare
from bench.exec.trainer import run_trial
from bench.exec.warmstart import WarmStartCache
from bench.store.folder import read_table
from bench.trial import TrialConfig


def _quiet(_: str) -> None:
    pass


def test_vocabulary_numbered_as_the_scripts_dictionary() -> None:
    """Alphabetical by code point of the script's spelling: its cleaning writes '\\(', '\\)' and '\\?', so those
    fall after the digits and capitals and before the letters, where a plain '(' would come first."""
    sentences = [["zoo", "(", "film", "?", ")"], ["10", "'s", "film", ",", "!"]]
    vocabulary = build_vocabulary(sentences, "alphabetical")
    script_words = {"(": "\\(", ")": "\\)", "?": "\\?"}
    spelt = sorted(script_words.get(w, w) for w in {w for s in sentences for w in s})
    assert spelt == ["!", "'s", ",", "10", "\\(", "\\)", "\\?", "film", "zoo"]
    back = {v: k for k, v in script_words.items()}
    assert vocabulary == {back.get(w, w): i + 2 for i, w in enumerate(spelt)}
    # bench's own numbering is by frequency: the same words, other ids
    by_frequency = build_vocabulary(sentences)
    assert set(by_frequency) == set(vocabulary) and by_frequency["film"] == 2 != vocabulary["film"]


def _write_corpus(root: Path, n: int) -> None:
    folder = root / "MR" / "rt-polaritydata"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    words = {"pos": ["great", "moving", "(superb)", "fun?"], "neg": ["dull", "boring", "awful", "flat!"]}
    for kind, own in words.items():
        lines = [" ".join(rng.choice(own + ["the", "film", "it's"], rng.integers(2, 12))) for _ in range(n)]
        (folder / f"rt-polarity.{kind}").write_bytes(("\n".join(lines) + "\n").encode())


def _script_loop(p, warm_epochs: int, epochs: int) -> tuple[list[float], list[float]]:
    """The MR script's main_ce then main_dmi (MR/main.py:123-224), written out with torch's own DataLoader over
    the trial's tokens and noisy labels: per epoch a new Adam, a shuffled loader (the last partial batch skipped),
    CE summed; each validation a pass of an unshuffled loader of 128; the warm start kept by accuracy >= and L_DMI
    computed as the script's DMI_loss on the first validation batch; one global stream throughout.
    Returns (the warm start's noisy-validation accuracies, the method stage's first-batch losses, epoch 0 first)."""
    x_train, y_train = p.train.x, p.train.labels
    x_val, y_val = p.val.x, p.val.labels

    def validate(net: torch.nn.Module) -> tuple[float, float]:
        net.eval()
        with torch.no_grad():
            batches = [(net(x_val[idx]), y_val[idx]) for idx in DataLoader(range(len(y_val)), batch_size=128)]
        output, target = batches[0]
        onehot = torch.zeros(len(target), 2).scatter_(1, target[:, None], 1).t()
        first = -torch.log(torch.abs(torch.det(onehot @ F.softmax(output, dim=1))) + 0.001)
        correct = sum(int((o.max(1)[1] == t).sum()) for o, t in batches)
        return 100.0 * correct / len(y_val), float(first)

    def train(net: torch.nn.Module, lr: float, loss_fn) -> None:
        optimizer = torch.optim.Adam(net.parameters(), lr=lr)
        net.train()
        for idx in DataLoader(range(len(y_train)), batch_size=128, shuffle=True):
            if len(idx) != 128:
                continue
            loss = loss_fn(net(x_train[idx]), y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def dmi(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        onehot = torch.zeros(len(target), 2).scatter_(1, target[:, None], 1).t()
        return -torch.log(torch.abs(torch.det(onehot @ F.softmax(output, dim=1))) + 0.001)

    torch.manual_seed(0)
    net = models.create("word_cnn_authors", 2, **p.splits.model_args)
    accuracies, best, kept = [], 0.0, None
    for _ in range(warm_epochs):
        train(net, 1e-3, lambda o, t: F.cross_entropy(o, t, reduction="sum"))
        accuracy, _ = validate(net)
        accuracies.append(accuracy)
        if accuracy >= best:
            best, kept = accuracy, copy.deepcopy(net.state_dict())
    net.load_state_dict(kept)
    losses = [validate(net)[1]]
    for _ in range(epochs):
        train(net, 1e-4, dmi)
        losses.append(validate(net)[1])
    return accuracies, losses


def test_authors_trial_is_the_scripts_loop_draw_for_draw(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    _write_corpus(tmp_path, 400)
    config = TrialConfig(dataset="mr", method="dmi", noise="pos_to_neg", r=0.3, seed=3, protocol="authors",
                         epochs_warmup=3, epochs=2)
    p = prepare(config, tmp_path, log=_quiet)
    assert {"script_stream", "ce_summed", "vocabulary_order"} <= set(p.protocol.names())
    accuracies, losses = _script_loop(p, 3, 2)

    cache = WarmStartCache(tmp_path / "results", log=_quiet)
    run_trial(config, tmp_path, results=tmp_path / "results", log=_quiet, warm_cache=cache)
    epochs = read_table(tmp_path / "results", "epochs").sort("epoch")
    assert epochs.filter(stage="warmup")["val_acc"].to_list() == accuracies
    assert epochs.filter(stage="method")["val_loss"].to_list() == losses  # bit for bit, epoch 0 included
    assert cache.misses == 1

    # From the cached warm start, the method stage continues the very stream the warm start left.
    again = tmp_path / "again"
    run_trial(config, tmp_path, results=again, log=_quiet, warm_cache=WarmStartCache(tmp_path / "results", _quiet))
    assert read_table(again, "epochs").filter(stage="method").sort("epoch")["val_loss"].to_list() == losses


def test_script_stream_trains_alone() -> None:
    config = TrialConfig(dataset="mr", method="dmi", noise="pos_to_neg", r=0.3, seed=3, protocol="authors")
    assert "global generator" in why_solo(config)
    assert why_solo(TrialConfig(dataset="mr", method="dmi", noise="pos_to_neg", r=0.3, seed=3,
                                protocol="authors-script_stream")) is None


# Printed by the authors' MR script (MR/main.py, commit 7d5e4bc) under the portable numerics' pins (`bench.numerics`:
# ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2, OMP_NUM_THREADS=1; re-run for issue #53 on an
# AMD EPYC with AVX-512, torch 2.14.1), with main_ce run for `warm` epochs and main_dmi for `epochs`, the clean test
# accuracy printed after each epoch with the global generator's state saved and put back around it (docs/fidelity.md,
# "MR, bit for bit"). The script prints each as a Python float (its accuracies 100 * hits / total, its losses the
# float32 `.item()`): bench's rows hold the same floats. (0.4, 1, 3, 2) is issue #36's own cell: these are its figures,
# which the native AVX-512 kernels did not give.
SCRIPT_FIGURES = {
    # (r, seed, warm, epochs): (noisy-val acc per CE epoch, test acc per CE epoch, first-batch L_DMI from the
    #                           warm start on, test acc per DMI epoch)
    (0.4, 1, 3, 2): ([67.74361646690986, 67.84783741532048, 67.63939551849921],
                     [52.38987816307404, 52.67104029990628, 54.170571696344894],
                     [-4.858760356903076, -5.094015598297119, -5.248054027557373],
                     [57.26335520149953, 59.79381443298969]),
    (0.6, 3, 4, 3): ([80.04168837936425, 80.04168837936425, 79.93746743095362, 79.72902553413236],
                     [52.20243673851921, 52.20243673851921, 52.483598875351454, 52.483598875351454],
                     [-3.4243152141571045, -4.058435440063477, -4.274144649505615, -4.430417060852051],
                     [52.95220243673852, 56.888472352389876, 58.76288659793814]),
}


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("cell", sorted(SCRIPT_FIGURES))
def test_authors_trial_prints_the_scripts_figures(cell, shared_data: Path, tmp_path: Path, portable_figures) -> None:
    """Under the portable numerics (the suite's pins, checked in force by the trial) bench is the script's computation
    to every printed digit, and its row says which kernels computed it."""
    r, seed, warm, epochs = cell
    val_acc, test_acc, losses, dmi_test = SCRIPT_FIGURES[cell]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the trial's: it computes with its own one thread
    try:
        row = run_trial(TrialConfig(dataset="mr", method="dmi", noise="pos_to_neg", r=r, seed=seed,
                                    protocol="authors", epochs_warmup=warm, epochs=epochs, numerics="portable"),
                        shared_data, results=tmp_path, log=_quiet)
    finally:
        torch.set_num_threads(threads)
    assert (row["cpu_capability"], row["mkl_cbwr"], row["threads"]) == ("AVX2", "COMPATIBLE", 1)
    table = read_table(tmp_path, "epochs").sort("epoch")
    warmup, method = table.filter(stage="warmup"), table.filter(stage="method")
    assert warmup["val_acc"].to_list() == val_acc
    assert warmup["test_acc"].to_list() == test_acc
    assert method["val_loss"].to_list() == losses
    assert method["test_acc"][1:].to_list() == dmi_test
    kept = max(i for i, a in enumerate(val_acc) if a == max(val_acc))  # main_ce keeps the best accuracy, ties later
    best = int(np.argmin(losses))  # main_dmi keeps the lowest first-batch loss, strict, the warm start first
    assert row["best_epoch"] == best
    assert row["test_acc"] == (dmi_test[best - 1] if best else test_acc[kept])


def test_labels_command_writes_the_protocols_labels(tmp_path: Path, monkeypatch, capsys) -> None:
    """`bench labels --protocol authors` writes the labels the script's TextDataset draws (np.random.seed(seed), one
    np.random.choice per sentence, training then validation from the same seed again: MR/dataloaders.py:25-29),
    restated here with NumPy's own legacy calls; `--protocol bench` writes bench's own draw."""
    import pyarrow.parquet as pq

    from bench.cli.main import main

    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    _write_corpus(tmp_path, 200)
    tables = {}
    for spec in ("bench", "authors"):
        out = tmp_path / f"{spec}.parquet"
        assert main(["labels", "--dataset", "mr", "--noise", "pos_to_neg", "--r", "0.4", "--seed", "5",
                     "--protocol", spec, "--out", str(out), "--data-root", str(tmp_path)]) == 0
        tables[spec] = pq.read_table(out).to_pydict()
    assert "under protocol authors" in capsys.readouterr().out
    t = [[1.0, 0.0], [0.4, 0.6]]
    for split in ("train", "val"):
        rows = [i for i, s in enumerate(tables["authors"]["split"]) if s == split]
        np.random.seed(5)
        want = [int(np.random.choice(2, 1, p=t[tables["authors"]["clean"][i]])[0]) for i in rows]
        assert [tables["authors"]["noisy"][i] for i in rows] == want
    assert tables["bench"]["clean"] == tables["authors"]["clean"]
    assert tables["bench"]["noisy"] != tables["authors"]["noisy"]


@pytest.mark.parametrize("method", ["vat", "dividemix"])
@pytest.mark.parametrize("spec", ["authors", "bench+script_model"])
def test_embedding_methods_refused_on_the_scripts_model(method: str, spec: str, tmp_path: Path, capsys) -> None:
    """VAT and DivideMix perturb word embeddings (forward_embedded), which the scripts' WordCNN has not: refused in
    one line before anything is read or written, exit 2; under bench and without script_model they run."""
    from bench.cli.main import main

    code = main(["trial", "--dataset", "mr", "--method", method, "--noise", "pos_to_neg", "--r", "0.4",
                 "--protocol", spec, "--results", str(tmp_path / "r"), "--data-root", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "forward_embedded" in err[0] and spec in err[0]
    assert not (tmp_path / "r").exists()
    for fine in ("bench", "authors-script_model"):
        TrialConfig(dataset="mr", method=method, noise="pos_to_neg", r=0.4, protocol=fine).check()


def test_a_trial_epoch_line_shows_the_test_accuracy_its_diagnostics_measured() -> None:
    """The per-epoch clean test accuracy reaches the log (two decimals, as the script's figures compare)."""
    from bench.exec.events import EpochRecord, log_line

    record = EpochRecord(stage="warmup", epoch=2, epochs=3, train_loss=(77.29,), val_loss=(0.6174,),
                         val_acc=(67.8478,), improved=(True,), active=(True,), seconds=13.6, test_acc=(52.5773,))
    assert log_line(record) == "warmup 2/3  train 77.2900  val 0.6174  noisy val acc  67.8%  test acc 52.58%  *  13.6s"
