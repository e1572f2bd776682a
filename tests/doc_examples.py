"""docs/extending.md's examples as the tests load them: read from the page, each under a fresh name (its own name with
FRESH appended), so that a contributor who copies an example into the checkout as written (a method into
`baselines/`, a dataset into `datasets/`, the executor into `bench/exec/executors/`, the switch into
`bench.protocol.SWITCHES`) collides with no test: the page's names stay the reader's placeholders, used by no test.
tests/system/test_doc_examples_in_tree.py installs them so and runs the tests that read the registries."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
FRESH = "_from_docs"
_NAME = re.compile(r'^( +name = )"(\w+)"', flags=re.M)  # a plug-in class's `name = "..."` line


def text() -> str:
    return DOC.read_text(encoding="utf-8")


def name_of(code: str) -> str:
    """The name an example's class declares (each example declares one)."""
    (name,) = [m[2] for m in _NAME.finditer(code)]
    return name


def renamed(code: str) -> str:
    """The example with its class's name made fresh; nothing else changes."""
    fresh, count = _NAME.subn(lambda m: f'{m[1]}"{m[2]}{FRESH}"', code)
    assert count == 1, f"an example declares one name, this one {count}"
    return fresh


def files() -> dict[str, str]:
    """The page's code blocks that start with `# file: NAME.py` (a method, a dataset), as written."""
    return dict(re.findall(r"```python\n# file: (\S+)\n(.*?)```", text(), flags=re.S))


def fresh_files() -> dict[str, str]:
    """`files()` renamed, each under its fresh file name: NAME_from_docs.py declaring NAME_from_docs."""
    return {f"{name_of(code)}{FRESH}.py": renamed(code) for code in files().values()}


def method_and_dataset() -> tuple[str, str]:
    """The fresh names of the page's method and dataset (told by what they import)."""
    (method,) = [name_of(renamed(c)) for c in files().values() if "from bench.methods import" in c]
    (dataset,) = [name_of(renamed(c)) for c in files().values() if "from bench.data import" in c]
    return method, dataset


def with_authors_protocol(dataset: str) -> str:
    """The page's dataset example with the page's `authors_protocol` declared in its class, "in its own file": its
    imports beside the file's, its lines after the class's last statement."""
    snippet = re.search(r"```python\n(from bench.protocol import .*?)```", text(), flags=re.S)[1]
    imports = [line for line in snippet.splitlines() if line.startswith("from ")]
    body = "\n".join(line for line in snippet.splitlines() if not line.startswith("from "))
    assert dataset.rstrip().endswith(")")  # the class is the file's last statement: the declaration goes into it
    dataset = dataset.replace("from bench.data import", "\n".join(imports) + "\nfrom bench.data import", 1)
    return dataset.rstrip() + "\n" + body


def executor() -> str:
    """The page's executor (`# executor: NAME.py`), as written."""
    return re.search(r"```python\n# executor: \S+\n(.*?)```", text(), flags=re.S)[1]


def executor_table() -> str:
    """The page's executor-table example (its header and one row), as written."""
    return re.search(r"```\n(model,device,executor.*?)```", text(), flags=re.S)[1]


def switch_entry() -> str:
    """The page's new switch, its lines for `bench.protocol.SWITCHES`, as written."""
    return re.search(r"```python\n# switch: bench/protocol.py, in SWITCHES\n(.*?)```", text(), flags=re.S)[1]


def fresh_switch(namespace: dict) -> tuple[str, object]:
    """The page's switch evaluated in `namespace` (bench.protocol's), under its fresh name."""
    (name, kind), = eval("{" + switch_entry() + "}", namespace).items()  # noqa: S307 - the page's own line
    return name + FRESH, kind


def panel() -> str:
    """The page's report panel (it imports polars, as report panels do), as written."""
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text(), flags=re.S)
                if "from bench.report.panel import Panel" in b]
    return block
