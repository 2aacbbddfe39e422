"""The package's shape: its imports (read from the source, imports inside functions
included) have no cycles, the product never imports its test support, and each stage
imports only from the stages before it, in the order of the data flow
(../shared/DESIGN.md):

    base <- record <- store <- query <- analyze <- replay <- video <- render <- distribute
         <- applications

Record imports only the base modules, and the store never imports the record stage: what
a recorder hands the store (:class:`ArchiveSpec`, :class:`FrameBlock`) is a base module's
(:mod:`flyarchive.archive_spec`); recorders hand blocks of frames to a sink
(:mod:`flyarchive.record.sink`, the protocols the store's writer implements), and the public
recorders are bound to the store and query by an application package
(:mod:`flyarchive.recorders`). Render (how one process turns an archive into videos) never
imports distribute (where that work runs).

Base modules (errors, schema, layout, clock, codecs, models, config, warp_log, lru,
zarr_internals, archive_spec) import only each other; applications (cli, demo, plot, summary,
recorders, interop, view, and the package's own ``__init__``) may import anything;
``flyarchive.testing`` is not part of the product and may import anything too.

The models package is the one home of models, and spans floors (:data:`FLOORS`): its
modules are base modules, but for :mod:`flyarchive.models.kept` (the kept forms, read and
written through the store: the store's floor) and :mod:`flyarchive.models.shipping` (models
sent to Dask workers: the analysis's floor). Its ``__init__`` is a base module: it imports
the base modules of the package, and the names of the others on first use (a module
``__getattr__`` and its ``_LAZY`` map, as ``flyarchive/__init__.py`` does). ``from package
import name`` of a name in a package's ``_LAZY`` map counts as an import of the module the
map names.

The public line: no module imports another module's private (``_name``) names, ``__all__``
appears only in the public modules (:data:`PUBLIC`), and every module is listed in its
package's docstring.

Each rule's test fails naming what breaks it.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator
from functools import cache
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "flyarchive"

BASE = frozenset({"errors", "schema", "layout", "clock", "codecs", "models", "config", "warp_log",
                  "lru", "zarr_internals", "archive_spec"})
STAGES = ("record", "store", "query", "analyze", "replay", "video", "render", "distribute")
#: Modules of a base package that are of a later stage's floor: module -> stage.
FLOORS = {"flyarchive.models.kept": "store", "flyarchive.models.shipping": "analyze"}
APPLICATIONS = frozenset({"cli", "demo", "plot", "summary", "recorders", "interop", "view",
                          "__main__"})
TEST_SUPPORT = "flyarchive.testing"

#: The public modules: the package's face (``flyarchive``), the errors, the environment
#: variables, models as files and bytes, the test support (as ``zarr.testing``), and the
#: bridges users call by module. Only these declare ``__all__``.
PUBLIC = frozenset({"flyarchive", "flyarchive.errors", "flyarchive.config", "flyarchive.models",
                    "flyarchive.interop.nmf", "flyarchive.interop.flygym_sim",
                    "flyarchive.interop.flygym_npz"})


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


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` in ``package`` imports from, relative ones resolved."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    return base


def our_imports(tree: ast.AST, package: str) -> Iterator[tuple[ast.alias, str | None]]:
    """``(alias, None)`` for each ``import flyarchive...`` in ``tree`` and ``(alias, module)``
    for each name of a ``from flyarchive... import`` (relative ones resolved in ``package``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a, None) for a in node.names if a.name.split(".")[0] == "flyarchive")
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, package)
            if base.split(".")[0] == "flyarchive":
                yield from ((a, base) for a in node.names)


def imports_in(source: str, name: str, package: str) -> set[str]:
    """The package's modules that the source of module ``name`` (in ``package``) imports.

    ``from flyarchive.store import ArchiveWriter`` is an import of ``flyarchive.store``;
    ``from flyarchive.store import writer`` one of ``flyarchive.store.writer``;
    ``from flyarchive.models import load_kept_model`` one of the module that
    ``flyarchive.models`` loads it from on first use (:func:`lazy_names`). Parent
    packages imported on the way are not counted.
    """
    found: set[str | None] = set()
    for alias, base in our_imports(ast.parse(source), package):
        if base is None:
            found.add(_known(alias.name))
        else:
            sub = f"{base}.{alias.name}"
            lazy = lazy_names(base).get(alias.name)
            found.add(sub if sub in modules() else lazy if lazy else _known(base))
    found.discard(None)
    found.discard(name)
    return found  # type: ignore[return-value]


