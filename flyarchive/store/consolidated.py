"""Consolidated metadata: every array's metadata inside the root ``zarr.json``, so that a
reader (``open_archive``, plain ``xarray.open_zarr(url)``) opens an archive with one
metadata request.

zarr v3 keeps it inline in the root document (``"consolidated_metadata": {"kind":
"inline", "must_understand": false, "metadata": {name: array metadata}}``); readers that
do not know it ignore it. It is a copy, written by writers as the last step of a commit
(after ``n_frames``, the marker), with every ``time`` extent cut to the frames committed
(the largest ``n_frames``): a reader that trusts it never sees an extent beyond what was
committed, whatever point a writer died at. It may lag behind: a writer that died after
writing ``n_frames`` and before this step leaves the previous commit's copy, and
``open_archive`` then reads the arrays' own metadata (see
:func:`flyarchive.store.dataset.read_dataset`). Writers and ``verify`` never trust the
copy; :func:`consolidated_findings` compares it with the arrays' own metadata.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr

from flyarchive.errors import SchemaError
from flyarchive.store import replicas
from flyarchive.store.allowlist import check_array_metadata
from flyarchive.store.location import sync
from flyarchive.zarr_internals import (
    ArrayV3Metadata,
    ConsolidatedMetadata,
    GroupMetadata,
    default_buffer_prototype,
)

Metadata = ArrayV3Metadata | GroupMetadata


def _cut(meta: Metadata, n_time: int | None) -> Metadata:
    """``meta`` with its ``time`` extent cut to ``n_time`` (None: as it is)."""
    if isinstance(meta, GroupMetadata):
        return meta if meta.consolidated_metadata is not None else dataclasses.replace(
            meta, consolidated_metadata=ConsolidatedMetadata(metadata={}))
    dims = tuple(meta.dimension_names or ())
    if n_time is None or "time" not in dims:
        return meta
    axis = dims.index("time")
    if meta.shape[axis] <= n_time:
        return meta
    return meta.update_shape(tuple(n_time if i == axis else s for i, s in enumerate(meta.shape)))


def members_metadata(group: zarr.Group) -> dict[str, Metadata]:
    """The metadata of every node under ``group`` (one level), read from the store; other
    objects beside them (claims, stored models) are not nodes and are left out quietly."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr")
        return {name: node.metadata for name, node in group.members()}


def write_consolidated(group: zarr.Group, members: Mapping[str, Metadata],
                       n_time: int | None, attributes: Mapping[str, Any] | None = None) -> None:
    """Rewrite the root ``zarr.json`` of ``group`` with ``members`` consolidated in it.

    Args:
        group: The archive's root group, as a writer opened it.
        members: Metadata of every node, e.g. from :func:`members_metadata`.
        n_time: Cut every ``time`` extent to this many frames (the largest ``n_frames``);
            None keeps the extents (archives of fixed capacity, written by several writers).
        attributes: The root attributes to write (None: ``group``'s, as opened).

    Raises:
        OSError (and the storage's client errors): the storage failed; the root document
        is either the old one or the new one.
    """
    consolidated = ConsolidatedMetadata(metadata={k: _cut(v, n_time) for k, v in members.items()})
    root = dataclasses.replace(group.metadata, consolidated_metadata=consolidated,
                               **({} if attributes is None else {"attributes": dict(attributes)}))
    document = root.to_buffer_dict(default_buffer_prototype())["zarr.json"]
    sync((group.store_path / "zarr.json").set(document))


def consolidate(group: zarr.Group, *, n_time: int | None = None,
                members: Mapping[str, Metadata] | None = None) -> None:
    """Consolidate the metadata of every node (see :func:`write_consolidated`): ``members``
    where the caller holds it (a writer that just made every node), else read from the
    store."""
    write_consolidated(group, members_metadata(group) if members is None else members, n_time)


def time_extent(metadata: Mapping[str, Any]) -> int | None:
    """The shortest ``time`` extent among arrays' metadata (None if no array has one)."""
    extents = [m.shape[m.dimension_names.index("time")] for m in metadata.values()
               if isinstance(m, ArrayV3Metadata) and "time" in (m.dimension_names or ())]
    return min(extents) if extents else None


def root_document(group: zarr.Group) -> dict[str, Any] | None:
    """The root ``zarr.json`` of ``group``'s store as stored, parsed (None if unreadable)."""
    import json

    raw = sync((group.store_path / "zarr.json").get(prototype=default_buffer_prototype()))
    try:
        parsed = json.loads(raw.to_bytes()) if raw is not None else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


