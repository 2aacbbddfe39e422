"""One opener and one reader family: no module of flyarchive but the opener
(:mod:`flyarchive.store.opener`) opens a zarr group, array or dataset of an archive
(``zarr.open*``, ``zarr.api...open*``, ``xarray.open_zarr``), and no module outside the
store's reader family defines a state reader (a class named ``...Reader``). Every reader
(query, render, positions, the viewer, exports, verify, derived groups) opens through
:func:`~flyarchive.store.opener.open_for_reading`.

Read from the source (ast). The modules that open plain zarr that is not an archive, and
why, are listed in :data:`NOT_ARCHIVES`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flyarchive"
OPENER = "flyarchive.store.opener"
#: Modules that open plain zarr without the opener: none of it is an archive.
NOT_ARCHIVES = {
    "flyarchive.video.maps": "a render's depth and segmentation maps: plain zarr arrays",
    "flyarchive.video.decode": "reads those maps back",
    "flyarchive.store.world_vars": "encodes a world variable's chunks in a scratch "
                                   "in-memory store",
}
#: Test support damages archives (and checks them) with plain zarr, as a user's own code
#: would: it is not the product.
TEST_SUPPORT = "flyarchive.testing"
#: The store's state reader family.
READER_FAMILY = frozenset({"flyarchive.store.reader", "flyarchive.store.window_reader"})
#: Reader classes below the family, and what they read: the bytes of one shard.
BELOW_FAMILY = {"flyarchive.store.shards": {"ShardReader"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _chain(node: ast.AST) -> list[str]:
    """``zarr.api.asynchronous.open_group`` -> ``["zarr", "api", "asynchronous",
    "open_group"]``; [] when the root is not a name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    return [node.id, *names] if isinstance(node, ast.Name) else []


def zarr_opens(source: str) -> list[str]:
    """``"line: call"`` for each call in ``source`` that opens zarr by itself."""
    tree = ast.parse(source)
    modules = {"zarr"}  # names bound to zarr or its modules
    opener_names = set()  # open functions imported by name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names
                        if a.name.split(".")[0] == "zarr"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "zarr":
            for alias in node.names:
                if alias.name.startswith("open"):
                    opener_names.add(alias.asname or alias.name)
                else:
                    modules.add(alias.asname or alias.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain = _chain(node.func)
        if not chain:
            continue
        zarr_open = chain[0] in modules and any(part.startswith("open") for part in chain[1:])
        by_name = len(chain) == 1 and chain[0] in opener_names
        if zarr_open or by_name or chain[-1] == "open_zarr":
            found.append(f"{node.lineno}: {'.'.join(chain)}")
    return found


def reader_classes(source: str) -> list[str]:
    """The classes ``source`` defines whose name says they read (``...Reader``)."""
    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.name.endswith("Reader")]


def _sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_only_the_opener_opens_a_zarr_group_of_an_archive():
    allowed = {OPENER, *NOT_ARCHIVES}

    found = {module: opens for module, source in _sources().items()
             if module not in allowed and not module.startswith(TEST_SUPPORT)
             and (opens := zarr_opens(source))}

    assert found == {}, (
        "modules that open zarr themselves (open archives with "
        f"flyarchive.store.opener.open_for_reading or open_for_writing): {found}")


def test_the_opener_is_where_archives_are_opened():
    opens = zarr_opens(_sources()[OPENER])

    assert [call.split(": ")[1] for call in opens] == ["open_group"]  # zarr's, awaited there


def test_no_module_outside_the_reader_family_defines_a_state_reader():
    found = {module: extra for module, source in _sources().items()
             if module not in READER_FAMILY
             and (extra := set(reader_classes(source)) - BELOW_FAMILY.get(module, set()))}

    assert found == {}, (
        "reader classes outside the store's reader family (flyarchive.store.reader, "
        f"flyarchive.store.window_reader): {found}")


def test_the_reader_family_has_one_name_per_class():
    names = [name for module in sorted(READER_FAMILY)
             for name in reader_classes(_sources()[module])]

    assert len(names) == len(set(names)) and {"StateReader", "WindowReader",
                                               "ProcessWindowReader", "DaskWindowReader"} <= set(names)


@pytest.mark.parametrize(("source", "expected"), [
    ("import zarr\nzarr.open_group('x', mode='r')\n", ["zarr.open_group"]),
    ("import zarr\nzarr.open('x')\nzarr.open_consolidated('x')\n", ["zarr.open", "zarr.open_consolidated"]),
    ("import zarr.api.asynchronous as za\nza.open_group('x')\n", ["za.open_group"]),
    ("from zarr import open_group as og\nog('x')\n", ["og"]),
    ("from zarr import Group\nGroup.open('x')\n", ["Group.open"]),
    ("import xarray as xr\nxr.open_zarr('x')\n", ["xr.open_zarr"]),
    ("import zarr\nzarr.create_array('x', shape=(1,), dtype='i4')\nopen('f')\n", []),
])
def test_the_rule_finds_each_way_to_open_zarr(source, expected):
    assert [call.split(": ")[1] for call in zarr_opens(source)] == expected


def test_the_rule_finds_a_reader_class():
    assert reader_classes("class MyStateReader:\n    pass\nclass Other:\n    pass\n") == [
        "MyStateReader"]
