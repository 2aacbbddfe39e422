"""Inside ``n_frames``, missing is damage: state that a read covers, whose chunk, shard or
index entry is missing, and that holds committed frames, raises one
:class:`~flyarchive.errors.CorruptArchiveError` naming the variable, the worlds, the
frames and the file. Frames at or beyond a world's ``n_frames`` are not data: missing
there is legal (readers mask them).

zarr reads a missing chunk as the fill value (xarray #10117), so a reader must ask. The
shard reader (:class:`~flyarchive.store.shards.ShardReader`) knows from the requests it
makes anyway which inner chunks hold nothing (:class:`~flyarchive.store.shards.NeverWritten`);
reads through zarr itself (selections the shard reader does not take, the render's
:class:`~flyarchive.store.reader.StateReader`) look only when a committed frame read as
the fill value (:func:`probe`): a sound read costs no request more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zarr

from flyarchive.errors import CorruptArchiveError
from flyarchive.store.location import sync
from flyarchive.store.shards import NeverWritten, ShardReader

_MAX_NAMED = 8  # holes named in one error


@dataclass(frozen=True)
class Hole:
    """Committed frames that a read found missing.

    Attributes:
        empty: The inner chunk (or chunk) that holds nothing.
        worlds: World indices (along the array's first axis) of the committed frames
            missing, sorted.
        frames: ``(first, last)`` of those frames.
    """

    empty: NeverWritten
    worlds: tuple[int, ...]
    frames: tuple[int, int]


def committed_holes(empty: Sequence[NeverWritten], worlds: np.ndarray, frames: np.ndarray,
                    n_frames: np.ndarray) -> list[Hole]:
    """The empty chunks of a read that hold committed frames of the cells it read.

    Args:
        empty: Empty chunks the read covered (world axis first, then ``time``).
        worlds: ``(w,)`` world indices the read selected.
        frames: ``(f,)`` frames the read selected.
        n_frames: ``(world,)`` committed frames of every world of the array.

    Returns:
        One hole per empty chunk holding at least one selected committed frame.
    """
    holes = []
    for chunk in empty:
        (w0, w1), (t0, t1) = chunk.region[:2]
        ws = worlds[(worlds >= w0) & (worlds < w1)]
        fs = frames[(frames >= t0) & (frames < t1)]
        committed = fs[None, :] < n_frames[ws][:, None]
        if committed.any():
            hit = fs[committed.any(axis=0)]
            holes.append(Hole(chunk, tuple(sorted({int(w) for w in ws[committed.any(axis=1)]})),
                              (int(hit.min()), int(hit.max()))))
    return holes


def fill_cells(values: np.ndarray, fill: object) -> np.ndarray:
    """``(w, f)`` bool: which (world, frame) cells of ``values`` (``(w, f, ...)``) hold the
    fill value somewhere (NaN compares as NaN)."""
    fill_is_nan = isinstance(fill, (float, np.floating)) and np.isnan(fill)
    hit = np.isnan(values) if fill_is_nan else values == np.asarray(fill, dtype=values.dtype)
    return hit.reshape(*values.shape[:2], -1).any(axis=2) if values.ndim > 2 else hit


def probe(arr: zarr.Array, cells: np.ndarray) -> list[NeverWritten]:
    """Which chunks holding ``cells`` are empty: asked of the storage, for reads through
    zarr, only after committed frames read as the fill value.

    Args:
        arr: A state array ``(world, time, ...)``.
        cells: ``(n, 2)`` (world index, frame) pairs that read as the fill value.

    Returns:
        The empty inner chunks (sharded arrays: the shard's index is read; a shard this
        zarr release's internals cannot read is looked up whole) or chunks, each once.
    """
    inner = np.asarray(arr.chunks[:2], dtype=np.int64)
    found: list[NeverWritten] = []
    tail = tuple(slice(0, int(n)) for n in arr.shape[2:])
    reader = ShardReader(arr) if arr.shards is not None and ShardReader.supports(arr) else None
    for w, t in np.unique(np.asarray(cells, dtype=np.int64) // inner, axis=0) * inner:
        box = (slice(int(w), int(min(w + inner[0], arr.shape[0]))),
               slice(int(t), int(min(t + inner[1], arr.shape[1]))), *tail)
        if reader is not None:
            reader.read(box, never_written=found)
            continue
        outer = arr.shards or arr.chunks
        coords = (int(w) // int(outer[0]), int(t) // int(outer[1])) + (0,) * (arr.ndim - 2)
        key = (arr.store_path / arr.metadata.encode_chunk_key(coords)).path
        if not sync(arr.store_path.store.exists(key)):
            region = ((box[0].start, box[0].stop), (box[1].start, box[1].stop),
                      *((0, int(n)) for n in arr.shape[2:]))
            found.append(NeverWritten(region, key, True))
    return found


def missing_error(url: str, name: str, world_ids: np.ndarray, holes: Sequence[Hole],
                  advice: str | None = None) -> CorruptArchiveError:
    """The error for committed frames found missing: each hole's variable, worlds (ids and
    indices), frames and file (the holes of one file merged), and what to do (``advice``:
    :func:`flyarchive.schema.damage_advice`; None: an archive's)."""
    holes = _by_file(holes)
    named = "; ".join(_describe(name, world_ids, hole) for hole in holes[:_MAX_NAMED])
    more = f" and {len(holes) - _MAX_NAMED} more" if len(holes) > _MAX_NAMED else ""
    why = ("the file is missing" if holes[0].empty.shard_missing
           else "the shard's index marks the chunk as never written")
    return CorruptArchiveError(
        f"Reading {named}{more} from {url!r} failed: {why}, but n_frames says these frames "
        f"were committed. The {'archive is' if advice is None else 'stored values are'} "
        "damaged (a file was deleted, lost or cut short). "
        + (advice or f"Run `flyarchive verify {url}` to list every damaged chunk; restore the "
           "archive from a backup.")
    )


def _by_file(holes: Sequence[Hole]) -> list[Hole]:
    """The holes of each file merged into one (worlds joined, frames spanned), in order."""
    merged: dict[str, Hole] = {}
    for hole in holes:
        seen = merged.get(hole.empty.key)
        merged[hole.empty.key] = hole if seen is None else Hole(
            seen.empty, tuple(sorted(set(seen.worlds) | set(hole.worlds))),
            (min(seen.frames[0], hole.frames[0]), max(seen.frames[1], hole.frames[1])))
    return list(merged.values())


def _describe(name: str, world_ids: np.ndarray, hole: Hole) -> str:
    """E.g. ``"qpos [world 3 (index 0), frames 5..9] (file qpos/c/0/1/0)"``."""
    ids = [int(world_ids[w]) for w in hole.worlds]
    who = (f"world {ids[0]} (index {hole.worlds[0]})" if len(ids) == 1
           else f"worlds {ids} (indices {', '.join(map(str, hole.worlds))})")
    first, last = hole.frames
    return f"{name} [{who}, frames {first}..{last}] (file {hole.empty.key})"
