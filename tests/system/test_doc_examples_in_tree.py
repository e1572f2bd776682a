"""docs/extending.md's examples copied into a copy of the checkout as written, at the paths its recipes give (the
method into `baselines/`, the dataset into `datasets/` with the page's `authors_protocol` in its class, the executor
into `bench/exec/executors/`, the switch into `bench.protocol.SWITCHES`, the panel into `bench/report/`), the two
regeneration commands the recipe names run (`bench methods --references --update docs/fidelity.md`, `python
docs/make_tables.py`), then the tests that read the registries run in that copy and pass: the examples are templates,
not fixtures, and no test loads one under its own name (tests/doc_examples.py gives them fresh names).

The executor-table row is not copied in: it is a measurement of the reader's machine that sends every CPU trial of
every model through the example executor, which is what it is for (the tests of the planner pin which executor a
trial gets); tests/exec/test_executors.py runs it from a table of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests import doc_examples

REPO = Path(__file__).resolve().parents[2]
# The tests that read a registry (methods, datasets, switches, executors, panels), the README's tables, the fidelity
# record or the row's columns; the other tests of these files train a method or run Ray, and read nothing the
# examples change.
FIDELITY = ("every_method_names_the_released_code_it_was_checked_against", "docs_fidelity_page_is_the_generated_record",
            "the_terminal_record_lists_each_method_with_its_reference",
            "dataset_defaults_name_registered_datasets_and_allowed_values")
TESTS = ["tests/core/test_plugins.py", "tests/system/test_readme_tables.py", "tests/system/test_extending.py",
         *[f"tests/methods/test_fidelity_records_and_training_rules.py::test_{name}" for name in FIDELITY],
         *[f"tests/protocol/test_switches.py::test_{name}" for name in (
             "specs_resolve_to_the_declared_switches_and_refuse_in_one_line", "a_switch_must_be_one_that_bench_knows",
             "every_declared_switch_is_known_cites_a_script_line_and_is_not_inherited",
             "where_a_switch_acts_is_its_one_declaration")],
         *[f"tests/report/test_panels.py::test_{name}" for name in (
             "the_built_in_panels_come_in_their_declared_order", "a_panel_is_one_plug_in_file")],
         *[f"tests/exec/test_executors.py::test_{name}" for name in (
             "the_executors_are_found_by_name_and_an_unknown_one_names_the_choices",
             "the_shipped_table_keeps_todays_plan",
             "the_docs_executor_is_chosen_by_name_and_planned_in_its_own_words")],
         "tests/methods/test_current_baselines.py::test_the_new_methods_are_registered_with_papers_and_declared_ranges",
         "tests/store/test_row_columns.py::test_the_declaration_groups_every_column_once"]
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
    protocol = root / "bench" / "protocol.py"
    text = protocol.read_text()
    end = text.index("\n}\n", text.index("SWITCHES = {\n"))
    protocol.write_text(text[:end] + "\n" + doc_examples.switch_entry().rstrip("\n") + text[end:])
    return [*written, f"bench/exec/executors/{executor}", f"bench/report/{doc_examples.name_of(panel)}.py",
            "bench/protocol.py"]


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
    readme = (root / "README.md").read_text()
    assert f"| `{method}` |" in readme and f"| `{dataset}` |" in readme
    done = run(sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS)
    assert done.returncode == 0, f"with {written} copied in:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert re.search(r"\b\d+ passed\b", done.stdout) and " failed" not in done.stdout
