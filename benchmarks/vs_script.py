"""bench's `authors` MR cell against the authors' own MR script: CPU time and wall of whole processes, interleaved.

    python benchmarks/vs_script.py --data-root DATA [--script PATH/TO/L_DMI/MR/main.py] [--rounds 3]

Arms, each a whole process at OMP_NUM_THREADS=1, run once per round in a rotating order (so that a load that comes
and goes on a shared machine falls on every arm):
- `bench`: `bench trial --dataset mr --method dmi --noise pos_to_neg --r 0.6 --seed 3 --protocol authors
  --epochs-warmup 4 --epochs 3`, the per-epoch diagnostics on (the default: test accuracy, memorisation and detection
  after every epoch, on `bench.exec.diagnostics.train_sample`);
- `bench, diagnostics off`: the same with BENCH_EPOCH_EVAL=0;
- `script` (with --script): the authors' MR/main.py (github.com/Newbeeer/L_DMI, commit 7d5e4bc; clone it yourself,
  nothing of it is in this repository), copied to a scratch folder with the shims docs/fidelity.md lists ("MR, bit
  for bit") and no other change: `.cuda()` the identity, `torch.load(..., weights_only=False)`, one `int(...[0])` for
  NumPy 2, the extension-less modules importable, `tqdm` and `gensim` stubbed; main_ce for --epochs-warmup epochs and
  main_dmi for --epochs, then `evaluate` of both models (main_gce, main_fw and main_lccn not run). Its data folder
  links to DATA/MR.

CPU time is user + sys of the finished child (`resource.getrusage(RUSAGE_CHILDREN)`, before and after), which a
loaded machine disturbs far less than wall. Printed per arm: best and median of the rounds; then each bench arm's
ratio to the script's (median of the per-round ratios, and best over best). Each process's numbers are checked: the
script's final test accuracies of the CE and the L_DMI model against bench's row (`warmup_test_acc`, `test_acc`), to
every digit Python prints.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CELL = dict(r="0.6", seed="3")

# The shims, as (file, text in the script, replacement): each must match exactly once, so that another checkout of
# the script fails here rather than running something else.
SHIMS = [
    ("dataloaders.py", "label = int(np.random.choice(num_classes, 1, p=np.array(conf_matrix[label])))",
     "label = int(np.random.choice(num_classes, 1, p=np.array(conf_matrix[label]))[0])"),
    ("main.py", "main_ce()\nmain_dmi()\nmain_gce()\nmain_fw()\nmain_lccn()\n",
     "args.epochs = WARM_EPOCHS\nmain_ce()\nargs.epochs = DMI_EPOCHS\nmain_dmi()\n"),
    ("main.py", "evaluate('./model_gce_' + str(args.r) + '_' + str(args.seed))\n"
     "evaluate('./model_fw_' + str(args.r) + '_' + str(args.seed))\n"
     "evaluate('./model_lccn_' + str(args.r) + '_' + str(args.seed))", ""),
]
PRELUDE = '''import sys, types, torch
torch.Tensor.cuda = lambda self, *a, **k: self
torch.nn.Module.cuda = lambda self, *a, **k: self
_load = torch.load
torch.load = lambda *a, **k: _load(*a, **k, weights_only=False)
from importlib.machinery import ModuleSpec
def _stub(name, **attrs):
    module = types.ModuleType(name); module.__spec__ = ModuleSpec(name, None); module.__dict__.update(attrs)
    sys.modules[name] = module
    return module
_stub("tqdm", tqdm=lambda it, *a, **k: it)
_stub("gensim", models=_stub("gensim.models", KeyedVectors=None))
'''


def prepare_script(script: Path, data_root: Path, warm: int, epochs: int) -> Path:
    """A scratch copy of the script's MR folder with the shims; returns its main.py."""
    source = script.parent if script.name == "main.py" else script
    folder = Path(tempfile.mkdtemp(prefix="ldmi-mr-")) / "MR"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("datasets", "logs", "model_*"))
    for name in ("download_dataset", "models/WordCNN"):
        shutil.copy(folder / name, folder / f"{name}.py")
    for file, old, new in SHIMS:
        path = folder / file
        text = path.read_text()
        if text.count(old) != 1:
            sys.exit(f"vs_script: {path.name} is not the script these shims fit (commit 7d5e4bc): {old[:40]!r}...")
        path.write_text(text.replace(old, new))
    main = folder / "main.py"
    main.write_text(f"{PRELUDE}WARM_EPOCHS, DMI_EPOCHS = {warm}, {epochs}\n{main.read_text()}")
    (folder / "datasets").mkdir()
    (folder / "datasets" / "MR").symlink_to((data_root / "MR").resolve())
    return main


def run(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"vs_script: {' '.join(command[:3])}... failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout


def bench_numbers(results: Path) -> tuple[float, float]:
    import pyarrow.parquet as pq

    (row,) = pq.read_table(next((results / "trials").glob("*.parquet"))).to_pylist()
    return row["warmup_test_acc"], row["test_acc"]


def script_numbers(stdout: str) -> tuple[float, float]:
    ce, dmi = (float(v) for v in re.findall(r"^test_acc= (\S+)$", stdout, re.M))
    return ce, dmi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, type=Path, help="the folder holding MR/rt-polaritydata")
    parser.add_argument("--script", type=Path, help="the authors' MR/main.py (or its MR folder), commit 7d5e4bc")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs-warmup", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("BENCH_EPOCH_EVAL", None)
    scratch = Path(tempfile.mkdtemp(prefix="vs-script-"))
    bench_cmd = [sys.executable, "-m", "bench.cli.main", "trial", "--dataset", "mr", "--method", "dmi",
                 "--noise", "pos_to_neg", "--r", CELL["r"], "--seed", CELL["seed"], "--protocol", "authors",
                 "--epochs-warmup", str(args.epochs_warmup), "--epochs", str(args.epochs),
                 "--data-root", str(args.data_root)]
    arms: dict[str, tuple[list[str], dict[str, str], Path | None]] = {
        "bench": (bench_cmd, env, None),
        "bench, diagnostics off": (bench_cmd, {**env, "BENCH_EPOCH_EVAL": "0"}, None),
    }
    if args.script:
        main_py = prepare_script(args.script, args.data_root, args.epochs_warmup, args.epochs)
        arms["script"] = ([sys.executable, str(main_py), "--r", CELL["r"], "--seed", CELL["seed"], "WordCNN"], env,
                          main_py.parent)
    names = list(arms)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    numbers: dict[str, set[tuple[float, float]]] = {n: set() for n in names}
    for i in range(args.rounds):
        for name in names[i % len(names):] + names[: i % len(names)]:
            command, arm_env, cwd = arms[name]
            results = scratch / f"{i}-{names.index(name)}"
            if cwd is None:
                command = [*command, "--results", str(results)]
            c, w, out = run(command, arm_env, cwd or scratch)
            cpu[name].append(c)
            wall[name].append(w)
            numbers[name].add(script_numbers(out) if cwd is not None else bench_numbers(results))
            print(f"round {i + 1}: {name:24s} CPU {c:7.1f} s  wall {w:7.1f} s", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if args.script:
        shutil.rmtree(main_py.parent.parent, ignore_errors=True)

    print(f"\n{'arm':24s} {'CPU best':>9s} {'median':>8s} {'wall best':>10s} {'median':>8s}   test acc (CE, L_DMI)")
    for name in names:
        print(f"{name:24s} {min(cpu[name]):9.1f} {statistics.median(cpu[name]):8.1f} {min(wall[name]):10.1f} "
              f"{statistics.median(wall[name]):8.1f}   {sorted(numbers[name])}")
    reference = "script" if "script" in arms else "bench, diagnostics off"
    for name in names:
        if name == reference:
            continue
        per_round = [a / b for a, b in zip(cpu[name], cpu[reference], strict=True)]
        walls = [a / b for a, b in zip(wall[name], wall[reference], strict=True)]
        print(f"{name} / {reference}: CPU {statistics.median(per_round):.3f}x (median of rounds), "
              f"{min(cpu[name]) / min(cpu[reference]):.3f}x (best / best); wall "
              f"{statistics.median(walls):.3f}x (median of rounds)")
    same = len(set().union(*numbers.values())) == 1
    print("the same test accuracies in every process, to every digit:", "yes" if same else "NO")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
