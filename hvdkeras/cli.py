"""The ``hvdkeras`` command line.

Subcommands register themselves with ``@command``: a function that receives
the parsed arguments and returns an exit code, plus an optional function that
adds the subcommand's options. New subcommands (train, validate, recipes, ...)
are added the same way.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], None]

LABEL_WIDTH = 17
THREAD_LEVEL_NAMES = (
    "MPI_THREAD_SINGLE",
    "MPI_THREAD_FUNNELED",
    "MPI_THREAD_SERIALIZED",
    "MPI_THREAD_MULTIPLE",
)


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
    from importlib import metadata

    try:
        return metadata.version("hvdkeras")
    except metadata.PackageNotFoundError:
        import hvdkeras

        return getattr(hvdkeras, "__version__", "unknown")


def thread_level_name(level: int) -> str:
    """Name of an MPI thread support level, e.g. 3 -> ``MPI_THREAD_MULTIPLE``."""
    from mpi4py import MPI

    for name in THREAD_LEVEL_NAMES:
        if getattr(MPI, name[4:]) == level:
            return name
    return f"unknown ({level})"


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------


def _configure_build(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached library exists")
    parser.add_argument("--verbose", action="store_true", help="show compiler commands and output")


@command("build", help="compile the op library (cached) and print its path", configure=_configure_build)
def _build(args: argparse.Namespace) -> int:
    from hvdkeras import _build

    print(_build.ensure_built(force=args.force, verbose=args.verbose))
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
    import keras
    import tensorflow as tf

    return [
        ("hvdkeras", hvdkeras_version()),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("TensorFlow", tf.__version__),
        ("Keras", keras.__version__),
    ]


def _mpi_rows() -> list[tuple[str, object]]:
    """The MPI that mpi4py loaded and its thread support level."""
    from mpi4py import MPI

    from hvdkeras import _build

    info = _build.mpi_library_info()
    return [
        ("MPI vendor", info["vendor"]),
        ("MPI library", info["version"]),
        ("libmpi", info["library"]),
        ("mpi.h", info["include_dir"] or "not found"),
        ("MPI thread level", thread_level_name(MPI.Query_thread())),
    ]


def _op_library_rows() -> list[tuple[str, object]]:
    """The op library for the current environment (built now if missing)."""
    from hvdkeras import _build

    key = _build.cache_key(_build.build_inputs())
    was_cached = _build.library_path(key).is_file()
    library = _build.ensure_built()
    info = _build.read_build_info(library)
    status = "yes" if was_cached else "it was missing; built it now"
    return [
        ("op library", library),
        ("built for", f"TensorFlow {info.get('tf_version')} on {info.get('built_at')}"),
        ("device", info.get("device")),
        ("CUDA", info.get("cuda")),
        ("NCCL", info.get("nccl")),
        ("up to date", status),
    ]


@command("check", help="report versions, the MPI in use and the op library's state")
def _check(args: argparse.Namespace) -> int:
    _print_rows(_framework_rows() + _mpi_rows())
    sys.stdout.flush()  # the versions appear before a possibly long build
    _print_rows(_op_library_rows())
    return 0


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="hvdkeras", description="Distributed Keras training over MPI.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, spec in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=spec.help, description=spec.help)
        if spec.configure:
            spec.configure(subparser)
        subparser.set_defaults(handler=spec.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (2 on build errors)."""
    from hvdkeras._build import BuildError

    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BuildError as exc:
        print(f"hvdkeras: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
