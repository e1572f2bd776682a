"""The plug-ins' declarations read from their source (`bench.declarations`, issue #56 item 4) answer what importing
the plug-ins answers: over every method and dataset of the checkout and docs/extending.md's templates (its method, and
its dataset with the page's authors' switches), in a plug-in folder as a contributor puts them; the checkout and the
templates read without torch; and a declaration that is not data is answered by the import, the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import declarations
from bench.data import registry as datasets
from bench.methods import registry as methods
from tests import doc_examples

ROOT = Path(__file__).resolve().parents[2]
# What each kind's readers ask of it (`bench.report.analysis`, `bench.store.mirror`), and more of its data, so that
# the reader is held to Python's lookup on attributes the subclasses override and inherit.
ASKED = {"method": ("title", "reference", "original", "version"),
         "dataset": ("model", "paper_noise", "title", "num_classes", "class_names", "split_sizes", "version")}
OWN = {"dataset": (("authors_protocol", ()),)}  # `Dataset.switches`: the class's own, not inherited
REGISTRIES = {"method": methods, "dataset": datasets}


def imported(kind: str, attribute: str, own: bool = False, default: object = None) -> dict[str, object]:
    return {name: cls.__dict__.get(attribute, default) if own else getattr(cls, attribute)
            for name, cls in REGISTRIES[kind]().items()}


def read(kind: str, attribute: str, own: bool = False, default: object = None) -> dict[str, object]:
    """The source's answer, never the import's (Unreadable where the source does not tell)."""
    return declarations._read(kind, attribute, own, default, declarations._plugin_stamps())  # noqa: SLF001


@pytest.fixture
def templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """docs/extending.md's method and dataset (the dataset with the page's `authors_protocol`), under their fresh
    names, in a `$BENCH_PLUGINS` folder."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, code in doc_examples.fresh_files().items():
        dataset = "from bench.data import" in code
        (folder / name).write_text(doc_examples.with_authors_protocol(code) if dataset else code)
    monkeypatch.setenv("BENCH_PLUGINS", str(folder))
    methods.cache_clear()
    datasets.cache_clear()
    yield doc_examples.method_and_dataset()
    monkeypatch.delenv("BENCH_PLUGINS")
    methods.cache_clear()
    datasets.cache_clear()


def check_every_declaration() -> None:
    for kind, attributes in ASKED.items():
        for attribute in ("name", *attributes):
            assert read(kind, attribute) == imported(kind, attribute), (kind, attribute)
            assert declarations.declared(kind, attribute) == imported(kind, attribute), (kind, attribute)
    for kind, owned in OWN.items():
        for attribute, default in owned:
            assert read(kind, attribute, True, default) == imported(kind, attribute, True, default), attribute


def test_the_checkouts_plugins_read_as_imported() -> None:
    check_every_declaration()
    # Some of it is inherited (CIFAR-10N's model is CIFAR-10's), some declared: both kinds of answer were compared.
    switches = read("dataset", "authors_protocol", True, ())
    assert switches["mr"] and not switches["cifar10n"] and datasets()["cifar10n"].authors_protocol


def test_the_docs_templates_read_as_imported(templates: tuple[str, str]) -> None:
    method, dataset = templates
    check_every_declaration()
    assert method in read("method", "title") and read("dataset", "authors_protocol", True, ())[dataset]


def test_reading_the_checkout_imports_no_torch() -> None:
    code = ("import json, sys\nfrom bench.declarations import declared\n"
            f"answers = [declared(k, a) for k, attributes in {ASKED!r}.items() for a in attributes]\n"
            "answers.append(declared('dataset', 'authors_protocol', own=True, default=()))\n"
            "print(json.dumps(['torch' in sys.modules, len(answers[0])]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                          timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [False, len(methods())]


def test_a_declaration_that_is_not_data_is_answered_by_the_import(tmp_path: Path, monkeypatch) -> None:
    """A title computed by a call the reader does not make (not a torch-free interface's): the import answers."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "shouting_ce.py").write_text(
        "from bench.baselines.ce import CrossEntropy\n\n\n"
        "class ShoutingCE(CrossEntropy):\n    name = 'shouting_ce'\n    title = 'cross entropy'.upper()\n")
    monkeypatch.setenv("BENCH_PLUGINS", str(folder))
    methods.cache_clear()
    try:
        with pytest.raises(declarations.Unreadable):
            read("method", "title")
        titles = declarations.declared("method", "title")
        assert titles == imported("method", "title") and titles["shouting_ce"] == "CROSS ENTROPY"
        assert read("method", "version") == imported("method", "version")  # inherited: still read from the source
    finally:
        monkeypatch.delenv("BENCH_PLUGINS")
        methods.cache_clear()
