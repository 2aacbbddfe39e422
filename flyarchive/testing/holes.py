"""Holes in an archive's state, on any storage (a local path, ``memory://``, ``s3://``): a
shard deleted, or inner chunks of a shard marked never written in its index, the way a
lost file or a writer that never wrote them leaves it. Used by the tests of
:mod:`flyarchive.store.missing` and the hostile cases of :mod:`flyarchive.testing.hostile`.

Shards are those flyarchive writes: inner chunks with a CRC-32C, the index at the end
(``(offset, length)`` little-endian ``uint64`` pairs, then its own CRC-32C).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["EMPTY", "delete_object", "empty_inner_chunks", "inner_chunks_of"]

#: An index entry (offset and length) of an inner chunk never written.
EMPTY = 2**64 - 1


def _fs(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, root.rstrip("/")


def delete_object(url: str, key: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the stored object ``key`` (e.g. ``"qpos/c/0/1/0"``) of the archive at ``url``."""
    fs, root = _fs(url, storage_options)
    fs.rm(f"{root}/{key}")


def inner_chunks_of(url: str, name: str, storage_options: Mapping[str, Any] | None = None
                    ) -> int:
    """Inner chunks per shard of state variable ``name``."""
    import json

    fs, root = _fs(url, storage_options)
    meta = json.loads(fs.cat(f"{root}/{name}/zarr.json"))
    outer = meta["chunk_grid"]["configuration"]["chunk_shape"]
    inner = meta["codecs"][0]["configuration"]["chunk_shape"]
    return int(np.prod([o // i for o, i in zip(outer, inner)]))


def empty_inner_chunks(url: str, key: str, entries: Sequence[int],
                       storage_options: Mapping[str, Any] | None = None) -> None:
    """Mark inner chunks ``entries`` (positions in the shard's index, C order over the
    shard's inner-chunk grid) of the shard ``key`` never written; the index keeps a
    valid checksum, so only the entries tell."""
    import google_crc32c

    fs, root = _fs(url, storage_options)
    name = key.split("/")[0]
    n = inner_chunks_of(url, name, storage_options)
    data = fs.cat(f"{root}/{key}")
    size = n * 16 + 4
    index = np.frombuffer(data[-size:-4], "<u8").reshape(n, 2).copy()
    index[list(entries)] = EMPTY
    raw = index.astype("<u8").tobytes()
    crc = np.uint32(google_crc32c.value(raw)).tobytes()
    fs.pipe(f"{root}/{key}", data[:-size] + raw + crc)
