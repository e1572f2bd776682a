"""Reading an experiment file: strict YAML, the command line's overrides, the name a changed grid gets.

Reading an experiment file: strict and bounded YAML (a key given twice is an error; `1e-4` is a number; the nesting
and what aliases repeat are bounded), the command line's changes to it (`--methods`, `--seeds`, `--set`:
`Overrides`), and the name a changed grid gets. The schema itself is `bench.grid.experiment`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.config import UserError, read_text_file
from bench.grid.experiment import Experiment, check_names, parse_experiment
from bench.schema import GRID_LIMIT

# An experiment file is a few levels deep and writes its values out: a document nested deeper, or whose aliases repeat
# more values than this, is refused while it is read (a "billion laughs" of nine aliases a level in `description`
# grew the driver to 4 GB; `r:` nested 20,000 deep was a 3,000-line RecursionError).
YAML_DEPTH = 50
YAML_ALIAS_BUDGET = 100_000


class TooLarge(yaml.MarkedYAMLError):
    """A document over the loader's bounds (`YAML_DEPTH`, `YAML_ALIAS_BUDGET`): valid YAML, but not read."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-4` (no dot) as a string; learning rates are written that way, so read it as a float.
    Bounded while nodes are composed, before any value is built: each node's size as its aliases expand it is counted
    bottom-up, an alias adds its node's size to the budget."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth, self.aliased = 0, 0
        self.sizes: dict[int, int] = {}  # id(node) -> its values, aliases expanded, once the node is complete

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.CollectionNode) and id(node) not in self.sizes:
                raise TooLarge(None, None, "an alias refers to a node that holds it (an endless value)", mark)
            self.aliased += self.sizes.get(id(node), 1)
            if self.aliased > YAML_ALIAS_BUDGET:
                raise TooLarge(None, None, f"its aliases repeat more than {YAML_ALIAS_BUDGET:,} values in all (an "
                               "alias bomb?); write the values out", mark)
            return node
        self.depth += 1
        if self.depth > YAML_DEPTH:
            raise TooLarge(None, None, f"nested more than {YAML_DEPTH} levels deep; an experiment file is a few "
                           "levels deep", self.peek_event().start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        sizes = self.sizes  # a scalar counts 1 and is not recorded: the 200,000 values of a long list stay cheap
        if isinstance(node, yaml.SequenceNode):
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            sizes[id(node)] = 1 + sum(sizes.get(id(key), 1) + sizes.get(id(value), 1) for key, value in node.value)
        return node


def _unique_keys(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    """A mapping that names a key twice is an error, not "the last one wins"."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def yaml_problem(error: yaml.YAMLError) -> tuple[str, str]:
    """Where a YAML error is (", line L, column C", 1-based, or "") and what it is, in one line: PyYAML's own text names
    its input "<unicode string>" and spreads over several lines with a caret under the fault."""
    if isinstance(error, TooLarge):
        return f", line {error.problem_mark.line + 1}, column {error.problem_mark.column + 1}", error.problem
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return "", " ".join(str(error).split())
    mark = error.problem_mark
    what = " ".join(str(error.problem).split())
    if error.context and error.context_mark is not None:
        context = error.context_mark
        what += f" ({' '.join(error.context.split())} at line {context.line + 1}, column {context.column + 1})"
    return f", line {mark.line + 1}, column {mark.column + 1}", what


def parse_yaml(text: str, path: str | Path) -> Any:
    """An experiment file's `text` as YAML; `path` names it in the one-line error."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        where, what = yaml_problem(e)
        raise UserError(f"{path}{where}: {'' if isinstance(e, TooLarge) else 'not valid YAML: '}{what}") from None


@dataclass(frozen=True)
class Overrides:
    """Command-line changes to an experiment file: `--methods A,B` (those methods: the file's settings where it has
    them, the defaults otherwise), `--seeds 0,1` (a list of seeds) and `--set KEY=VALUE` (a dotted key into the
    file's mapping, the value in YAML as the file would write it). Applied in that order."""

    sets: tuple[str, ...] = ()
    methods: str | None = None
    seeds: str | None = None

    def flags(self) -> list[str]:
        return (([f"--methods {self.methods}"] if self.methods is not None else [])
                + ([f"--seeds {self.seeds}"] if self.seeds is not None else []) + [f"--set {s}" for s in self.sets])

    def names(self) -> bool:
        """Whether `--set name=...` names the grid."""
        return any(item.partition("=")[0].strip() == "name" for item in self.sets)

    def apply(self, data: Any) -> Any:
        """The file's mapping with the changes made (a new mapping; `data` is left as it was)."""
        if not self.flags() or not isinstance(data, dict):
            return data
        data = json.loads(json.dumps(data, default=str))  # a deep copy of plain YAML values
        names: list[str] = []
        if self.methods is not None:
            names = [m.strip() for m in self.methods.split(",")]
            if not all(names) or len(set(names)) != len(names):
                raise UserError(f"--methods {self.methods!r}: expected distinct method names separated by commas, "
                                "e.g. --methods dmi,ce")
            given = data.get("methods") if isinstance(data.get("methods"), dict) else {}
            data["methods"] = {m: given.get(m) or {} for m in names}
        if self.seeds is not None:
            data["seeds"] = _yaml_value(f"--seeds {self.seeds}", f"[{self.seeds}]")
        for item in self.sets:
            key, sep, text = item.partition("=")
            parts = key.strip().split(".")
            if not sep or not all(parts):
                raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set r=[0.2,0.4] or "
                                "--set methods.dmi.lr=1e-5")
            if self.methods is not None and parts[0] == "methods" and (len(parts) < 2 or parts[1] not in names):
                what = f"method {parts[1]}" if len(parts) > 1 else "the methods"
                raise UserError(f"--set {item}: changes {what}, which --methods {self.methods} leaves out; add it to "
                                "--methods, or drop this --set")
            _set_path(data, parts, _yaml_value(f"--set {item}", text))
        return data


def _yaml_value(flag: str, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        where, what = yaml_problem(e)
        raise UserError(f"{flag}: the value{'' if isinstance(e, TooLarge) else ' is not valid YAML'}{where}: "
                        f"{what}") from None


def _set_path(data: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set `a.b.c` in nested mappings, making the missing ones (the schema then checks every key, so a new method
    or a misspelt key is named there as it would be in the file)."""
    node = data
    for depth, part in enumerate(parts[:-1]):
        if node.get(part) is None:
            node[part] = {}
        if not isinstance(node[part], dict):
            raise UserError(f"--set {'.'.join(parts)}: {'.'.join(parts[:depth + 1])} is {node[part]!r}, not a "
                            "mapping of keys")
        node = node[part]
    node[parts[-1]] = value


def load_experiment(path: str | Path, registries: bool = True, overrides: Overrides | None = None) -> Experiment:
    """Read, validate and (with `registries`) check the names of an experiment file, with command-line
    `overrides` applied first (the changed grid gets its own name unless `--set name=` gives one)."""
    text = read_text_file(Path(path), "experiment file")
    data = parse_yaml(text, path)
    flags = overrides.flags() if overrides else []
    if not flags:
        exp = dataclasses.replace(parse_experiment(data, source=str(path)), text=text)
    else:
        changed = overrides.apply(data)
        exp = parse_experiment(changed, source=f"{path} with {' '.join(flags)}")
        try:
            base: Experiment | None = parse_experiment(data, source=str(path))
        except UserError:  # the overrides mended the file
            base = None
        grid = _grid_digest(exp, changed)
        if base is None or grid != _grid_digest(base, data):  # resources, max_concurrent, device: no trial changes
            base_name = str(data.get("name"))
            if not overrides.names():
                changed = {**changed, "name": f"{base_name}-{grid[:8]}"}
            text = (f"# {path} {' '.join(flags)}\n"
                    + yaml.safe_dump(changed, sort_keys=False, default_flow_style=None, allow_unicode=True))
            exp = dataclasses.replace(exp, name=changed["name"], overrides=tuple(flags), base_name=base_name,
                                      text=text)
    if registries:
        check_names(exp)
    return exp


def _grid_digest(exp: Experiment, data: dict[str, Any]) -> str:
    """What the grid trains: its trials' identities (a grid too large to expand: its file's mapping)."""
    if exp.size() <= GRID_LIMIT:
        text = " ".join(sorted(t.trial_id for t in exp.trials()))
    else:
        text = json.dumps({**data, "name": None, "description": None}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
