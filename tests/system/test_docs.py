"""Docs that cannot drift (issue 38): every `bench ...` command in a shell block of README.md and docs/*.md is
checked flag by flag against its command's `--help` and by the real parser, and then run (a training command with
the smallest settings that still exercise it, a grid as `--dry-run`, a results command on a folder of real
trials); the README's sample outputs are the excerpts of files that docs/make_samples.py wrote from real runs, and
the quick samples are run again and compared, times and paths aside. The checker is shown failing on broken copies.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import yaml

from bench.cli import main as cli
from tests.conftest import SHARED_DATA, repo_script

REPO = Path(__file__).resolve().parents[2]
MAKE_SAMPLES = "docs/make_samples.py"  # the README's samples: its runs and their excerpts
DOC_FILES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
SHELL = {"sh", "bash", "shell", "console"}  # fences whose lines are commands; synopses go in `text` blocks
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
ENV = re.compile(r"[A-Z_][A-Z0-9_]*=\S*$")
# Commands that read these trial rows (`bench report results/demo`) get a folder of real trials made here.
RESULTS_COMMANDS = {"report", "leaderboard", "results", "sync-mlflow", "ui", "verify"}


@dataclass(frozen=True)
class Command:
    """One `bench` command of a shell block: where it is, its arguments after `bench`, and the environment it sets."""

    source: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)
    inline: bool = False  # a `bench ...` span in a sentence: its flags are checked; it may hold placeholders

    def __str__(self) -> str:
        return f"{self.source}: bench {shlex.join(self.argv)}"


def collect(text: str, name: str) -> list[Command]:
    """The `bench` commands of a Markdown text's shell blocks: continuation lines joined, comments dropped, a
    leading `VAR=value` kept as environment, and a `bench` after `--` (`ray job submit -- bench run ...`) found."""
    found = []
    for block in FENCE.finditer(text):
        if block.group(1) not in SHELL:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        logical, start = "", first
        for offset, line in enumerate(block.group(2).splitlines()):
            if not logical:
                start = first + offset
            logical += line
            if logical.endswith("\\"):
                logical = logical[:-1] + " "
                continue
            words, logical = shlex.split(logical, comments=True), ""
            env = {}
            while words and ENV.match(words[0]):
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            at = 0 if words[:1] == ["bench"] else words.index("--") + 1 if "--" in words else None
            if at is not None and words[at:at + 1] == ["bench"]:
                found.append(Command(f"{name}:{start}", tuple(words[at + 1:]), env))
    return found


INLINE = re.compile(r"(?<!`)`(bench [^`]+)`(?!`)")


def collect_inline(text: str, name: str) -> list[Command]:
    """The `bench ...` code spans of a Markdown text's sentences (outside fenced blocks)."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [Command(f"{name}:{prose.count(chr(10), 0, m.start()) + 1}", tuple(shlex.split(m.group(1))[1:]),
                    inline=True) for m in INLINE.finditer(prose)]


def all_commands() -> list[Command]:
    return [c for path in DOC_FILES
            for c in collect(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())]


def all_inline() -> list[Command]:
    return [c for path in DOC_FILES
            for c in collect_inline(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())]


# -- flags: each one in its command's --help, and the whole line accepted by the real parser -------------------------

