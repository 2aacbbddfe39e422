"""What is at a URL where an archive was expected and none is: a depth or segmentation map
that ``flyarchive render`` wrote beside a video, an array or a folder inside an archive
(``run.zarr/qpos``), or a plain zarr array. Readers name it and say what to open instead
(:func:`not_an_archive`), rather than call it damaged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype

from flyarchive.errors import ArchiveNotFoundError
from flyarchive.schema import SCHEMA_NAME
from flyarchive.store.allowlist import MAX_METADATA_BYTES, check_json_bytes

#: Levels above a URL searched for the archive holding it.
_LEVELS = 4
_MAPS = {"depth": ("read_depth", "a (frames, H, W) float32 array in model length units"),
         "segmentation": ("read_segmentation", "a (frames, H, W) int32 array of geom ids")}


def _document(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``zarr.json`` at ``url``, parsed (None if there is none or it is not JSON).

    Read as a byte range of at most :data:`~flyarchive.store.allowlist.MAX_METADATA_BYTES`:
    the guarded local store checks whole metadata files against what archives hold, and
    a map's pipeline is not an archive's.
    """
    from flyarchive.store.location import open_store, sync

    try:
        store = open_store(url, storage_options, read_only=True)
        raw = sync(store.get("zarr.json", prototype=default_buffer_prototype(),
                             byte_range=RangeByteRequest(0, MAX_METADATA_BYTES)))
        if raw is None:
            return None
        data = raw.to_bytes()
        check_json_bytes(data, f"{url}/zarr.json", url)
        document = json.loads(data)
    except Exception:  # nothing to tell beyond what the caller says
        return None
    return document if isinstance(document, dict) else None


def _parent(url: str) -> str | None:
    """The URL one level up (None at a bucket, a drive's root, or a bare name)."""
    head, sep, path = url.rstrip("/").rpartition("://")
    if "/" not in path.strip("/"):
        return None
    return f"{head}{sep}{path.rsplit('/', 1)[0] or '/'}"


def not_an_archive(url: str, storage_options: Mapping[str, Any] | None = None
                   ) -> ArchiveNotFoundError | None:
    """The error for ``url`` when it holds a flyarchive map, or lies inside an archive, or
    is a plain zarr array; None when it is none of them.

    Returns:
        An :class:`ArchiveNotFoundError` naming what is there and what to open instead.
    """
    here = _document(url, storage_options)
    attributes = (here or {}).get("attributes")
    kind = attributes.get("flyarchive_map") if isinstance(attributes, dict) else None
    if kind in _MAPS:
        reader, what = _MAPS[kind]
        return ArchiveNotFoundError(
            f"No archive at {url!r}: it is a {kind} map that `flyarchive render` wrote beside a "
            f"video, not an archive. Read it with flyarchive.{reader}({url!r}) ({what}), or "
            "with any zarr v3 reader (zarr.open_array).")
    if (here or {}).get("node_type") == "group" and isinstance(attributes, dict) \
            and attributes.get("flyarchive_schema") == SCHEMA_NAME:
        return None  # flyarchive's own group (an archive, a derived group): its error stands
    parent, inside = url if "://" in url else os.path.abspath(url), []
    for _ in range(_LEVELS):
        name, parent = parent.rstrip("/").rsplit("/", 1)[-1], _parent(parent)
        if parent is None:
            break
        inside.insert(0, name)
        found = _document(parent, storage_options)
        if (found or {}).get("node_type") == "group" and \
                (found.get("attributes") or {}).get("flyarchive_schema") == SCHEMA_NAME:
            what = (f"the array {inside[0]!r}" if len(inside) == 1 and
                    (here or {}).get("node_type") == "array" else f"{'/'.join(inside)!r}")
            if "://" not in url and not os.path.isabs(url):  # as the user wrote it
                parent = os.path.relpath(parent)
            return ArchiveNotFoundError(
                f"No archive at {url!r}: it is {what} inside the archive at {parent!r}. Pass "
                f"the archive's URL instead, e.g. `flyarchive verify {parent}` or "
                f"flyarchive.open_archive({parent!r}).")
    if (here or {}).get("node_type") == "array":
        return ArchiveNotFoundError(
            f"No archive at {url!r}: it is a zarr array, not a flyarchive archive (a zarr group "
            "that flyarchive wrote). Open it with zarr.open_array.")
    return None
