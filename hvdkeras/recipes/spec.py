"""A small declarative validator for nested configuration values.

Pure Python: no TensorFlow, no MPI. Each spec checks one value, reports
problems with the value's path, and returns the value normalized (defaults
filled in, YAML 1.1 quirks undone) or `INVALID`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hvdkeras.recipes.yaml_source import Document, Path


class _Invalid:
    def __repr__(self) -> str:
        return "INVALID"


INVALID: Any = _Invalid()

# A "package.module:function" reference to user code.
MODULE_FUNCTION = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_NO_DEFAULT: Any = object()


def dotted(path: Path) -> str:
    """`("data", "validation", "split")` -> `data.validation.split`; lists as `[0]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(recipe)"


@dataclasses.dataclass(frozen=True)
class Issue:
    """One problem: where (file:line or --set), which field, what is wrong."""

    location: str
    path: Path
    message: str

    def __str__(self) -> str:
        if not self.path:
            return f"{self.location}: {self.message}"
        return f"{self.location}: {dotted(self.path)}: {self.message}"


class Context:
    """Collects issues; knows the document for locations and raw texts."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.issues: List[Issue] = []

    def error(self, path: Path, message: str) -> None:
        self.issues.append(Issue(self.doc.location(path), tuple(path), message))

    def raw(self, path: Path) -> Optional[str]:
        return self.doc.raw_text(path)

    def value_at(self, path: Path) -> Any:
        """The value as written at `path` (before defaults), or None."""
        node = self.doc.data
        for part in path:
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                return None
        return node


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest candidate, or ``."""
    candidates = list(candidates)
    lowered = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.5)
    return f" (did you mean {lowered[match[0]]!r}?)" if match else ""


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value:g}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class Spec:
    """Base class: `check` returns the normalized value or INVALID."""

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        raise NotImplementedError

    def _wrong(self, value: Any, path: Path, ctx: Context) -> Any:
        ctx.error(path, f"expected {self.describe()}, got {_kind(value)}")
        return INVALID


def _number(value: float) -> str:
    """12, 0.5, 1e-06: whole numbers without exponent or decimals."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return f"{value:g}"


def _bounds_text(low, high, low_open, high_open) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_number(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_number(high)}")
    return " and ".join(parts)


class Int(Spec):
    """A whole number within [low, high]. Integral floats (1e3) are accepted;
    strings are not (a quoted "64" stays a string, e.g. a column name)."""

    def __init__(self, low: Optional[int] = None, high: Optional[int] = None,
                 what: str = "an integer") -> None:
        self.low, self.high, self.what = low, high, what

    def describe(self) -> str:
        bounds = _bounds_text(self.low, self.high, False, False)
        return f"{self.what} {bounds}".strip()

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            return self._wrong(value, path, ctx)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            ctx.error(path, f"{value} is out of range; expected {self.describe()}")
            return INVALID
        return value


class Float(Spec):
    """A finite number; YAML 1.1 strings such as '1e-3' are converted."""

    def __init__(self, low: Optional[float] = None, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def describe(self) -> str:
        bounds = _bounds_text(self.low, self.high, self.low_open, self.high_open)
        return f"a number {bounds}".strip()

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if isinstance(value, str):
            try:
                value = float(value.strip().replace("_", ""))
            except ValueError:
                return self._wrong(value, path, ctx)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self._wrong(value, path, ctx)
        value = float(value)
        if not math.isfinite(value):
            ctx.error(path, f"{value} is not allowed; expected {self.describe()}")
            return INVALID
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            ctx.error(path, f"{_number(value) if abs(value) >= 1 else f'{value:g}'} is out of "
                            f"range; expected {self.describe()}")
            return INVALID
        return value


class Bool(Spec):
    def describe(self) -> str:
        return "true or false"

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if isinstance(value, bool):
            return value
        return self._wrong(value, path, ctx)


class Str(Spec):
    """A string, optionally from `choices` (case-insensitive) or a pattern.

    A plain scalar that YAML 1.1 turned into a boolean or number (`off`,
    `1:30`) is given back as the text that was written.
    """

    def __init__(self, choices: Optional[Sequence[str]] = None, pattern: Optional[str] = None,
                 what: str = "a string", non_empty: bool = True) -> None:
        self.choices = list(choices) if choices is not None else None
        self.pattern = re.compile(pattern) if pattern else None
        self.what = what
        self.non_empty = non_empty

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return self.what

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if isinstance(value, (bool, int, float)) and ctx.raw(path) is not None:
            value = ctx.raw(path)
        if not isinstance(value, str):
            return self._wrong(value, path, ctx)
        if self.non_empty and not value.strip():
            ctx.error(path, f"is empty; expected {self.describe()}")
            return INVALID
        if self.choices is not None:
            for choice in self.choices:
                if value.lower() == choice.lower():
                    return choice
            ctx.error(path, f"{value!r} is not allowed{did_you_mean(value, self.choices)}; "
                            f"expected {self.describe()}")
            return INVALID
        if self.pattern is not None and not self.pattern.match(value):
            ctx.error(path, f"{value!r} is not {self.what}")
            return INVALID
        return value


class Nullable(Spec):
    """`None` or whatever `inner` accepts."""

    def __init__(self, inner: Spec) -> None:
        self.inner = inner

    def describe(self) -> str:
        return f"{self.inner.describe()}, or null"

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if value is None:
            return None
        return self.inner.check(value, path, ctx)


class Union(Spec):
    """The first of `options` that accepts the value (tried in order)."""

    def __init__(self, *options: Spec, what: Optional[str] = None) -> None:
        self.options = options
        self.what = what

    def describe(self) -> str:
        return self.what or " or ".join(o.describe() for o in self.options)

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        first_issues: Optional[List[Issue]] = None
        for option in self.options:
            trial = Context(ctx.doc)
            result = option.check(value, path, trial)
            if not trial.issues:
                return result
            if first_issues is None and _accepts_type(option, value):
                first_issues = trial.issues
        if first_issues:  # the value had a fitting type but a bad value: say why
            ctx.issues.extend(first_issues)
            return INVALID
        return self._wrong(value, path, ctx)


def _accepts_type(spec: Spec, value: Any) -> bool:
    if isinstance(spec, Nullable):
        return value is None or _accepts_type(spec.inner, value)
    if isinstance(spec, (Map, AnyMap)):
        return isinstance(value, dict)
    if isinstance(spec, ListOf):
        return isinstance(value, list)
    if isinstance(spec, Str):
        return isinstance(value, str)
    if isinstance(spec, Bool):
        return isinstance(value, bool)
    if isinstance(spec, (Int, Float)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


class ListOf(Spec):
    """A list of `item`; with `scalar_ok` a single item means a list of one."""

    def __init__(self, item: Spec, min_len: int = 0, max_len: Optional[int] = None,
                 scalar_ok: bool = False, what: Optional[str] = None) -> None:
        self.item, self.min_len, self.max_len = item, min_len, max_len
        self.scalar_ok = scalar_ok
        self.what = what

    def describe(self) -> str:
        if self.what:
            return self.what
        size = f" of at least {self.min_len}" if self.min_len else ""
        return f"a list{size} of {self.item.describe()}"

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if not isinstance(value, list):
            if self.scalar_ok and value is not None and not isinstance(value, dict):
                value = [value]
                items = [self.item.check(value[0], path, ctx)]
                return INVALID if INVALID in items else items
            return self._wrong(value, path, ctx)
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            ctx.error(path, f"has {len(value)} items; expected {self.describe()}")
            return INVALID
        items = [self.item.check(v, path + (i,), ctx) for i, v in enumerate(value)]
        return INVALID if any(i is INVALID for i in items) else items


class AnyMap(Spec):
    """A mapping with any keys and values (e.g. keyword arguments)."""

    def __init__(self, values: Optional[Spec] = None, what: str = "a mapping of name: value") -> None:
        self.values = values
        self.what = what

    def describe(self) -> str:
        return self.what

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            return self._wrong(value, path, ctx)
        if self.values is None:
            return copy.deepcopy(value)
        result = {k: self.values.check(v, path + (k,), ctx) for k, v in value.items()}
        return INVALID if any(v is INVALID for v in result.values()) else result


@dataclasses.dataclass
class Field:
    """A key of a `Map`: its spec, default and whether it must be given."""

    spec: Spec
    default: Any = None
    required: bool = False
    help: str = ""


class Map(Spec):
    """A mapping with known keys; unknown keys get a did-you-mean."""

    def __init__(self, fields: Dict[str, Field], what: str = "a mapping",
                 post: Optional[Callable[[dict, Path, Context], None]] = None) -> None:
        self.fields = fields
        self.what = what
        self.post = post

    def describe(self) -> str:
        return f"{self.what} with keys {', '.join(self.fields)}"

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            ctx.error(path, f"expected {self.what} (keys: {', '.join(self.fields)}), "
                            f"got {_kind(value)}")
            return INVALID
        result: Dict[str, Any] = {}
        ok = True
        for key, item in value.items():
            if key not in self.fields:
                ctx.error(path + (key,), f"unknown key{did_you_mean(key, self.fields)}; "
                                         f"allowed keys here: {', '.join(self.fields)}")
                ok = False
                continue
            checked = self.fields[key].spec.check(item, path + (key,), ctx)
            ok = ok and checked is not INVALID
            result[key] = checked
        for key, spec_field in self.fields.items():
            if key in value:
                continue
            if spec_field.required:
                ctx.error(path, f"missing required key {key!r} ({spec_field.spec.describe()})")
                ok = False
            elif spec_field.default is None:
                result[key] = None
            else:  # defaults go through the spec too (a section's own defaults and checks)
                checked = spec_field.spec.check(copy.deepcopy(spec_field.default), path + (key,), ctx)
                ok = ok and checked is not INVALID
                result[key] = checked
        if not ok:
            return INVALID
        result = {key: result[key] for key in self.fields if key in result}
        if self.post is not None:
            before = len(ctx.issues)
            self.post(result, path, ctx)
            if len(ctx.issues) > before:
                return INVALID
        return result


def given(doc_data: Any, path: Path) -> bool:
    """Whether `path` was written in the document (not filled by a default)."""
    node = doc_data
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return False
    return True


def require_one_of(value: dict, keys: Tuple[str, ...], path: Path, ctx: Context,
                   at_most: bool = False) -> Optional[str]:
    """Exactly one (or with `at_most`, at most one) of `keys` is set (not None)."""
    present = [k for k in keys if value.get(k) is not None]
    if len(present) > 1:
        ctx.error(path + (present[1],), f"set only one of {', '.join(keys)} "
                                        f"(found {' and '.join(present)})")
        return None
    if not present:
        if not at_most:
            ctx.error(path, f"needs one of {', '.join(keys)}")
        return None
    return present[0]
