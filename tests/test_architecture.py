"""The package's shape, checked so it cannot drift: layers, import cycles,
lazy imports, file sizes, where TensorFlow's and Keras's internals are used,
the named notes, and what `import hvdkeras` and the command lines load.

`docs/architecture.md` describes the layers these tests hold the code to.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

import pytest

import import_graph

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "hvdkeras"
MAX_LINES = 450

# Who may import whom: a module of the component on the left may import
# modules of its own component and of the ones listed (a listed name covers
# the modules under it). Everything else is an arrow pointing the wrong way.
ALLOWED: Dict[str, Set[str]] = {
    "hvdkeras.compat": set(),
    "hvdkeras.engine": {"hvdkeras.compat"},
    "hvdkeras.collectives": {"hvdkeras.engine", "hvdkeras.compat",  # compat: XLA custom calls
                             "hvdkeras.host.objects"},  # pickling, shared with host's
    "hvdkeras.gpu": {"hvdkeras.engine"},
    # Collectives on host memory, for every backend (no framework).
    "hvdkeras.host": {"hvdkeras.engine"},
    # The other Keras backends: beside collectives, on the engine's C entry points;
    # their optimizer shards state with the sharded optimizer every backend shares.
    "hvdkeras.backends": {"hvdkeras.engine", "hvdkeras.compat", "hvdkeras.sharding",
                          "hvdkeras.host"},
    # Sharded optimizer state: below training (which wraps optimizers in it).
    "hvdkeras.sharding": {"hvdkeras.collectives", "hvdkeras.engine", "hvdkeras.compat",
                          "hvdkeras.host"},
    "hvdkeras.training": {"hvdkeras.collectives", "hvdkeras.engine", "hvdkeras.compat",
                          "hvdkeras.sharding", "hvdkeras.backends", "hvdkeras.host"},
    # Each rank's share of the input data: below callbacks and recipes.
    "hvdkeras.inputs": {"hvdkeras.engine", "hvdkeras.compat"},
    "hvdkeras.callbacks": {"hvdkeras.inputs",
                           "hvdkeras.training", "hvdkeras.sharding", "hvdkeras.collectives",
                           "hvdkeras.gpu", "hvdkeras.backends", "hvdkeras.host",
                           "hvdkeras.engine", "hvdkeras.compat",
                           "hvdkeras.report.run_data"},  # the figures' key prefix
    "hvdkeras.runner": {"hvdkeras.engine.config", "hvdkeras.engine.failfast"},  # both stdlib-only
    "hvdkeras.recipes": {"hvdkeras.callbacks", "hvdkeras.inputs", "hvdkeras.training", "hvdkeras.collectives",
                         "hvdkeras.gpu", "hvdkeras.engine", "hvdkeras.runner",
                         "hvdkeras.report.run_data"},  # run.json's name, the figures' prefix
    # The estimator's training function runs on the ranks: Keras training.
    "hvdkeras.spark": {"hvdkeras.cluster", "hvdkeras.runner", "hvdkeras.engine",
                       "hvdkeras.training", "hvdkeras.callbacks"},
    # Ranks started by a cluster engine's tasks; each rank runs hvdkeras.
    "hvdkeras.cluster": {"hvdkeras.runner", "hvdkeras.engine"},
    "hvdkeras.ray": {"hvdkeras.cluster", "hvdkeras.runner"},
    "hvdkeras.migrate": set(),  # standard library only
    "hvdkeras.report": set(),  # files in, pictures out (matplotlib)
    "hvdkeras.elastic": {"hvdkeras.callbacks", "hvdkeras.training"},
    "hvdkeras.cli": {"hvdkeras"},
    "hvdkeras": {"hvdkeras"},
}


def component(module: str) -> str:
    for name in sorted(ALLOWED, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    raise AssertionError(f"{module} belongs to no component of ALLOWED")


def covered(target: str, names: Set[str]) -> bool:
    return any(target == n or target.startswith(n + ".") for n in names)


@pytest.fixture(scope="module")
def edges():
    return import_graph.edges(PACKAGE)


def test_no_import_cycles(edges):
    assert import_graph.cycles(list(import_graph.modules(PACKAGE)), edges) == []


def test_imports_follow_the_layers(edges):
    wrong = []
    for edge in edges:
        source = component(edge.source)
        if component(edge.target) == source and source != "hvdkeras":
            continue
        if not covered(edge.target, ALLOWED[source]):
            wrong.append(f"{edge.source} -> {edge.target} ({edge.path.name}:{edge.line})")
    assert wrong == []


def test_nothing_inside_imports_the_top_level_package(edges):
    """The top-level package is the users' facade; `hvdkeras.cli` reads its version."""
    assert [e for e in edges if e.target == "hvdkeras" and e.source != "hvdkeras.cli"] == []


