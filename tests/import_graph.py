"""The import graph of a package, read from its source (no module is imported).

Used by `tests/test_architecture.py`; run it directly for a report:

    python tests/import_graph.py [PACKAGE_DIR]

Each edge is one import statement of a project module: where it is, the
module it names, and whether it runs at import time ("module") or only when
a function runs ("function"). `from pkg import name` counts as an import of
`pkg.name` when that is a module, else of `pkg`.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path
from typing import Dict, List, Set


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # "module" or "function"
    line: int
    path: Path


def modules(package_dir: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    root = package_dir.parent
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(known: Dict[str, Path], name: str) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _in_type_checking_block(node: ast.AST, parents: Dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def edges(package_dir: Path) -> List[Edge]:
    """Every import of a module of the package by a module of the package."""
    known = modules(package_dir)
    package = package_dir.name
    out: List[Edge] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if _in_type_checking_block(node, parents):
                continue
            kind = "module"
            up = node
            while up in parents:
                up = parents[up]
                if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    kind = "function"
                    break
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            for target in targets:
                if target.split(".")[0] != package:
                    continue
                resolved = _resolve(known, target)
                if resolved and resolved != module:
                    out.append(Edge(module, resolved, kind, node.lineno, path))
    return out


def cycles(nodes: List[str], all_edges: List[Edge]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    adjacency: Dict[str, Set[str]] = {}
    for edge in all_edges:
        adjacency.setdefault(edge.source, set()).add(edge.target)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(adjacency.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def main(argv: List[str]) -> int:
    package_dir = Path(argv[1]) if len(argv) > 1 else (
        Path(__file__).resolve().parent.parent / "hvdkeras")
    known = modules(package_dir)
    found = edges(package_dir)
    print(f"{len(known)} modules, {len({(e.source, e.target) for e in found})} imported pairs")
    inside = [e for e in found if e.kind == "function"]
    print(f"imports of project modules inside functions: {len(inside)}")
    for e in inside:
        print(f"    {e.source} -> {e.target} (line {e.line})")
    loops = cycles(list(known), found)
    print(f"import cycles: {len(loops)}")
    for loop in loops:
        print("    " + " <-> ".join(loop))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
