"""The package's shape: its imports (read from the source, imports inside functions
included) have no cycles, the product never imports its test support, and each stage
imports only from the stages below it:

    base <- store <- query <- analyze <- record <- replay <- video <- distribute <- applications

Data flows record -> store -> query -> analyze -> replay -> video, but recorders write
through the store and read their recording back through query (flygym's ``trajectory``),
so record sits on top of both. Analyze (positions of bodies, gait measures) reads archives
through query and keeps derived values through the store; replay and later stages may use it.

Base modules (errors, schema, layout, clock, codecs, models, config, warp_log) import
only each other; applications (cli, cli_analyze, demo, plot, summary, interop, render, view,
and the package's own ``__init__``) may import anything; ``flyarchive.testing`` is not part of
the product and may import anything too.

Where today's code breaks a rule, the rule's test is marked xfail(strict=True) with the
list of what breaks it, so that it fails (XPASS) once the product is fixed: then empty the
list. A second test per rule fails at once on anything not on the list.
"""

from __future__ import annotations

import ast
from collections import deque
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flyarchive"

BASE = frozenset({"errors", "schema", "layout", "clock", "codecs", "models", "config", "warp_log"})
STAGES = ("store", "query", "analyze", "record", "replay", "video", "distribute")
APPLICATIONS = frozenset({"cli", "cli_analyze", "demo", "plot", "summary", "interop", "render", "view",
                          "__main__"})
TEST_SUPPORT = "flyarchive.testing"

#: Import cycles of today's code, each as the set of its modules.
KNOWN_CYCLES: list[frozenset[str]] = []

#: Imports of today's code against the stage order: (importer, imported).
KNOWN_STAGE_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


# ----------------------------------------------------------------------------- the graph
def module_name(path: Path) -> str:
    """``flyarchive/store/writer.py`` -> ``flyarchive.store.writer``; a package's
    ``__init__.py`` is the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _known(name: str) -> str | None:
    """The module ``name`` is, or the nearest package above it that is one of ours."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str) -> set[str]:
    """The package's modules that module ``name`` imports anywhere (functions included)."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(), name, package)


def imports_in(source: str, name: str, package: str) -> set[str]:
    """The package's modules that the source of module ``name`` (in ``package``) imports.

    ``from flyarchive.store import ArchiveWriter`` is an import of ``flyarchive.store``;
    ``from flyarchive.store import writer`` one of ``flyarchive.store.writer``. Parent
    packages imported on the way are not counted.
    """
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name) for alias in node.names
                         if alias.name.split(".")[0] == "flyarchive")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            if base.split(".")[0] != "flyarchive":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules() else _known(base))
    found.discard(None)
    found.discard(name)
    return found  # type: ignore[return-value]


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imports_of(name)) for name in modules()}


def cycles(edges: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def a_cycle_through(component: frozenset[str], edges: dict[str, frozenset[str]]) -> list[str]:
    """One shortest import cycle inside ``component``: ``[a, b, ..., a]``."""
    start = min(component)
    paths = deque([[start]])
    while paths:
        path = paths.popleft()
        for nxt in sorted(edges[path[-1]] & component):
            if nxt == start:
                return [*path, start]
            if nxt not in path:
                paths.append([*path, nxt])
    raise AssertionError(f"no cycle through {start}")


def describe(found: list[frozenset[str]]) -> list[str]:
    return [" -> ".join(a_cycle_through(c, graph())) for c in found]


# ----------------------------------------------------------------------------- layers
def layer(name: str) -> tuple[int, str]:
    """``(rank, group)``: base 0, the stages 1..7 in flow order, applications 100."""
    parts = name.split(".")
    if len(parts) == 1:
        return 100, "flyarchive"  # the package's __init__: re-exports the API on top
    top = parts[1]
    if top in BASE:
        return 0, "base"
    if top in STAGES:
        return 1 + STAGES.index(top), top
    if top in APPLICATIONS:
        return 100, top
    raise AssertionError(
        f"{name} is in no layer: add {top!r} to BASE, STAGES or APPLICATIONS in {__file__}")


def is_product(name: str) -> bool:
    return not (name == TEST_SUPPORT or name.startswith(TEST_SUPPORT + "."))


def stage_violations() -> set[tuple[str, str]]:
    """Imports from a later stage, or a stage importing an application."""
    bad = set()
    for importer, imported in sorted(graph().items()):
        if not is_product(importer):
            continue
        rank, group = layer(importer)
        for target in filter(is_product, imported):
            target_rank, target_group = layer(target)
            if rank == 100 or target_group == group:
                continue  # applications may import anything; a stage its own modules
            if target_rank >= rank:
                bad.add((importer, target))
    return bad


# ----------------------------------------------------------------------------- tests
def test_imports_inside_functions_and_relative_imports_are_read():
    source = (
        "import numpy\n"
        "from flyarchive.errors import SchemaError\n"
        "def load():\n"
        "    from flyarchive.store import writer\n"
        "    from .frames import select_frames\n"
        "    import flyarchive.replay.opengl\n"
    )

    found = imports_in(source, "flyarchive.query.archive", "flyarchive.query")

    assert found == {"flyarchive.errors", "flyarchive.store.writer", "flyarchive.query.frames",
                     "flyarchive.replay.opengl"}


def test_cycles_are_found_and_named():
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
             "d": frozenset({"a"})}

    found = cycles(edges)

    assert found == [frozenset({"a", "b", "c"})]
    assert a_cycle_through(found[0], edges) == ["a", "b", "c", "a"]


@pytest.mark.xfail(bool(KNOWN_CYCLES), strict=True,
                   reason=f"known import cycles: {[sorted(c) for c in KNOWN_CYCLES]}")
def test_the_package_has_no_import_cycle():
    found = cycles(graph())

    assert found == [], f"import cycles: {describe(found)}"


def test_no_import_cycle_beyond_the_known_ones():
    found = cycles(graph())

    new = [c for c in found if not any(c <= known for known in KNOWN_CYCLES)]
    assert new == [], f"new import cycles: {describe(new)}"


def test_no_product_module_imports_the_test_support():
    offenders = sorted((importer, target) for importer, targets in graph().items()
                       for target in targets if is_product(importer) and not is_product(target))

    assert offenders == []


def test_every_product_module_is_in_a_layer():
    unplaced = []
    for name in filter(is_product, modules()):
        try:
            layer(name)
        except AssertionError as err:
            unplaced.append(str(err))

    assert unplaced == []


@pytest.mark.xfail(bool(KNOWN_STAGE_VIOLATIONS), strict=True,
                   reason=f"known imports against the stage order: {sorted(KNOWN_STAGE_VIOLATIONS)}")
def test_each_stage_imports_only_from_the_stages_before_it():
    found = stage_violations()

    assert sorted(found) == []


def test_no_import_against_the_stage_order_beyond_the_known_ones():
    found = stage_violations()

    assert sorted(found - KNOWN_STAGE_VIOLATIONS) == []