def _lazy_imports(path: Path):
    """Imports inside functions: (line number, text of that line)."""
    tree = ast.parse(path.read_text())
    lines = path.read_text().splitlines()
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node.lineno, lines[node.lineno - 1]


def test_every_import_inside_a_function_says_why():
    """Only deliberate lazy loading and optional extras, each with "# lazy: reason"."""
    unexplained = [f"{path.relative_to(REPO)}:{line}: {text.strip()}"
                   for path in sorted(PACKAGE.rglob("*.py"))
                   for line, text in _lazy_imports(path)
                   if not re.search(r"# lazy: \S", text)]
    assert unexplained == []


def test_no_source_file_is_over_the_size_limit():
    files = [p for p in PACKAGE.rglob("*.py")]
    files += [p for p in (REPO / "ops").rglob("*") if p.suffix in (".h", ".cc", ".cu", ".def")
              and "tests" not in p.relative_to(REPO / "ops").parts]
    too_long = {str(p.relative_to(REPO)): n for p in files
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert too_long == {}


C_INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([^>"]+)[>"]', re.M)
# Which headers each C++ layer may not include (by path prefix or name).
FORBIDDEN_INCLUDES = {
    "core": ("tensorflow/", "xla/", "cuda", "nccl.h", "nvrtc.h", "cuda/"),
    "cuda": ("tensorflow/", "xla/", "tf/"),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_INCLUDES))
def test_cpp_layers_include_only_what_they_may(layer):
    """The engine includes no TensorFlow, CUDA or NCCL header (GPUs are behind
    core/device.h); the CUDA backend includes no TensorFlow header."""
    wrong = []
    for path in sorted((REPO / "ops" / layer).rglob("*")):
        if path.suffix not in (".h", ".cc", ".cu"):
            continue
        for header in C_INCLUDE.findall(path.read_text()):
            if header.startswith(FORBIDDEN_INCLUDES[layer]):
                wrong.append(f"{path.relative_to(REPO)}: {header}")
    assert wrong == []


def test_tensorflow_and_keras_internals_are_used_only_in_compat():
    internal = re.compile(r"^\s*(from|import)\s+(tensorflow\.python|keras\.src)\b", re.M)
    users = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
                   if p.name != "compat.py" and internal.search(p.read_text()))
    assert users == []


def test_every_package_says_what_it_holds_and_who_may_import_it():
    missing = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("__init__.py")
               if "What may import" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
               and p.parent != PACKAGE]
    assert missing == []


NOTE_DEFINITION = re.compile(r"Note \[([^\]]+)\]\s*\n\s*(?:#|//)?\s*~~~")
NOTE_REFERENCE = re.compile(r"Note\s+\[([^\]]+)\]")


def test_every_named_note_is_defined_once_and_referenced():
    texts = {p: p.read_text() for root in ("hvdkeras", "ops", "tests", "docs")
             for p in (REPO / root).rglob("*") if p.is_file()
             and p.suffix in (".py", ".h", ".cc", ".def", ".md")}
    definitions: Dict[str, list] = {}
    references: Dict[str, list] = {}
    for path, text in texts.items():
        for match in NOTE_DEFINITION.finditer(text):
            definitions.setdefault(match.group(1), []).append(path)
        for match in NOTE_REFERENCE.finditer(text):
            # A reference may wrap onto the next comment line.
            name = " ".join(re.sub(r"(#|//)", " ", match.group(1)).split())
            references.setdefault(name, []).append(path)
    assert {n: p for n, p in definitions.items() if len(p) > 1} == {}
    assert sorted(set(references) - set(definitions)) == []
    # A note nobody points to is just a comment.
    unreferenced = [n for n in definitions
                    if len([p for p in references[n] if p not in definitions[n]]) == 0]
    assert unreferenced == []


LIGHT_CHECK = """
import sys
{code}
heavy = [m for m in ("tensorflow", "keras", "mpi4py.MPI") if m in sys.modules]
print("HEAVY", heavy)
"""


@pytest.mark.parametrize("code", [
    "import hvdkeras; hvdkeras.Sum; hvdkeras.init; hvdkeras.launch",
    "from hvdkeras import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass",
    "from hvdkeras.runner import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass",
    "from hvdkeras import cli\ncli.main(['validate', 'digits', '--schema-only'])",
], ids=["import hvdkeras", "hvdkeras --help", "hvdkerasrun --help", "validate --schema-only"])
def test_starting_points_do_not_load_tensorflow_or_mpi(code):
    result = subprocess.run([sys.executable, "-c", LIGHT_CHECK.format(code=code)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr
