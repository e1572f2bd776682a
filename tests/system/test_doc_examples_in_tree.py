"""docs/extending.md's recipes followed in a copy of the checkout with their files only: each example written where
its recipe puts it, as written (the method into `baselines/`, the dataset into `datasets/` with the page's
`authors_protocol` in its class, the executor into `bench/exec/executors/`, the switch into `bench.protocol.SWITCHES`,
the panel under the page's own name into `bench/report/` with its one word in the report's layers), and a new module
of `bench` (its file with a docstring and its name in its package's layers); then the recipe's commands (`bench
methods --references --update docs/fidelity.md`, `python docs/make_tables.py`), then `bench check` on what was added,
which trains each plug-in and runs lint-imports over the copy, and the tests of the generated pages. The examples are
templates, not fixtures: no test loads one under its own name (tests/doc_examples.py gives them fresh names), so one
copied in as written collides with no test.

The executor-table row is not copied in: it is a measurement of the reader's machine that sends every CPU trial of
every model through the example executor, which is what it is for; tests/exec/test_executors.py runs it from a table
of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import doc_examples

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]
# The tests of what the recipes' commands write: the README's and the code's tables. (The layers: `bench check` runs
# lint-imports and reads each plug-in file's imports.)
TESTS = ["tests/system/test_readme_tables.py", "tests/system/test_architecture_doc.py"]
# A module of bench, added as the recipe says: a file with a docstring, its name beside its package's lowest layer.
MODULE = ("bench/store/notes.py", '"""The notes a results folder keeps beside its rows (a recipe\'s example)."""\n',
          "bench.store")
# The copy's `bench.baselines` and `bench.datasets` are its `baselines/` and `datasets/` (pyproject.toml's
# package-dir), ahead of the editable install's finder, which maps them into this checkout.
SITECUSTOMIZE = '''import importlib.util, sys
_ROOT = {root!r}
class _CopysPackages:
    @staticmethod
    def find_spec(name, path=None, target=None):
        folder = {{"bench.baselines": "baselines", "bench.datasets": "datasets"}}.get(name)
        if folder is None:
            return None
        where = _ROOT + "/" + folder
        return importlib.util.spec_from_file_location(name, where + "/__init__.py",
                                                      submodule_search_locations=[where])
sys.meta_path.insert(0, _CopysPackages)
'''


def copy_checkout(to: Path) -> None:
    """The files git tracks (or would: untracked, not ignored), as they are in the working tree."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def install_examples(root: Path) -> list[str]:
    """Each example of the page where its recipe puts it, as written; the paths written."""
    written = []
    for name, code in doc_examples.files().items():
        folder = "baselines" if "from bench.methods import" in code else "datasets"
        if folder == "datasets":  # the authors' protocol "declares their choices in its own file"
            code = doc_examples.with_authors_protocol(code)
        (root / folder / name).write_text(code)
        written.append(f"{folder}/{name}")
    executor = re.search(r"```python\n# executor: (\S+)\n", doc_examples.text())[1]
    (root / "bench" / "exec" / "executors" / executor).write_text(doc_examples.executor())
    panel = doc_examples.panel()
    (root / "bench" / "report" / f"{doc_examples.name_of(panel)}.py").write_text(panel)
    placed(root, "bench.report", lambda layers: next(i for i, layer in enumerate(layers) if "leaderboard" in layer),
           doc_examples.name_of(panel))  # the recipe's one word: beside the built-in panels
    protocol = root / "bench" / "protocol.py"
    text = protocol.read_text()
    end = text.index("\n}\n", text.index("SWITCHES = {\n"))
    protocol.write_text(text[:end] + "\n" + doc_examples.switch_entry().rstrip("\n") + text[end:])
    path, code, package = MODULE
    (root / path).write_text(code)
    placed(root, package, lambda layers: len(layers) - 1, Path(path).stem)  # it imports nothing: the lowest layer
    return [*written, f"bench/exec/executors/{executor}", f"bench/report/{doc_examples.name_of(panel)}.py",
            "bench/protocol.py", path, "pyproject.toml"]


def placed(root: Path, package: str, which, module: str) -> None:
    """`module` written beside the modules of one layer of `package`'s contract in the copy's pyproject.toml: the one
    word the recipes ask for."""
    config = root / "pyproject.toml"
    text = config.read_text()
    (layers,) = [c["layers"] for c in tomllib.loads(text)["tool"]["importlinter"]["contracts"]
                 if c.get("containers") == [package]]
    layer = layers[which(layers)]
    assert text.count(f'"{layer}"') == 1, layer
    config.write_text(text.replace(f'"{layer}"', f'"{layer} | {module}"'))


def test_the_docs_examples_copied_into_the_checkout_break_no_test(tmp_path: Path) -> None:
    root, boot = tmp_path / "checkout", tmp_path / "boot"
    root.mkdir(), boot.mkdir()
    copy_checkout(root)
    written = install_examples(root)
    (boot / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=str(root)))
    env = {**os.environ, "PYTHONPATH": f"{boot}{os.pathsep}{root}", "OMP_NUM_THREADS": "1",
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("BENCH_PLUGINS", None)
    bench = [sys.executable, "-c", "import sys; from bench.cli.main import main; sys.exit(main(sys.argv[1:]))"]

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)

    # The copy is what runs: its registries hold the examples under their own names.
    method, dataset = (name.removesuffix(doc_examples.FRESH) for name in doc_examples.method_and_dataset())
    listed = run(*bench, "methods")
    assert listed.returncode == 0 and method in listed.stdout, listed.stderr
    # The recipe's two commands, then the tests.
    assert run(*bench, "methods", "--references", "--update", "docs/fidelity.md").returncode == 0
    assert run(sys.executable, "docs/make_tables.py").returncode == 0
    readme, architecture = (root / "README.md").read_text(), (root / "docs" / "architecture.md").read_text()
    assert f"| `{method}` |" in readme and f"| `{dataset}` |" in readme
    assert f"| `{MODULE[0]}` | The notes a results folder keeps" in architecture
    assert "| seeds\"` (the built-in panels" in (root / "docs" / "extending.md").read_text()
    # Every plug-in the recipes added, trained and read back, and lint-imports over the copy; then the tests.
    checked = run(*bench, "check", *[p for p in written if p != "pyproject.toml"])
    assert checked.returncode == 0, f"with {written} added:\n{checked.stdout[-4000:]}{checked.stderr[-2000:]}"
    done = run(sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS)
    assert done.returncode == 0, f"with {written} added:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert re.search(r"\b\d+ passed\b", done.stdout) and " failed" not in done.stdout
