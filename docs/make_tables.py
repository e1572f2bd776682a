"""Write the docs' generated tables, as `bench methods --references --update docs/fidelity.md` writes the fidelity
record: README.md's method and dataset tables from the registries, docs/architecture.md's module tables from the
layers of `pyproject.toml` (import-linter's contracts, the one map of the code) and each module's docstring, and the
panels' layer that docs/extending.md's panel recipe quotes. A method, a dataset, a panel or a module added needs no
hand edit of these pages, only this command; tests/system/test_readme_tables.py and
tests/system/test_architecture_doc.py check that the pages hold what it writes.

    .venv/bin/python docs/make_tables.py    # rewrite the pages' tables in place

Each table sits between `<!-- table: NAME -->` and `<!-- /table -->`. Only the checkout's own methods and datasets
are listed (modules of `bench`), never those of a `$BENCH_PLUGINS` folder.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from bench.data import registry as datasets
from bench.methods import registry as methods

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the docs are written with 3.11+
    raise SystemExit("docs/make_tables.py needs Python 3.11 or newer (tomllib)")

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", flags=re.S)
# A docstring's first sentence: up to the first full stop that ends it (a space or the end follows).
SENTENCE = re.compile(r"(.+?\.)(?:\s|$)", flags=re.S)


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


# -- the map of the code: pyproject's layers ------------------------------------------------------------------------
def contracts(root: Path = REPO) -> list[dict]:
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]


def layers(container: str, root: Path = REPO) -> list[list[str]]:
    """The layers of `container` ("bench" or a sub-package), top first, each a list of sibling modules' names."""
    for contract in contracts(root):
        if contract.get("type") == "layers" and contract.get("containers", ["bench"]) == [container]:
            return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]
    raise SystemExit(f"docs/make_tables.py: pyproject.toml has no layers contract for {container}")


def summary(path: Path) -> str:
    """A module's role: its docstring's first sentence (a package's: its __init__.py's)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    match = SENTENCE.match(" ".join(doc.split()))
    if not match:
        raise SystemExit(f"docs/make_tables.py: {path.relative_to(REPO)} has no docstring whose first sentence says "
                         "what it holds: write one")
    return match[1]


def module_files(package: Path, names: list[str]) -> list[Path]:
    """The files of `names` in `package`, a sub-package's own modules in place of its name."""
    files = []
    for name in names:
        if (package / name).is_dir():
            files += sorted(p for p in (package / name).glob("*.py") if p.name != "__init__.py")
        else:
            files.append(package / f"{name}.py")
    return files


def modules_table(files: list[Path]) -> list[str]:
    rows = [f"| `{p.relative_to(REPO).as_posix()}` | {cell(summary(p))} |" for p in files]
    return ["| module | role |", "|---|---|", *rows]


def modules_section() -> str:
    """docs/architecture.md's module tables: each package in the order of the top layers, its modules in its own."""
    bench = REPO / "bench"
    top = [name.removeprefix("bench.") for layer in layers("bench") for name in layer]
    lines = []
    for name in [n for n in top if (bench / n).is_dir()]:
        heading = summary(bench / name / "__init__.py").rstrip(".")
        modules = [m for layer in layers(f"bench.{name}") for m in layer]
        lines += [f"### bench/{name}/: {heading[0].lower()}{heading[1:]}", "",
                  *modules_table(module_files(bench / name, modules)), ""]
    own = [bench / f"{n}.py" for n in top if (bench / f"{n}.py").is_file()]
    lines += ["### bench/: a trial and the plug-in interfaces", "", *modules_table(own)]
    return "\n".join(lines) + "\n"


def shared_table() -> str:
    """The modules of baselines/ and datasets/ that are no plug-in: what several plug-ins share."""
    plugins = {cls.__module__ for cls in [*methods().values(), *datasets().values()]}
    shared = [p for folder in ("baselines", "datasets") for p in sorted((REPO / folder).glob("*.py"))
              if p.name != "__init__.py" and f"bench.{folder}.{p.stem}" not in plugins]
    return "\n".join(modules_table(shared)) + "\n"


def panels_line() -> str:
    """The report contract's layer of the built-in panels, as docs/extending.md's panel recipe quotes it, and their
    orders."""
    from bench.report.panel import panels  # the report's registry: polars, as the report needs

    built_in = sorted(panels(), key=lambda p: p.order)
    (layer,) = [" | ".join(names) for names in layers("bench.report")
                if {type(p).__module__.removeprefix("bench.report.") for p in built_in} <= set(names)]
    orders = ", ".join(f"{p.name} {p.order:g}" for p in built_in)
    return f'`"{layer}"` (the built-in panels, run in the order each declares: {orders})\n'


PAGES = {README: {"methods": methods_table, "datasets": datasets_table},
         REPO / "docs" / "architecture.md": {"modules": modules_section, "shared": shared_table},
         REPO / "docs" / "extending.md": {"panels": panels_line}}


def updated(text: str, tables: dict | None = None) -> str:
    """`text` with each table block rewritten; every table of `tables` (default: README's) has one block."""
    tables = PAGES[README] if tables is None else tables
    names = [m[2] for m in BLOCK.finditer(text)]
    if sorted(names) != sorted(tables):
        raise SystemExit(f"docs/make_tables.py: the page's table blocks are {names}, expected one of each of "
                         f"{sorted(tables)}")
    return BLOCK.sub(lambda m: m[1] + tables[m[2]]() + m[4], text)


def stale() -> list[str]:
    """The pages whose tables are not what this script writes."""
    return [page.relative_to(REPO).as_posix() for page, tables in PAGES.items()
            if updated(page.read_text(encoding="utf-8"), tables) != page.read_text(encoding="utf-8")]


if __name__ == "__main__":
    for page, tables in PAGES.items():
        page.write_text(updated(page.read_text(encoding="utf-8"), tables), encoding="utf-8")
