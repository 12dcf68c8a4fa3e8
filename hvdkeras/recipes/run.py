"""The per-rank training entry point: `python -m hvdkeras.recipes.run RECIPE`.

`hvdkeras train RECIPE --np N` starts N of these (through the launcher);
started by hand it works the same:

    mpiexec -n 2 python -m hvdkeras.recipes.run recipes/digits.yaml --set training.epochs=3

Every rank validates the recipe again (cheap, and the same on every rank),
sets the engine knobs from its `engine` section unless the environment
already has them, starts hvdkeras and trains. Exit codes: 0 done, 2 bad
recipe or data (the message says what), 1 anything else.

What may import this module: the CLI (`hvdkeras train --np 1`), lazily; the
ranks run it as `python -m hvdkeras.recipes.run`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from hvdkeras.engine import failfast, frameworks, world
from hvdkeras.gpu.pin import pin_gpu
from hvdkeras.recipes import load_recipe
from hvdkeras.recipes.data_files import DataError
from hvdkeras.recipes.launching import engine_env
from hvdkeras.recipes.training import run
from hvdkeras.recipes.validation import RecipeError


def _launch_rank() -> int:
    """This process's rank from the launcher's environment (before MPI starts)."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "HVDKERAS_RANK"):
        value = os.environ.get(key, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hvdkeras.recipes.run",
                                     description="Train a recipe on this rank (run on every rank).")
    parser.add_argument("recipe", help="recipe file (or the name of a bundled recipe)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a recipe value (repeatable)")
    parser.add_argument("--summary-json", default=None,
                        help="rank 0 also writes the run summary to this JSON file")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        recipe, _ = load_recipe(args.recipe, args.overrides)
    except RecipeError as error:
        if _launch_rank() == 0:
            print(f"hvdkeras: error: {error}", file=sys.stderr, flush=True)
        return 2
    for key, value in engine_env(recipe).items():
        os.environ.setdefault(key, value)
    return train(recipe, args.summary_json)


def train_on_task(recipe: str, overrides: Sequence[str] = (),
                  summary_json: Optional[str] = None,
                  working_dir: Optional[str] = None) -> int:
    """One rank of a recipe run on a cluster engine's tasks (`hvdkeras train
    --engine ray`): the rank's world is already joined and its engine
    variables set (the runner's `env=`). Returns the exit code.

    A task starts in its worker's directory (for Ray, wherever the cluster
    was started), so relative paths (the recipe, its data and run
    directory, `summary_json`) are read in `working_dir`, the directory the
    job was started from, where this node has it.

    Example: `hvdkeras.ray.run(train_on_task, args=("digits",), num_proc=2)`.
    """
    if working_dir:
        if os.path.isdir(working_dir):
            os.chdir(working_dir)
        elif world.rank() == 0:
            print(f"hvdkeras: {working_dir} (where the job was started) is not on this "
                  f"node; relative paths in the recipe are read in {os.getcwd()}",
                  file=sys.stderr, flush=True)
    loaded, _ = load_recipe(recipe, overrides)
    return train(loaded, summary_json)


def _check_backend(wanted: Optional[str]) -> None:
    """The recipe's backend must be the one Keras loaded (KERAS_BACKEND is read once,
    when Keras is imported: `hvdkeras train` sets it for every rank)."""
    actual = frameworks.keras_backend()
    if wanted and wanted != actual:
        raise RecipeError(f"the recipe says backend: {wanted}, but Keras runs on {actual}: "
                          f"set KERAS_BACKEND={wanted} before starting this process (hvdkeras "
                          "train does that).")


def train(recipe: dict, summary_json: Optional[str] = None) -> int:
    """Starts hvdkeras (if needed) and trains `recipe`; returns the exit code."""
    _check_backend(recipe["backend"])
    timeline = recipe["engine"]["timeline"]
    if timeline:  # rank 0's engine opens it at init, before anything made the run directory
        os.makedirs(os.path.dirname(timeline) or ".", exist_ok=True)
    world.init()
    pin_gpu()  # one GPU per rank, where there are GPUs
    try:
        run(recipe, summary_json=summary_json)
    except DataError as error:
        # Any rank may meet bad data; each says it, and the job ends at once
        # instead of the others waiting for this rank (Note [abort, not finalize]).
        print(f"hvdkeras: error (rank {world.rank()}): {error}", file=sys.stderr, flush=True)
        failfast.end_job(2, "a data error")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