@cache
def lazy_names(package: str) -> dict[str, str]:
    """The names a package of ours loads on first use, and their modules: its ``__init__``'s
    ``_LAZY`` map (``{}`` for a module, or a package without one)."""
    path = modules().get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "_LAZY" and node.value is not None:
            return {k: v for k, v in ast.literal_eval(node.value).items()}
    return {}


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
    """``(rank, group)``: base 0, the stages 1..8 in flow order, applications 100. A module
    of :data:`FLOORS` is of its stage."""
    parts = name.split(".")
    if len(parts) == 1:
        return 100, "flyarchive"  # the package's __init__: re-exports the API on top
    if name in FLOORS:
        return 1 + STAGES.index(FLOORS[name]), FLOORS[name]
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
        "    from .selection import select_frames\n"
        "    import flyarchive.replay.opengl_frames\n"
    )

    found = imports_in(source, "flyarchive.query.archive", "flyarchive.query")

    assert found == {"flyarchive.errors", "flyarchive.store.writer", "flyarchive.query.selection",
                     "flyarchive.replay.opengl_frames"}


def test_cycles_are_found_and_named():
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
             "d": frozenset({"a"})}

    found = cycles(edges)

    assert found == [frozenset({"a", "b", "c"})]
    assert a_cycle_through(found[0], edges) == ["a", "b", "c", "a"]


def test_the_package_has_no_import_cycle():
    found = cycles(graph())

    assert found == [], f"import cycles: {describe(found)}"


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


def test_each_stage_imports_only_from_the_stages_before_it():
    found = stage_violations()

    assert sorted(found) == []


def test_a_lazy_name_of_a_package_is_read_as_an_import_of_its_module():
    source = ("from flyarchive.models import load_kept_model, model_bytes\n"
              "def f():\n"
              "    from flyarchive import verify\n")

    found = imports_in(source, "flyarchive.render.plan", "flyarchive.render")

    assert found == {"flyarchive.models.kept", "flyarchive.models", "flyarchive.store.integrity"}


def test_each_module_of_the_models_package_has_its_floor():
    floors = {name: layer(name)[1] for name in modules() if name.startswith("flyarchive.models.")}

    assert sorted(name for name in FLOORS if name not in modules()) == []
    assert {name for name, floor in floors.items() if floor != "base"} == set(FLOORS)
    assert floors["flyarchive.models.kept"] == "store"
    assert floors["flyarchive.models.shipping"] == "analyze"
    assert floors["flyarchive.models.check"] == floors["flyarchive.models.child"] == "base"


def test_the_models_package_imports_its_base_modules_only_and_loads_the_others_lazily():
    init = modules()["flyarchive.models"]
    eager = {target for node in ast.parse(init.read_text()).body
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flyarchive")
             for target in imports_in(ast.unparse(node), "flyarchive.models", "flyarchive.models")}
    lazy = set(lazy_names("flyarchive.models").values())

    assert eager and sorted(t for t in eager if layer(t)[0] != 0) == []
    assert lazy and lazy <= set(FLOORS)  # what it loads on first use: modules above the base


# ----------------------------------------------------------------------------- packages
def room(name: str) -> str:
    """The package (or top-level module) module ``name`` is of: ``flyarchive.store.writer``
    -> ``flyarchive.store``; a module of :data:`FLOORS` is of its floor's package
    (``flyarchive.models.kept`` stands with the store)."""
    return f"flyarchive.{FLOORS[name]}" if name in FLOORS else ".".join(name.split(".")[:2])


def package_graph() -> dict[str, frozenset[str]]:
    """Which packages and top-level modules of the product import which others (the
    package's own ``__init__``, which re-exports the API on top, left out)."""
    edges: dict[str, set[str]] = {}
    for importer, targets in graph().items():
        if importer == "flyarchive" or not is_product(importer):
            continue
        here = room(importer)
        edges.setdefault(here, set()).update(
            room(t) for t in targets if t != "flyarchive" and is_product(t) and room(t) != here)
    return {name: frozenset(targets) for name, targets in edges.items()}


