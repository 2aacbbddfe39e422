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

World variables are stored whole (every chunk written,
:data:`~flyarchive.schema.WHOLE_ATTR`): any chunk of theirs missing is damage.
:func:`read_whole` reads them (asking the storage only where values read as the fill
value) and :func:`missing_chunks` lists what ``verify`` reports; a variable written
before flyarchive marked them reads a missing chunk as the fill value, as it always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from flyarchive.errors import CorruptArchiveError
from flyarchive.schema import WHOLE_ATTR
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


# ----------------------------------------------------------------------------- stored whole
def stored_whole(arr: zarr.Array) -> bool:
    """Whether every chunk of ``arr`` was written (:data:`~flyarchive.schema.WHOLE_ATTR`)."""
    return arr.attrs.get(WHOLE_ATTR) is True


def chunks_of(arr: zarr.Array, indices: np.ndarray | None = None) -> list[tuple[str, int, int]]:
    """The chunks of a 1-D array (a world variable): ``(key relative to the archive, first
    index, stop)`` each, of every chunk, or of those holding ``indices``."""
    size, n = int(arr.chunks[0]), int(arr.shape[0])
    blocks = np.arange(-(-n // size)) if indices is None else np.unique(np.asarray(indices) // size)
    return [(_chunk_key(arr, int(b), relative=True), int(b) * size, min((int(b) + 1) * size, n))
            for b in blocks]


def missing_chunks(arr: zarr.Array, indices: np.ndarray | None = None) -> list[tuple[str, int, int]]:
    """The chunks of a 1-D array (:func:`chunks_of`) that the storage does not hold."""
    size = int(arr.chunks[0])
    return [chunk for chunk in chunks_of(arr, indices) if not sync(arr.store_path.store.exists(
        _chunk_key(arr, chunk[1] // size, relative=False)))]


def _chunk_key(arr: zarr.Array, block: int, *, relative: bool) -> str:
    """The key of chunk ``block`` of a 1-D array: relative to the archive (``name/c/0``), or
    in the store."""
    key = arr.metadata.encode_chunk_key((block,))
    if relative:
        return f"{arr.path}/{key}" if arr.path else key
    return (arr.store_path / key).path


def read_whole(arr: zarr.Array, name: str, key: Any, url: str, world_ids: np.ndarray) -> np.ndarray:
    """A selection ``key`` (along ``world``) of a world variable, as stored.

    Raises:
        CorruptArchiveError: a chunk it covers does not read (a checksum that fails, bytes
            that do not decode), or, for a variable stored whole, is missing; naming the
            variable, the worlds and the file, and what to do.
    """
    picked = np.arange(int(arr.shape[0]))[key]
    try:
        values = np.asarray(arr[key])
    except Exception as err:  # checksum, decode: the stored bytes are damaged
        chunks = chunks_of(arr, np.atleast_1d(picked))
        raise whole_error(url, name, world_ids, chunks[0] if len(chunks) == 1 else None,
                          picked, getattr(err, "reason", err)) from None
    if stored_whole(arr):
        hit = np.atleast_1d(fill_cells(np.atleast_1d(values), arr.fill_value))
        if hit.any():
            gone = missing_chunks(arr, np.atleast_1d(picked)[hit])
            if gone:
                raise whole_error(url, name, world_ids, gone[0], picked, None)
    return values


def whole_error(url: str, name: str, world_ids: np.ndarray, chunk: tuple[str, int, int] | None,
                picked: np.ndarray, reason: object) -> CorruptArchiveError:
    """The error for a world variable's chunk that is missing (``reason`` None) or does not
    read: its name, worlds, file, and what to do."""
    if chunk is not None:
        file, start, stop = chunk
        where = f"{_world_span(world_ids[start:stop])} (file {file})"
    else:
        where = _world_span(world_ids[np.atleast_1d(picked)])
    why = ("its file is missing, but world variables are stored whole (every chunk written)"
           if reason is None else f"{reason}")
    error = CorruptArchiveError(
        f"Reading world variable {name!r} [{where}] from {url!r} failed: {why}. The archive "
        "is damaged (a file was deleted, lost or cut short). Run `flyarchive verify "
        f"{url}` to list every damaged chunk; restore the file from a backup, or store the "
        f"variable again: `flyarchive set-world-var {url} {name}=V1,V2,... --overwrite` "
        f"(flyarchive.add_world_vars(..., overwrite=True); gait measures: `flyarchive gait "
        f"{url} --save`)."
    )
    error.names_read = True  # type: ignore[attr-defined]
    return error


def _world_span(ids: np.ndarray) -> str:
    """E.g. ``"worlds 0..1023"``, ``"world 3"``, ``"worlds [0, 5, 9]"``."""
    ids = [int(i) for i in np.atleast_1d(ids)]
    if len(ids) == 1:
        return f"world {ids[0]}"
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"worlds {ids[0]}..{ids[-1]}"
    return f"worlds {ids[:_MAX_NAMED]}{'...' if len(ids) > _MAX_NAMED else ''}"


def lost_commit_markers(n_frames_arr: zarr.Array, n_frames: np.ndarray,
                        state: Sequence[zarr.Array]) -> list[tuple[str, int, int]]:
    """The chunks of ``n_frames`` (the commit markers) that are missing though frames of
    their worlds were committed: they read as 0 committed frames. A chunk of worlds with
    no frame yet may be missing (zarr writes no chunk of zeros), but once a frame of its
    worlds is committed it holds that; so a chunk is lost when it is missing and a
    ``state`` array holds a chunk of its worlds. Asked only where ``n_frames`` reads 0."""
    zero = np.flatnonzero(np.asarray(n_frames) == 0)
    if not zero.size:
        return []
    gone = missing_chunks(n_frames_arr, zero)
    if not gone:
        return []

    async def written(arr: zarr.Array, start: int, stop: int) -> bool:
        rows = int((arr.shards or arr.chunks)[0])
        for block in range(start // rows, -(-stop // rows)):
            key = arr.metadata.encode_chunk_key((block,) + (0,) * (arr.ndim - 1))
            prefix = "/".join(key.split("/")[:2]) + "/"  # c/<block>/
            async for _ in arr.store_path.store.list_prefix(f"{arr.store_path.path}/{prefix}"):
                return True
        return False

    return [chunk for chunk in gone
            if any(sync(written(arr, chunk[1], chunk[2])) for arr in state)]
