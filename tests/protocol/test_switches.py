"""Issue 31: the two protocols. `bench` is today's protocol, bit for bit; `authors` is the paper's scripts as they
ran, each of their choices a switch (`bench.protocol`) checked here against an independent computation."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from bench import noise
from bench.cli.main import main
from bench.config import Schedule, UserError
from bench.data import Split, get_dataset, registry
from bench.dmi import script_dmi_loss
from bench.exec.pack import run_pack
from bench.exec.prepare import SplitLoader
from bench.exec.stage import SoloStage, run_stage
from bench.exec.trainer import run_trial
from bench.models import WordCNNAuthors
from bench.protocol import SWITCHES, Protocol, Selection, Switch, canonical
from bench.trial import TrialConfig
from tests.tolerances import same_accuracy, trained_close

REPO = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda s: None)
TODAY = json.loads((REPO / "tests" / "data" / "bench_rows_f352407.json").read_text())


# -- bench: the rows it gave before protocols existed -------------------------------------------------------------
def _check_same(row: dict, want: dict, test_examples: int) -> None:
    assert row["trial_id"] == want["trial_id"]  # the identity of a bench trial did not move
    assert row["noise_hash"] == want["noise_hash"]
    assert row["best_epoch"] == want["best_epoch"]
    assert trained_close(row["val_loss"], want["val_loss"])
    assert same_accuracy(row["test_acc"], want["test_acc"], test_examples)
    assert same_accuracy(row["last_test_acc"], want["last_test_acc"], test_examples)


def test_bench_protocol_gives_the_rows_of_the_code_before_protocols() -> None:
    """tests/data/bench_rows_f352407.json holds rows written by f352407 (tests/data/make_bench_rows.py, run there):
    the same trials under today's code, solo and packed, give the same ids, hashes, selections and numbers (up to the
    float order of another machine's kernels: tests/tolerances.py)."""
    for method, want in zip(("ce", "dmi", "gce"), TODAY["solo"], strict=True):
        c = TrialConfig("synthetic", method, "case3", 0.3, seed=1, epochs=3, epochs_warmup=2)
        _check_same(run_trial(c, "unused", **QUIET), want, 1000)
    pack = [TrialConfig("synthetic", "dmi", "case3", 0.3, seed=s, lr=lr, epochs=3, epochs_warmup=2)
            for s in (0, 1) for lr in (1e-3, 1e-4)]
    for row, want in zip(run_pack(pack, "unused", **QUIET), TODAY["pack"], strict=True):
        _check_same(row, want, 1000)
        assert row["protocol"] == "bench" and row["switches"] == ""


# -- the protocol spec --------------------------------------------------------------------------------------------
def test_specs_resolve_to_the_declared_switches_and_refuse_in_one_line() -> None:
    mr = get_dataset("mr")
    declared = set(mr.switches())
    assert set(mr.protocol("authors").switches) == declared
    assert mr.protocol("bench").switches == {}
    assert set(mr.protocol("bench+fixed_torch_seed+script_noise").switches) == {"fixed_torch_seed", "script_noise"}
    assert set(mr.protocol("authors-fixed_torch_seed").switches) == declared - {"fixed_torch_seed"}
    assert canonical("bench+script_noise+fixed_torch_seed") == "bench+fixed_torch_seed+script_noise"
    for bad, words in (("nonsense", "write bench, authors"), ("bench+nope", "unknown switch 'nope'"),
                       ("bench+warmup_batch_size", "mr's scripts make no 'warmup_batch_size' choice"),
                       ("authors+script_noise", "added to bench with '+' and taken from authors with '-'")):
        with pytest.raises(UserError, match=re.escape(words)):
            mr.protocol(bad)
    with pytest.raises(UserError, match="synthetic declares no switches"):
        get_dataset("synthetic").protocol("authors")


# A switch's citation: "owner/repo, path/file.py:LINES[, LINES or file:LINES ...], commit SHA" (docs/extending.md's
# form), where LINES is N or N-M and places are joined by ", " or " and ".
_LINES = r"\d+(-\d+)?"
_PLACE = rf"([\w./-]+:)?{_LINES}"
CITE = re.compile(rf"[\w.-]+/[\w.-]+, [\w./-]+:{_LINES}((, | and ){_PLACE})*, commit [0-9a-f]{{7,40}}")
PAPER_DATASETS = {"mr", "fashion_mnist", "cifar10", "dogs_vs_cats"}  # their scripts: the paper's own repository


