"""Write the sample outputs that README.md and docs/ show, from real runs of the commands they document.

Each sample is a command run for real; its whole output is kept in docs/samples/<name>.txt (the first line is the
command; a sample that takes minutes ends with the commit that made it), and a page shows an excerpt of it between
`<!-- sample: NAME -->` and `<!-- /sample -->`. tests/system/test_docs.py checks that each excerpt is the excerpt of its
file, and re-runs the quick samples to compare their output with the file, times and paths aside.

    BENCH_DATA=/path/to/data .venv/bin/python docs/make_samples.py            # every sample (the demo: see its file)
    BENCH_DATA=/path/to/data .venv/bin/python docs/make_samples.py trial      # one sample
    .venv/bin/python docs/make_samples.py --readme-only                       # refresh README from the files

The demo sample is `make demo`'s two bench commands; its results folder (results/demo) is also what
docs/make_report_image.py renders.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
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


# name -> (the commands, how the README excerpt is cut from their outputs, quick: re-run by tests/system/test_docs.py)
SAMPLES: dict[str, tuple[list[list[str]], Callable[[list[list[str]]], list[str]], bool]] = {
    "demo": ([["bench", "run", "tune_configs/demo.yaml", "--results", "results/demo"],
              ["bench", "report", "results/demo"]], _demo_excerpt, False),
    "trial": ([_trial("dmi"), _trial("ce")], _trial_excerpt, True),
    "variation": ([["bench", "run", "tune_configs/demo.yaml", "--set", "r=[0.6]", "--seeds", "0", "--set", "epochs=3",
                    "--set", "epochs_warmup=2", "--results", "results/variation"]], _variation_excerpt, False),
}
# The files whose `<!-- sample: NAME -->` blocks show a sample: the README and the docs.
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


def run_sample(name: str, cwd: Path = WORKDIR) -> list[str]:
    """Run a sample's commands with the installed bench in `cwd`, from empty results folders; return the file's
    lines: `$ command`, then its output."""
    commands = SAMPLES[name][0]
    cwd.mkdir(parents=True, exist_ok=True)
    if not (cwd / "tune_configs").exists():
        (cwd / "tune_configs").symlink_to(REPO / "tune_configs")
    for argv in commands:
        if "--results" in argv:
            shutil.rmtree(cwd / argv[argv.index("--results") + 1], ignore_errors=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "120"}
    lines: list[str] = []
    for argv in commands:
        done = subprocess.run([sys.executable, "-m", "bench.cli.main", *argv[1:]], cwd=cwd, env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"make_samples: `{' '.join(argv)}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
        lines += [f"$ {' '.join(argv)}", *done.stdout.rstrip("\n").splitlines()]
    return relative(lines, cwd)


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
