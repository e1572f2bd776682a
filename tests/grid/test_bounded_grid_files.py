"""An experiment file cannot take the machine: a YAML alias bomb (in `description`, `r` or a method's `lr`) and
nesting 20,000 deep are one line each, exit 2, within 10 s and 300 MB over what the same command takes to refuse a
one-line file (peak RSS measured in a separate process); `epochs` is bounded; a grid over the size limit is refused
before any per-trial check. Each fails on 9638f3c (issue #54)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cli.main import main
from bench.grid import experiment
from bench.grid.files import YAML_ALIAS_BUDGET, YAML_DEPTH, parse_yaml
from bench.trial import TrialConfig, TrialError
from tests.grid.test_damaged_files_and_bad_values import one_error_line

HEAD = "name: bounded\ndataset: fashion_mnist\nnoise: case3\nseeds: [0]\n"
# Peak RSS (KB) of one `bench run FILE --dry-run` in a process of its own: the child of a fresh interpreter whose only
# child it is (RUSAGE_CHILDREN is the largest child's).
MEASURE = ("import resource, subprocess, sys, time; start = time.monotonic(); "
           "done = subprocess.run([sys.executable, '-m', 'bench.cli.main', 'run', sys.argv[1], '--dry-run', "
           "'--no-mlflow', '--results', sys.argv[2]], capture_output=True, text=True, timeout=60); "
           "print(done.returncode, time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
           "print(done.stderr, end='')")


def bomb(levels: int = 12) -> str:
    """A "billion laughs" as one value: a list of anchors, each nine aliases of the one before (9**11 at the last)."""
    return "[" + ", ".join(['&l0 ["lol"]'] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]"
                                             for i in range(1, levels)]) + "]"


def refused(tmp_path: Path, name: str, text: str) -> tuple[int, float, int, list[str]]:
    """Exit code, seconds, peak RSS (KB) and stderr lines of `bench run` on a file holding `text`."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(tmp_path / "results")], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout, f"bench did not end within 60 s: {done.stderr[-300:]}"  # the measuring process's timeout
    first, *err = done.stdout.splitlines()
    code, seconds, rss = first.split()
    return int(code), float(seconds), int(rss), [line for line in err if line]


BOMBS = {
    "description": HEAD + f"r: [0.2]\nmethods: {{ce: {{}}}}\ndescription: {bomb()}\n",
    "r": HEAD + f"r: {bomb()}\nmethods: {{ce: {{}}}}\n",
    "lr": HEAD + f"r: [0.2]\nmethods: {{ce: {{lr: {bomb()}}}}}\n",
    "deep flow": HEAD + "methods: {ce: {}}\nr: " + "[" * 20_000 + "0.2" + "]" * 20_000 + "\n",
    "deep block": HEAD + "methods: {ce: {}}\nr:\n" + "".join(f"{' ' * i}- \n" for i in range(2_000)),
}


def test_alias_bombs_and_deep_nesting_are_one_line_within_10_s_and_300_mb(tmp_path: Path) -> None:
    code, _, baseline, err = refused(tmp_path, "broken", HEAD + "r: [\n")  # the same command's own cost
    assert code == 2 and len(err) == 1 and "not valid YAML" in err[0], err
    for name, text in BOMBS.items():
        code, seconds, rss, err = refused(tmp_path, name.replace(" ", "_"), text)
        assert code == 2 and len(err) == 1, (name, err[:3])
        says = f"nested more than {YAML_DEPTH} levels" if "deep" in name else \
            f"aliases repeat more than {YAML_ALIAS_BUDGET:,} values"
        assert err[0].startswith(f"bench: error: {tmp_path / name.replace(' ', '_')}.yaml, line ") and says in err[0]
        assert seconds < 10 and rss - baseline < 300 * 1024, (name, seconds, rss, baseline)


def test_a_bomb_given_on_the_command_line_is_one_line_too(tmp_path: Path, capsys) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(HEAD + "r: [0.2]\nmethods: {ce: {}}\n")
    assert main(["run", str(path), "--dry-run", "--no-mlflow", "--set", f"r={bomb()}"]) == 2
    assert "the value, line 1, column " in (line := one_error_line(capsys)) and "aliases repeat" in line


def test_the_bounds_let_a_file_that_uses_aliases_sensibly_through(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(HEAD + "r: &levels [0.2, 0.4]\nmethods: {ce: &schedule {lr: 0.1, epochs: 2}, dmi: *schedule}\n"
                    "description: a grid\n")
    assert parse_yaml(path.read_text(), path)["methods"] == {"ce": {"lr": 0.1, "epochs": 2},
                                                             "dmi": {"lr": 0.1, "epochs": 2}}


@pytest.mark.parametrize("key", ["epochs: 1000000000", "epochs_warmup: 1000000000",
                                 "methods: {ce: {epochs: [1, 1000000000]}}"])
def test_epochs_are_bounded(key: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "epochs.yaml"
    path.write_text(HEAD + "r: [0.2]\n" + (key if key.startswith("methods") else f"methods: {{ce: {{}}}}\n{key}")
                    + "\n")
    assert main(["run", str(path), "--dry-run", "--no-mlflow", "--results", str(tmp_path / "r")]) == 2
    assert "must be an integer >= 0 and <= 10,000, got 1000000000" in one_error_line(capsys)
    with pytest.raises(TrialError, match="epochs"):
        TrialConfig("fashion_mnist", "ce", "case3", 0.2, seed=0, epochs=10_001).check(set())


def test_a_grid_over_the_size_limit_is_refused_before_any_per_trial_check(tmp_path: Path, capsys,
                                                                          monkeypatch) -> None:
    checked = []
    real = TrialConfig.check
    monkeypatch.setattr(TrialConfig, "check", lambda self, *a: (checked.append(self), real(self, *a))[1])
    monkeypatch.setattr(experiment, "GRID_LIMIT", 100)  # the limit the check reads, made small to keep this quick
    monkeypatch.setattr("bench.grid.validate.GRID_LIMIT", 100)
    path = tmp_path / "large.yaml"
    path.write_text(HEAD.replace("seeds: [0]", "seeds: [0, 1]")
                    + f"r: [{', '.join(f'{i / 1000:.3f}' for i in range(101))}]\nmethods: {{ce: {{}}}}\n")
    start = time.monotonic()
    assert main(["run", str(path), "--no-mlflow", "--results", str(tmp_path / "r")]) == 2
    assert "the grid has 202 trials (more than 100)" in one_error_line(capsys)
    assert checked == [] and time.monotonic() - start < 10
