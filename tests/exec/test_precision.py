"""A trial's precision (bench.trial.PRECISIONS): fp32 by default, with the ids, keys and rows it always had; bf16
declared per trial, in its id, its row and its keys, its forward passes really computed in bf16 (solo and packed)
and its losses from float32 logits. Bounds from tests/tolerances.py (bf16: `bf16_linear`, `BF16_TRAINED_REL`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F
import yaml

from bench.cli.main import main
from bench.config import UserError
from bench.exec.pack import run_pack
from bench.exec.packed import PackedStage, device_generator
from bench.exec.packing import pack_key
from bench.exec.prepare import build_model, prepare, seed_everything, warm_start_key
from bench.exec.stage import make_optimizer, predict, train_epoch
from bench.exec.trainer import run_trial
from bench.grid.experiment import parse_experiment
from bench.grid.files import Overrides
from bench.grid.plan import warm_cell
from bench.methods import get_method
from bench.trial import TrialConfig
from tests.tolerances import U32, U_BF16, bf16_linear, bf16_trained_close, f32, within

QUIET = dict(log=lambda s: None)


def config(precision: str = "fp32", **kw) -> TrialConfig:
    return TrialConfig("synthetic", kw.pop("method", "ce"), "case3", 0.3, seed=kw.pop("seed", 1), epochs=3,
                       epochs_warmup=2, precision=precision, **kw)


def test_precision_is_in_the_id_and_the_keys_only_where_it_is_not_fp32() -> None:
    fp32, bf16 = config(), config("bf16")
    # tests/data/rows_before_seams.json: this trial's id before precisions existed.
    assert fp32.trial_id == TrialConfig("synthetic", "ce", "case3", 0.3, seed=1, epochs=3, epochs_warmup=2,
                                        precision="fp32").trial_id == "053ca811260091f7"
    assert "precision" not in fp32.identity() and bf16.identity()["precision"] == "bf16"
    assert bf16.trial_id != fp32.trial_id
    assert pack_key(bf16) == pack_key(fp32) + ("bf16",) and warm_cell(bf16) == warm_cell(fp32) + ("bf16",)
    p32, p16 = prepare(fp32, "unused", **QUIET), prepare(bf16, "unused", **QUIET)
    assert warm_start_key(p16, 0) != warm_start_key(p32, 0)
    # The fp32 warm start's key before precisions existed (as commit a6c13bd computes it).
    assert warm_start_key(p32, 0) == "03cb51ca508496ec"


def _mlp(net: torch.nn.Module) -> list[np.ndarray]:
    return [t.detach().double().numpy() for t in (net.net[0].weight, net.net[0].bias, net.net[2].weight,
                                                   net.net[2].bias)]


def test_a_bf16_trial_computes_its_forward_pass_in_bf16() -> None:
    """The logits of a bf16 trial's evaluation (`predict`) are those of an explicit bf16 autocast pass, bit for bit;
    they lie within bf16's rounding of the exact logits (`bf16_linear`, layer by layer; ReLU moves no error up),
    and farther from the float32 pass than two float32 passes can lie (twice float32's bound)."""
    p = prepare(config("bf16"), "unused", **QUIET)
    seed_everything(0)
    net = build_model(p)  # the synthetic set's MLP: 10 -> 32 -> 2
    logits = predict(net, p.test)
    x = p.test.x
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        explicit = net(x).float()
    with torch.no_grad():
        fp32 = net(x)
    assert logits.dtype == torch.float32 and torch.equal(logits, explicit)

    w1, b1, w2, b2 = _mlp(net)
    xd = x.double().numpy()
    h = np.maximum(xd @ w1.T + b1, 0.0)
    exact = h @ w2.T + b2
    bound = bf16_linear(h, w2, b2, bf16_linear(xd, w1, b1, U_BF16 * np.abs(xd)))
    assert within(logits, exact, atol=bound)
    # float32: each layer's products and sum round by f32(n + 1, 1) of their magnitudes; the first layer's error
    # is carried through |w2|.
    e1 = f32(xd.shape[1] + 1, 1) * (np.abs(xd) @ np.abs(w1).T + np.abs(b1))
    f32_bound = (1 + U32) * (e1 @ np.abs(w2).T) + f32(h.shape[1] + 1, 1) * ((h + e1) @ np.abs(w2).T + np.abs(b2))
    assert within(fp32, exact, atol=f32_bound)
    assert (np.abs(logits.numpy() - fp32.numpy()) > 2 * f32_bound).any()


class Products(torch.utils._python_dispatch.TorchDispatchMode):
    """The dtypes of every matrix product dispatched (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
            self.dtypes.append(args[-1].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_a_training_pass_runs_the_networks_at_the_precision_and_the_loss_on_float32_logits(
        precision: str, dtype: torch.dtype) -> None:
    """`train_epoch` (a solo trial's pass): every matrix product in bf16 under bf16 (fp32: float32), and the method's
    loss sees float32 logits, outside autocast, however the method calls its network."""
    p = prepare(config(precision), "unused", **QUIET)
    seed_everything(0)
    net = build_model(p)
    seen: list[tuple[torch.dtype, bool]] = []

    def step(nets: list[torch.nn.Module], batch) -> torch.Tensor:
        logits = nets[0](batch.x)
        seen.append((logits.dtype, torch.is_autocast_enabled("cpu")))
        return F.cross_entropy(logits, batch.y)

    products = Products()
    with products:
        loss = train_epoch([net], step, make_optimizer(list(net.parameters()), p.warmup), p.train, 128, 0,
                           torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)
    assert len(seen) == 4000 // 128 and set(seen) == {(torch.float32, False)}
    assert products.dtypes and set(products.dtypes) == {dtype}, set(products.dtypes)
    assert not net._forward_hooks and not net._forward_pre_hooks  # nothing left on the network after the pass


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_a_pack_computes_at_its_members_precision(precision: str, dtype: torch.dtype) -> None:
    """The stacked training step and evaluation of a pack: matrix products at the members' precision (on the CPU
    too), losses and logits in float."""
    ps = [prepare(config(precision, seed=s), "unused", **QUIET) for s in (0, 1)]
    nets, generators = [], []
    for s, p in enumerate(ps):
        seed_everything(s)
        nets.append(build_model(p))
        generators.append(device_generator(p.device, s))
    stage = PackedStage(ps, nets, generators, ps[0].warmup, [1e-2] * 2, [0, 1],
                        [get_method("ce")(2) for _ in ps])
    products = Products()
    with products:
        losses = stage.batch_losses(torch.arange(128).expand(2, 128), 0)
        logits = stage.predict(ps[0].val.x)
    assert products.dtypes and set(products.dtypes) == {dtype}, set(products.dtypes)
    assert losses.dtype == torch.float64 and torch.isfinite(losses).all() and logits.dtype == torch.float32


def test_a_packed_bf16_member_equals_its_solo_bf16_trial(tmp_path: Path) -> None:
    """Bit-equal: the trial, its noisy labels, its status, its selected epoch. Within two float orders of one bf16
    training (`BF16_TRAINED_REL`): its selected loss and every epoch's losses. Accuracies are not compared: a bf16
    logit moves by up to U_BF16 of itself, and 5 to 10 of the 1,000 test margins lie that close to zero."""
    configs = [config("bf16", method=m, seed=s) for m, s in (("ce", 0), ("dmi", 1), ("gce", 2))]
    packed = run_pack(configs, "unused", results=tmp_path / "packed", **QUIET)
    for c, member in zip(configs, packed, strict=True):
        solo = run_trial(c, "unused", results=tmp_path / "solo", **QUIET)
        for key in ("trial_id", "noise_hash", "status", "best_epoch", "precision"):
            assert member[key] == solo[key], (key, member[key], solo[key])
        assert bf16_trained_close(member["val_loss"], solo["val_loss"]), (member["val_loss"], solo["val_loss"])
        a, b = (pl.read_parquet(tmp_path / side / "epochs" / f"{c.trial_id}.parquet") for side in ("packed", "solo"))
        assert a["stage"].to_list() == b["stage"].to_list() and a["epoch"].to_list() == b["epoch"].to_list()
        for column in ("train_loss", "val_loss"):
            for x, y in zip(a[column], b[column], strict=True):
                assert (x is None and y is None) or bf16_trained_close(x, y), (c.method, column, x, y)


def test_the_row_and_its_file_hold_the_precision(tmp_path: Path, capsys) -> None:
    code = main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "case3", "--r", "0.3",
                 "--epochs-warmup", "1", "--epochs", "1", "--precision", "bf16", "--results", str(tmp_path)])
    assert code == 0
    back = pl.read_parquet(next((tmp_path / "trials").glob("*.parquet")))
    assert back["precision"].to_list() == ["bf16"]
    assert '"precision": "bf16"' in back["config_json"].item()
    assert re.search(r"^  wall .* at bf16$", capsys.readouterr().out, re.M)


def test_a_bad_precision_is_one_line_naming_the_choices(tmp_path: Path, capsys, monkeypatch) -> None:
    results = tmp_path / "res"
    code = main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "case3", "--r", "0.3",
                 "--precision", "fp16", "--results", str(results)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not results.exists()
    assert err[0] == "bench: error: --precision must be fp32 or bf16, got 'fp16'"
    grid = dict(name="g", dataset="synthetic", noise="case3", r=0.3, seeds=1, methods={"ce": {}})
    with pytest.raises(UserError, match=r"^grid.yaml: precision: must be fp32 or bf16, got 'fp16'$"):
        parse_experiment(grid | dict(precision="fp16"), "grid.yaml")
    with pytest.raises(UserError, match=r"^--precision must be fp32 or bf16, got 'fp16'$"):
        prepare(config("fp16"), "unused", **QUIET)
    monkeypatch.setenv("BENCH_PACK_PRECISION", "bf16")  # the opt-in of packs alone, refused rather than ignored
    with pytest.raises(UserError, match="BENCH_PACK_PRECISION is gone"):
        run_pack([config(seed=0), config(seed=1)], "unused", **QUIET)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))  # `bench run` says so before Ray starts
    capsys.readouterr()
    assert main(["run", str(tmp_path / "g.yaml"), "--results", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench: error: BENCH_PACK_PRECISION is gone")
    assert not (tmp_path / "run").exists()


def test_precision_is_an_experiment_key_and_a_grid_axis() -> None:
    grid = dict(name="g", dataset="synthetic", noise="case3", r=0.3, seeds=2, methods={"ce": {}})
    assert {t.precision for t in parse_experiment(grid).trials()} == {"fp32"}
    both = parse_experiment(Overrides(sets=("precision=[fp32,bf16]",)).apply(grid))
    trials = both.trials()
    assert both.size() == len(trials) == 4 and sorted(t.precision for t in trials) == ["bf16", "bf16", "fp32", "fp32"]
    assert len({t.trial_id for t in trials}) == 4
    assert sorted(t.describe().endswith("  bf16") for t in trials) == [False, False, True, True]  # --dry-run
