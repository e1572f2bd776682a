"""Write the README's method and dataset tables from the registries, as `bench methods --references --update
docs/fidelity.md` writes the fidelity record: a method added to `baselines/` or a dataset to `datasets/` needs no hand
edit of the README, only this command; tests/system/test_readme_tables.py checks that the README holds what it writes.

    .venv/bin/python docs/make_tables.py    # rewrite README.md's tables in place

Each table sits between `<!-- table: NAME -->` and `<!-- /table -->`. Only the checkout's own methods and datasets
are listed (modules of `bench`), never those of a `$BENCH_PLUGINS` folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.data import registry as datasets
from bench.methods import registry as methods

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", flags=re.S)


def in_tree(found: dict[str, type]) -> dict[str, type]:
    return {name: cls for name, cls in found.items() if cls.__module__.split(".")[0] == "bench"}


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def methods_table() -> str:
    rows = [f"| `{name}` | {cell(cls.title)} | {cell(cls.paper)} |" for name, cls in in_tree(methods()).items()]
    return "\n".join(["| name | method | paper |", "|---|---|---|", *rows]) + "\n"


def datasets_table() -> str:
    rows = [f"| `{name}` | {cell(cls.title)} | {cls.num_classes} | {' / '.join(f'{n:,}' for n in cls.split_sizes)} "
            f"| `{cls.model}` |" for name, cls in in_tree(datasets()).items()]
    return "\n".join(["| name | what | classes | train / validation / test | network |", "|---|---|---|---|---|",
                      *rows]) + "\n"


TABLES = {"methods": methods_table, "datasets": datasets_table}


def updated(text: str) -> str:
    """`text` with each table block rewritten from the registries; every table of TABLES has one block."""
    names = [m[2] for m in BLOCK.finditer(text)]
    if sorted(names) != sorted(TABLES):
        raise SystemExit(f"docs/make_tables.py: README.md's table blocks are {names}, expected one of each of "
                         f"{sorted(TABLES)}")
    return BLOCK.sub(lambda m: m[1] + TABLES[m[2]]() + m[4], text)


if __name__ == "__main__":
    README.write_text(updated(README.read_text(encoding="utf-8")), encoding="utf-8")