@cache
def help_text(command: str | None) -> str:
    """`bench --help` or `bench COMMAND --help`, as a user sees it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--help"] if command else ["--help"])
    return out.getvalue()


def bench_commands() -> list[str]:
    """The commands `bench --help` lists (its lines `    NAME   what it does`)."""
    return re.findall(r"^    (\S+)\s{2,}", help_text(None), re.M)


def flag_problems(command: Command) -> list[str]:
    """What is wrong with a documented command before it runs: an unknown command, a flag that its --help does
    not list, or a line the real parser refuses (a missing required flag, a value of the wrong type)."""
    sub = next((a for a in command.argv if not a.startswith("-")), None) if command.argv[:1] != ("--version",) else None
    if command.inline and sub is not None and (sub.isupper() or sub == "..."):  # `bench COMMAND --help`
        sub = None if sub == "..." else sub
        return [] if sub is None or not [a for a in command.argv if a.startswith("--") and a != "--help"] else [
            f"{command}: a placeholder command takes only --help"]
    if sub is not None and sub not in bench_commands():
        return [f"{command}: no command `bench {sub}` (see `bench --help`)"]
    helped = set(re.findall(r"--[a-z][a-z0-9-]*", help_text(sub)))
    problems = [f"{command}: `bench {sub or ''}` has no flag {flag} (it is not in its --help)"
                for flag in dict.fromkeys(a.split("=")[0] for a in command.argv if a.startswith("--"))
                if flag not in helped]
    if not problems and not command.inline and not {"--help", "-h", "--version"} & set(command.argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                cli.build_parser().parse_args(list(command.argv))
            except SystemExit:
                problems.append(f"{command}: the parser refuses it: {err.getvalue().strip().splitlines()[-1]}")
    return problems


def test_every_documented_command_uses_real_flags() -> None:
    commands = all_commands()
    assert len(commands) >= 25, "the collector found too few commands: is it still reading the shell blocks?"
    assert {c.source.split(":")[0] for c in commands} >= {"README.md", "docs/running.md", "docs/reports.md"}
    problems = [p for c in commands for p in flag_problems(c)]
    assert not problems, "\n".join(problems)


def test_every_command_named_in_a_sentence_uses_real_flags() -> None:
    """`bench datasets --download NAME` in a sentence: the command exists and its flags are in its --help."""
    inline = all_inline()
    assert len(inline) >= 20
    problems = [p for c in inline for p in flag_problems(c)]
    assert not problems, "\n".join(problems)


def test_the_checker_fails_on_a_broken_readme() -> None:
    """A README copy with a misspelt flag, a flag argparse would take as an abbreviation, and a command that does not
    exist: the checker names each, with its line; and a value of the wrong type is refused by the real parser."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    good = [p for c in collect(text, "README.md") + collect_inline(text, "README.md") for p in flag_problems(c)]
    assert good == []
    broken = text
    for old, new in (("demo.yaml --dry-run\n", "demo.yaml --dry-runn\n"), (" --seeds 0 ", " --seed 0 "),
                     ("`bench report results/demo`", "`bench reprot results/demo`")):
        assert text.count(old) == 1, f"the README no longer holds {old!r}: pick another flag to break"
        broken = broken.replace(old, new)
    problems = [p for c in collect(broken, "README.md") + collect_inline(broken, "README.md") for p in flag_problems(c)]
    assert len(problems) == 3, problems
    assert any("has no flag --dry-runn" in p for p in problems), problems
    assert any("has no flag --seed " in p for p in problems), problems  # argparse alone would read it as --seeds
    assert any("no command `bench reprot`" in p for p in problems), problems
    wrong_type = collect("```sh\nbench trial --dataset synthetic --method ce --noise case1 --r high\n```\n", "x")
    assert [p for c in wrong_type for p in flag_problems(c)] == [
        "x:2: bench trial --dataset synthetic --method ce --noise case1 --r high: the parser refuses it: "
        "bench trial: error: argument --r: invalid number value: 'high'"]


def test_the_collector_reads_shell_blocks_only() -> None:
    text = ("```sh\nBENCH_DATA=/d bench run a.yaml \\\n    --dry-run   # comment\nmake demo\n```\n"
            "```text\nbench trial --dataset D [--epochs N]\n```\n"
            "```bash\nray job submit --address http://h:8265 -- \\\n    bench report r --out x\n```\n")
    assert [(c.source, c.argv, c.env) for c in collect(text, "t")] == [
        ("t:2", ("run", "a.yaml", "--dry-run"), {"BENCH_DATA": "/d"}),
        ("t:10", ("report", "r", "--out", "x"), {})]
    spans = "Run `bench ui R --port 1`.\n```sh\nbench x\n```\nThen `bench report R` and ``bench y``.\n"
    assert [(c.source, c.argv) for c in collect_inline(spans, "s")] == [("s:1", ("ui", "R", "--port", "1")),
                                                                         ("s:5", ("report", "R"))]


# -- running them --------------------------------------------------------------------------------------------------