#: Module names that name one thing in several packages, and why. A basename says what a
#: module holds; the same name in two packages would be two things under one name.
SHARED_BASENAMES = {
    "__init__.py": "Python's name for a package's face (each lists its package's modules)",
    "__main__.py": "Python's name for a package's program: ``python -m flyarchive`` and "
                   "``python -m flyarchive.cli`` both run the flyarchive command",
}


def repeated_basenames() -> dict[str, list[str]]:
    """``basename -> its paths`` for each module basename used more than once under
    flyarchive/ (test support included), but :data:`SHARED_BASENAMES`."""
    paths: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        paths.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    return {name: found for name, found in paths.items()
            if len(found) > 1 and name not in SHARED_BASENAMES}


def test_no_import_loop_between_packages_applications_included():
    found = cycles(package_graph())

    assert found == [], " ; ".join(" -> ".join(a_cycle_through(c, package_graph()))
                                   for c in found)


def test_a_loop_between_two_packages_is_found_although_no_module_loop_is():
    edges = {"flyarchive.recorders": frozenset({"flyarchive.interop"}),
             "flyarchive.interop": frozenset({"flyarchive.recorders"})}

    assert cycles(edges) == [frozenset(edges)]
    assert room("flyarchive.recorders.stored_archives") == "flyarchive.recorders"
    assert room("flyarchive.models.kept") == "flyarchive.store"


def test_the_store_never_imports_the_record_stage():
    found = sorted((importer, target) for importer, targets in graph().items()
                   if is_product(importer) and layer(importer)[1] == "store"
                   for target in targets if is_product(target) and layer(target)[1] == "record")

    assert found == [], "what both need belongs to a base module (as flyarchive.archive_spec)"


def test_no_module_basename_is_used_for_two_things():
    assert repeated_basenames() == {}


def test_each_shared_basename_is_still_shared():
    counts = {name: len(list(PACKAGE.rglob(name))) for name in SHARED_BASENAMES}

    assert {name: n for name, n in counts.items() if n < 2} == {}


# ----------------------------------------------------------------------------- the public line
def is_public(name: str) -> bool:
    return name in PUBLIC or not is_product(name)


def private_uses_in(source: str, name: str, package: str) -> set[tuple[str, str]]:
    """``(name, "module.attr")`` for each private name of another of the package's modules
    that the source of module ``name`` imports (``from flyarchive.x import _y``) or reads
    as an attribute of a module it imported (``x._y``, ``flyarchive.x._y``). Dunder names
    (``__all__``, ``__version__``) are not private."""
    def private(attr: str) -> bool:
        return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))

    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> module of ours it is bound to
    found: set[tuple[str, str]] = set()
    for alias, base in our_imports(tree, package):
        sub = alias.name if base is None else f"{base}.{alias.name}"
        if sub in modules():
            bound[alias.asname or alias.name] = sub
        elif base is not None and private(alias.name) and base != name:
            found.add((name, sub))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = _dotted(node.value)
            target = bound.get(owner) or (owner if owner in modules() else None)
            if target is not None and target != name:
                found.add((name, f"{target}.{node.attr}"))
    return found


def _dotted(node: ast.expr) -> str:
    """``a.b.c`` of an expression made only of names and attributes ("" otherwise)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


def private_uses() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found |= private_uses_in(path.read_text(), name, package)
    return found


def declares_all(name: str) -> bool:
    tree = ast.parse(modules()[name].read_text())
    return any(isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
        isinstance(t, ast.Name) and t.id == "__all__"
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in tree.body)


def all_outside_public() -> set[str]:
    return {name for name in modules() if not is_public(name) and declares_all(name)}


def unlisted() -> set[str]:
    """Modules (and subpackages) whose full name is missing from their package's docstring."""
    missing = set()
    for name, path in modules().items():
        if "." not in name or path.name == "__main__.py":
            continue
        package = name.rpartition(".")[0]
        doc = ast.get_docstring(ast.parse(modules()[package].read_text())) or ""
        if not re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", doc.replace("~", "")):
            missing.add(name)
    return missing