def test_every_declared_switch_is_known_cites_a_script_line_and_is_not_inherited() -> None:
    for name, cls in registry().items():
        for switch in cls.switches().values():
            assert switch.name in SWITCHES
            assert CITE.fullmatch(switch.cite), f"{name}: {switch.cite!r} is not 'owner/repo, file:line, commit sha'"
            if name in PAPER_DATASETS:
                # CIFAR-10's at 54e0d5d, the last commit whose CIFAR-10 scripts run (datasets/cifar10.py)
                commit = "54e0d5d" if name == "cifar10" else "7d5e4bc"
                assert switch.cite.startswith("Newbeeer/L_DMI, ") and switch.cite.endswith(f", commit {commit}")
    # CIFAR-10N, CIFAR-100 subclass CIFAR-10's class: its scripts' choices are not theirs.
    assert get_dataset("cifar10").switches() and not get_dataset("cifar10n").switches()
    assert not get_dataset("cifar100").switches()


@pytest.mark.parametrize("dataset,method,noise_name", [("mr", "dmi", "pos_to_neg"), ("fashion_mnist", "ce", "case3"),
                                                       ("cifar10", "dmi", "pairs")])
def test_each_switch_changes_the_trial_id(dataset: str, method: str, noise_name: str) -> None:
    ids = {TrialConfig(dataset, method, noise_name, 0.4, protocol=spec).trial_id
           for spec in ["bench", "authors"] + [f"bench+{s}" for s in get_dataset(dataset).switches()]}
    assert len(ids) == 2 + len(get_dataset(dataset).switches())
    # One protocol, two spellings: one trial.
    names = list(get_dataset(dataset).switches())
    assert TrialConfig(dataset, method, noise_name, 0.4, protocol="bench+" + "+".join(names)).trial_id == \
        TrialConfig(dataset, method, noise_name, 0.4, protocol="authors").trial_id


def test_ce_cell_is_the_warm_start_and_cifar10_warms_up_at_256() -> None:
    warm, stage = TrialConfig("mr", "ce", "pos_to_neg", 0.4, protocol="authors").schedules()
    assert stage.epochs == 0 and warm.epochs == 50
    assert TrialConfig("mr", "dmi", "pos_to_neg", 0.4, protocol="authors").schedules()[1].epochs == 50
    assert TrialConfig("cifar10", "ce", "pairs", 0.4, protocol="authors").schedules()[0].batch_size == 256
    assert TrialConfig("cifar10", "ce", "pairs", 0.4).schedules()[0].batch_size == 128


# -- noise as the scripts draw it ---------------------------------------------------------------------------------
@pytest.mark.parametrize("validation,float32", [("reseed", False), ("continue", False), ("reseed", True)])
def test_script_noise_is_np_random_choice_per_example(validation: str, float32: bool) -> None:
    """Against the scripts' own loop: np.random.seed(seed), then np.random.choice(C, 1, p=T[label]) per example in
    list order, training then validation (re-seeded or continuing)."""
    c, r, seed = 10, 0.37, 7
    t = noise.uniform(r, c) if not float32 else np.where(np.eye(c) > 0, 1 - r, r / (c - 1))
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, c, 3000), rng.integers(0, c, 700)
    got = noise.inject_as_script(seed, train, val, t, validation=validation, float32=float32)
    rows = t.astype(np.float32) if float32 else t
    np.random.seed(seed)
    want_train = [int(np.random.choice(c, 1, p=rows[y])[0]) for y in train]
    if validation == "reseed":
        np.random.seed(seed)
    want_val = [int(np.random.choice(c, 1, p=rows[y])[0]) for y in val]
    assert got.train.tolist() == want_train and got.val.tolist() == want_val
    assert got.noise_rate == np.mean(got.train != train)