def _ready(dataset: str, root: Path) -> bool:
    from bench.data import get_dataset

    return get_dataset(dataset)(root).status().startswith("ready")


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _set(argv: list[str], flag: str, value: str) -> None:
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]


def runnable(command: Command, results: Path, data: Path) -> list[str] | str:
    """The arguments to run a documented command with in a test, or why it is not run."""
    argv = list(command.argv)
    sub = next((a for a in argv if not a.startswith("-")), None)
    if "BENCH_PLUGINS" in command.env:
        return "it uses the plug-in templates of docs/extending.md, which tests/core/test_plugins.py trains"
    if sub == "ui":
        return "`bench ui` serves until it is stopped"
    if "BENCH_EXECUTOR_TABLE" in command.env and not Path(command.env["BENCH_EXECUTOR_TABLE"]).is_absolute():
        return ("it plans from the table a `bench calibrate` line before it writes "
                "(tests/grid/test_calibrate.py runs both)")
    if sub == "calibrate":  # on this machine's CPU, the smallest measurement that still times every arm once
        for flag, value in (("--device", "cpu"), ("--budget-s", "20"), ("--steps", "2"), ("--rounds", "1"),
                            ("--members", "2")):
            _set(argv, flag, value)
        if "--models" in argv:  # the CPU times a small network in seconds; ResNet-34's arms take minutes here
            _set(argv, "--models", "mlp")
    if sub == "datasets" and "--download" in argv:
        names = argv[argv.index("--download") + 1:]
        if not all(_ready(n, data) for n in names):
            return f"downloading needs the internet; {', '.join(names)} not all present under {data}"
    if sub in ("trial", "labels"):
        dataset = _value(argv, "--dataset")
        if not _ready(dataset, data):
            return f"needs {dataset}'s files under {data} (set BENCH_DATA)"
    if sub == "trial":  # the smallest settings that still train both stages
        _set(argv, "--epochs", "1")
        _set(argv, "--epochs-warmup", "1")
        _set(argv, "--train-subset", str(min(int(_value(argv, "--train-subset") or 512), 512)))
        _set(argv, "--results", "trial-results")
    if sub == "run":
        if "--address" in argv:  # a cluster's: the dry run plans on this machine
            del argv[argv.index("--address"):argv.index("--address") + 2]
        if "--dry-run" not in argv:
            argv.append("--dry-run")
        _set(argv, "--results", "run-results")
    if sub in RESULTS_COMMANDS:
        argv[argv.index(sub) + 1] = str(results)
    if sub in ("trial", "run", "labels", "datasets", "calibrate") and "--data-root" not in argv:
        argv += ["--data-root", str(data)]
    return argv


@pytest.fixture(scope="module")
def trial_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder of real trials for the commands that read one: CE and L_DMI, two seeds, on the generated
    dataset, as `bench trial` writes them."""
    results = tmp_path_factory.mktemp("docs") / "results"
    for method in ("ce", "dmi"):
        for seed in ("0", "1"):
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli.main(["trial", "--dataset", "synthetic", "--method", method, "--noise", "case3", "--r",
                                 "0.6", "--seed", seed, "--epochs", "1", "--epochs-warmup", "1", "--results",
                                 str(results), "--experiment", "docs"]) == 0
    return results


COMMANDS = all_commands()
MISSING_DATA = re.compile(r"bench: error: [a-z0-9_]+: missing .+ under \S+; run `bench datasets --download [a-z0-9_]+`"
                          r"[^\n]*\n?$")


def run_documented(command: Command, results: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a documented command as `runnable` adapts it, in `folder`, where tune_configs/ is the repository's, with
    a data root of real data; return what it printed, or fail naming the command, its line and its error."""
    if flag_problems(command):
        pytest.fail("\n".join(flag_problems(command)))
    argv = runnable(command, results, SHARED_DATA)
    if isinstance(argv, str):
        pytest.skip(f"{command.source}: not run: {argv}")
    for key, value in command.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("BENCH_EPOCH_EVAL", "0")  # the per-epoch diagnostics have tests of their own
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    monkeypatch.setenv("BENCH_UNSAVED", str(folder / "unsaved"))
    (folder / "tune_configs").symlink_to(REPO / "tune_configs")
    monkeypatch.chdir(folder)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # --version and --help exit
            code = e.code
    if code == 2 and argv[0] == "run" and MISSING_DATA.match(err.getvalue()) and "--dry-run" in argv:
        # A grid whose data is not here (a cluster's /mnt/data, a set not downloaded): its dry run printed the plan,
        # then ended as the run would, on the one line naming the missing files.
        assert "grid:" in out.getvalue() or "trials" in out.getvalue(), f"{command}: no plan before the data line"
        return out.getvalue()
    if code == 2 and f"missing under {SHARED_DATA} " in err.getvalue():  # real data this checkout lacks (`bench
        # calibrate` of a model with no stand-in): skipped, as every real-data test is without it
        pytest.skip(f"{command.source}: needs real data under {SHARED_DATA} (set BENCH_DATA)")
    if code != 0:
        pytest.fail(f"{command} (run as bench {shlex.join(argv)}) exited {code}:\n{err.getvalue()[-3000:]}")
    assert out.getvalue().strip(), f"{command} printed nothing"
    return out.getvalue()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.source for c in COMMANDS])
