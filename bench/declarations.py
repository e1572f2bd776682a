"""What the plug-ins declare as data, read from their source without running it: a method's title, a dataset's default
model, the pattern of its paper's table, the switches of its authors' scripts.

A plug-in file (a method, a dataset) imports torch at its top, and so do the interfaces it subclasses: importing the
registries (`bench.methods.registry`, `bench.data.registry`) to learn a method's title costs a listing of rows a
second of start-up and a gigabyte of memory, for a string. The declarations are class attributes written as data
(DESIGN.md §2: "parameters declared as data"), so they are read here from each file's syntax (`ast`): the same files
the registries import (`bench.config.discover`'s places, and the `$BENCH_PLUGINS` files that import the kind's
modules), the same classes (defined in the file, subclassing the kind's base through any chain of plug-in classes,
with a `name`), each attribute looked up through the classes' bases as Python looks it up.

A value is evaluated from literals, the file's own constants and names, and calls into the torch-free interfaces
(`SAFE`: `Schedule`, `Switch`, `Selection`, ...). Where a declaration is anything else (computed by a function, a
decorated class, a base the syntax does not name), the kind is not readable so, and its registry is imported instead:
the answer is the same, only slower (tests/core/test_declarations.py holds both equal over every plug-in of the
checkout and the templates of docs/extending.md, and the checkout's readable). Nothing new is written in a plug-in.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import operator
import os
import pkgutil
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.config import PLUGINS_ENV, plugin_files, plugin_module_name

# The modules a declaration may call into or read a name from: the interfaces that import no torch.
SAFE = ("bench.config", "bench.schema", "bench.noise", "bench.protocol")
# A kind: its base class (module, name) and the places its registry discovers plug-ins in (`bench.config.discover`).
KINDS = {"method": (("bench.methods", "Method"), ("bench.dmi", "bench.baselines")),
         "dataset": (("bench.data", "Dataset"), ("bench.datasets",))}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_MISSING = object()


class Unreadable(Exception):
    """A declaration that is not data (or a class the syntax cannot place): its registry is imported instead."""


@dataclass
class _Source:
    """One parsed module: its imported names, its top-level assignments and classes."""

    name: str
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local name -> (module, attribute)
    values: dict[str, ast.expr | None] = field(default_factory=dict)  # None: bound, but not as data
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


def declared(kind: str, attribute: str, own: bool = False, default: Any = None) -> dict[str, Any]:
    """{plug-in name: its `attribute`} for every plug-in of `kind` ("method" or "dataset"), as importing its registry
    answers `getattr(cls, attribute)` (with `own`: `cls.__dict__.get(attribute, default)`, the class's own
    declaration, not inherited; `default` hashable), read from the files' syntax where they declare it as data."""
    key = (kind, attribute, own, default, _plugin_stamps())
    try:
        return _read(*key)
    except Unreadable:
        return _imported(*key)


@functools.cache
def _read(kind: str, attribute: str, own: bool, default: Any, plugins: tuple) -> dict[str, Any]:
    del plugins  # the cache's key: other plug-in files, or the same changed
    found: dict[str, Any] = {}
    for source, cls in _plugin_classes(kind):
        name = _attribute(source, cls, "name", False)
        if not name:
            continue
        if name in found:  # two plug-ins of one name: the registry's own error says which
            raise Unreadable(name)
        found[name] = _attribute(source, cls, attribute, own, default)
    return dict(sorted(found.items()))


@functools.cache
def _imported(kind: str, attribute: str, own: bool, default: Any, plugins: tuple) -> dict[str, Any]:
    del plugins
    registry = importlib.import_module(KINDS[kind][0][0]).registry()
    return {name: cls.__dict__.get(attribute, default) if own else getattr(cls, attribute)
            for name, cls in registry.items()}


