"""docs/extending.md's recipes for a switch and a column, as a new contributor follows them: the authors' protocol
of a dataset built into the doc's plug-in dataset in a temporary folder and trained under `--protocol authors`; a new
kind of switch added as the doc's one declaration, landing in the warm start's key and the planner's cell where its
`acts` says and nowhere else; and the column recipe's every named file and function found where it says (a column
cannot be a plug-in: it is an edit of the store)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import polars as pl
import pytest

from bench import protocol
from bench.cli.main import main
from bench.data import get_dataset
from bench.data import registry as datasets
from bench.exec.prepare import prepare, warm_start_key
from bench.grid.plan import warm_cell
from bench.protocol import SWITCHES, Switch
from bench.trial import TrialConfig
from tests import doc_examples
from tests.protocol.test_switches import CITE

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "extending.md").read_text()
_, DATASET = doc_examples.method_and_dataset()


def section(title: str) -> str:
    start = DOC.index(f"## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end >= 0 else None]


@pytest.fixture
def authors_dataset(tmp_path, monkeypatch):
    """The doc's dataset plug-in with the doc's `authors_protocol` added to its class, in a plug-in folder, under its
    fresh name (tests/doc_examples.py)."""
    (ring,) = [code for code in doc_examples.fresh_files().values() if "from bench.data import" in code]
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{DATASET}.py").write_text(doc_examples.with_authors_protocol(ring))
    monkeypatch.setenv("BENCH_PLUGINS", str(folder))
    datasets.cache_clear()
    yield get_dataset(DATASET)
    monkeypatch.delenv("BENCH_PLUGINS")
    datasets.cache_clear()


def trial(spec: str) -> TrialConfig:
    return TrialConfig(DATASET, "ce", "next_class", 0.3, seed=1, epochs=1, epochs_warmup=1, protocol=spec)


def test_the_docs_authors_protocol_is_declared_in_the_dataset_file_and_trains(authors_dataset, tmp_path) -> None:
    switches = authors_dataset.switches()
    assert sorted(switches) == ["first_batch_selection", "warmup_by_accuracy"]
    assert all(CITE.fullmatch(s.cite) for s in switches.values()), [s.cite for s in switches.values()]
    # Where each acts is its SWITCHES declaration: warmup_by_accuracy the warm start, first_batch_selection not.
    bench, method_only, warm = trial("bench"), trial("bench+first_batch_selection"), trial("bench+warmup_by_accuracy")
    assert warm_cell(method_only) == warm_cell(bench) != warm_cell(warm)
    keys = [warm_start_key(prepare(t, tmp_path, log=lambda s: None), 0) for t in (bench, method_only, warm)]
    assert keys[0] == keys[1] != keys[2]
    results = tmp_path / "r"
    assert main(["trial", "--dataset", DATASET, "--method", "ce", "--noise", "next_class", "--r", "0.3",
                 "--epochs-warmup", "1", "--epochs", "1", "--protocol", "authors", "--results", str(results)]) == 0
    row = pl.read_parquet(next((results / "trials").glob("*.parquet"))).row(0, named=True)
    assert (row["status"], row["protocol"]) == ("ok", "authors")
    assert row["switches"] == "first_batch_selection,warmup_by_accuracy"


@pytest.mark.parametrize("acts", [protocol.WARM, protocol.METHOD, protocol.BOTH])
def test_a_new_kind_of_switch_is_one_declaration_of_where_it_acts(authors_dataset, tmp_path, monkeypatch,
                                                                    acts: str) -> None:
    """The doc's SWITCHES entry, its `acts` set to each value in turn, declared by the dataset: the warm start's
    key and the planner's cell take it in exactly where it acts on the warm start."""
    name, kind = doc_examples.fresh_switch(vars(protocol))  # the doc's entry, under a fresh name
    assert name not in SWITCHES and isinstance(kind, protocol.SwitchKind)
    monkeypatch.setitem(SWITCHES, name, dataclasses.replace(kind, acts=acts))
    declared = Switch(name, "owner/repo, train.py:10, commit abc1234", "smooths the targets", 0.1)
    monkeypatch.setattr(authors_dataset, "authors_protocol", (*authors_dataset.authors_protocol, declared))
    bench, switched = trial("bench"), trial(f"bench+{name}")
    assert switched.resolved_protocol().on(name) and switched.trial_id != bench.trial_id
    on_warm = acts != protocol.METHOD
    assert (warm_cell(switched) != warm_cell(bench)) == on_warm
    keys = [warm_start_key(prepare(t, tmp_path, log=lambda s: None), 0) for t in (bench, switched)]
    assert (keys[0] != keys[1]) == on_warm


def test_the_column_recipe_names_files_and_functions_that_exist() -> None:
    """Every file the recipe names exists, every `bench.x.y` it names imports, and every other name in backticks
    is defined (a def, a class or an assignment) in one of the files it names."""
    text = section("A new column")
    files = sorted(set(re.findall(r"`((?:bench|tests)/[\w/]+\.py)`", text)))
    assert {"bench/store/columns.py", "bench/store/rows.py", "tests/store/test_row_columns.py"} <= set(files)
    assert all((REPO / f).is_file() for f in files), files
    defined: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse((REPO / f).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for dotted in re.findall(r"`(bench(?:\.\w+)+)`", text):
        module, _, attr = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), dotted
    names = {m.split("(")[0] for m in re.findall(r"`([A-Za-z_]\w*)(?:\([^`]*\))?`", text)}
    missing = sorted(n for n in names - {"default"} if n not in defined)  # `default`: a keyword of `_c`
    assert not missing, f"docs/extending.md's column recipe names {missing}, defined in none of {files}"
