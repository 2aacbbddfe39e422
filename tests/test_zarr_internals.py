"""zarr's internals behind one module: :mod:`flyarchive.zarr_internals` is the only module of
flyarchive that imports ``zarr.core.*`` or a private zarr name (a ``zarr._...`` module, a
``_``-prefixed name imported from zarr, or a ``_``-prefixed attribute of a zarr object:
``arr._async_array``, a zarr codec's ``_decode_sync`` overridden or called). A zarr release
that moves an internal then breaks one module, and the source says where to look.

Read from the source (ast), as ``tests/test_layout_rules.py`` reads imports. The private
attributes of zarr's objects are those zarr's classes define (read from zarr itself), less
the names flyarchive's own classes define (their own privates, e.g. a ``_lock``).
"""

from __future__ import annotations

import ast
import inspect
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flyarchive"
#: The one module allowed.
ALLOWED = "flyarchive.zarr_internals"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _zarr_classes() -> list[type]:
    import zarr
    import zarr.abc.codec
    import zarr.abc.store
    import zarr.codecs
    import zarr.codecs.numcodecs
    import zarr.codecs.sharding
    import zarr.storage

    found = []
    for module in (zarr, zarr.abc.codec, zarr.abc.store, zarr.codecs, zarr.codecs.numcodecs,
                   zarr.codecs.sharding, zarr.storage):
        for value in vars(module).values():
            if inspect.isclass(value):
                found += [c for c in value.__mro__ if (c.__module__ or "").startswith("zarr")]
    return found


def _own_names(sources: dict[str, str]) -> set[str]:
    """``_``-prefixed names that flyarchive's own code defines (methods, attributes set on
    ``self``, class attributes), outside the allowed module."""
    names = set()
    for module, source in sources.items():
        if module == ALLOWED:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                names |= {t.id for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                          for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                          if isinstance(t, ast.Name)}
    return {n for n in names if n.startswith("_")}


@cache
def sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def zarr_private_names() -> frozenset[str]:
    """``_``-prefixed (not dunder) attributes of zarr's classes, less flyarchive's own."""
    names = set()
    for cls in _zarr_classes():
        members = [*vars(cls), *getattr(cls, "__annotations__", {}),
                   *getattr(cls, "__dataclass_fields__", {})]
        names |= {n for n in members if n.startswith("_") and not n.startswith("__")}
    return frozenset(names - _own_names(sources()))


def _zarr_bases(node: ast.ClassDef, from_zarr: set[str]) -> bool:
    """Whether a class subclasses something of zarr (``zarr.storage.LocalStore``, or a
    name imported from zarr)."""
    for base in node.bases:
        root = base
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and (root.id == "zarr" or root.id in from_zarr):
            return True
    return False


def internals_used(source: str, private: frozenset[str]) -> list[str]:
    """Where ``source`` reaches into zarr: ``"line: what"`` for each use."""
    tree = ast.parse(source)
    from_zarr = {alias.asname or alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zarr")
                 for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("zarr.core")
                      or (a.name.startswith("zarr.") and
                          any(p.startswith("_") for p in a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "zarr":
            parts = node.module.split(".")
            if node.module.startswith("zarr.core") or any(p.startswith("_") for p in parts) \
                    or any(a.name.startswith("_") for a in node.names):
                found.append(f"{node.lineno}: from {node.module} import "
                             f"{', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "zarr" and \
                    (node.attr == "core" or (node.attr.startswith("_")
                                             and not node.attr.startswith("__"))):
                found.append(f"{node.lineno}: zarr.{node.attr}")
            elif node.attr in private and not (isinstance(node.value, ast.Name)
                                               and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value in private:
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, ast.ClassDef) and _zarr_bases(node, from_zarr):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        inner.name in private:
                    found.append(f"{inner.lineno}: def {inner.name} (overrides zarr's)")
                elif isinstance(inner, ast.Attribute) and inner.attr in private and \
                        isinstance(inner.value, ast.Name) and inner.value.id in ("self", "cls"):
                    found.append(f"{inner.lineno}: {inner.value.id}.{inner.attr} (zarr's)")
    return sorted(set(found), key=lambda s: (int(s.split(":")[0]), s))


def test_only_the_zarr_internals_module_touches_zarr_internals():
    private = zarr_private_names()

    found = {module: used for module, source in sources().items()
             if module != ALLOWED and (used := internals_used(source, private))}

    assert found == {}, (
        "modules that reach into zarr's internals (use flyarchive.zarr_internals, or add "
        f"what they need there): {found}")


def test_the_zarr_internals_module_exists_and_reaches_into_zarr():
    used = internals_used(sources()[ALLOWED], zarr_private_names())

    assert any("zarr.core" in u for u in used) and any("._async_array" in u for u in used)


def test_the_rule_finds_each_way_into_zarr_internals():
    private = zarr_private_names()
    source = (
        "import zarr\n"
        "import zarr.core.sync\n"
        "from zarr.core.buffer import default_buffer_prototype\n"
        "from zarr.abc.store import RangeByteRequest, _store_supports_sync_io\n"
        "from zarr.codecs import Crc32cCodec\n"
        "def f(arr, codec):\n"
        "    zarr.core.buffer.default_buffer_prototype()\n"
        "    getattr(arr, '_async_array')\n"
        "    return arr._async_array.config, codec._decode_shard_index_sync\n"
        "class C(Crc32cCodec):\n"
        "    def _decode_sync(self, data, spec):\n"
        "        return super()._decode_sync(data, spec)\n"
        "class S(zarr.storage.LocalStore):\n"
        "    def get_sync(self, key):\n"
        "        self._ensure_open_sync()\n"
    )

    found = [line.split(": ", 1)[1] for line in internals_used(source, private)]

    assert found == [
        "import zarr.core.sync",
        "from zarr.core.buffer import default_buffer_prototype",
        "from zarr.abc.store import RangeByteRequest, _store_supports_sync_io",
        "zarr.core",
        "getattr(..., '_async_array')",
        "._async_array",
        "._decode_shard_index_sync",
        "def _decode_sync (overrides zarr's)",
        "._decode_sync",
        "self._ensure_open_sync (zarr's)",
    ]


def test_public_zarr_and_flyarchive_own_private_names_are_not_flagged():
    source = (
        "import zarr\n"
        "from zarr.abc.store import RangeByteRequest\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._lock = None\n"
        "def g(arr, mine):\n"
        "    return zarr.open_array, arr.metadata, mine._lock, arr.shards\n"
    )

    assert internals_used(source, zarr_private_names()) == []