# -- selection ----------------------------------------------------------------------------------------------------
class _Table(nn.Module):
    """Logits looked up by (epoch, example index): the stage's net, with a counter that each training epoch moves."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.w = nn.Parameter(torch.zeros(()))
        self.epoch = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[self.epoch][x.long()] + 0 * self.w


def _table_stage(table: torch.Tensor, labels: np.ndarray, proto: Protocol) -> SoloStage:
    ds = SimpleNamespace(num_classes=2, train_transform=lambda x, generator=None: x, eval_transform=lambda x: x)
    n = len(labels)
    index = Split(torch.arange(n, dtype=torch.float32), labels)
    loader = SplitLoader(index, labels, ds, torch.device("cpu"))
    p = SimpleNamespace(val=loader, train=loader, dataset=ds, protocol=proto, epoch_eval=False)
    net = _Table(table)

    def step(nets: list[nn.Module], batch: object) -> torch.Tensor:
        nets[0].epoch += 1  # one step an epoch: the batch is the whole split
        return nets[0].w * 0

    return SoloStage(p, [net], Schedule("adam", 1e-3, epochs=2, batch_size=n), 0, step,
                     lambda logits, y: nn.functional.cross_entropy(logits, y))


def test_first_batch_selection_reads_exactly_the_first_batch_in_split_order() -> None:
    """A made validation set of 8 whose first 4 examples prefer epoch 1 and whose other 4 (and the whole) prefer
    epoch 2: the first-batch rule keeps epoch 1, bench's whole-set rule epoch 2."""
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    right = torch.where(torch.as_tensor(labels)[:, None] == torch.arange(2), 3.0, -3.0)
    table = torch.stack([torch.zeros(8, 2), right.clone(), right.clone()])
    table[1, 4:] = -right[4:]  # epoch 1: the first 4 right, the rest wrong
    table[2, :4] = 0.5 * right[:4]  # epoch 2: all right, the first 4 less sure than at epoch 1
    first = run_stage(_table_stage(table, labels, Protocol()), "method", 2, lambda s: None, True,
                      selection=Selection("loss", first=4))
    whole = run_stage(_table_stage(table, labels, Protocol()), "method", 2, lambda s: None, True)
    assert first.best_epoch[0] == 1 and whole.best_epoch[0] == 2
    by_acc = run_stage(_table_stage(table, labels, Protocol()), "method", 2, lambda s: None, True,
                       selection=Selection("accuracy", first=4))
    assert by_acc.best_epoch[0] == 1  # both 100% on the first 4: strict keeps the earlier
    ties = run_stage(_table_stage(table, labels, Protocol()), "warmup", 2, lambda s: None, False,
                     selection=Selection("accuracy", first=4, ties=True))
    assert ties.best_epoch[0] == 2  # the warm start's >=: ties to the later epoch


