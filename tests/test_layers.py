"""The layers of labkit, enforced: imports point downward only, no import cycles, no use of
another module's private names, and labkit's own code never goes through the public aliases.

    core  →  faces (data, hardware, vertex, notebooks)  →  engines (torch, tf, train)
          →  analysis and recipes (profiling, recipes)  →  course  →  entry points (cli)

A module may import its own layer and the layers below it. Function-level imports count too:
a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "labkit"

# (layer, module prefixes), lowest first. The longest matching prefix decides a module's layer.
LAYERS = (
    ("core", ("labkit.core", "labkit")),
    ("faces", ("labkit.data", "labkit.hardware", "labkit.vertex", "labkit.notebooks")),
    ("engines", ("labkit.torch", "labkit.tf", "labkit.train")),
    ("analysis and recipes", ("labkit.profiling", "labkit.recipes")),
    ("course", ("labkit.course",)),
    ("entry points", ("labkit.cli", "labkit.__main__")),
)
# Stable public names of core modules (each *is* its labkit.core module); for users, not for
# labkit's own code.
ALIASES = ("labkit.config", "labkit.cluster", "labkit.checkpoint", "labkit.metrics", "labkit.models")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def layer_of(module: str) -> int:
    best, rank = "", -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, i
    return rank


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def tree_of(module: str) -> ast.Module:
    """`module`'s syntax tree, parsed once for all the tests here (parsing is most of their time)."""
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


@functools.cache
def nodes_of(module: str) -> tuple[ast.AST, ...]:
    """Every node of `module`'s tree, in `ast.walk` order, walked once for all the tests here."""
    return tuple(ast.walk(tree_of(module)))


@functools.cache
def imports(module: str) -> tuple[tuple[str, int, list[str]], ...]:
    """(imported labkit module, line, names imported from it) for every import in `module`."""
    path = MODULES[module]
    out = []
    for node in nodes_of(module):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, path.name == "__init__.py")
            if not target.startswith("labkit"):
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            out.append((target, node.lineno, [n for n in names if f"{target}.{n}" not in MODULES]))
            out += [(m, node.lineno, []) for m in submodules]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno, []) for a in node.names if a.name.startswith("labkit")]
    return tuple(out)


def test_the_layer_table_covers_every_module():
    assert all(layer_of(m) >= 0 for m in MODULES), [m for m in MODULES if layer_of(m) < 0]


def test_imports_point_downward_only():
    upward = []
    for module in MODULES:
        if module in ALIASES:
            continue
        for target, line, _ in imports(module):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module}:{line} imports {target} "
                              f"({LAYERS[layer_of(module)][0]} -> {LAYERS[layer_of(target)][0]})")
    assert not upward, "\n".join(upward)


def test_labkit_code_does_not_import_the_public_aliases():
    found = [f"{m}:{line} imports {t}" for m in MODULES if m not in ALIASES
             for t, line, _ in imports(m) if t in ALIASES or (t == "labkit" and False)]
    assert not found, "\n".join(found)


def test_no_private_names_of_other_modules():
    found = []
    for module in MODULES:
        aliases = {}
        for node in nodes_of(module):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("labkit"):
                        aliases[a.asname or a.name.split(".")[0]] = a.name
        for target, line, names in imports(module):
            if target == module:
                continue
            found += [f"{module}:{line} imports {target}.{n}" for n in names
                      if n.startswith("_") and not n.startswith("__")]
        for node in nodes_of(module):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(module, node, MODULES[module].name == "__init__.py")
                for a in node.names:
                    if f"{target}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
        for node in nodes_of(module):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__") and aliases[node.value.id] != module):
                found.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not found, "\n".join(found)


def test_no_import_cycles():
    graph: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        for target, _, _ in imports(module):
            # `from labkit.x import y` runs labkit/x/__init__.py: an edge to the package itself.
            if target in MODULES and target != module:
                graph[module].add(target)
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("alias", ALIASES)
def test_public_aliases_are_the_core_modules(alias):
    import importlib

    assert importlib.import_module(alias) is importlib.import_module(alias.replace("labkit.", "labkit.core."))
