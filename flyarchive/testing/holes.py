"""Holes in an archive's state, on any storage (a local path, ``memory://``, ``s3://``): a
shard deleted, or inner chunks of a shard marked never written in its index, the way a
lost file or a writer that never wrote them leaves it; and the hostile cases built from
them (:data:`MISSING_CASES`), with those of archives whose parts disagree
(:data:`INCONSISTENT_CASES`), which :mod:`flyarchive.testing.hostile_cases` lists with its
other cases (run by :mod:`flyarchive.testing.hostile`). Used by the tests of :mod:`flyarchive.store.chunk_holes`, ``tests/bad_input`` and
``scripts/reliability_report.py``.

Shards are those flyarchive writes: inner chunks with a CRC-32C, the index at the end
(``(offset, length)`` little-endian ``uint64`` pairs, then its own CRC-32C).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EMPTY", "delete_object", "empty_inner_chunks", "inner_chunks_of", "READERS",
           "MISSING_CASES", "INCONSISTENT_CASES"]

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


# ----------------------------------------------------------------------------- hostile cases
# Edits of a copy of flyarchive.testing.hostile_cases.make_sound's archive (2 worlds x 20 frames,
# all committed; a qpos shard holds both worlds over 5 frames, an inner chunk one world).

#: The harness's commands that read recorded state (plot: world 0's qpos).
READERS = ("verify", "open_archive", "export-npz", "plot", "render")


def _deleted(key: str) -> Callable[[Path], None]:
    return lambda root: delete_object(str(root), key)


def _emptied(key: str, entries: Sequence[int]) -> Callable[[Path], None]:
    return lambda root: empty_inner_chunks(str(root), key, entries)


#: Committed frames missing: name -> (edit, the commands that read them; each must refuse).
MISSING_CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "qpos shard deleted inside n_frames": (_deleted("qpos/c/0/1/0"), READERS),
    "last committed qpos shard deleted": (_deleted("qpos/c/0/3/0"), READERS),
    "qpos index entry never written inside n_frames": (_emptied("qpos/c/0/2/0", [0]), READERS),
    "qpos shard index all never written": (_emptied("qpos/c/0/0/0", [0, 1]), READERS),
    "mocap_quat shard deleted inside n_frames": (
        _deleted("mocap_quat/c/0/1/0/0"), ("verify", "open_archive", "export-npz", "render")),
    "mocap_pos index entry never written": (
        _emptied("mocap_pos/c/0/2/0/0", [1]), ("verify", "open_archive", "export-npz", "render")),
    "time chunk deleted inside n_frames": (_deleted("time/c/2"), ("info", *READERS)),
    "sim_time chunk deleted inside n_frames": (_deleted("sim_time/c/1"), ("info", *READERS)),
}


def _json(root: Path, name: str, edit: Callable[[dict], None]) -> None:
    """Edit array ``name``'s metadata the same way in its own ``zarr.json`` and in the
    consolidated copy of the root ``zarr.json`` (a consistent edit: copies that disagree
    are a case of their own, :mod:`flyarchive.testing.checksums`)."""
    path = root / name / "zarr.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    root_path = root / "zarr.json"
    document = json.loads(root_path.read_text())
    copies = (document.get("consolidated_metadata") or {}).get("metadata") or {}
    if name in copies:
        edit(copies[name])
        root_path.write_text(json.dumps(document))


def _values(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        import zarr

        arr = zarr.open_array(str(root / name), mode="r+")
        arr[:] = change(np.asarray(arr[:]))

    return edit


def _short_world_var(root: Path) -> None:
    from flyarchive.store.world_vars import add_world_vars

    add_world_vars(str(root), {"gain": [0.5, 1.5]})
    _json(root, "gain", lambda meta: meta.update(shape=[1]))


def _repeat_third_time(time: np.ndarray) -> np.ndarray:
    time[3] = time[2]
    return time


#: Archives whose parts disagree: every way in (info, open_archive, render planning,
#: verify) must refuse each, the first three with the same error.
INCONSISTENT_CASES: dict[str, Callable[[Path], None]] = {
    "qpos dof extent 14, dof coordinate 13":
        lambda root: _json(root, "qpos", lambda meta: meta["shape"].__setitem__(2, 14)),
    "world variable of length 1 in 2 worlds": _short_world_var,
    "n_frames of length 3 in 2 worlds":
        lambda root: _json(root, "n_frames", lambda meta: meta.update(shape=[3])),
    "time coordinate reversed": _values("time", lambda t: t[::-1].copy()),
    "time coordinate repeats a frame's time": _values("time", _repeat_third_time),
    "n_frames beyond the time extent": _values("n_frames", lambda n: n + 5),
    "n_frames negative": _values("n_frames", lambda n: n - n - 1),
}
