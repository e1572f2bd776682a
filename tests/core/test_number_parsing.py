"""Fault injection, sixth round (issue #45): every number a user writes is read one way (`bench.config.integer`,
`number`, `whole_number`: ASCII digits only, int() and float() alone take '٣' as 3 and str.isdigit() calls '²' a
digit), within bounds at both ends; an image past the decoder's pixel limit is one line naming it; the MR size check
reads the files' line ends. Each test fails on the code before that issue."""

from __future__ import annotations

import struct
import zlib

import pytest

from bench import models
from bench.cli.main import main
from bench.config import UserError, integer, number, whole_number
from bench.data import get_dataset
from bench.datasets.image_files import key_label_lines
from bench.grid import executor_table
from tests.datasets.test_realworld import tiny_network, write_animal10n
from tests.grid.test_damaged_files_and_bad_values import TRIAL, one_error_line, write_config
from tests.grid.test_plan_limits_and_inputs import MR_TRIAL, write_mr

ODD = ["²", "٣", "３", "1_0", "", " ", "+", "0x1"]  # a superscript, an Arabic-Indic and a full-width digit, ...


@pytest.mark.parametrize("text", ODD)
def test_the_one_parser_takes_ascii_digits_only(text):
    for parse in (integer, number):
        with pytest.raises(ValueError, match="ASCII digits"):
            parse(text)
    with pytest.raises(UserError, match="in ASCII digits"):
        whole_number(text, "x", 0, 10)


@pytest.mark.parametrize("text, value", [("3", 3), (" 42 ", 42), ("-7", -7), ("+5", 5), ("0009", 9)])
def test_the_one_parser_reads_plain_integers_as_int_does(text, value):
    assert integer(text) == int(text) == value
    assert number(text) == float(text) == value


@pytest.mark.parametrize("text", ["1e-3", ".5", "5.", "-2.5E+3", "inf", "nan", "1e400"])
def test_the_one_parser_reads_plain_reals_as_float_does(text):
    got, want = number(text), float(text)
    assert got == want or (got != got and want != want)  # nan


@pytest.mark.parametrize("args, says", [
    (["--executor", "pack:²"], "K from 1 to 999,999 in ASCII digits"),
    (["--executor", "pack:٣"], "K from 1 to 999,999 in ASCII digits"),  # was taken as pack:3
    (["--executor", "pack:"], "K from 1 to 999,999"),  # was "as many as fit"
    (["--executor", "pack:0"], "K from 1 to 999,999"),
    (["--executor", "solo:5"], "--executor solo trains one trial a unit, got 'solo:5'"),
    (["--pack", "²"], "--pack must be auto, off or a number of trials per pack"),
    (["--pack", "٣"], "--pack must be auto, off or a number of trials per pack"),
])
def test_odd_executor_counts_are_one_line_before_anything(tmp_path, capsys, args, says):
    config = write_config(tmp_path)
    for extra in (["--dry-run"], ["--no-mlflow"]):
        assert main(["run", str(config), "--results", str(tmp_path / "res"), *args, *extra]) == 2
        assert says in one_error_line(capsys)
    assert not (tmp_path / "res").exists()


def test_plain_executor_counts_still_plan(tmp_path, capsys):
    config = write_config(tmp_path)
    for args in (["--executor", "solo:1"], ["--executor", "streams:2"], ["--pack", "3"], ["--executor", "pack"]):
        assert main(["run", str(config), "--results", str(tmp_path / "res"), *args, "--dry-run"]) == 0, args
        capsys.readouterr()


@pytest.mark.parametrize("flag, value", [("--seed", "٣"), ("--seed", "²"), ("--r", "٠.٢"), ("--epochs", "３"),
                                         ("--lr", "1_0")])