def test_every_documented_command_runs(command: Command, trial_rows: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run_documented(command, trial_rows, tmp_path, monkeypatch)


def test_a_documented_command_that_fails_is_reported(trial_rows: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A command whose flags are right but whose value is not (r = 1.5) fails the test, naming its line and the
    error `bench` printed; a results command pointed at the test's trials runs and prints their table."""
    bad = collect("```sh\nbench trial --dataset synthetic --method ce --noise case1 --r 1.5\n```\n", "copy.md")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"copy.md:2: bench trial .* exited 2:\nbench: error: .*r"):
        run_documented(bad[0], trial_rows, tmp_path / "a", monkeypatch)
    good = collect("```sh\nbench leaderboard results/demo\n```\n", "copy.md")[0]
    assert "ce" in run_documented(good, trial_rows, tmp_path / "b", monkeypatch)


# -- the README's samples ------------------------------------------------------------------------------------------

def test_readme_samples_are_excerpts_of_real_runs() -> None:
    """Each sample block of the README and the docs is the excerpt of the file that docs/make_samples.py wrote from a
    real run, and the file's first line is the command the sample names; a sample the tests do not re-run (it takes
    minutes) names the commit that made it, where it was made since samples say so."""
    samples = repo_script(MAKE_SAMPLES)
    shown = [(page, name, block) for page in samples.DOCS
             for name, block in samples.readme_samples(page.read_text(encoding="utf-8")).items()]
    assert sorted(name for _, name, _ in shown) == sorted(samples.SAMPLES), "every sample shown once, only samples"
    for page, name, block in shown:
        assert block == samples.readme_block(name), f"{page.name}'s sample {name} differs from " \
            f"docs/samples/{name}.txt; run `python docs/make_samples.py --readme-only`"
        recorded = (REPO / "docs" / "samples" / f"{name}.txt").read_text().splitlines()
        assert recorded[0] == "$ " + " ".join(samples.SAMPLES[name][0][0])
    made = (REPO / "docs" / "samples" / "variation.txt").read_text().splitlines()[-1]
    assert re.fullmatch(r"# made by docs/make_samples.py at commit [0-9a-f]{12}", made), made


def test_the_sample_check_fails_on_a_changed_readme() -> None:
    samples = repo_script(MAKE_SAMPLES)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    name, block = next(iter(samples.readme_samples(text).items()))
    changed = text.replace(block, block.replace(" ok ", " OK ", 1) if " ok " in block else block + "\nextra", 1)
    assert samples.readme_samples(changed)[name] != samples.readme_block(name)


TIME = re.compile(r"\b\d+m\d\ds\b|\b\d+(\.\d+)?s\b")
PATH = re.compile(r"(?<![\w/.])(/[\w.+-]+)+/?")  # an absolute path, not the 2/8 of "epoch 2/8"


def normalised(lines: list[str]) -> list[str]:
    """A sample's lines with what changes from run to run masked: times and absolute paths."""
    return [PATH.sub("<path>", TIME.sub("<time>", line)) for line in lines]


def test_normalising_masks_times_and_paths_only() -> None:
    assert normalised(["warm start done: clean test acc 97.86%  (83.2s)", "wall 1.4s on cpu", "at /tmp/x/y.parquet",
                       "elapsed 1m31s  ETA 0m00s", "epoch 2/8  val 0.0618"]) == [
        "warm start done: clean test acc 97.86%  (<time>)", "wall <time> on cpu", "at <path>",
        "elapsed <time>  ETA <time>", "epoch 2/8  val 0.0618"]


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One fork server for every quick sample's commands (docs/make_samples.py, `Forks`): 27 commands, each its own
    process, paid one import of torch, Ray, polars and matplotlib instead of 27."""
    server = repo_script(MAKE_SAMPLES).Forks(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


@pytest.mark.parametrize("name", [n for n, (_, _, quick) in repo_script(MAKE_SAMPLES).SAMPLES.items() if quick])
def test_quick_samples_reproduce(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forks: object) -> None:
    """Run the sample's commands again, as docs/make_samples.py runs them: the same output line for line, numbers
    included (a trial is a pure function of its config), times and paths aside. The commands are forked from one
    Python that imported their modules once, each still a process with its own folder, environment, output, error
    and exit status (make_samples checks it: 0, or an error sample's 2 and one `bench: error:` line on stderr)."""
    samples = repo_script(MAKE_SAMPLES)
    datasets = {argv[argv.index("--dataset") + 1] for argv in samples.SAMPLES[name][0]
                if "--dataset" in argv and "--data-root" not in argv}  # an error sample brings its damaged files
    if not all(_ready(d, SHARED_DATA) for d in datasets):
        pytest.skip(f"sample {name} needs {', '.join(sorted(datasets))} under {SHARED_DATA} (set BENCH_DATA)")
    monkeypatch.setenv("BENCH_DATA", str(SHARED_DATA))
    fresh = samples.run_sample(name, cwd=tmp_path, forks=forks)
    recorded = (REPO / "docs" / "samples" / f"{name}.txt").read_text().splitlines()
    assert normalised(fresh) == normalised(recorded)


def test_the_reproduction_check_fails_on_a_broken_copy() -> None:
    """A recorded sample with one number changed (an accuracy, a loss) no longer matches: normalising masks times and
    paths only, so the comparison of `test_quick_samples_reproduce` fails on it."""
    recorded = (REPO / "docs" / "samples" / "trial.txt").read_text().splitlines()
    accuracy = next(i for i, line in enumerate(recorded) if line.startswith("  clean test accuracy"))
    for i, old, new in ((accuracy, "%", "1%"), (2, " val ", " val 9")):
        broken = list(recorded)
        broken[i] = broken[i].replace(old, new, 1)
        assert broken != recorded and normalised(broken) != normalised(recorded)


def test_the_readme_grid_is_the_demo_file() -> None:
    """The YAML the README shows is tune_configs/demo.yaml, key for key."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    shown = [yaml.safe_load(b.group(2)) for b in FENCE.finditer(text) if b.group(1) == "yaml"]
    assert shown == [yaml.safe_load((REPO / "tune_configs" / "demo.yaml").read_text())]


def test_the_demo_file_states_the_time_its_recorded_sample_took() -> None:
    """tune_configs/demo.yaml says how long the demo takes: the minutes of docs/samples/demo.txt, the recorded run
    (#55: it said 37 where the sample took 9)."""
    sample = (REPO / "docs" / "samples" / "demo.txt").read_text()
    took = re.search(r"^demo: 16 of 16 trials finished in (\d+)m(\d\d)s", sample, re.M)
    stated = re.search(r"(\d+) minutes on", (REPO / "tune_configs" / "demo.yaml").read_text())
    assert took and stated and int(stated[1]) == round(int(took[1]) + int(took[2]) / 60)


def test_every_help_names_its_doc_page() -> None:
    """`bench --help` and each command's --help name the manual page for depth, and the page exists."""
    for command in [None, *bench_commands()]:
        pages = re.findall(r"docs/[\w-]+\.md", help_text(command))
        assert pages, f"bench {command or ''} --help names no docs page"
        assert all((REPO / p).is_file() for p in pages), pages
