"""Reading a recipe: YAML with the line of every key kept, and `--set` overrides.

Pure Python (PyYAML only): no TensorFlow, no MPI.

PyYAML implements YAML 1.1, which has quirks that bite configuration files:

* `1e-3` (no dot) is a *string*, not a float. The loader here adds a resolver
  so that exponent notation without a dot reads as a float.
* `yes`/`no`/`on`/`off` are booleans and `1:30` is the integer 90. The raw
  text of every plain scalar is kept, so a field that wants a string (say
  `mode: off`) gets the text back instead of a boolean.

Hostile input is bounded: at most 1 MiB of text, at most 100,000 values once
aliases are expanded, and no explicit tags at all (each refused with its line).

Every value is addressed by its *path*, a tuple of keys and list indices such
as `("optimizer", "schedule", "name")`; `Document.location(path)` says where
that value came from: `recipe.yaml:12` or `--set optimizer.learning_rate=0.1`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

Path = Tuple[Any, ...]

# Exponent notation that YAML 1.1 leaves as a string: 1e-3, 5E4, 2.5e3, .5e-2.
_EXPONENT_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"
)


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-3` style numbers as floats."""


RecipeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT,
                                   list("-+0123456789."))


class SourceError(Exception):
    """The text is not valid YAML (or not a mapping); carries a location."""

    def __init__(self, location: str, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location
        self.message = message


@dataclasses.dataclass
class Document:
    """A recipe's values plus where each one came from.

    Attributes:
        data: The plain values (dicts, lists, scalars).
        filename: The file name used in messages.
        lines: 1-based line of each path that appears in the file.
        raw: The source text of each plain (unquoted) scalar, by path.
        origins: For paths set on the command line, the `--set` text.
        duplicates: Problems found while reading that validation reports
            (duplicate keys), as (path, message).
    """

    data: Any
    filename: str
    lines: Dict[Path, int] = dataclasses.field(default_factory=dict)
    raw: Dict[Path, str] = dataclasses.field(default_factory=dict)
    origins: Dict[Path, str] = dataclasses.field(default_factory=dict)
    duplicates: List[Tuple[Path, str]] = dataclasses.field(default_factory=list)
    values: int = 0  # values converted so far, against MAX_VALUES

    def location(self, path: Path) -> str:
        """`file:line` or `--set ...` for `path` (or its nearest known parent)."""
        path = tuple(path)
        if path not in self.lines and path not in self.origins:
            for origin_path, origin in self.origins.items():  # a key --set created
                if origin_path[:len(path)] == path:
                    return origin
        for end in range(len(path), -1, -1):
            prefix = tuple(path[:end])
            if prefix in self.origins:
                return self.origins[prefix]
            if prefix in self.lines:
                return f"{self.filename}:{self.lines[prefix]}"
        return f"{self.filename}:1"

    def raw_text(self, path: Path) -> Optional[str]:
        """The plain-scalar source text at `path`, if it came from YAML."""
        return self.raw.get(tuple(path))


def _scalar_key(node: yaml.Node, loader: RecipeLoader, where: str) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise SourceError(f"{where}:{node.start_mark.line + 1}",
                          "a mapping key must be a plain name, not a list or mapping")
    # The text as written: `on:` or `1:` stay the names "on" and "1".
    return str(node.value)


def _convert(node: yaml.Node, loader: RecipeLoader, path: Path, doc: Document,
             active: set) -> Any:
    doc.values += 1
    if doc.values > MAX_VALUES:
        raise SourceError(f"{doc.filename}:{node.start_mark.line + 1}",
                          f"the recipe expands to more than {MAX_VALUES} values; aliases "
                          "(*name) that repeat anchors inside anchors multiply, and a recipe "
                          "never needs that many")
    if isinstance(node, yaml.ScalarNode):
        if node.style is None:
            doc.raw[path] = node.value
        try:
            return loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as error:
            raise SourceError(f"{doc.filename}:{node.start_mark.line + 1}",
                              str(error.problem or error)) from None
    if id(node) in active:
        raise SourceError(f"{doc.filename}:{node.start_mark.line + 1}",
                          "a recursive alias (an anchor that contains itself)")
    active = active | {id(node)}
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, child in enumerate(node.value):
            doc.lines[path + (index,)] = child.start_mark.line + 1
            items.append(_convert(child, loader, path + (index,), doc, active))
        return items
    if isinstance(node, yaml.MappingNode):
        try:
            loader.flatten_mapping(node)  # `<<: *base` merge keys
        except yaml.constructor.ConstructorError as error:
            raise SourceError(f"{doc.filename}:{node.start_mark.line + 1}",
                              str(error.problem or error)) from None
        result: Dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar_key(key_node, loader, doc.filename)
            child_path = path + (key,)
            if key in result:
                doc.duplicates.append((child_path, (
                    f"duplicate key (also on line {doc.lines[child_path]}); "
                    "YAML would silently keep only the last one")))
            doc.lines[child_path] = key_node.start_mark.line + 1
            result[key] = _convert(value_node, loader, child_path, doc, active)
        return result
    raise SourceError(f"{doc.filename}:{node.start_mark.line + 1}",  # pragma: no cover
                      f"unsupported YAML node {type(node).__name__}")


# Limits that keep a hostile recipe from costing time or memory: a recipe is
# a page of settings, so both are far above any real one.
MAX_RECIPE_BYTES = 1 << 20
MAX_VALUES = 100_000  # values after aliases are expanded (an alias bomb has billions)

# Contexts in which PyYAML's context mark, not its problem mark, is where the
# mistake is: the problem is only noticed on a later line (a key missing its
# ':', an unclosed quote or bracket).
_CONTEXT_IS_THE_MISTAKE = ("while scanning a simple key", "while scanning a quoted scalar",
                           "while scanning a double-quoted scalar", "while parsing a flow")


def _syntax_error(error: yaml.MarkedYAMLError, filename: str) -> SourceError:
    problem = error.problem or "invalid YAML"
    mark = error.problem_mark or error.context_mark
    if (error.context_mark is not None and error.context
            and error.context.startswith(_CONTEXT_IS_THE_MISTAKE)):
        mark = error.context_mark
        if error.problem_mark is not None and error.problem_mark.line != mark.line:
            problem = f"{problem} (noticed on line {error.problem_mark.line + 1})"
    if error.context:
        problem = f"{error.context}, {problem}"
    line = mark.line + 1 if mark is not None else 1
    return SourceError(f"{filename}:{line}", f"YAML syntax error: {problem}")


def _reject_tags(text: str, filename: str) -> None:
    """Refuses every explicit YAML tag (`!!python/...`, `!!str`, `!custom`) with its line.

    A safe loader refuses unknown tags on plain values but would drop a tag on
    a mapping or list without a word; a recipe never needs one.
    """
    scanner = RecipeLoader(text)
    try:
        while True:
            token = scanner.get_token()
            if token is None or isinstance(token, yaml.StreamEndToken):
                return
            if isinstance(token, yaml.TagToken):
                handle, suffix = token.value
                raise SourceError(f"{filename}:{token.start_mark.line + 1}",
                                  f"YAML tags such as '{handle or ''}{suffix}' are not allowed in "
                                  "a recipe; write the plain value (a recipe names what to build, "
                                  "it never constructs Python objects)")
    finally:
        scanner.dispose()


def _compose(text: str, filename: str) -> Tuple[Optional[yaml.Node], RecipeLoader]:
    if len(text.encode("utf-8", "replace")) > MAX_RECIPE_BYTES:
        raise SourceError(f"{filename}:1", f"the recipe is larger than {MAX_RECIPE_BYTES >> 20} "
                          "MiB; a recipe holds settings, and data belongs in data files")
    try:
        _reject_tags(text, filename)
        loader = RecipeLoader(text)
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        raise _syntax_error(error, filename) from None
    except yaml.YAMLError as error:
        raise SourceError(f"{filename}:1", f"YAML error: {error}") from None
    return node, loader


def parse_text(text: str, filename: str = "<recipe>") -> Document:
    """Parses recipe text into a `Document` (the top level must be a mapping).

    Raises:
        SourceError: on YAML syntax errors, unknown tags or a top level that
            is not a mapping, with the line.
    """
    node, loader = _compose(text, filename)
    doc = Document(data=None, filename=filename)
    try:
        if node is None:
            raise SourceError(f"{filename}:1", "the recipe is empty; it needs at least "
                              "'version: 1' and a 'model' section")
        data = _convert(node, loader, (), doc, set())
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SourceError(f"{filename}:{node.start_mark.line + 1}",
                          f"a recipe must be a mapping of sections (version, model, data, ...), "
                          f"got {type(data).__name__}")
    doc.data = data
    return doc


def load_file(path: str) -> Document:
    """Reads and parses the recipe file at `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as error:
        raise SourceError(str(path), f"cannot read the recipe: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise SourceError(str(path), "cannot read the recipe: it is not UTF-8 text") from None
    return parse_text(text, filename=str(path))


# --------------------------------------------------------------------------
# --set key.path=value
# --------------------------------------------------------------------------


def _kind_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else type(value).__name__


def parse_override(text: str) -> Tuple[Path, Any, Dict[Path, str]]:
    """Splits `key.path=value` into (path, value, raw texts relative to path).

    The value is read as YAML (with the same quirk fixes), so `--set
    data.batch_size=64`, `--set optimizer.learning_rate=1e-3`, `--set
    training.metrics=[accuracy]` and `--set checkpoint=null` all work.
    Numeric path parts index lists: `training.metrics.0=mae`.

    Raises:
        SourceError: located at `--set text`.
    """
    where = f"--set {text}"
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SourceError(where, "expected KEY.PATH=VALUE, e.g. --set data.batch_size=64")
    parts = key.split(".")
    if any(not part for part in parts):
        raise SourceError(where, f"{key!r} is not a valid key path (empty part)")
    path: Path = tuple(int(p) if p.isdigit() else p for p in parts)
    if value_text.strip() == "":
        return path, "", {}
    try:
        node, loader = _compose(value_text, where)
    except SourceError as error:
        raise SourceError(where, error.message) from None
    doc = Document(data=None, filename=where)
    try:
        value = _convert(node, loader, (), doc, set()) if node is not None else None
    finally:
        loader.dispose()
    return path, value, doc.raw


def apply_overrides(doc: Document, overrides: Sequence[str]) -> None:
    """Applies `--set` texts to `doc` in order (later ones win).

    Intermediate mappings are created as needed; setting inside a value that
    is not a mapping (or a list index out of range) is an error.

    Raises:
        SourceError: located at the offending `--set`.
    """
    for text in overrides:
        where = f"--set {text}"
        path, value, raw = parse_override(text)
        target = doc.data
        actual: list = []
        for depth, part in enumerate(path[:-1]):
            here = ".".join(map(str, path[:depth + 1]))
            if isinstance(target, dict):
                if isinstance(part, int):
                    part = str(part)
                actual.append(part)
                if target.get(part) is None:
                    target[part] = {}
                target = target[part]
            elif isinstance(target, list) and isinstance(part, int):
                if part >= len(target):
                    raise SourceError(where, f"{here}: index {part} is out of range "
                                             f"(the list has {len(target)} items)")
                actual.append(part)
                target = target[part]
            else:
                raise SourceError(where, f"{here} is {_kind_name(target)}, not a mapping; "
                                         f"cannot set {'.'.join(map(str, path))}")
        last = path[-1]
        if isinstance(target, dict):
            target[str(last)] = value
            path = tuple(actual) + (str(last),)
        elif isinstance(target, list) and isinstance(last, int):
            if last >= len(target):
                raise SourceError(where, f"index {last} is out of range "
                                         f"(the list has {len(target)} items)")
            target[last] = value
            path = tuple(actual) + (last,)
        else:
            raise SourceError(where, f"{'.'.join(map(str, path[:-1]))} is {_kind_name(target)}, "
                                     f"not a mapping; cannot set {'.'.join(map(str, path))}")
        # The new value replaces whatever the file said under this path.
        for table in (doc.lines, doc.raw, doc.origins):
            for known in [p for p in table if p[:len(path)] == path]:
                del table[known]
        doc.origins[path] = where
        for sub, text_value in raw.items():
            doc.raw[path + sub] = text_value