def test_private_names_of_other_modules_are_found():
    source = (
        "import flyarchive.store.writer\n"
        "from flyarchive.store import opener as o\n"
        "from flyarchive.store.opener import _refuse_v2, open_for_reading\n"
        "from flyarchive.errors import __all__\n"
        "def f():\n"
        "    return o._open_group(), flyarchive.store.writer._opened, o.open_for_reading\n"
    )

    found = private_uses_in(source, "flyarchive.query.archive", "flyarchive.query")

    assert found == {("flyarchive.query.archive", "flyarchive.store.opener._refuse_v2"),
                     ("flyarchive.query.archive", "flyarchive.store.opener._open_group"),
                     ("flyarchive.query.archive", "flyarchive.store.writer._opened")}


def test_no_module_uses_another_modules_private_names():
    assert sorted(private_uses()) == []


def test_only_public_modules_declare_all():
    assert sorted(all_outside_public()) == []


def test_the_public_modules_exist_and_declare_all():
    assert sorted(name for name in PUBLIC if name not in modules() or not declares_all(name)) == []


def test_every_module_is_listed_in_its_packages_docstring():
    assert sorted(unlisted()) == []



# ----------------------------------------------------------------------------- the README's map
def readme_layout() -> str:
    """The README's "Layout of the code" section."""
    text = (PACKAGE.parent / "README.md").read_text()
    start = text.index("### Layout of the code")
    end = text.find("\n#", start + 1)
    return text[start:end if end != -1 else None]


def unmapped() -> list[str]:
    """The packages (``name/``) and top-level modules (``name`` or ``name.py``) of flyarchive
    that the README's "Layout of the code" does not name."""
    section = readme_layout()
    missing = []
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            if f"`{path.name}/`" not in section:
                missing.append(f"{path.name}/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            if f"`{path.stem}`" not in section and f"`{path.name}`" not in section:
                missing.append(path.name)
    return missing


def test_the_readmes_layout_of_the_code_maps_every_package_and_top_level_module():
    assert unmapped() == []


# ----------------------------------------------------------------------------- caches
#: Module-level mutable holders that are not caches, and why (each else is a hand-made
#: cache: keep what a process reuses in :class:`flyarchive.lru.LRUCache`).
NOT_CACHES = {
    "flyarchive.render.renderer_cache._slots": "the Warp slots a process uses, each an LRUCache",
    "flyarchive.record.common._BEFORE_EXIT": "what runs first at exit, in order",
    "flyarchive.render.renderer_cache._local": "each thread's OpenGL LRUCache",
    "flyarchive.analyze.blocks._LOCAL": "each thread's LRUCache of CPU engines",
    "flyarchive.store.claims._HOLDERS": "the claims this process holds, by writer (weak)",
    "flyarchive.warp_log._warn_of_another_line": "a warning said once per process",
    "flyarchive.store.creation._installed_versions": "the installed packages' versions, looked "
                                                     "up once (functools.cache of a pure lookup)",
}
_HOLDERS = ("dict", "OrderedDict", "defaultdict", "threading.local", "local", "WeakValueDictionary")


def hand_made_caches(tree: ast.AST, name: str) -> list[str]:
    """Module-level names bound to an empty mutable mapping (or a thread-local holder) or
    decorated with ``functools.cache``/``lru_cache`` in the module ``name``'s ``tree``,
    not listed in :data:`NOT_CACHES`."""
    found = []
    for node in getattr(tree, "body", []):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        empty = isinstance(value, ast.Dict) and not value.keys or \
            isinstance(value, ast.Call) and _dotted(value.func).split(".", 1)[-1] in _HOLDERS \
            and not value.args
        if empty:
            found += [f"{name}.{t.id}" for t in targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.FunctionDef) and any(
                _dotted(d.func if isinstance(d, ast.Call) else d).endswith(("cache", "lru_cache"))
                for d in node.decorator_list):
            found.append(f"{name}.{node.name}")
    return [f for f in found if f not in NOT_CACHES]


def test_hand_made_caches_are_found():
    tree = ast.parse("import functools, threading\n_A = {}\n_B: dict[str, int] = {}\n"
                     "_C = threading.local()\nTABLE = {'a': 1}\n"
                     "@functools.cache\ndef f(): pass\n")

    assert hand_made_caches(tree, "m") == ["m._A", "m._B", "m._C", "m.f"]


def test_every_process_level_cache_is_the_one_cache_helper():
    found = [cache for name, path in modules().items() if not name.startswith(TEST_SUPPORT)
             for cache in hand_made_caches(ast.parse(path.read_text()), name)]

    assert found == [], f"hand-made caches (use flyarchive.lru.LRUCache): {found}"
