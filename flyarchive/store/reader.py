"""Reading archives, from the group :func:`~flyarchive.store.opener.open_for_reading` opened
(checked before any chunk is read): the renders' :class:`StateReader` of the store's state
reader family (pieces of worlds, straight through zarr; the window readers of positions,
gait and the viewer are :mod:`~flyarchive.store.window_reader`'s), the dataset as stored,
and the errors that name what failed to read.

Readers read ``n_frames`` first, then each array's metadata once: extents only grow,
and a writer grows them before it commits, so every state a reader can see is valid.
The consolidated copy of the metadata (:mod:`~flyarchive.store.consolidated`) is read
before ``n_frames`` but written after it, so it never claims more than was committed
(:func:`~flyarchive.store.dataset.read_dataset` falls back to the arrays' own metadata
when it lags behind).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from flyarchive.errors import CorruptArchiveError
from flyarchive.schema import STATE_VARS, finite_frames
from flyarchive.store import storage_errors
from flyarchive.store.location import sync
from flyarchive.store.opener import open_for_reading
from flyarchive.store.replicas import read_checked
from flyarchive.zarr_internals import FUSED_PIPELINE, HAS_FUSED_PIPELINE, array_getitem

if TYPE_CHECKING:
    import xarray as xr


_CONFIG_LOCK = threading.Lock()


@contextmanager
def fused_reads() -> Iterator[None]:
    """Arrays opened inside read (and write) through zarr's ``FusedCodecPipeline``.

    zarr picks an array's codec pipeline when the array object is made, from its
    process-wide configuration; this sets it for that moment only (a lock keeps two
    flyarchive threads from restoring each other's setting). zarr 3.4 keeps the pipeline
    opt-in; ``tests/test_query_fast.py`` reads through it bit for bit (and fails, while
    reads go on through zarr's default pipeline, should a zarr release drop it).
    """
    if not HAS_FUSED_PIPELINE:
        yield
        return
    with _CONFIG_LOCK, zarr.config.set({"codec_pipeline.path": FUSED_PIPELINE}):
        yield


def fused_array(arr: zarr.Array) -> zarr.Array:
    """``arr`` again (the same metadata, store and configuration, no I/O), reading and
    writing through zarr's ``FusedCodecPipeline`` (:func:`fused_reads`).

    For an array made elsewhere (a new archive's, made with its metadata): a writer's
    commit of 1024 worlds x 16 frames of a small model, one shard of 64 worlds per
    write, took 10x longer through zarr's default pipeline (a coroutine per inner chunk
    and codec) than through the fused one.
    """
    if not HAS_FUSED_PIPELINE:
        return arr
    kept = arr.async_array
    with fused_reads():
        return zarr.Array(zarr.AsyncArray(kept.metadata, kept.store_path, config=kept.config))


def corrupt_read(url: str, what: str, err: BaseException,
                 advice: str | None = None) -> CorruptArchiveError:
    """The error for stored bytes that fail their checksum or do not decode; ``err`` itself
    when it is already one of these (it names what was read: wrapping it again would say
    everything twice in one message). ``advice``: what to do
    (:func:`flyarchive.schema.damage_advice`); None: run ``verify``."""
    if getattr(err, "names_read", False):
        assert isinstance(err, CorruptArchiveError)
        return err
    error = CorruptArchiveError(
        f"Reading {what} from {url!r} failed: {getattr(err, 'reason', err)}. The stored "
        "bytes are damaged; " + (advice or f"run `flyarchive verify {url}` to list every "
                                 "damaged chunk.")
    )
    error.names_read = True  # type: ignore[attr-defined]
    return error


def time_extents(group: zarr.Group) -> dict[str, int]:
    """Length along ``time`` of every stored array that has that dimension."""
    return _extents(dict(group.arrays()))


def _extents(arrays: Mapping[str, zarr.Array]) -> dict[str, int]:
    out = {}
    for name, arr in arrays.items():
        dims = tuple(arr.metadata.dimension_names or ())
        if "time" in dims:
            out[name] = int(arr.shape[dims.index("time")])
    return out


def stored_dataset(group: zarr.Group, chunks: Mapping[str, int] | None = None) -> xr.Dataset:
    """The dataset as stored (not masked), lazy, from one consistent look at the archive.

    ``n_frames`` is read first (in memory), then each array's metadata exactly once:
    a writer grows every array before it commits, and extents only grow, so the
    extents seen are never below the ``n_frames`` seen, whatever a writer does
    meanwhile. Arrays may have different time extents (a commit in progress grows
    them one by one; a crash can stop it halfway): every array is cut to the
    shortest (committed frames never go beyond it).

    Args:
        group: The archive's root group.
        chunks: Dask chunk length per dimension; other dimensions follow the stored
            shards (or chunks). None: the stored shards.
    """
    import dask.array as da
    import xarray as xr  # not at import: Dask workers that only read states skip it

    n_frames = np.asarray(group["n_frames"][:]) if "n_frames" in group else None
    arrays = dict(group.arrays())
    extents = _extents(arrays)
    n = min(extents.values()) if extents else 0
    variables, coords = {}, {}
    for name, arr in arrays.items():
        dims = tuple(arr.metadata.dimension_names or ())
        cut = tuple(slice(0, n) if d == "time" else slice(None) for d in dims)
        if name in dims:  # a coordinate: small, read now
            coords[name] = xr.Variable(dims, np.asarray(arr[cut]), dict(arr.attrs))
        elif name == "n_frames" and n_frames is not None:
            variables[name] = xr.Variable(dims, n_frames, dict(arr.attrs))
        else:
            stored = arr.shards or arr.chunks
            sizes = tuple((chunks or {}).get(d, c) for d, c in zip(dims, stored))
            data = da.from_zarr(arr, chunks=sizes)[cut]
            variables[name] = xr.Variable(dims, data, dict(arr.attrs))
    return xr.Dataset(variables, coords=coords, attrs=group.attrs.asdict())


def chunk_file(arr: zarr.Array, coords: tuple[int, ...]) -> str:
    """The key of the stored object (shard, or chunk when unsharded) at ``coords`` of the
    stored-object grid, relative to the archive, e.g. ``"qpos/c/0/1/0"``."""
    return f"{arr.path}/{arr.metadata.encode_chunk_key(coords)}" if arr.path else \
        arr.metadata.encode_chunk_key(coords)


@dataclass(frozen=True)
class DamagedChunk:
    """A stored object of an array that fails to read.

    Attributes:
        name: The array.
        file: Its key in the archive, e.g. ``"time/c/1"``.
        region: ``(start, stop)`` index ranges it covers, one per dimension.
        dims: The array's dimension names.
        error: What reading it raised.
    """

    name: str
    file: str
    region: tuple[tuple[int, int], ...]
    dims: tuple[str, ...]
    error: BaseException

    def describe(self) -> str:
        """E.g. ``"qpos [worlds 0..1, frames 5..9] (file qpos/c/0/1/0)"``."""
        words = {"world": "worlds", "time": "frames"}
        spans = [f"{words.get(d, d)} {a}..{b - 1}" for d, (a, b) in zip(self.dims, self.region)
                 if d in words or len(self.region) == 1]
        return f"{self.name} [{', '.join(spans)}] (file {self.file})"


def damaged_chunks(arr: zarr.Array, *, limit: int | None = None,
                   region: tuple[slice, ...] | None = None) -> list[DamagedChunk]:
    """Read an array one stored object (shard or chunk) at a time; list those that fail.

    Args:
        arr: The array.
        limit: Stop after this many (None: all).
        region: Only objects touching these index ranges, leading dimensions first
            (default, and for dimensions not given: all of it).

    Returns:
        The damaged objects, in grid order; empty when every one reads.
    """
    outer = arr.shards or arr.chunks
    region = tuple(region or ()) + tuple(slice(0, n) for n in arr.shape[len(region or ()):])
    ranges = []
    for (start, stop, _), size, n in zip((r.indices(m) for r, m in zip(region, arr.shape)),
                                         outer, arr.shape):
        ranges.append(range(start // size, -(-stop // size)) if stop > start else range(0))
    dims = tuple(arr.metadata.dimension_names or (f"dim{i}" for i in range(arr.ndim)))
    found: list[DamagedChunk] = []
    for coords in itertools.product(*ranges):
        box = tuple((c * s, min((c + 1) * s, n)) for c, s, n in zip(coords, outer, arr.shape))
        try:
            arr[tuple(slice(a, b) for a, b in box)]
        except Exception as err:  # checksum, decode, refused file: all mean damaged bytes
            found.append(DamagedChunk(arr.basename, chunk_file(arr, coords), box, dims, err))
            if limit is not None and len(found) >= limit:
                break
    return found


@dataclass(frozen=True)
class StateDamage:
    """Committed frames of a state array that do not read back, one block of it (a shard
    of worlds by a chunk of frames).

    Attributes:
        worlds: ``(start, stop)`` world indices.
        frames: ``(start, stop)`` frames.
        text: The sentence ``verify`` reports.
    """

    worlds: tuple[int, int]
    frames: tuple[int, int]
    text: str


def state_blocks(arr: zarr.Array, n_frames: np.ndarray
            ) -> Iterator[tuple[int, int, int, int, np.ndarray | Exception]]:
    """Each block of ``arr`` holding committed frames, read: ``(w0, w1, t0, t1, values)``,
    or the error its read raised in place of the values."""
    block_w = (arr.shards or arr.chunks)[0]
    block_t = arr.chunks[1]
    for w0 in range(0, arr.shape[0], block_w):
        w1 = min(w0 + block_w, arr.shape[0])
        for t0 in range(0, int(n_frames[w0:w1].max(initial=0)), block_t):
            t1 = t0 + block_t
            try:
                yield w0, w1, t0, t1, np.asarray(arr[w0:w1, t0:t1])
            except Exception as err:  # noqa: BLE001 - reported as damage
                yield w0, w1, t0, t1, err


def block_damage(arr: zarr.Array, name: str, n_frames: np.ndarray, w0: int, w1: int, t0: int,
            t1: int, values: np.ndarray | Exception) -> tuple[StateDamage | None, np.ndarray]:
    """The damage of one block that :func:`state_blocks` read (None: none), and which of
    its ``(world, frame)`` cells are committed and finite."""
    if isinstance(values, Exception):
        shard_t = (arr.shards or arr.chunks)[1]
        block_w = (arr.shards or arr.chunks)[0]
        where = chunk_file(arr, (w0 // block_w, t0 // shard_t) + (0,) * (arr.ndim - 2))
        return StateDamage((w0, w1), (t0, t1), (
            f"{name}[worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1}] (file {where}) is "
            f"unreadable: {getattr(values, 'reason', values)} (corrupt bytes: checksum "
            "mismatch or damaged chunk).")), np.zeros((0, 0), dtype=bool)
    committed = np.arange(t0, t0 + values.shape[1])[None, :] < n_frames[w0:w1, None]
    finite = finite_frames(values, frame_dims=2)
    bad = committed & ~finite
    if not bad.any():
        return None, committed & finite
    w, t = np.argwhere(bad)[0]
    return StateDamage((w0, w1), (t0, min(t1, t0 + values.shape[1])), (
        f"{name} has {int(bad.sum())} committed frames that are missing or not finite "
        f"in worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1} (first: world index "
        f"{w0 + w}, frame {t0 + t}); a chunk inside n_frames is missing or damaged.")), \
        committed & finite


def state_damage(arr: zarr.Array, name: str, n_frames: np.ndarray) -> list[StateDamage]:
    """Every block of the state array ``arr`` whose committed frames do not read back
    (unreadable: a checksum that fails, a file refused; or missing or not finite), read as
    :func:`flyarchive.store.integrity.verify` reads it.

    Args:
        arr: A state array ``(world, time, ...)``.
        name: Its name, for the sentences.
        n_frames: ``(world,)`` committed frames.
    """
    found = []
    for w0, w1, t0, t1, values in state_blocks(arr, n_frames):
        damage, _ = block_damage(arr, name, n_frames, w0, w1, t0, t1, values)
        if damage is not None:
            found.append(damage)
    return found


#: A box of a reader's window: its worlds ``[w0, w1)`` (positions in the window) by its
#: frames ``[t0, t1)``; read as ``(w1 - w0) * (t1 - t0)`` rows, world by world.
Box = tuple[int, int, int, int]


def row_boxes(r0: int, r1: int, n_time: int) -> list[Box]:
    """The boxes of rows ``[r0, r1)`` of a window of ``n_time`` frames: the partial worlds
    at either end, the whole worlds between them in one box."""
    boxes, row = [], r0
    while row < r1:
        w, t = divmod(row, n_time)
        if t == 0 and r1 - row >= n_time:
            run = (r1 - row) // n_time
            boxes.append((w, w + run, 0, n_time))
            row += run * n_time
        else:
            stop = min(n_time, t + r1 - row)
            boxes.append((w, w + 1, t, stop))
            row += stop - t
    return boxes


def box_rows(boxes: Sequence[Box]) -> int:
    """The rows ``boxes`` read."""
    return sum((w1 - w0) * (t1 - t0) for w0, w1, t0, t1 in boxes)


class StateReader:
    """Reads recorded states straight through zarr into host arrays, for replay batches:
    a reader of the family's interface (:class:`~flyarchive.store.window_reader.RowReader`)
    whose window is the whole archive.

    xarray and dask cost about 6x more per batch than zarr alone, and a batch reader
    must keep up with a GPU. Opened once, with every array's metadata checked.

    Args:
        url: The archive's URL.
        storage_options: Passed to fsspec.
        group: The archive's group, opened and checked already (an archive header's
            ``group``); None: opened here.
        world_ids: The archive's world ids (its ``world`` coordinate), when known
            already; None: read here.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 group: zarr.Group | None = None, world_ids: np.ndarray | None = None) -> None:
        if group is None:
            group = open_for_reading(url, storage_options or None, own_later=True)
        #: The opened, checked group the states are read through.
        self.url, self.group = url, group
        #: The ``archive_id`` of the archive opened (None for archives without one).
        self.archive_id: str | None = group.attrs.get("archive_id")
        with fused_reads():
            self.arrays = {n: group[n] for n in STATE_VARS if n in group}
        if world_ids is None:
            world = array_getitem(group["world"], slice(None))  # beside the arrays' metadata
            world_ids = sync(read_checked(group, str(url), [world]))[0]
        self.world_ids = np.asarray(world_ids)
        #: Frames of the window (the archive's time axis as opened).
        self.n_time = int(self.arrays["qpos"].shape[1])

    def read(self, r0: int, r1: int, *, dtype: Any = None) -> dict[str, np.ndarray]:
        """Rows ``[r0, r1)`` of the archive's states (world by world), as
        :meth:`read_boxes` reads them."""
        return self.read_boxes(row_boxes(r0, r1, self.n_time), dtype=dtype)

    def read_boxes(self, boxes: Sequence[Box], *, dtype: Any = None
                   ) -> dict[str, np.ndarray]:
        """The states of ``boxes``, one after another: ``{"qpos": (n, nq)}`` and, with
        mocap bodies, ``"mocap_pos"``/``"mocap_quat"`` ``(n, nmocap, 3|4)``, host arrays
        of ``dtype``.

        Args:
            boxes: ``(w0, w1, start, stop)``: worlds ``[w0, w1)`` (archive indices) by
                frames ``[start, stop)``, read world by world; ``n`` is their rows.
            dtype: Of the arrays returned (float32 for the Warp renderer); None: as stored
                (OpenGL replays float64 states bit-exactly).

        The bounding block of worlds x frames is read at once when it holds at most
        twice the frames needed (whole recordings of consecutive worlds); else one read
        per world of a box.

        Every frame of ``boxes`` must be committed (below its world's ``n_frames``): one
        whose chunk, shard or index entry is missing is damage.

        Raises:
            CorruptArchiveError: stored bytes fail their checksum or do not decode, or a
                chunk of the boxes is missing (named: variable, worlds, frames, file).
        """
        pieces = [(w, start, stop) for w0, w1, start, stop in boxes for w in range(w0, w1)
                  if stop > start]
        if not pieces:
            return {name: np.empty((0, *a.shape[2:]), a.dtype if dtype is None else dtype)
                    for name, a in self.arrays.items()}
        try:
            out = self._read(pieces, dtype)
        except ValueError as err:
            worlds = sorted({int(self.world_ids[w]) for w, _, _ in pieces})
            what, err = self._damaged(pieces, err)
            raise corrupt_read(self.url, f"the states of worlds {worlds}{what}", err) from None
        except Exception as err:  # a storage fault (zarr's concurrent reads: in a group)
            new = storage_errors.translate(err, self.url)
            if new is None:
                raise
            raise new from None
        for name, values in out.items():
            self._check_present(name, values, pieces)
        return out

    def _damaged(self, pieces: Sequence[tuple[int, int, int]], err: ValueError
                 ) -> tuple[str, BaseException]:
        """The first stored object of the pieces' region that fails to read, named
        (``": qpos [worlds 0..1, frames 0..9] (file qpos/c/0/0/0)"``), and its error; ``""``
        and ``err`` when none is found (one at a time, each reads)."""
        w0, w1 = min(p[0] for p in pieces), max(p[0] for p in pieces) + 1
        k0, k1 = min(p[1] for p in pieces), max(p[2] for p in pieces)
        for arr in self.arrays.values():
            found = damaged_chunks(arr, limit=1, region=(slice(w0, w1), slice(k0, k1)))
            if found:
                return f": {found[0].describe()}", found[0].error
        return "", err

    def _check_present(self, name: str, values: np.ndarray,
                       pieces: Sequence[tuple[int, int, int]]) -> None:
        """Raise if frames of ``pieces`` that read as the fill value are missing (the
        storage is asked only when some did)."""
        from flyarchive.store.chunk_holes import committed_holes, fill_cells, missing_error, probe

        arr = self.arrays[name]
        hit = fill_cells(values[:, None], arr.fill_value)[:, 0]
        if not hit.any():
            return
        worlds = np.concatenate([np.full(stop - start, w) for w, start, stop in pieces])
        frames = np.concatenate([np.arange(start, stop) for _, start, stop in pieces])
        cells = np.stack([worlds[hit], frames[hit]], axis=1)
        empty = probe(arr, cells)
        if not empty:
            return
        # every piece is committed; n_frames (read now, for the message) spans each hole
        committed = np.maximum(np.asarray(self.group["n_frames"][:], dtype=np.int64), 0)
        np.maximum.at(committed, cells[:, 0], cells[:, 1] + 1)
        holes = committed_holes(empty, np.unique(cells[:, 0]), np.arange(arr.shape[1]),
                                committed)
        raise missing_error(self.url, name, self.world_ids, holes)

    def _read(self, pieces: Sequence[tuple[int, int, int]], dtype: Any) -> dict[str, np.ndarray]:
        n = sum(stop - start for _, start, stop in pieces)
        out = {name: np.empty((n, *a.shape[2:]), dtype=a.dtype if dtype is None else dtype)
               for name, a in self.arrays.items()}
        w0, w1 = min(p[0] for p in pieces), max(p[0] for p in pieces) + 1
        k0, k1 = min(p[1] for p in pieces), max(p[2] for p in pieces)
        block = None
        if (w1 - w0) * (k1 - k0) <= 2 * n:
            block = {name: a[w0:w1, k0:k1] for name, a in self.arrays.items()}
        row = 0
        for world, start, stop in pieces:
            for name, a in self.arrays.items():
                out[name][row:row + stop - start] = (
                    a[world, start:stop] if block is None
                    else block[name][world - w0, start - k0:stop - k0])
            row += stop - start
        return out
