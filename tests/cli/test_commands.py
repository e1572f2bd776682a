"""`bench trial`, `bench datasets`, `bench methods`: real output, and one clear line with exit code 2 for bad input."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from bench.cli.main import main
from bench.store.columns import CORE_COLUMNS

QUICK = ["--epochs-warmup", "1", "--epochs", "2"]


def test_trial_writes_the_result_row(tmp_path: Path, capsys) -> None:
    results = tmp_path / "res"
    code = main(["trial", "--dataset", "synthetic", "--method", "dmi", "--noise", "case2", "--r", "0.2",
                 "--seed", "1", *QUICK, "--results", str(results)])
    assert code == 0
    out = capsys.readouterr().out
    assert "clean test accuracy" in out and "epoch 2/2" in out
    files = list((results / "trials").glob("*.parquet"))
    assert len(files) == 1
    row = pl.read_parquet(files[0])
    assert row.columns[: len(CORE_COLUMNS)] == CORE_COLUMNS
    assert row["method"][0] == "dmi" and row["r"][0] == 0.2 and row["seed"][0] == 1
    assert row["status"][0] == "ok" and 0 <= row["test_acc"][0] <= 100
    assert row["trial_id"][0] == files[0].stem
    assert pl.read_parquet(results / "epochs" / files[0].name).height == 1 + 3  # warm-up 1, method 0..2


def test_trial_on_tiny_fashion_files(tiny_fashion: Path, tmp_path: Path) -> None:
    code = main(["trial", "--dataset", "fashion_mnist", "--method", "ce", "--noise", "case3", "--r", "0.1",
                 "--epochs-warmup", "1", "--epochs", "1", "--data-root", str(tiny_fashion),
                 "--results", str(tmp_path / "res")])
    assert code == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "nope", "--method", "ce", "--noise", "case1", "--r", "0.1"], "unknown dataset 'nope'"),
        (["--dataset", "synthetic", "--method", "nope", "--noise", "case1", "--r", "0.1"], "unknown method"),
        (["--dataset", "synthetic", "--method", "ce", "--noise", "pairs", "--r", "0.1"], "unknown noise 'pairs'"),
        (["--dataset", "synthetic", "--method", "ce", "--noise", "case1", "--r", "1.5"], r"\[0, 1\]"),
        (["--dataset", "synthetic", "--method", "ce", "--noise", "case1", "--r", "0.1", "--param", "q=1"],
         "has no parameter q"),
        (["--dataset", "synthetic", "--method", "ce", "--noise", "case1", "--r", "0.1", "--lr", "-1"],
         "--lr must be positive"),
        (["--dataset", "fashion_mnist", "--method", "ce", "--noise", "case1", "--r", "0.1",
          "--data-root", "/nonexistent"], "missing raw/train-images"),
        # #55: the registries' names and the noises say "did you mean" as the experiment files' keys do; a setting
        # of the trial given as a method parameter names its flag.
        (["--dataset", "fmnist", "--method", "ce", "--noise", "case1", "--r", "0.1"],
         r"unknown dataset 'fmnist' \(did you mean 'fashion_mnist'\?\); choose from"),
        (["--dataset", "fashion_mnist", "--method", "ce", "--noise", "symetric", "--r", "0.1"],
         r"unknown noise 'symetric' for fashion_mnist \(did you mean 'symmetric'\?\)"),
        (["--dataset", "synthetic", "--method", "cee", "--noise", "case1", "--r", "0.1"],
         r"unknown method 'cee' \(did you mean 'ce'\?\)"),
        (["--dataset", "synthetic", "--method", "dmi", "--noise", "case1", "--r", "0.1", "--param", "lr=1e-3"],
         r"lr is a setting of the trial, not a parameter of method 'dmi': give --lr 1e-3$"),
        (["--dataset", "synthetic", "--method", "dmi", "--noise", "case1", "--r", "0.1", "--param", "batch_size=64"],
         r"give --batch-size 64$"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys, args, message) -> None:
    results = tmp_path / "res"
    code = main(["trial", *args, "--results", str(results)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("bench: error:")
    assert re.search(message, err[0]), err[0]
    assert not results.exists()


@pytest.mark.parametrize("flags, line", [
    (["tune_configs/demo.yaml", "--resume"], "bench run has no --resume: run the same command again and it resumes "
     "(trials with a result row are skipped, those cut off continue from their last epoch checkpoint); drop --resume"),
    (["tune_configs/demo.yaml", "--max-concurrent", "0"], "--max-concurrent must be >= 1, got 0"),
    (["tune_configs/demo.yml"], "experiment file: no such file: tune_configs/demo.yml"),
])
def test_run_flag_mistakes_answer_before_any_import(tmp_path: Path, flags: list[str], line: str) -> None:
    """#55: these waited for Ray's import (3 s here, 7-29 s under load), `--resume` (a Ray Tune habit) was
    argparse's two lines ("unrecognized arguments"): each is one line, exit 2, with neither torch nor Ray imported
    (a subprocess: nothing imported before)."""
    import subprocess
    import sys

    code = (f"import sys; from bench.cli.main import main; c = main(['run', *{flags!r}, '--results', "
            f"{str(tmp_path / 'res')!r}]); print(c, 'torch' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["2", "False", "False"]
    assert out.stderr.splitlines() == [f"bench: error: {line}"]
    assert not (tmp_path / "res").exists()


def test_non_stochastic_transition_file(tmp_path: Path, capsys) -> None:
    t = tmp_path / "t.csv"
    t.write_text("0.9,0.2\n0.1,0.9\n")
    code = main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "transition", "--r", "0",
                 "--transition", str(t), "--results", str(tmp_path / "res")])
    assert code == 2 and "row-stochastic" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


def test_corrupt_data_file(tiny_fashion: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "1")
    code = main(["trial", "--dataset", "fashion_mnist", "--method", "ce", "--noise", "case1", "--r", "0.1",
                 "--data-root", str(tiny_fashion), "--results", str(tmp_path / "res")])
    assert code == 2 and "corrupt (md5 mismatch)" in capsys.readouterr().err


def test_datasets_and_methods_listings(tiny_fashion: Path, capsys) -> None:
    assert main(["datasets", "--data-root", str(tiny_fashion)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert "ready" in lines["fashion_mnist"]
    assert "missing 2 of 2 files" in lines["mr"]
    assert "rt-polarity.pos" in out  # says what is missing
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "dmi" in out and "NeurIPS 2019" in out and "ce" in out


def test_a_closed_pipe_ends_quietly() -> None:
    """`bench methods | head -1`: the reader leaves early; bench exits 0 without a BrokenPipeError traceback."""
    import subprocess
    import sys

    bench = str(Path(sys.executable).parent / "bench")
    out = subprocess.run(f"'{bench}' methods | head -1", shell=True, capture_output=True, text=True, timeout=120,
                         executable="/bin/bash")
    assert out.stdout.count("\n") == 1
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_data_root_only_on_the_commands_that_read_data(tmp_path: Path, capsys) -> None:
    """--data-root is accepted by trial, run and datasets, and refused (argparse, exit 2) by the others."""
    for command in ("trial", "run", "datasets"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0 and "--data-root" in capsys.readouterr().out
    for command in (["methods"], ["results", "R"], ["report", "R"], ["leaderboard", "R"], ["sync-mlflow", "R"],
                    ["ui", "R"]):
        with pytest.raises(SystemExit) as info:
            main([*command, "--data-root", str(tmp_path)])
        assert info.value.code == 2 and "unrecognized arguments: --data-root" in capsys.readouterr().err


def test_on_a_bare_box_the_commands_that_need_more_say_what_is_missing(tmp_path: Path) -> None:
    """With only torch, numpy and pyyaml (Ray, polars, ... refused), `bench methods` runs, and `bench report` and
    `bench run` stop with one line naming the missing package and exit code 2, having written nothing."""
    import subprocess
    import sys

    script = """
import sys
for name in ("ray", "mlflow", "polars", "pyarrow", "pandas", "scipy", "matplotlib"):
    sys.modules[name] = None
from bench.cli.main import main
print("EXIT", main(sys.argv[1:]))
"""

    def bench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)

    listing = bench("methods")
    assert "EXIT 0" in listing.stdout and "dmi" in listing.stdout, listing.stderr[-2000:]
    config = str(Path(__file__).resolve().parents[2] / "tune_configs" / "demo.yaml")
    for args, missing in ((["report", "somewhere"], "polars"), (["run", config, "--results", "res"], "ray")):
        out = bench(*args)
        assert "EXIT 2" in out.stdout, out.stderr[-2000:]
        assert out.stderr.strip().splitlines() == [
            f"bench: error: `bench {args[0]}` needs {missing}, which is not installed here; install bench with its "
            "dependencies (pip install -e .)"]
    assert list(tmp_path.iterdir()) == []
