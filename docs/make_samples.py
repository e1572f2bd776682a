"""Write the sample outputs that README.md and docs/ show, from real runs of the commands they document.

Each sample is a command run for real; its whole output is kept in docs/samples/<name>.txt (the first line is the
command; a sample that takes minutes ends with the commit that made it), and a page shows an excerpt of it between
`<!-- sample: NAME -->` and `<!-- /sample -->`. tests/system/test_docs.py checks that each excerpt is the excerpt of its
file, and re-runs the quick samples to compare their output with the file, times and paths aside (their commands
there forked from one Python that made their imports once: `Forks`).

    BENCH_DATA=/path/to/data .venv/bin/python docs/make_samples.py            # every sample (the demo: see its file)
    BENCH_DATA=/path/to/data .venv/bin/python docs/make_samples.py trial      # one sample
    .venv/bin/python docs/make_samples.py --readme-only                       # refresh README from the files

The demo sample is `make demo`'s two bench commands; its results folder (results/demo) is also what
docs/make_report_image.py renders.

The error samples (docs/failures.md) are commands that must fail on bad input: each exits 2, and its file keeps the
command and the one line it wrote to stderr. The inputs they refuse (a grid file, executor tables, damaged data
files) are written into the folder they run in by `write_inputs`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES_DIR = REPO / "docs" / "samples"
README = REPO / "README.md"
# The samples run here, with tune_configs/ linked in, so that their output shows short relative paths
# (results/demo/...) and a rerun starts from empty results folders.
WORKDIR = REPO / "results" / "samples"


def _demo_excerpt(runs: list[list[str]]) -> list[str]:
    """`bench run`: its command, first and last trial lines, summary and leaderboard."""
    lines = runs[0]
    trials = [line for line in lines if re.match(r"\[ *\d+/\d+\] ", line)]
    end = next(i for i, line in enumerate(lines) if re.search(r": \d+ of \d+ trials finished in ", line))
    table = next(i for i, line in enumerate(lines) if line.startswith("clean test accuracy (%)"))
    return [lines[0], trials[0], "...", trials[-1], lines[end], *lines[table:]]


def _trial_excerpt(runs: list[list[str]]) -> list[str]:
    """The L_DMI trial: its first line, the warm start's end, the last epoch and the summary's main lines; of the CE
    trial on the same noisy labels, its command and its accuracy."""
    dmi, ce = runs
    last_epoch = [line for line in dmi if re.match(r"epoch \d+/\d+ ", line)][-1]
    summary = [line for line in dmi if re.match(r"trial \w+  status|  (selected epoch|clean test|result row)", line)]
    warm = next(line for line in dmi if line.startswith("warm start done"))
    ce_accuracy = next(line for line in ce if line.startswith("  clean test"))
    return [*dmi[:2], warm, "...", last_epoch, *summary, ce[0], ce_accuracy]


def _variation_excerpt(runs: list[list[str]]) -> list[str]:
    """A one-cell variation of the demo: how the grid changed, what it runs, its first status line, its trials."""
    lines = runs[0]
    status = next(line for line in lines if line.startswith("status: ") and " | " in line)  # trials in flight
    trials = [line for line in lines if re.match(r"\[ *\d+/\d+\] ", line)]
    return [lines[0], lines[1], lines[2], status, *trials]


def _trial(method: str) -> list[str]:
    return ["bench", "trial", "--dataset", "synthetic", "--method", method, "--noise", "case3", "--r", "0.6",
            "--seed", "0"]


def _everything(runs: list[list[str]]) -> list[str]:
    """An error sample: every command and the line it printed."""
    return [line for run in runs for line in run]


def _bench(line: str) -> list[str]:
    return line.split()


# The inputs the error samples refuse, written into the folder they run in. A grid small enough to plan in a second,
# executor tables each with one fault, a YAML file with a misplaced colon, a link in a results folder, data files
# that cannot be the published ones.
GRID = "name: grid\ndataset: synthetic\nnoise: case3\nr: [0.2]\nseeds: [0]\nepochs: 1\nepochs_warmup: 1\n" \
       "methods:\n  ce: {}\n  dmi: {}\n"
TABLE = "model,device,executor,trials,images_per_s,measured,source\n"
INPUTS: dict[str, bytes | str | None] = {
    "grid.yaml": GRID,
    "broken.yaml": "name: broken\ndataset: synthetic\nnoise: case3: [0.2]\n",
    "trials.csv": TABLE + "*,cpu,pack,2,,2026-11-27,calibrate\n*,cpu,solo,1,,2026-11-27,calibrate\n"
                          "*,cpu,streams,\u00b2,,2026-11-27,calibrate\n",
    "rate.csv": TABLE + "*,cpu,pack,2,abc,2026-11-27,calibrate\n",
    "fields.csv": TABLE + "*,cpu,pack,2,,2026-11-27,calibrate\n*,cpu,solo,1,,2026-11-27,calibrate,extra\n",
    "latin1.csv": TABLE.encode() + b"*,cpu,p\xffack,2,,2026-11-27,calibrate\n",
    "a_file": "a file where a folder is asked for\n",
    "empty/": None,
    "pct%20x/": None,
    "shared/logs/": None,
    "notes.txt": "a file outside the results folder\n",
    "damaged/cifar-100-python/meta": b"not a pickle",
    "damaged/cifar-100-python/train": b"not a pickle",
    "damaged/cifar-100-python/test": b"not a pickle",
    "damaged/MR/rt-polaritydata/rt-polarity.pos/": None,
    "damaged/MR/rt-polaritydata/rt-polarity.neg": "a short review .\n",
    "unsplit/MR/rt-polaritydata/rt-polarity.pos": "x" * 300_001 + "\n",
    "unsplit/MR/rt-polaritydata/rt-polarity.neg": "a short review .\n",
}
LINKS = {"shared/logs/6c0fffcc6ca64703.log": "../../notes.txt"}


def write_inputs(cwd: Path) -> None:
    """The files the error samples refuse, fresh in `cwd`."""
    for name, content in INPUTS.items():
        path = cwd / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if content is None:
            path.mkdir(parents=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    for name, target in LINKS.items():
        (cwd / name).symlink_to(target)


RUN = "bench run grid.yaml --dry-run"
# name -> (the commands, how the README excerpt is cut from their outputs, quick: re-run by tests/system/test_docs.py)
SAMPLES: dict[str, tuple[list[list[str]], Callable[[list[list[str]]], list[str]], bool]] = {
    "demo": ([["bench", "run", "tune_configs/demo.yaml", "--results", "results/demo"],
              ["bench", "report", "results/demo"]], _demo_excerpt, False),
    "trial": ([_trial("dmi"), _trial("ce")], _trial_excerpt, True),
    "variation": ([["bench", "run", "tune_configs/demo.yaml", "--set", "r=[0.6]", "--seeds", "0", "--set", "epochs=3",
                    "--set", "epochs_warmup=2", "--results", "results/variation"]], _variation_excerpt, False),
    # docs/failures.md: bad input, one line each, exit 2
    "bad_input": ([_bench(line) for line in (
        f"{RUN} --set r=1.5", f"{RUN} --set seeds=99999999999999999999", f"{RUN} --set name=my/grid",
        f"{RUN} --methods dmi --set methods.ce.lr=2e-3",
        f"BENCH_PACK_MEMORY_GB=inf {RUN}", f"BENCH_PACK_MEMORY_GB=1.7e299 {RUN}", f"BENCH_PACK_MEMORY_GB=1e-300 {RUN}",
        f"BENCH_EXECUTOR_TABLE=trials.csv {RUN}", f"BENCH_EXECUTOR_TABLE=rate.csv {RUN}",
        f"BENCH_EXECUTOR_TABLE=fields.csv {RUN}", f"BENCH_EXECUTOR_TABLE=latin1.csv {RUN}",
        f"{RUN} --executor pack:\u00b2", f"{RUN} --executor solo:5",
        "bench calibrate --models mlp --device cpu --members 2,1000000",
        "bench calibrate --models mlp --device cpu --budget-s 1e9",
        "bench trial --dataset synthetic --method ce --noise case3 --r 0.2 --model linear_probe "
        "--model-arg backbone=resnet18 --model-arg weights=random --model-arg image_size=0",
        "bench run broken.yaml --dry-run")], _everything, True),
    "bad_output": ([_bench(line) for line in (
        "bench report empty --out a_file", "bench results empty --out a_file/all.parquet")], _everything, True),
    "bad_results_path": ([_bench(f"{RUN} --results pct%20x")], _everything, True),
    "damaged_cifar100": ([_bench("BENCH_VERIFY_CHECKSUMS=0 bench trial --dataset cifar100 --method ce --noise uniform "
                                 "--r 0.2 --data-root damaged")], _everything, True),
    "damaged_mr": ([_bench(line) for line in (
        "bench trial --dataset mr --method ce --noise pos_to_neg --r 0.2 --data-root damaged",
        "BENCH_VERIFY_CHECKSUMS=0 bench trial --dataset mr --method ce --noise pos_to_neg --r 0.2 "
        "--data-root unsplit")], _everything, True),
    "no_cluster": ([_bench(f"{RUN} --address 127.0.0.1:9")], _everything, True),
    "links": ([_bench("bench report shared")], _everything, True),
}
# The samples whose every command must fail on bad input: exit 2, and the line on stderr is what they show.
ERRORS = {name for name, (_, cut, _) in SAMPLES.items() if cut is _everything}
ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")
# The files whose `<!-- sample: NAME -->` blocks show a sample: the README and the docs.
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


def run_sample(name: str, cwd: Path = WORKDIR, forks: Forks | None = None) -> list[str]:
    """Run a sample's commands with the installed bench in `cwd`, from empty results folders; return the file's
    lines: `$ command`, then its output. With `forks`, the commands are forked from it (the tests' way: the same
    commands, each a process of its own, less their seconds of imports)."""
    commands = SAMPLES[name][0]
    cwd.mkdir(parents=True, exist_ok=True)
    if not (cwd / "tune_configs").exists():
        (cwd / "tune_configs").symlink_to(REPO / "tune_configs")
    for argv in commands:
        if "--results" in argv:
            shutil.rmtree(cwd / argv[argv.index("--results") + 1], ignore_errors=True)
    if name in ERRORS:
        write_inputs(cwd)
    # An error sample's commands read their inputs and write nothing: they run side by side (each is a Python start,
    # seconds of imports); the others run one after another, as a user would type them.
    with ThreadPoolExecutor(max_workers=4 if name in ERRORS else 1) as pool:
        outputs = list(pool.map(lambda words: _run(name, words, cwd, forks), commands))
    return relative([line for lines in outputs for line in lines], cwd)


def _environment() -> dict[str, str]:
    """What every sample command runs with, before its own `VAR=value` words: under the portable numerics' pins
    (`bench.numerics.PINS`), as the tests that re-run the quick samples compute, so that their figures are the same
    on any x86-64 CPU."""
    from bench.numerics import PINS

    return {**os.environ, **PINS, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "120"}


def _run(name: str, words: list[str], cwd: Path, forks: Forks | None = None) -> list[str]:
    """One command of a sample, `VAR=value` words as its environment: `$ command`, then what it shows (stdout, or
    an error sample's one line on stderr, exit status 2)."""
    env = _environment()
    argv = list(words)
    while ENV_WORD.match(argv[0]):  # `VAR=value bench ...`, as a shell reads it
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    if forks is not None:
        done = forks.run(argv[1:], env, cwd)
    else:
        done = subprocess.run([sys.executable, "-m", "bench.cli.main", *argv[1:]], cwd=cwd, env=env,
                              capture_output=True, text=True, check=False)
    wanted = 2 if name in ERRORS else 0
    if done.returncode != wanted:
        raise SystemExit(f"make_samples: `{' '.join(words)}` exited {done.returncode}, not {wanted}:\n"
                         f"{done.stderr[-2000:]}")
    shown = done.stderr if name in ERRORS else done.stdout
    if name in ERRORS and not re.fullmatch(r"bench: error: [^\n]+\n", shown):
        raise SystemExit(f"make_samples: `{' '.join(words)}` wrote more than one `bench: error:` line:\n{shown}")
    return [f"$ {' '.join(words)}", *shown.rstrip("\n").splitlines()]


# The modules the quick samples' commands import before they read their input (torch and Ray by bench.exec.memory,
# polars and matplotlib by bench.report.build, ...): seconds of a 2-core machine for each command started afresh.
PRELOADED = ("torch", "ray", "ray._private.worker", "polars", "matplotlib", "yaml", "bench.cli.calibrate",
             "bench.exec.memory", "bench.exec.trainer", "bench.exec.calibrate", "bench.grid.runner",
             "bench.grid.describe", "bench.report.build")
# The fork server: it imports PRELOADED (its own stderr must stay empty: a warning there would be a command's second
# line), then for each request (one JSON line: argv, env, cwd, files for stdout and stderr) forks a child that is that
# command as `python -m bench.cli.main` runs it: its folder, its environment (the server's, which import-time
# `os.environ.setdefault`s of bench modules joined, with the request's differences applied), its stdout and stderr on
# files, its exit status reported back as `id status`. At most 4 run at once.
_SERVER = r"""
import json, os, select, sys
base = dict(os.environ)
for module in sys.argv[1:]:
    __import__(module)
os.write(1, b"ready\n")
pending, queue, buffer = {}, [], b""
while True:
    while queue and len(pending) < 4:
        request = queue.pop(0)
        pid = os.fork()
        if pid == 0:
            os.chdir(request["cwd"])
            for key in [k for k in base if k not in request["env"]]:
                os.environ.pop(key, None)
            os.environ.update({k: v for k, v in request["env"].items() if base.get(k) != v})
            written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], written),
                                    (2, request["err"], written)):
                opened = os.open(path, flags)
                os.dup2(opened, fd)
                os.close(opened)
            sys.argv = [sys.executable, *request["argv"]]
            import runpy
            try:
                runpy.run_module("bench.cli.main", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pending[pid] = request["id"]
    ready, _, _ = select.select([0], [], [], 0.02 if pending else None)
    if ready:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        queue += [json.loads(line) for line in lines]
    while pending:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        os.write(1, f"{pending.pop(pid)} {os.waitstatus_to_exitcode(status)}\n".encode())
os._exit(0)  # no teardown of torch and Ray: seconds
"""


class Forks:
    """Runs commands as forks of one Python that has imported `PRELOADED` once (`_SERVER`): each still a process of
    its own with its own folder, environment, standard output and error and exit status, as `_run` starts them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sending, self.reading = threading.Lock(), threading.Lock()
        self.statuses: dict[str, int] = {}
        self.count = 0
        with open(folder / "server.err", "w+") as err:
            self.server = subprocess.Popen([sys.executable, "-c", _SERVER, *PRELOADED], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=err, env=_environment())
            said = self.server.stdout.readline()
            err.seek(0)
            if said != b"ready\n" or (noise := err.read()):
                self.close()
                raise RuntimeError(f"make_samples: the fork server did not start quietly: {said!r} {noise[-2000:]}")

    def run(self, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
        with self.sending:
            self.count += 1
            key = str(self.count)
            out, err = self.folder / f"{key}.out", self.folder / f"{key}.err"
            request = dict(id=key, argv=argv, env=env, cwd=str(cwd), out=str(out), err=str(err))
            self.server.stdin.write(json.dumps(request).encode() + b"\n")
            self.server.stdin.flush()
        while True:  # one reader at a time takes a status off the pipe, for whichever request it answers
            with self.reading:
                if key in self.statuses:
                    code = self.statuses.pop(key)
                    break
                line = self.server.stdout.readline().decode()
                if not line:
                    raise RuntimeError("make_samples: the fork server ended")
                done, status = line.split()
                self.statuses[done] = int(status)
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)


def commit() -> str:
    """The commit the samples are made from (with -dirty where the tree has changes): a sample that takes minutes
    says which code made it, as the quick ones are re-run by the tests."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def relative(lines: list[str], cwd: Path) -> list[str]:
    """Paths under the folder the samples ran in, as the user who ran them there would read them."""
    return [line.replace(f"{cwd.resolve()}/", "") for line in lines]


def excerpt(name: str, lines: list[str]) -> list[str]:
    """What README shows of a sample file's lines: the file cut into its commands (each from its `$` line), and
    the sample's cut of those."""
    runs: list[list[str]] = []
    for line in lines:
        if line.startswith("$ "):
            runs.append([])
        runs[-1].append(line)
    return SAMPLES[name][1](runs)


def readme_block(name: str) -> str:
    lines = (SAMPLES_DIR / f"{name}.txt").read_text().splitlines()
    return "\n".join(["```text", *excerpt(name, lines), "```"]) + "\n"


BLOCK = re.compile(r"(<!-- sample: (\w+) -->\n)(.*?)(^<!-- /sample -->)", re.S | re.M)


def readme_samples(text: str) -> dict[str, str]:
    """The sample blocks of a README text, by name."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def update_readme() -> None:
    """Every sample block of the README and the docs, from its file."""
    def block(m: re.Match) -> str:  # a sample not yet recorded keeps what the page shows
        recorded = (SAMPLES_DIR / f"{m.group(2)}.txt").is_file()
        return m.group(1) + (readme_block(m.group(2)) if recorded else m.group(3)) + m.group(4)

    for page in DOCS:
        text = page.read_text()
        if (new := BLOCK.sub(block, text)) != text:
            page.write_text(new)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"samples to run (default: all of {', '.join(SAMPLES)})")
    parser.add_argument("--readme-only", action="store_true", help="only refresh README.md from docs/samples/")
    args = parser.parse_args()
    SAMPLES_DIR.mkdir(exist_ok=True)
    if not args.readme_only:
        for name in args.names or SAMPLES:
            print(f"running sample {name} ...", flush=True)
            made = [] if SAMPLES[name][2] else [f"# made by docs/make_samples.py at commit {commit()}"]
            (SAMPLES_DIR / f"{name}.txt").write_text("\n".join(run_sample(name) + made) + "\n")
    update_readme()
    print(f"README.md samples refreshed from {SAMPLES_DIR.relative_to(REPO)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
