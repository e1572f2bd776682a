"""The README's method and dataset tables are written from the registries by docs/make_tables.py, as docs/fidelity.md
is by `bench methods --references --update`: the committed README is what it writes, each table names every method
and dataset of the checkout once (and no plug-in of a `$BENCH_PLUGINS` folder). A new method or dataset in the
checkout needs the command, never a hand edit: tests/system/test_doc_examples_in_tree.py adds docs/extending.md's
two in a copy of the checkout, runs it, and runs this file there."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

from bench.data import registry as datasets
from bench.methods import registry as methods
from tests import doc_examples

REPO = Path(__file__).resolve().parents[2]


def make_tables():
    spec = importlib.util.spec_from_file_location("make_tables", REPO / "docs" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_column(text: str, table: str) -> list[str]:
    block = re.search(rf"<!-- table: {table} -->\n(.*?)<!-- /table -->", text, flags=re.S)[1]
    return [m for row in block.splitlines()[2:] for m in re.findall(r"^\| `(\w+)` \|", row)]


def test_the_readme_tables_are_what_the_generator_writes() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert make_tables().updated(text) == text, "README.md's tables are stale: run `python docs/make_tables.py`"


def test_each_table_names_every_method_and_dataset_of_the_checkout_once() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for table, registry in (("methods", methods()), ("datasets", datasets())):
        named = first_column(text, table)
        # The checkout's: defined in a file under it (a plug-in folder is anywhere else).
        in_tree = {n for n, cls in registry.items() if Path(inspect.getfile(cls)).resolve().is_relative_to(REPO)}
        assert len(named) == len(set(named)) and set(named) == in_tree, (table, sorted(set(named) ^ in_tree))


def test_a_plug_in_is_not_listed(tmp_path, monkeypatch) -> None:
    """docs/extending.md's method and dataset in a `$BENCH_PLUGINS` folder: registered, and absent from the tables
    (they are the checkout's, the same on every machine)."""
    for name, code in doc_examples.fresh_files().items():
        (tmp_path / name).write_text(code)
    monkeypatch.setenv("BENCH_PLUGINS", str(tmp_path))
    methods.cache_clear(), datasets.cache_clear()
    try:
        method, dataset = doc_examples.method_and_dataset()
        assert method in methods() and dataset in datasets()
        text = make_tables().updated((REPO / "README.md").read_text(encoding="utf-8"))
        assert method not in first_column(text, "methods") and dataset not in first_column(text, "datasets")
        assert text == (REPO / "README.md").read_text(encoding="utf-8")
    finally:
        monkeypatch.delenv("BENCH_PLUGINS")
        methods.cache_clear(), datasets.cache_clear()
