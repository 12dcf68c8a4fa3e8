"""The recipe schema as Markdown, made from the schema itself (`RECIPE`),
for the documentation site's schema page (docs/hooks/recipe_schema.py), so
the page cannot drift from what `hvdkeras validate` accepts. Pure.

What may import this module: the documentation build and tests.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

from hvdkeras.recipes.schema import RECIPE
from hvdkeras.recipes.spec import ListOf, Map, Nullable, Spec, Union


def _section(spec: Spec) -> Optional[Map]:
    """The mapping a field holds (itself, or inside null-or or a list)."""
    while True:
        if isinstance(spec, Map):
            return spec
        if isinstance(spec, Nullable):
            spec = spec.inner
        elif isinstance(spec, ListOf):
            spec = spec.item
        elif isinstance(spec, Union):
            maps = [o for o in spec.options if isinstance(o, Map)]
            return maps[0] if len(maps) == 1 else None
        else:
            return None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if value == {}:
        return "(its defaults)"
    return f"`{json.dumps(value)}`"


def _table(path: str, section: Map, out: List[str]) -> None:
    nested = []
    out += [f"### `{path}`" if path else "### The top level", "",
            "| key | value | default | meaning |", "|---|---|---|---|"]
    for key, field in section.fields.items():
        default = "**required**" if field.required else _default(field.default)
        child = _section(field.spec)
        kind = f"see [`{path + '.' if path else ''}{key}`](#{(path + key).replace('.', '')})" \
            if child is not None and child is not section else _cell(field.spec.describe())
        out.append(f"| `{key}` | {kind} | {default} | {_cell(field.help)} |")
        if child is not None and child is not section:
            nested.append((f"{path + '.' if path else ''}{key}", child))
    out.append("")
    for child_path, child in nested:
        _table(child_path, child, out)


def schema_markdown() -> str:
    """Every section of the recipe schema as Markdown tables, top level first.

    Example:

    >>> "| `version` |" in schema_markdown()
    True
    """
    out: List[str] = []
    _table("", RECIPE, out)
    return "\n".join(out)