#: What consolidated metadata that a commit in progress can explain says while a writer
#: holds the archive: no advice to restore or delete metadata then.
WHILE_WRITING = "A commit in progress explains it; run verify again once the writer is closed."
_FIX = ("Readers that use it (open_archive, xarray.open_zarr) would read the wrong data; "
        "restore the root zarr.json from a backup, or delete its 'consolidated_metadata' "
        "entry (readers then read each array's own zarr.json).")


def consolidated_findings(root_document: Mapping[str, Any] | None, group: zarr.Group,
                          n_frames: np.ndarray | None, archive: str = ""
                          ) -> list[tuple[str, str | None]]:
    """What is wrong with an archive's consolidated metadata (empty when sound or absent).

    Read ``root_document`` before ``n_frames`` and ``group``'s arrays: writers grow the
    arrays, then commit ``n_frames``, then rewrite the copy, so a copy read first is never
    ahead of them, whatever a writer does meanwhile.

    Args:
        root_document: The root ``zarr.json``, parsed (None: none could be read).
        group: The archive's group opened without the consolidated copy (its arrays'
            own metadata, read now).
        n_frames: The commit markers, for archives of one writer (None: not checked,
            e.g. archives of fixed capacity whose extents are set at creation).
        archive: The archive's URL, for messages.

    Returns:
        ``(sentence, while_writing)`` per problem. ``while_writing`` is None for damage
        whatever a writer does: a copy whose pipeline flyarchive does not write (no
        CRC-32C checksum...), a copy that decodes otherwise than the array's own metadata
        (the sentences readers refuse it with: :mod:`~flyarchive.store.replicas`), other
        differences (attributes). For what a commit in progress can explain (an array
        missing from the copy, a ``time`` extent beyond the largest ``n_frames``) it is
        the sentence to show while a writer holds the archive.
    """
    copy = (root_document or {}).get("consolidated_metadata")
    if not isinstance(copy, Mapping):
        return []
    try:
        root = GroupMetadata.from_dict({**root_document, "node_type": "group"})
        listed = dict(root.consolidated_metadata.metadata) if root.consolidated_metadata else {}
    except Exception as err:  # zarr refuses what it cannot parse
        return [(f"The consolidated metadata in the root zarr.json is unreadable ({err}); "
                 "rewrite it by appending a frame, or delete its 'consolidated_metadata' entry.",
                 None)]
    found: list[tuple[str, str | None]] = []
    for name, arr in sorted(group.arrays()):
        copied = listed.get(name)
        if copied is None:
            what = f"The consolidated metadata lacks the array {name!r}."
            found.append((f"{what} {_FIX}", f"{what} {WHILE_WRITING}"))
        elif not isinstance(copied, ArrayV3Metadata):
            found.append((f"The consolidated metadata of {name!r} is not an array's. {_FIX}", None))
        else:
            found += [(text, None) for text in _array_copy_problems(name, arr, copied, archive)]
    extent = time_extent(listed)
    if n_frames is not None and extent is not None and extent > int(np.max(n_frames, initial=0)):
        what = (f"The consolidated metadata gives 'time' {extent} frames, more than the "
                f"{int(np.max(n_frames, initial=0))} committed (n_frames): it is ahead of the "
                "commit markers.")
        found.append((f"{what} {_FIX}", f"{what} {WHILE_WRITING}"))
    return found


def consolidated_behind(root_document: Mapping[str, Any] | None, n_frames: np.ndarray
                        ) -> int | None:
    """The frames of ``time`` the consolidated copy gives when that is fewer than the
    largest of ``n_frames`` (a writer stopped between committing and consolidating: step
    5 of the next commit rewrites it); None when it is not behind, or absent."""
    copy = (root_document or {}).get("consolidated_metadata")
    if not isinstance(copy, Mapping):
        return None
    try:
        root = GroupMetadata.from_dict({**root_document, "node_type": "group"})  # type: ignore[dict-item]
        listed = dict(root.consolidated_metadata.metadata) if root.consolidated_metadata else {}
    except Exception:  # noqa: BLE001 - unreadable: consolidated_findings says so
        return None
    extent = time_extent(listed)
    committed = int(np.max(n_frames, initial=0))
    return extent if extent is not None and extent < committed else None


def _array_copy_problems(name: str, arr: zarr.Array, copied: ArrayV3Metadata,
                         archive: str) -> list[str]:
    copy, own = replicas.plain(copied), replicas.plain(arr.metadata)
    problems = []
    try:
        check_array_metadata(copy, replicas.copy_where(archive, name), archive, name=name)
    except SchemaError as err:
        problems.append(str(err))
    found = replicas.differences(own, copy)
    if found:
        problems.append(str(replicas.disagreement(name, found, archive)))
    elif copy.get("attributes") != own.get("attributes"):
        problems.append(f"The consolidated metadata of {name!r} differs from its own zarr.json "
                        f"in its attributes. {_FIX}")
    return problems
