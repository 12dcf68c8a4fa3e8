"""Validating a parsed recipe as a whole: the schema check, defaults that
depend on other values, and absolute paths. Pure Python (PyYAML only).

What may import this module: the rest of `hvdkeras.recipes` and the CLI.
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import List, Optional, Sequence, Tuple

from hvdkeras.recipes.paths import resolve_paths
from hvdkeras.recipes.schema import RECIPE
from hvdkeras.recipes.spec import INVALID, Context, Issue
from hvdkeras.recipes.yaml_source import Document


class RecipeError(Exception):
    """A recipe with problems; `issues` lists them (file:line: field: what)."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = list(issues)
        super().__init__(format_issues(self.issues))


def format_issues(issues: Sequence[Issue]) -> str:
    count = len(issues)
    head = f"the recipe has {count} problem{'s' if count != 1 else ''}:"
    return "\n".join([head] + [f"  {issue}" for issue in issues])


def validate(doc: Document, recipe_path: Optional[str] = None,
             cwd: Optional[str] = None) -> Tuple[Optional[dict], List[Issue]]:
    """Checks `doc` against schema version 1.

    Args:
        doc: The parsed recipe (with `--set` overrides applied).
        recipe_path: The recipe file; relative input paths (data.path,
            data.validation.path) are relative to its directory, and the
            name defaults to its stem.
        cwd: The directory output paths (checkpoint.dir, log files,
            engine.timeline) are relative to; default the current one.

    Returns:
        (the normalized recipe, []) or (None, the problems).
    """
    ctx = Context(doc)
    for path, message in doc.duplicates:
        ctx.error(path, message)
    result = RECIPE.check(doc.data, (), ctx)
    if ctx.issues or result is INVALID:
        return None, ctx.issues
    base = FsPath(recipe_path).resolve().parent if recipe_path else FsPath.cwd()
    if result["name"] is None:
        result["name"] = FsPath(recipe_path).stem if recipe_path else "recipe"
    if result["data"]["seed"] is None:
        result["data"]["seed"] = result["seed"]
    resolve_paths(result, base, FsPath(cwd) if cwd else FsPath.cwd())
    return result, []