# -- the optimiser, new every epoch -------------------------------------------------------------------------------
def test_optimizer_state_is_empty_at_every_epoch_start_solo_and_packed(tiny_fashion: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    solo_steps = SoloStage.train_steps

    def record(self: SoloStage, epoch: int) -> torch.Tensor:
        seen.append(len(self.optimizer.state))
        return solo_steps(self, epoch)

    monkeypatch.setattr(SoloStage, "train_steps", record)
    cfg = dict(epochs=3, epochs_warmup=2)
    run_trial(TrialConfig("fashion_mnist", "dmi", "case3", 0.2, protocol="bench+optimizer_per_epoch", **cfg),
              tiny_fashion, **QUIET)
    assert seen == [0] * 5  # 2 warm-start epochs + 3 method epochs, each from a new optimiser
    seen.clear()
    run_trial(TrialConfig("fashion_mnist", "dmi", "case3", 0.2, **cfg), tiny_fashion, **QUIET)
    assert seen[0] == 0 and all(n > 0 for n in seen[1:2] + seen[3:])  # bench: state carried across epochs

    from bench.exec.packed import PackedStage

    packed_steps, starts = PackedStage.train_steps, []

    def record_packed(self: PackedStage, epoch: int) -> torch.Tensor:
        starts.append((self.optimizer.steps, sum(len(s) for s in self.optimizer.state.values())))
        return packed_steps(self, epoch)

    monkeypatch.setattr(PackedStage, "train_steps", record_packed)
    pack = [TrialConfig("fashion_mnist", "dmi", "case3", r, protocol="bench+optimizer_per_epoch", **cfg)
            for r in (0.2, 0.4)]
    run_pack(pack, tiny_fashion, **QUIET)
    assert starts == [(0, 0)] * 5


def test_authors_pack_members_equal_their_solo_trials(tiny_fashion: Path) -> None:
    """Every Fashion-MNIST switch on but script_stream (whose trials train alone: torch's global generator is the
    process's), two members packed against each alone: the same selections and accuracies."""
    configs = [TrialConfig("fashion_mnist", "dmi", "case3", r, seed=3, epochs=3, epochs_warmup=2,
                           protocol="authors-script_stream") for r in (0.2, 0.4)]
    packed = run_pack(configs, tiny_fashion, **QUIET)
    for c, row in zip(configs, packed, strict=True):
        solo = run_trial(c, tiny_fashion, **QUIET)
        assert row["trial_id"] == solo["trial_id"] and row["noise_hash"] == solo["noise_hash"]
        assert row["best_epoch"] == solo["best_epoch"] or trained_close(row["val_loss"], solo["val_loss"])
        assert same_accuracy(row["test_acc"], solo["test_acc"], 60)
        assert row["switches"] == ",".join(sorted(set(get_dataset("fashion_mnist").switches()) - {"script_stream"}))


def test_a_pack_selects_by_its_members_rule(tiny_fashion: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first-batch rule shorter than the validation set: each packed member keeps the epoch, and the loss, its solo
    trial keeps on the first 8 validation examples (a pack that selected on the whole set would not)."""
    fashion = get_dataset("fashion_mnist")
    rules = {s.name: s for s in fashion.authors_protocol}
    first = Switch("first_batch_selection", rules["first_batch_selection"].cite, "test", {"*": Selection("loss", 8)})
    monkeypatch.setattr(fashion, "authors_protocol", (first,))
    configs = [TrialConfig("fashion_mnist", "dmi", "case3", r, seed=2, epochs=3, epochs_warmup=2,
                           protocol="bench+first_batch_selection") for r in (0.2, 0.4)]
    for c, row in zip(configs, run_pack(configs, tiny_fashion, **QUIET), strict=True):
        solo = run_trial(c, tiny_fashion, **QUIET)
        assert row["best_epoch"] == solo["best_epoch"] and trained_close(row["val_loss"], solo["val_loss"])


# -- the scripts' forms -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["sum", "mean"])
def test_script_dmi_loss_is_the_scripts_formula(form: str) -> None:
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 64, 3), torch.randint(0, 3, (2, 64))
    got = script_dmi_loss(logits, labels, 3, form)
    for k in range(2):
        probs = torch.softmax(logits[k].double(), 1)
        m = torch.nn.functional.one_hot(labels[k], 3).double().T @ probs
        m = m / 64 if form == "mean" else m
        want = -math.log(abs(float(torch.linalg.det(m))) + 1e-3)
        # float32 softmax, a 64-term product and a 3 x 3 determinant: a few hundred roundings of 6e-8 at most
        assert got[k].item() == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_authors_word_cnn_equals_batches_padded_to_their_longest_sentence() -> None:
    """The masked fixed-length model against the scripts' way: each batch cut to its longest sentence (>= 5)."""
    torch.manual_seed(0)
    net = WordCNNAuthors(2, vocab_size=50).eval()
    lengths = torch.randint(1, 12, (200,))
    lengths[:128] = torch.clamp(lengths[:128], max=7)  # the first batch of 128 is shorter than the second
    tokens = torch.zeros(200, 30, dtype=torch.int64)
    for i, n in enumerate(lengths.tolist()):
        tokens[i, :n] = torch.randint(2, 50, (n,))
    with torch.no_grad():
        got = net(tokens)
        plain = [_unmasked(net, tokens[s:s + 128]) for s in (0, 128)]
    assert torch.allclose(got, torch.cat(plain), atol=1e-6)
    assert not torch.allclose(got[:128], _unmasked(net, tokens[:128], 30), atol=1e-3)  # padding counts: masked


def test_authors_word_cnn_reads_a_batch_cut_after_its_longest_sentence() -> None:
    """`shortened` drops the padding past a batch's longest sentence (at least 5 tokens), which the model masks out
    of its max: the same logits from shorter inputs, in evaluation one 128-row group at a time (as `predict` feeds
    it) and in training (one batch, the same dropout draws)."""
    torch.manual_seed(0)
    net = WordCNNAuthors(2, vocab_size=50)
    lengths = torch.randint(1, 12, (200,))
    tokens = torch.zeros(200, 30, dtype=torch.int64)
    for i, n in enumerate(lengths.tolist()):
        tokens[i, :n] = torch.randint(2, 50, (n,))
    cut = net.shortened(tokens)
    assert cut.shape[1] == max(5, int(lengths.max())) < 30 and torch.equal(cut, tokens[:, : cut.shape[1]])
    assert net.shortened(tokens[lengths <= 3]).shape[1] == 5  # never below the widest filter's reach
    with torch.no_grad():
        net.eval()
        whole = torch.cat([net(tokens[s:s + 128]) for s in (0, 128)])
        assert torch.allclose(torch.cat([net(net.shortened(tokens[s:s + 128])) for s in (0, 128)]), whole, atol=1e-6)
        net.train()
        torch.manual_seed(1)
        full = net(tokens[:128])
        torch.manual_seed(1)
        assert torch.allclose(net(net.shortened(tokens[:128])), full, atol=1e-6)


def _unmasked(net: WordCNNAuthors, batch: torch.Tensor, length: int | None = None) -> torch.Tensor:
    length = length or max(5, int((batch != 0).sum(1).max()))
    h = net.embedding(batch[:, :length]).transpose(1, 2)
    pooled = [torch.tanh(conv(h)).max(2).values for conv in net.convs]
    return torch.log_softmax(net.classifier(torch.cat(pooled, 1)), 1)  # the scripts' WordCNN returns log-probabilities


# -- MR as the paper ran it ---------------------------------------------------------------------------------------
@pytest.mark.realdata
def test_mr_authors_r0_gives_every_seed_the_same_number(shared_data: Path) -> None:
    """The paper's MR table reads ± 0.00 at r = 0: one torch seed for all, and no noise to draw."""
    rows = {}
    for spec in ("authors", "bench"):
        for seed in (0, 1):
            c = TrialConfig("mr", "ce", "pos_to_neg", 0.0, seed=seed, epochs_warmup=1, epochs=1, train_subset=1500,
                            protocol=spec)
            rows[spec, seed] = run_trial(c, shared_data, **QUIET)["test_acc"]
    assert rows["authors", 0] == rows["authors", 1]
    assert rows["bench", 0] != rows["bench", 1]


# -- the command line ---------------------------------------------------------------------------------------------
def test_trial_refuses_a_bad_protocol_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["trial", "--dataset", "mr", "--method", "dmi", "--noise", "pos_to_neg", "--r", "0.4",
                 "--protocol", "bench+nope", "--results", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown switch 'nope'" in err[0]
    assert not (tmp_path / "r").exists()


def test_dry_run_lists_the_switches_of_each_protocol(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\ndataset: mr\nnoise: pos_to_neg\nr: [0.4]\nseeds: 2\nprotocol: [bench, authors]\n"
                    "methods: {ce: {}, dmi: {}}\n")
    # No data here: the dry run prints its plan, then ends as the run would, on the missing files (exit 2).
    assert main(["run", str(grid), "--dry-run", "--results", str(tmp_path / "r"), "--data-root",
                 str(tmp_path / "none")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("bench: error: mr: missing ")
    assert "grid: 8 trials" in out
    assert "protocol authors: 12 switches of the authors' scripts" in out
    for name, switch in get_dataset("mr").switches().items():
        assert f"  {name}: {switch.what} ({switch.cite})" in out
    grid.write_text(grid.read_text().replace("[bench, authors]", "[bench, authors-nope]"))
    assert main(["run", str(grid), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    assert "protocol: protocol 'authors-nope': unknown switch 'nope'" in capsys.readouterr().err


def test_a_switch_must_be_one_that_bench_knows() -> None:
    with pytest.raises(ValueError, match="unknown switch"):
        Switch("made_up", "x", "y")


def test_where_a_switch_acts_is_its_one_declaration() -> None:
    """The warm-start key's switches and the planner's cell read `SwitchKind.acts` alone: a protocol turning on
    every switch keeps in its warm start exactly those not declared METHOD."""
    from bench.protocol import METHOD, SwitchKind

    everything = Protocol("authors", {n: Switch(n, "cite", "what") for n in SWITCHES})
    assert everything.warm_start_switches() == sorted(n for n, k in SWITCHES.items() if k.acts != METHOD)
    assert all(isinstance(k, SwitchKind) for k in SWITCHES.values())
    with pytest.raises(ValueError, match="WARM, METHOD or BOTH"):
        SwitchKind("somewhere", "words")
