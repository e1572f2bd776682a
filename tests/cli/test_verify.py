"""`bench verify` (issue #53): it re-runs trials from their rows and compares every figure bit for bit; a row changed
by hand is named with its first differing figure, or with the provenance field that differs from this machine."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from bench.cli.main import main
from bench.exec.trainer import run_trial
from bench.store.rows import trial_config
from bench.trial import TrialConfig

QUIET = dict(log=lambda s: None)
TRIALS = [TrialConfig("synthetic", "dmi", "case3", 0.4, seed=1, epochs=2, epochs_warmup=1, lr=1e-3),
          TrialConfig("synthetic", "gce", "case3", 0.4, seed=1, epochs=2, epochs_warmup=1, numerics="portable",
                      method_params=(("q", 0.5),))]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("verify") / "results"
    for config in TRIALS:
        run_trial(config, "unused", results=folder, **QUIET)
    return folder


def test_a_row_rebuilds_its_trial() -> None:
    """`trial_config` is `make_row`'s inverse: the same trial id from the row, for a default and a changed setting."""
    for config in TRIALS:
        row = run_trial(config, "unused", **QUIET)
        assert trial_config(row).trial_id == config.trial_id


def test_verify_reproduces_every_row_bit_for_bit(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(results), "--data-root", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.count("\nok  ") == 2 and "2 of 2 trials reproduced bit for bit" in out
    assert "provenance that differs" not in out


def _edit(results: Path, trial_id: str, **values: object) -> None:
    path = results / "trials" / f"{trial_id}.parquet"
    frame = pl.read_parquet(path)
    frame.with_columns(**{k: pl.lit(v, dtype=frame.schema[k]) for k, v in values.items()}).write_parquet(path)


def test_verify_names_a_changed_figure_and_a_changed_provenance(results: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A figure changed by hand: DIFFERS, naming it with both values, exit 1. A provenance field changed by hand (the
    CPU capability the row says computed it): the figures still match (ok), and the field is named with both."""
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    dmi, gce = (t.trial_id for t in TRIALS)
    row = pl.read_parquet(copy / "trials" / f"{dmi}.parquet").row(0, named=True)
    _edit(copy, dmi, test_acc=row["test_acc"] + 1e-9)
    _edit(copy, gce, cpu_capability="AVX512_AMX")
    assert main(["verify", str(copy), "--data-root", str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"DIFFERS  {dmi}" in out and f"test_acc {row['test_acc']!r} here, {row['test_acc'] + 1e-9!r} in the row" \
        in out
    assert f"ok  {gce}" in out and "cpu_capability AVX2 here, AVX512_AMX in the row" in out
    assert "1 of 2 trials reproduced bit for bit" in out


def test_verify_of_one_trial_and_an_unknown_one(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dmi = TRIALS[0].trial_id
    assert main(["verify", str(results), "--trial", dmi, "--data-root", str(results)]) == 0
    assert "1 of 1 trials reproduced" in capsys.readouterr().out
    assert main(["verify", str(results), "--trial", "0123456789abcdef"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no row of that trial" in err[0]
