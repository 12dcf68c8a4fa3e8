"""The ``hvdkeras`` command line.

Subcommands register themselves with ``@command``: a function that receives
the parsed arguments and returns an exit code, plus an optional function that
adds the subcommand's options.

What may import this module: nothing in the package (it is the console
script's entry point). It may import anything, but imports TensorFlow, Keras
and mpi4py only inside the subcommands that need them, so ``hvdkeras --help``
and ``hvdkeras validate --schema-only`` start in a fraction of a second.
"""

from __future__ import annotations

import argparse
import difflib
import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Optional, Sequence

import yaml

import hvdkeras
from hvdkeras.engine import build, toolchain
from hvdkeras.engine.world import thread_level_name
from hvdkeras.gpu.report import gpu_rows
from hvdkeras.migrate import migrate
from hvdkeras.recipes import RecipeError, bundled_recipes, find_recipe, load_recipe
from hvdkeras.recipes import launching
from hvdkeras.recipes.paths import run_dir_of
from hvdkeras.recipes.yaml_source import SourceError, load_file
from hvdkeras.report import ReportError, write_report
from hvdkeras.report.run_data import SUMMARY_NAME
from hvdkeras.runner import startup_noise
from hvdkeras.runner import slurm
from hvdkeras.runner.knobs import LOG_LEVELS
from hvdkeras.runner.remote_options import add_remote_arguments, remote_access_from_args

Handler = Callable[[argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], None]

