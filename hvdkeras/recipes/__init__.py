"""YAML training recipes: one file describes a whole distributed training run.

    hvdkeras validate recipes/digits.yaml
    hvdkeras train recipes/digits.yaml --np 2 --set training.epochs=5
    hvdkeras recipes                       # the bundled ones

`load_recipe` reads, overrides and validates a recipe (schema version 1,
see `hvdkeras.recipes.schema`) and raises `RecipeError` listing every problem
as `file:line: field.path: what is wrong`. The training itself runs on every
rank through `python -m hvdkeras.recipes.run RECIPE`.

The modules, from the YAML up:
* `yaml_source` (parsing with line numbers, `--set` overrides), `spec` (a
  small declarative validator), `schema`, `schema_data`, `schema_optimizer`
  (the fields), `validation` (a whole recipe, with defaults) and `paths`:
  pure Python, no TensorFlow.
* `resolve`: checks against the installed Keras and files, before launch
  (`resolve_keras` and its cached `keras_catalog`, `data_checks`).
* `launching`: the ranks' command and engine variables, and the launch.
* On each rank: `run` (entry point) -> `training` (the run), with `data`
  and `data_files` (input pipelines), `models`, `keras_objects`
  (optimizers, losses, metrics, learning rate from `lr_plan`),
  `run_callbacks` and `summary`.

What may import it: the CLI and the top-level package. Importing it imports
no TensorFlow; `load_recipe(environment=True)` imports Keras only to make
the catalogue of Keras names, or for names the catalogue does not hold.
"""

from __future__ import annotations

from pathlib import Path as _FsPath
from typing import Dict, Optional, Sequence, Tuple

from hvdkeras.recipes.schema import SCHEMA_VERSION
from hvdkeras.recipes.spec import Issue
from hvdkeras.recipes.validation import RecipeError, format_issues, validate
from hvdkeras.recipes.yaml_source import Document, SourceError, apply_overrides, load_file

BUNDLED_DIR = _FsPath(__file__).resolve().parent / "bundled"


def bundled_recipes() -> Dict[str, _FsPath]:
    """Name -> path of the recipes shipped inside the package."""
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.yaml"))}


def find_recipe(name_or_path: str) -> str:
    """A recipe file path; a bare bundled name (e.g. `digits`) also works."""
    path = _FsPath(name_or_path)
    if path.exists():
        return str(path)
    bundled = bundled_recipes()
    key = path.stem if path.suffix in (".yaml", ".yml") and len(path.parts) == 1 else name_or_path
    if key in bundled:
        return str(bundled[key])
    return str(path)


def load_recipe(path: str, overrides: Sequence[str] = (), environment: bool = True,
                cwd: Optional[str] = None, world_size: Optional[int] = None
                ) -> Tuple[dict, Document]:
    """Reads, overrides and validates a recipe.

    Args:
        path: The recipe file (or a bundled recipe's name).
        overrides: `key.path=value` texts, applied in order.
        environment: Also check names and files against this environment
            (imports Keras; see `hvdkeras.recipes.resolve`).
        cwd: Where relative output paths point (default: the current dir).
        world_size: The number of ranks it will run on, when known: a
            per-rank batch that a rank's shard cannot fill is then an error.

    Returns:
        (the normalized recipe, the parsed document).

    Raises:
        RecipeError: with every problem found.
    """
    path = find_recipe(path)
    try:
        doc = load_file(path)
        apply_overrides(doc, overrides)
    except SourceError as error:
        raise RecipeError([Issue(error.location, (), error.message)]) from None
    recipe, issues = validate(doc, recipe_path=path, cwd=cwd)
    if not issues and environment:
        from hvdkeras.recipes.resolve import resolve  # lazy: may import Keras, see above

        issues = resolve(recipe, doc, world_size)
    if issues:
        raise RecipeError(issues)
    return recipe, doc


__all__ = ["BUNDLED_DIR", "Document", "Issue", "RecipeError", "SCHEMA_VERSION",
           "bundled_recipes", "find_recipe", "format_issues", "load_recipe"]