def _plugin_stamps() -> tuple[tuple[str, int, int], ...]:
    """Every file of the `$BENCH_PLUGINS` folders with its change time and size: what the answers are cached on."""
    stamps = []
    for folder in filter(None, os.environ.get(PLUGINS_ENV, "").split(os.pathsep)):
        for file in sorted(Path(folder).expanduser().absolute().glob("*.py")):
            stat = file.stat()
            stamps.append((str(file), stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


def _plugin_classes(kind: str) -> list[tuple[_Source, ast.ClassDef]]:
    """The classes the registry of `kind` would register (with or without a `name`), each with its module."""
    (base_module, base_name), places = KINDS[kind]
    sources = []
    for place in places:
        spec = importlib.util.find_spec(place)
        sources.append(_module(place))
        if spec.submodule_search_locations:  # a package: its modules
            sources += [_module(f"{place}.{m.name}") for m in pkgutil.iter_modules(spec.submodule_search_locations)]
    sources += [_parse(plugin_module_name(file), file) for file in plugin_files((base_module, *places))]
    return [(source, cls) for source in sources for cls in source.classes.values()
            if _subclasses(source, cls, (base_module, base_name))]


@functools.cache
def _module(name: str) -> _Source:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise Unreadable(name)
    return _parse(name, Path(spec.origin))


def _parse(name: str, file: Path) -> _Source:
    stat = file.stat()
    return _parsed(name, file, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parsed(name: str, file: Path, *stamp: int) -> _Source:
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError):  # the import says what is wrong, in the registry's words
        raise Unreadable(str(file)) from None
    source = _Source(name)
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    source.imports[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    source.imports[top] = (top, None)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [module]).strip(".")
            for alias in node.names:
                source.imports[alias.asname or alias.name] = (module, alias.name)
        elif isinstance(node, ast.ClassDef):
            source.classes[node.name] = node
        else:
            source.values.update(_bindings(node))
    return source


def _class(source: _Source, expr: ast.expr) -> tuple[_Source, ast.ClassDef] | None:
    """The class a base expression names: (its module, its definition); None for a class outside bench (torch's,
    the standard library's: never a subclass of a bench interface); Unreadable where the syntax does not tell."""
    if isinstance(expr, ast.Name):
        if expr.id in source.classes:
            return source, source.classes[expr.id]
        if expr.id in source.imports:
            module, attribute = source.imports[expr.id]
            return _imported_class(module, attribute) if attribute else None
        if expr.id == "object":
            return None
    elif isinstance(expr, ast.Attribute):  # module.Class, package.module.Class
        path, root = [], expr
        while isinstance(root, ast.Attribute):
            path, root = [root.attr, *path], root.value
        if isinstance(root, ast.Name) and root.id in source.imports:
            module, attribute = source.imports[root.id]
            dotted = ".".join([module, *([attribute] if attribute else []), *path[:-1]])
            return _imported_class(dotted, path[-1])
    raise Unreadable(ast.dump(expr))


def _imported_class(module: str, name: str) -> tuple[_Source, ast.ClassDef] | None:
    if module.split(".")[0] != "bench":
        return None
    source = _module(module)
    if name in source.classes:
        return source, source.classes[name]
    if name in source.imports:  # a name the module imports in its turn
        module, attribute = source.imports[name]
        return _imported_class(module, attribute) if attribute else None
    raise Unreadable(f"{module}.{name}")


def _bases(source: _Source, cls: ast.ClassDef) -> list[tuple[_Source, ast.ClassDef]]:
    return [found for base in cls.bases if (found := _class(source, base)) is not None]


def _mro(source: _Source, cls: ast.ClassDef) -> list[tuple[_Source, ast.ClassDef]]:
    """The classes an attribute is looked up in, in Python's order (C3), those outside bench left out."""
    lines = [_mro(*base) for base in _bases(source, cls)]
    lines.append(_bases(source, cls))
    out = [(source, cls)]
    while any(lines):
        for line in lines:
            head = line[0] if line else None
            if head and not any(_key(head) in map(_key, other[1:]) for other in lines):
                break
        else:
            raise Unreadable(f"{cls.name}: no consistent method resolution order")
        out.append(head)
        lines = [[c for c in line if _key(c) != _key(head)] for line in lines]
    return out


def _key(entry: tuple[_Source, ast.ClassDef]) -> tuple[str, str]:
    return entry[0].name, entry[1].name


def _subclasses(source: _Source, cls: ast.ClassDef, base: tuple[str, str]) -> bool:
    return any(_key(entry) == base for entry in _mro(source, cls)[1:])


def _attribute(source: _Source, cls: ast.ClassDef, attribute: str, own: bool, default: Any = None) -> Any:
    for where, body in _mro(source, cls)[:1] if own else _mro(source, cls):
        if body.decorator_list or body.keywords:  # a decorator or a metaclass may set what the body does not say
            raise Unreadable(body.name)
        value = _body_value(where, body, attribute)
        if value is not _MISSING:
            return value
    if own:
        return default
    raise Unreadable(f"{cls.name}.{attribute}")


def _body_value(source: _Source, cls: ast.ClassDef, attribute: str) -> Any:
    """The attribute as the class body leaves it (its last binding), _MISSING where the body binds none."""
    names: dict[str, ast.expr | None] = {}
    for node in cls.body:
        names.update(_bindings(node))
    if attribute not in names:
        return _MISSING
    if names[attribute] is None:
        raise Unreadable(f"{cls.name}.{attribute} is not declared as data")
    return _Evaluator(source, names).value(names[attribute])


def _bindings(node: ast.stmt) -> list[tuple[str, ast.expr | None]]:
    """The names a statement binds, each with the expression of its value (None: not a declaration's: a function,
    a loop's variable, an augmented assignment, an unpacking this reader does not follow)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, None)]
    if isinstance(node, ast.AnnAssign):
        return [(node.target.id, node.value)] if isinstance(node.target, ast.Name) and node.value else []
    if isinstance(node, ast.Assign):
        out: list[tuple[str, ast.expr | None]] = []
        for target in node.targets:
            if isinstance(target, ast.Name):
                out.append((target.id, node.value))
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(node.value.elts) and all(isinstance(t, ast.Name) for t in target.elts):
                out += [(t.id, v) for t, v in zip(target.elts, node.value.elts, strict=True)]
            else:
                out += [(n.id, None) for n in ast.walk(target) if isinstance(n, ast.Name)]
        return out
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [((a.asname or a.name).split(".")[0], None) for a in node.names]
    return [(n.id, None) for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


@dataclass
class _Evaluator:
    """The value of a declaration's expression: literals, the class's and the module's names, calls into `SAFE`."""

    source: _Source
    names: dict[str, ast.expr | None]  # the class body's names, before the module's

    def value(self, node: ast.expr | None) -> Any:
        if node is None:
            raise Unreadable("a name bound, but not as data")
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.value(e) for e in node.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.JoinedStr):
            return "".join(self._formatted(part) for part in node.values)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](self.value(node.left), self.value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](self.value(node.operand))
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Attribute):
            return self._safe_attribute(self.value(node.value), node.attr)
        if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args) \
                and all(k.arg for k in node.keywords):
            function = self.value(node.func)
            if not callable(function) or getattr(function, "__module__", "") not in SAFE:
                raise Unreadable(ast.dump(node.func))
            return function(*map(self.value, node.args), **{k.arg: self.value(k.value) for k in node.keywords})
        raise Unreadable(ast.dump(node)[:200])

    def _formatted(self, part: ast.expr) -> str:
        if isinstance(part, ast.Constant):
            return str(part.value)
        if not isinstance(part, ast.FormattedValue):
            raise Unreadable(ast.dump(part))
        value = self.value(part.value)
        value = {-1: value, 115: str(value), 114: repr(value), 97: ascii(value)}[part.conversion]
        return format(value, self._formatted(part.format_spec) if part.format_spec else "")

    def _name(self, name: str) -> Any:
        if name in self.names:  # the class body's own, then without it: `x = x + 1` in a body reads the module's x
            rest = dict(self.names)
            return _Evaluator(self.source, rest).value(rest.pop(name))
        if name in self.source.values:
            return _Evaluator(self.source, {}).value(self.source.values[name])
        if name in self.source.imports:
            module, attribute = self.source.imports[name]
            if attribute is None:
                return _safe_module(module)
            if module in SAFE:
                return getattr(importlib.import_module(module), attribute)
            if module.split(".")[0] == "bench":  # a constant of another bench file, read from its syntax
                other = _module(module)
                if attribute in other.values:
                    return _Evaluator(other, {}).value(other.values[attribute])
        raise Unreadable(name)

    @staticmethod
    def _safe_attribute(value: Any, attribute: str) -> Any:
        if isinstance(value, types.ModuleType) and value.__name__ in SAFE:
            return getattr(value, attribute)
        raise Unreadable(attribute)


def _safe_module(module: str) -> Any:
    if module in SAFE:
        return importlib.import_module(module)
    raise Unreadable(module)