LABEL_WIDTH = 17


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, option setup and handler."""

    help: str
    handler: Handler
    configure: Configure | None = None


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, configure: Configure | None = None) -> Callable[[Handler], Handler]:
    """Decorator registering ``handler`` as subcommand ``name``."""

    def register(handler: Handler) -> Handler:
        COMMANDS[name] = Command(help=help, handler=handler, configure=configure)
        return handler

    return register


def hvdkeras_version() -> str:
    """Installed hvdkeras version (package metadata, else the module attribute)."""
    try:
        return metadata.version("hvdkeras")
    except metadata.PackageNotFoundError:
        return hvdkeras.__version__


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------


def _configure_build(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached library exists")
    parser.add_argument("--verbose", action="store_true", help="show compiler commands and output")


def _load_tensorflow() -> None:
    """Imports TensorFlow and sees its devices, without its start-up lines
    unless the user asked for them (Note [quiet start-up])."""
    with startup_noise.filtered_stderr(startup_noise.quiet_requested(os.environ)):
        import tensorflow as tf  # lazy: seconds to import; only some commands need it

        tf.config.list_physical_devices()


@command("build", help="compile the op library (cached) and print its path", configure=_configure_build)
def _build(args: argparse.Namespace) -> int:
    if not toolchain.tensorflow_installed():  # Note [the engine alone]
        print(build.ensure_engine_built(force=args.force, verbose=args.verbose))
        return 0
    _load_tensorflow()
    print(build.ensure_built(force=args.force, verbose=args.verbose))
    return 0


# --------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------


def _print_rows(rows: list[tuple[str, object]]) -> None:
    """Print ``label: value`` rows with aligned values."""
    for label, value in rows:
        print(f"{label + ':':<{LABEL_WIDTH}} {value}")


def _framework_rows() -> list[tuple[str, object]]:
    """Versions of hvdkeras, Python, TensorFlow and Keras."""
    import keras  # lazy: seconds to import; only `check` needs it

    tf = sys.modules.get("tensorflow")  # imported by _check where installed
    tf_version = tf.__version__ if tf else "not installed (the engine is built alone)"
    return [
        ("hvdkeras", hvdkeras_version()),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("TensorFlow", tf_version),
        ("Keras", f"{keras.__version__} (backend {keras.backend.backend()})"),
    ]


def _mpi_rows() -> list[tuple[str, object]]:
    """The MPI that mpi4py loaded and its thread support level."""
    from mpi4py import MPI  # lazy: importing it initializes MPI

    info = toolchain.mpi_library_info()
    return [
        ("MPI vendor", info["vendor"]),
        ("MPI library", info["version"]),
        ("libmpi", info["library"]),
        ("mpi.h", info["include_dir"] or "not found"),
        ("MPI thread level", thread_level_name(MPI.Query_thread())),
    ]


def _op_library_rows() -> list[tuple[str, object]]:
    """The op library for the current environment (built now if missing), or
    the engine alone where no TensorFlow is installed."""
    alone = not toolchain.tensorflow_installed()
    library = build.ensure_engine_built() if alone else build.ensure_built()
    info = toolchain.read_build_info(library)
    status = "it was missing; built it now" if build.last_build_performed else "yes"
    built_for = f"TensorFlow {info['tf_version']}" if not alone else "the engine alone"
    return [
        ("engine library" if alone else "op library", library),
        ("built for", f"{built_for} on {info.get('built_at')}"),
        ("device", info.get("device")),
        ("up to date", status),
        *gpu_rows(info),
    ]


@command("check", help="report versions, the MPI in use and the op library's state")
def _check(args: argparse.Namespace) -> int:
    if toolchain.tensorflow_installed():
        _load_tensorflow()
    _print_rows(_framework_rows() + _mpi_rows())
    sys.stdout.flush()  # the versions appear before a possibly long build
    _print_rows(_op_library_rows())
    return 0


# --------------------------------------------------------------------------
# train, validate, recipes
# --------------------------------------------------------------------------


def _add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="a recipe file, or the name of a bundled recipe "
                                       "(see `hvdkeras recipes`)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE",
                        help="override a recipe value, e.g. --set training.epochs=5 "
                             "(repeatable; the value is read as YAML)")


def _configure_train(parser: argparse.ArgumentParser) -> None:
    _add_recipe_arguments(parser)
    parser.add_argument("--np", "-n", dest="np", type=int, default=None,
                        help="number of ranks (processes); default 1, or inside a Slurm "
                             "allocation SLURM_NTASKS on its hosts")
    parser.add_argument("--hosts", default=None, help="comma-separated hosts (with --np > 1)")
    parser.add_argument("--hostfile", default=None, help="a hostfile (with --np > 1)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="restart the job this many times after a failure (it resumes "
                             "from the newest checkpoint when the recipe has one)")
    parser.add_argument("--min-np", type=int, default=None,
                        help="elastic: after a failure, continue on as few as this many ranks "
                             "(the failed ranks' slots are left out)")
    parser.add_argument("--max-np", type=int, default=None, help="elastic: at most this many ranks")
    add_remote_arguments(parser)
    parser.add_argument("--summary-json", default=None,
                        help="also write the final summary (metrics, time, checkpoints) here")
    parser.add_argument("--engine", choices=("mpi", "ray"), default="mpi",
                        help="start the ranks with hvdkerasrun's mpiexec (default) or as Ray "
                             "actors (hvdkeras.ray.run; extra [ray]; RAY_ADDRESS picks a cluster)")


def _load_recipe_or_report(recipe: str, overrides, environment: bool = True,
                           world_size: Optional[int] = None):
    """(recipe, path) or None after printing the problems to stderr."""
    try:
        loaded, _ = load_recipe(recipe, overrides, environment=environment, world_size=world_size)
    except RecipeError as error:
        print(f"hvdkeras: error: {error}", file=sys.stderr)
        return None
    return loaded, find_recipe(recipe)


@command("train", help="train a YAML recipe on N ranks (validated before anything starts)",
         configure=_configure_train)
def _train(args: argparse.Namespace) -> int:
    try:  # inside a Slurm allocation: its hosts and tasks, reached through Slurm
        args.hosts, args.np, through_slurm = slurm.train_launch(os.environ, args)
    except ValueError as error:
        print(f"hvdkeras: error: {error}", file=sys.stderr)
        return 2
    if args.np < 1:
        print(f"hvdkeras: error: --np must be at least 1, got {args.np}", file=sys.stderr)
        return 2
    if args.max_restarts < 0:
        print(f"hvdkeras: error: --max-restarts must be >= 0, got {args.max_restarts}",
              file=sys.stderr)
        return 2
    loaded = _load_recipe_or_report(args.recipe, args.overrides,
                                    world_size=max(args.np, args.max_np or 0))
    if loaded is None:
        return 2
    recipe, path = loaded
    env = launching.engine_env(recipe)
    summary_json = os.path.abspath(args.summary_json) if args.summary_json else None
    elastic = args.min_np is not None or args.max_np is not None
    if args.engine == "ray":
        code = _train_on_ray(args, os.path.abspath(path), env, summary_json, elastic)
    elif args.np == 1 and not args.hosts and not args.hostfile and not args.max_restarts \
            and not elastic:
        os.environ.update(env)
        _load_tensorflow()  # here, in this process: quietly (Note [quiet start-up])
        from hvdkeras.recipes.run import train  # lazy: imports TensorFlow

        code = train(recipe, summary_json)
    else:
        command = launching.rank_command(os.path.abspath(path), args.overrides, summary_json)
        try:
            code = launching.launch_ranks(command, np=args.np, hosts=args.hosts,
                                          hostfile=args.hostfile, env=env,
                                          max_restarts=args.max_restarts, min_np=args.min_np,
                                          max_np=args.max_np,
                                          remote=remote_access_from_args(
                                              args, through_slurm=through_slurm))
        except ValueError as error:
            print(f"hvdkeras: error: {error}", file=sys.stderr)
            return 2
    if code == 0:
        _report_run(run_dir_of(recipe))
    return code


def _report_run(run_dir: Optional[str]) -> None:
    """After a successful run: its report, or how to get one."""
    if not run_dir or not os.path.isfile(os.path.join(run_dir, SUMMARY_NAME)):
        return
    try:
        print(f"hvdkeras: report: {write_report(run_dir)}")
    except ReportError as error:
        print(f"hvdkeras: no report ({error}); once that is fixed: hvdkeras report {run_dir}")


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


def _configure_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory, e.g. runs/digits (where the recipe's "
                                        "CSV log and run.json are)")


@command("report", help="draw a run's curves and step times into RUN_DIR/report/ (HTML + PNGs)",
         configure=_configure_report)
def _report(args: argparse.Namespace) -> int:
    try:
        print(write_report(args.run_dir))
    except ReportError as error:
        print(f"hvdkeras: error: {error}", file=sys.stderr)
        return 2
    return 0


def _train_on_ray(args: argparse.Namespace, path: str, env: dict, summary_json: Optional[str],
                  elastic: bool) -> int:
    """`hvdkeras train --engine ray`: the recipe on --np Ray actors."""
    unused = [flag for flag, given in (("--hosts", args.hosts), ("--hostfile", args.hostfile),
                                       ("--max-restarts", args.max_restarts),
                                       ("--min-np/--max-np", elastic),
                                       ("the ssh and network options",
                                        not remote_access_from_args(args).is_default())) if given]
    if unused:
        print(f"hvdkeras: error: {', '.join(unused)} do not apply with --engine ray (Ray "
              "places the ranks); leave them out", file=sys.stderr)
        return 2
    from hvdkeras.ray import run as ray_run  # lazy: an optional extra (hvdkeras[ray])
    from hvdkeras.recipes.run import train_on_task  # lazy: imports TensorFlow
    from hvdkeras.runner.function_runner import RankFailedError  # lazy: with the rest

    try:
        codes = ray_run(train_on_task,
                        args=(path, list(args.overrides), summary_json, os.getcwd()),
                        num_proc=args.np, env=env)
    except (ImportError, RankFailedError) as error:
        print(f"hvdkeras: error: {error}", file=sys.stderr)
        return 1
    return max(codes)


def _configure_validate(parser: argparse.ArgumentParser) -> None:
    _add_recipe_arguments(parser)
    parser.add_argument("--print", dest="show", action="store_true",
                        help="print the recipe with every default filled in")
    parser.add_argument("--schema-only", action="store_true",
                        help="check the schema only (no Keras names, files or packages)")


@command("validate", help="check a recipe (schema, names, files, packages); exit 2 if bad",
         configure=_configure_validate)
def _validate(args: argparse.Namespace) -> int:
    loaded = _load_recipe_or_report(args.recipe, args.overrides,
                                    environment=not args.schema_only)
    if loaded is None:
        return 2
    recipe, path = loaded
    if args.show:
        print(yaml.safe_dump(recipe, sort_keys=False, default_flow_style=None), end="")
    data = recipe["data"]
    print(f"hvdkeras: {path}: OK ({recipe['name']}: model {recipe['model']['name']}, "
          f"data {data['source']}, batch {data['batch_size']} per rank)")
    return 0


def _configure_recipes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="print this bundled recipe")


def _configure_migrate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", help="a Horovod + Keras 2 training script")
    parser.add_argument("-o", "--output", help="write the rewritten script here (default: stdout)")
    parser.add_argument("--diff", action="store_true",
                        help="print a unified diff instead of the rewritten script")


@command("migrate", help="rewrite a Horovod + Keras 2 script for hvdkeras + Keras 3",
         configure=_configure_migrate)
def _migrate(args: argparse.Namespace) -> int:
    try:
        with open(args.script, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as error:
        print(f"hvdkeras: error: cannot read {args.script}: {error}", file=sys.stderr)
        return 2
    try:
        result = migrate(source)
    except SyntaxError as error:
        print(f"hvdkeras: error: {args.script}:{error.lineno}: not valid Python: {error.msg}",
              file=sys.stderr)
        return 2
    if args.diff:
        sys.stdout.writelines(difflib.unified_diff(
            source.splitlines(keepends=True), result.text.splitlines(keepends=True),
            fromfile=args.script, tofile=args.output or args.script))
    if args.output:
        temporary = f"{args.output}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(result.text)
        os.replace(temporary, args.output)
    elif not args.diff:
        sys.stdout.write(result.text)
    print(result.report(args.script), file=sys.stderr)
    return 0


@command("recipes", help="list the bundled recipes (or print one)", configure=_configure_recipes)
def _recipes(args: argparse.Namespace) -> int:
    bundled = bundled_recipes()
    if args.name:
        if args.name not in bundled:
            print(f"hvdkeras: error: no bundled recipe {args.name!r}; bundled: "
                  f"{', '.join(bundled)}", file=sys.stderr)
            return 2
        print(bundled[args.name].read_text(), end="")
        return 0
    width = max(len(name) for name in bundled) if bundled else 0
    for name, path in bundled.items():
        try:
            description = str(load_file(str(path)).data.get("description", "")).strip()
        except SourceError:
            description = "(unreadable)"
        print(f"{name:<{width}}  {description.splitlines()[0] if description else ''}")
        print(f"{'':<{width}}  {path}")
    print("\nRun one: hvdkeras train NAME --np 2   (NAME or a path; --set key.path=value "
          "overrides)")
    return 0


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="hvdkeras", description="Distributed Keras training over MPI.")
    parser.add_argument("--log-level", choices=sorted(LOG_LEVELS), type=str.lower, default=None,
                        help="show TensorFlow's C++ log lines from this level on, start-up "
                             "lines included (default: errors only, start-up lines hidden)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, spec in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=spec.help, description=spec.help)
        if spec.configure:
            spec.configure(subparser)
        subparser.set_defaults(handler=spec.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (2 on build errors)."""
    args = build_parser().parse_args(argv)
    if args.log_level:
        os.environ[startup_noise.HVDKERAS_LOG_LEVEL] = args.log_level
        os.environ[startup_noise.TF_LOG_LEVEL] = LOG_LEVELS[args.log_level]
    # Note [quiet start-up]: this process and the ranks it launches.
    os.environ.update(startup_noise.quiet_env(os.environ))
    try:
        return args.handler(args)
    except toolchain.BuildError as exc:
        print(f"hvdkeras: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