def test_trial_flags_take_ascii_digits_only(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        main([*TRIAL, flag, value, "--results", str(tmp_path / "res")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid" in err and "Traceback" not in err
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("param", ["q=٠.5", "q=0.٥"])
def test_a_method_parameter_takes_ascii_digits_only(tmp_path, capsys, param):
    assert main([*TRIAL, "--param", param, "--results", str(tmp_path / "res")]) == 2
    assert "expected a number in (0, 1]" in one_error_line(capsys)


def test_a_transition_file_takes_ascii_digits_only(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("0.٩,0.1\n0.2,0.8\n")  # float() reads it as 0.9
    assert main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "transition", "--transition",
                 str(tmp_path / "t.csv"), "--r", "0", "--epochs-warmup", "0", "--epochs", "0",
                 "--results", str(tmp_path / "res")]) == 2
    assert "not a matrix of numbers" in one_error_line(capsys)


@pytest.mark.parametrize("label", ["²", "٣", "３"])
def test_a_list_files_label_takes_ascii_digits_only(tmp_path, label):
    (tmp_path / "list.txt").write_text(f"a.jpg 1\nb.jpg {label}\n")
    with pytest.raises(UserError, match=r"line 2: expected `key label` with a label in 0\.\.9"):
        key_label_lines(tmp_path / "list.txt", "webvision_mini", 10)


def test_an_animal10n_name_takes_an_ascii_label(tmp_path):
    write_animal10n(tmp_path)
    (tmp_path / "animal10n" / "training" / "٣_00099.jpg").write_bytes(b"x")  # its label read as 3 before
    with pytest.raises(UserError, match="is not named <label>_<number>.jpg"):
        get_dataset("animal10n")(tmp_path).load()


@pytest.mark.parametrize("members, says", [
    ("2,1000000", "from 2 to 256"), ("2,²", "ASCII digits"), ("٣", "ASCII digits"), ("1", "from 2 to 256"),
    ("2,,4", "ASCII digits")])
def test_calibrate_members_are_bounded_and_ascii(tmp_path, capsys, members, says):
    """2,1000000 ran unbounded (4 GB and past its budget)."""
    assert main(["calibrate", "--models", "mlp", "--device", "cpu", "--members", members,
                 "--out", str(tmp_path / "t.csv")]) == 2
    line = one_error_line(capsys)
    assert line.startswith("bench: error: --members") and says in line, line
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("args, says", [
    (["--budget-s", "1e9"], "at most 86,400"), (["--budget-s", "inf"], "at most 86,400"),
    (["--rounds", "100000"], "--rounds must be a whole number from 1 to 100"),
    (["--steps", "0"], "--steps must be a whole number from 1 to 100,000"),
    (["--batch", "10000000"], "--batch must be a whole number from 1 to 65,536")])
def test_calibrate_budgets_are_bounded(tmp_path, capsys, args, says):
    assert main(["calibrate", "--models", "mlp", "--device", "cpu", *args]) == 2
    assert says in one_error_line(capsys)


@pytest.mark.parametrize("size", ["abc", "-1", "100000", "0", "٣٢", "true"])
def test_a_probe_image_size_is_bounded(tmp_path, capsys, size):
    """abc, -1 and 100000 were tracebacks (int() in the worker, a negative or a huge interpolation), 0 silently no
    resize."""
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"")
    assert main(["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "case3", "--r", "0.2",
                 "--model", "linear_probe", "--model-arg", "backbone=resnet18", "--model-arg", f"weights={weights}",
                 "--model-arg", f"image_size={size}", "--results", str(tmp_path / "res")]) == 2
    line = one_error_line(capsys)
    assert "option image_size must be a whole number from 32 to 1,024" in line, line
    assert not (tmp_path / "res").exists()


def test_a_probe_image_size_in_a_grid_file_is_bounded(tmp_path, capsys):
    config = write_config(tmp_path, model="linear_probe",
                          model_args={"backbone": "resnet18", "weights": "random", "image_size": 100000})
    assert main(["run", str(config), "--results", str(tmp_path / "res"), "--dry-run"]) == 2
    assert "option image_size must be a whole number from 32 to 1,024" in one_error_line(capsys)
    models.check_args("linear_probe", {"backbone": "resnet18", "weights": "random", "image_size": 224})


@pytest.mark.parametrize("value, says", [("1e-300", "at least 0.000976562 GiB"), ("0.0001", "at least"),
                                         ("²", "a positive number"), ("٣", "a positive number")])
def test_a_pack_memory_bound_is_bounded_below_and_ascii(tmp_path, capsys, monkeypatch, value, says):
    monkeypatch.setenv("BENCH_PACK_MEMORY_GB", value)
    config = write_config(tmp_path)
    assert main(["run", str(config), "--results", str(tmp_path / "res"), "--dry-run"]) == 2
    line = one_error_line(capsys)
    assert line.startswith("bench: error: BENCH_PACK_MEMORY_GB must be") and says in line, line


@pytest.mark.parametrize("rate", ["abc", "-5", "0", "nan", "inf", "٣"])
def test_an_executor_tables_rate_must_be_a_number(tmp_path, rate):
    path = tmp_path / "table.csv"
    path.write_text(",".join(executor_table.COLUMNS) + f"\n*,cpu,solo,1,{rate},today,a test\n")
    with pytest.raises(UserError, match=r"line 2: images_per_s must be a number > 0"):
        executor_table.read_table(path)
    path.write_text(",".join(executor_table.COLUMNS) + "\n*,cpu,solo,1,123.5,today,a test\n*,cpu,solo,1,,t,s\n")
    assert [c.images_per_s for c in executor_table.read_table(path)] == ["123.5", ""]


# -- an image past the decoder's pixel limit ----------------------------------------------------------------------
def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` pixels (its IHDR) and holds one empty IDAT: what a decompression bomb
    looks like to a decoder's first look."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [30_000, 10_000])  # past twice PIL's limit (its error), and past it (a warning)
def test_an_image_past_the_pixel_limit_is_one_line_naming_it(tmp_path, monkeypatch, capsys, side):
    """It was 80 lines (a DecompressionBombError through the DataLoader) and a `failed` row every relaunch re-ran;
    now, like any damaged data file, one line naming the image, exit 2, no row (docs/failures.md says why)."""
    write_animal10n(tmp_path)
    bomb = tmp_path / "animal10n" / "testing" / "3_00003.jpg"
    bomb.write_bytes(png_header_only(side, side))
    tiny_network(monkeypatch, get_dataset("animal10n"))
    code = main(["trial", "--dataset", "animal10n", "--method", "ce", "--noise", "real", "--r", "0",
                 "--epochs-warmup", "1", "--epochs", "1", "--batch-size", "8", "--data-root", str(tmp_path),
                 "--results", str(tmp_path / "results")])
    line = one_error_line(capsys)
    assert code == 2 and str(bomb) in line and "larger than the decoder's limit" in line, line
    assert not list((tmp_path / "results").glob("trials/*.parquet"))


# -- the MR size check ---------------------------------------------------------------------------------------------
def test_an_mr_file_whose_first_part_lost_its_line_ends_is_one_line(tmp_path, monkeypatch, capsys):
    """The average line length passed a file whose first 300 KB were one line (the rest intact); one sentence of
    50,000 words made the encoded set 4.35 GB. The check reads the longest line."""
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    folder = write_mr(tmp_path / "data", lines=13_000)  # 611,000 bytes, as the published 626,168
    pos = folder / "rt-polarity.pos"
    text = pos.read_bytes()
    cut = text.index(b"\n", 300_000)
    pos.write_bytes(text[:cut].replace(b"\n", b" ") + text[cut:])
    assert main([*MR_TRIAL, "--data-root", str(tmp_path / "data"), "--results", str(tmp_path / "r")]) == 2
    line = one_error_line(capsys)
    assert line.startswith("bench: error: mr: ") and "rt-polarity.pos" in line and "line 1" in line, line
    assert "were its line ends lost?" in line
    assert not (tmp_path / "r").exists()


def test_an_mr_file_with_its_longest_published_line_loads(tmp_path, monkeypatch):
    from bench.datasets.mr import LONGEST_LINE, MovieReview

    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    folder = write_mr(tmp_path)
    for kind in ("pos", "neg"):
        words = " ".join(["word"] * ((LONGEST_LINE - 1) // 5))
        (folder / f"rt-polarity.{kind}").write_text(f"{words}\n" + (f"a film {kind} .\n") * 50)
    splits = MovieReview(tmp_path).load()
    assert len(splits.train) + len(splits.val) + len(splits.test) == 102

