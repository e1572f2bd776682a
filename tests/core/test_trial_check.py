"""A trial's validity has one home, `TrialConfig.check` (issue #48): a rule added there alone is enforced by the driver
(`bench run --dry-run`, its planning, `bench trial`, `bench labels`), worded with the experiment file's key where a
file set the value, and by the worker before it loads any data or trains (`prepare`, a solo trial, a pack); and the
places that checked a trial before (the grid's loading and planning, the CLI, the worker's preparation) hold no rule
of their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

import bench
from bench.cli.main import main
from bench.exec import pack, prepare
from bench.exec.trainer import run_trial
from bench.grid.files import load_experiment
from bench.grid.plan import Plan
from bench.trial import TrialConfig, TrialError

BENCH = Path(bench.__file__).parent
GRID = dict(name="g", dataset="synthetic", noise="case3", r=[0.2, 0.7], seeds=[0], epochs=1, epochs_warmup=1,
            train_subset=200, resources={"cpu": 1}, methods={"ce": {}})
HALF = "must be at most 0.5 under this test's rule"


@pytest.fixture
def half_at_most(monkeypatch):
    """A new constraint, added where a developer adds one: to the one check (here wrapping it, as an edit of
    `TrialConfig.check` would add a line to it): r above 0.5 is refused."""
    check = TrialConfig.check

    def with_the_rule(self: TrialConfig, transitions=None) -> None:
        check(self, transitions)
        if self.r > 0.5:
            raise TrialError(f"--r {HALF}, got {self.r:g}", "r", f"{HALF}, got {self.r:g}")

    monkeypatch.setattr(TrialConfig, "check", with_the_rule)


def trial(r: float) -> TrialConfig:
    return TrialConfig("synthetic", "ce", "case3", r, seed=0, epochs=1, epochs_warmup=1, train_subset=200)


def one_line(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_the_driver_refuses_a_new_rule_in_one_line_naming_the_files_key(tmp_path, capsys, half_at_most):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(GRID))
    results = tmp_path / "res"
    assert main(["run", str(path), "--dry-run", "--results", str(results)]) == 2
    assert one_line(capsys) == [f"bench: error: {path}: r: {HALF}, got 0.7"]
    assert not results.exists()
    exp = load_experiment(path, registries=False)  # the planning path checks every trial by the same rule
    with pytest.raises(TrialError, match=f"^--r {HALF}, got 0.7$"):
        Plan.make(exp, str(results))


def test_without_the_rule_the_same_grid_passes(tmp_path, capsys):
    """The refusal above is the rule's doing: the grid, the trial and its preparation pass without it."""
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(GRID))
    assert main(["run", str(path), "--dry-run", "--results", str(tmp_path / "res")]) == 0
    trial(0.7).check()
    assert prepare.prepare(trial(0.7), tmp_path, log=lambda s: None).config.r == 0.7


@pytest.mark.parametrize("command", [
    ["trial", "--dataset", "synthetic", "--method", "ce", "--noise", "case3", "--r", "0.7", "--epochs", "1"],
    ["labels", "--dataset", "synthetic", "--noise", "case3", "--r", "0.7"],
])
def test_each_command_refuses_it_before_it_reads_data(tmp_path, capsys, half_at_most, command):
    out = tmp_path / "labels.parquet"
    args = [*command, "--data-root", str(tmp_path / "nowhere")]
    args += ["--out", str(out)] if command[0] == "labels" else ["--results", str(tmp_path / "res")]
    assert main(args) == 2
    assert one_line(capsys) == [f"bench: error: --r {HALF}, got 0.7"]
    assert not out.exists() and not (tmp_path / "res").exists()


def test_the_worker_refuses_it_before_it_loads_data_or_trains(tmp_path, monkeypatch, half_at_most):
    loaded: list[TrialConfig] = []
    load = prepare.load_data
    monkeypatch.setattr(prepare, "load_data", lambda config, root: loaded.append(config) or load(config, root))
    with pytest.raises(TrialError, match=f"^--r {HALF}, got 0.7$"):
        prepare.prepare(trial(0.7), tmp_path, log=lambda s: None)
    with pytest.raises(TrialError, match=f"^--r {HALF}, got 0.7$"):
        run_trial(trial(0.7), tmp_path, results=str(tmp_path / "res"), log=lambda s: None)
    assert loaded == [] and not (tmp_path / "res" / "trials").exists()
    with pytest.raises(TrialError, match=f"^--r {HALF}, got 0.7$"):  # a pack: its refused member, before training
        pack.run_pack([trial(0.2), trial(0.7)], tmp_path, results=str(tmp_path / "res"), log=lambda s: None)
    assert not (tmp_path / "res" / "trials").exists()


# The rules of a trial's values, by the functions that hold them: called by `TrialConfig.check` alone.
RULES = {"check_noise", "check_level", "check_args", "refuses", "validate_transition", "transition_matrix"}
# Where a trial was checked before: the grid's loading and planning, its driver checks, the CLI, the worker.
FORMER = ["grid/experiment.py", "grid/validate.py", "grid/plan.py", "exec/prepare.py", "cli/main.py", "cli/labels.py",
          "cli/run.py"]


def calls(path: Path) -> set[str]:
    """The names of the functions and methods a module calls."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


def test_no_former_place_holds_a_rule_of_its_own():
    for name in FORMER:
        held = calls(BENCH / name) & (RULES | {"check_params", "check_name", "transition"} if name.startswith("grid")
                                      else RULES)
        assert not held, f"bench/{name} checks a trial itself ({sorted(held)}): ask TrialConfig.check"
    defined = {node.name for node in ast.walk(ast.parse((BENCH / "exec" / "prepare.py").read_text()))
               if isinstance(node, ast.FunctionDef)}
    assert not {name for name in defined if name.startswith("check")}, defined  # its network check is check_inputs
    # The rules' only caller outside the modules that declare them (a dataset's noise and levels, a model's options,
    # a method's refusals, T's checks) is the one check. A command's own `check_args` (bench calibrate's flags) is
    # a function of its module, not a model's; `bench check` asks a plug-in's own rules (its refusals, its matrices)
    # to check the plug-in, never a trial.
    declaring = {"data.py", "models.py", "methods.py", "noise.py", "features.py"}
    callers = {str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py")
               if p.name not in declaring and "datasets" not in p.parts and calls(p) & RULES}
    assert callers == {"trial.py", "cli/calibrate.py", "cli/check.py"}, callers
    assert "def check_args" in (BENCH / "cli" / "calibrate.py").read_text()
