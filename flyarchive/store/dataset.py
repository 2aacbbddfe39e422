"""The lazy dataset a reader gets: dask arrays over zarr that read only what a selection
touches, with frames past each world's ``n_frames`` masked inside the read.

dask fuses a selection into the call of an array's getter (``x.isel(world=341)`` calls
:meth:`CommittedFrames.__getitem__` with ``(341, slice(0, 500), slice(None))``), and the
getter reads that box through a :class:`~flyarchive.store.shards.ShardReader`: per shard,
the whole shard in one request when the box covers it, else its index (kept once the
shard can no longer change) and only the box's inner chunks, decoded straight into the
result. Masking with ``.where`` on the dask array would put a layer between the getter
and the selection, and every selection would read whole dask chunks; so the mask is
applied here, inside the read, and skipped when every world holds every frame. Dask
chunks are whole shards of worlds by several time chunks (about
:data:`TARGET_CHUNK_BYTES` decoded): few tasks for a full scan, while a selection still
reads only its inner chunks. Opening reads ``n_frames`` and the coordinates in one
concurrent round of requests when the consolidated metadata bounds them
(:mod:`~flyarchive.store.coordinates`).

Its header, without xarray or dask (:func:`open_header`), is read from the same group. Both
are read by :func:`read_archive` from the group that
:func:`~flyarchive.store.opener.open_for_reading` opens, looked at twice should a writer
change the archive under the first look.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import zarr

from flyarchive.errors import (
    CorruptArchiveError,
    FlyarchiveError,
    SchemaError,
    StorageError,
    UnsafeFileError,
)
from flyarchive.schema import (
    DERIVED_ATTR,
    WHOLE_ATTR,
    damage_advice,
    is_state,
    is_world_var,
    validate,
)
from flyarchive.store import storage_errors
from flyarchive.store.coordinates import committed_coordinates, dims_of, time_cut
from flyarchive.store.header import ArchiveHeader, HeaderVariable
from flyarchive.store.location import as_url, unavailable
from flyarchive.store.opener import open_for_reading
from flyarchive.store.reader import chunk_file, corrupt_read, damaged_chunks
from flyarchive.store.chunk_holes import (
    committed_holes,
    fill_cells,
    missing_error,
    probe,
    read_whole,
)
from flyarchive.store.shards import NeverWritten, OpenedArchive, ShardReader, settled_shards

_Read = TypeVar("_Read")

if TYPE_CHECKING:
    import xarray as xr

#: Decoded bytes of one dask chunk of state, about: a shard of worlds by as many chunks of
#: frames as fit (a full scan of 1024 x 1000 NeuroMechFly frames: 32 tasks).
TARGET_CHUNK_BYTES = 32 << 20
_MAX_NAMED = 8  # damaged inner chunks named in one error
_MAX_PROBES = 4096  # inner chunks re-read, one by one, to find the damaged ones


def _axis_key(k: Any, n: int) -> int | slice | np.ndarray:
    """One axis of a selection as an int in ``0..n-1``, a slice of positive step, or an
    array of indices."""
    if isinstance(k, (int, np.integer)):
        i = int(k) + (n if k < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"index {int(k)} is out of bounds for an axis of size {n}")
        return i
    if isinstance(k, slice):
        if k.step is None or k.step > 0:
            return slice(*k.indices(n))
        return np.arange(n)[k]
    index = np.asarray(k)
    if index.dtype == bool:
        return np.flatnonzero(index)
    return np.where(index < 0, index + n, index).astype(np.int64)


class CommittedFrames:
    """One state array ``(world, time, ...)`` as an array-like for ``dask.array.from_array``:
    reads through zarr, frames at or past ``n_frames[world]`` set to NaN.

    Args:
        arr: The zarr array (opened with the fused codec pipeline).
        name: Its variable name, for messages.
        n_frames: ``(world,)`` committed frames per world; None when every world holds
            all ``n_time`` frames (no mask).
        n_time: Frames along ``time`` (the largest ``n_frames``).
        world_ids: ``(world,)`` ids, for messages.
        url: The archive, for messages.
        storage_options: As given to ``open_archive``, for messages about storage faults.
        reader: Reads boxes of ``arr`` (:class:`~flyarchive.store.shards.ShardReader`);
            None: every read goes through zarr.
        committed: ``(world,)`` committed frames of every world: a read of committed
            frames whose chunk, shard or index entry is missing raises
            (:mod:`~flyarchive.store.chunk_holes`); None: not checked.
        advice: What the errors say to do (:func:`flyarchive.schema.damage_advice`: for a
            derived group, recompute it); None: an archive's (``verify``, a backup).

    Raises (from ``__getitem__``):
        CorruptArchiveError: stored bytes that fail their checksum or do not decode, or
            committed frames that are missing, naming the world ids, frames and file of
            each damaged inner chunk and pointing at ``flyarchive verify``.
        StorageError: the storage failed to answer.
        SchemaError, UnsafeFileError: as the store raises them (they name their file).
    """

    def __init__(self, arr: zarr.Array, name: str, n_frames: np.ndarray | None, n_time: int,
                 world_ids: np.ndarray, url: str,
                 storage_options: Mapping[str, Any] | None = None, *,
                 reader: ShardReader | None = None,
                 committed: np.ndarray | None = None, advice: str | None = None) -> None:
        self.arr, self.name, self.n_frames, self.reader = arr, name, n_frames, reader
        self.advice = advice
        self.world_ids, self.url, self.storage_options = world_ids, url, storage_options
        self.shape = (int(arr.shape[0]), int(n_time), *(int(s) for s in arr.shape[2:]))
        self.dtype = arr.dtype
        self.ndim = arr.ndim
        self.committed = committed

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            at = key.index(Ellipsis)
            key = key[:at] + (slice(None),) * (self.ndim - len(key) + 1) + key[at + 1:]
        key = key + (slice(None),) * (self.ndim - len(key))
        norm = [_axis_key(k, n) for k, n in zip(key, self.shape)]
        drop = tuple(i for i in (0, 1) if isinstance(norm[i], int))
        for i in drop:  # worlds and frames stay axes until the mask is applied
            norm[i] = slice(norm[i], norm[i] + 1)
        worlds = np.arange(self.shape[0])[norm[0]]
        frames = np.arange(self.shape[1])[norm[1]]
        values = self._read(tuple(norm), worlds, frames)
        if self.n_frames is not None and worlds.size and frames.size:
            past = frames[None, :] >= self.n_frames[worlds][:, None]
            if past.any():
                values = np.array(values, copy=True) if not values.flags.writeable else values
                values[past] = np.nan
        return values.squeeze(axis=drop) if drop else values

    def _read(self, key: tuple[Any, ...], worlds: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """The values of ``key`` (worlds and frames as slices or arrays, never ints), as
        stored; committed frames found missing raise."""
        empty: list[NeverWritten] = []
        try:
            box = _box(key) if self.reader is not None else None
            if box is not None:
                values = self.reader.read(box, never_written=empty)
                for axis in range(self.ndim - 1, 1, -1):  # dofs, mocap bodies... picked
                    if isinstance(key[axis], np.ndarray):
                        values = np.take(values, key[axis] - box[axis].start, axis=axis)
                points = tuple(i for i, k in enumerate(key) if isinstance(k, int))
                values = values.squeeze(axis=points) if points else values
            elif any(isinstance(k, np.ndarray) for k in key):
                values = np.asarray(self.arr.oindex[key])
            else:
                values = np.asarray(self.arr[key])
        except BaseExceptionGroup as group:  # zarr's concurrent reads: the first fault
            err: BaseException = group.exceptions[0]
        except Exception as caught:
            err = caught
        else:
            self._check_committed(values, worlds, frames, empty, read_by_zarr=box is None)
            return values
        raise self._error(err, worlds, frames) from None

    def _check_committed(self, values: np.ndarray, worlds: np.ndarray, frames: np.ndarray,
                         empty: list[NeverWritten], *, read_by_zarr: bool) -> None:
        """Raise if committed frames of the read are missing: those the shard reader found
        empty, or, for reads through zarr, those the storage says are missing among the
        committed frames that read as the fill value (asked only then)."""
        if self.committed is None or not worlds.size or not frames.size:
            return
        if read_by_zarr:
            hit = fill_cells(values, self.arr.fill_value)
            hit &= frames[None, :] < self.committed[worlds][:, None]
            if not hit.any():
                return
            w, t = np.nonzero(hit)
            empty = probe(self.arr, np.stack([worlds[w], frames[t]], axis=1))
        holes = committed_holes(empty, worlds, frames, self.committed) if empty else []
        if holes:
            raise missing_error(self.url, self.name, self.world_ids, holes, self.advice)

    def _error(self, err: BaseException, worlds: np.ndarray, frames: np.ndarray) -> Exception:
        if isinstance(err, (SchemaError, StorageError, UnsafeFileError)):
            return err  # names its file already, or is not the stored bytes' fault
        if not isinstance(err, FlyarchiveError):
            translated = storage_errors.translate(err, self.url, self.storage_options)
            if translated is not None:
                return translated
            if isinstance(err, (OSError, TimeoutError)):
                return unavailable(self.url, err)
        found = self._damaged(worlds, frames)
        if not found and not isinstance(err, CorruptArchiveError):
            return err if isinstance(err, Exception) else RuntimeError(repr(err))
        if not found:  # e.g. a shard index that failed its checksum once
            return corrupt_read(self.url, f"{self.name} [{self._worlds(worlds)}, frames "
                                f"{frames.min(initial=0)}..{frames.max(initial=0)}]", err,
                                self.advice)
        named = "; ".join(what for what, _ in found[:_MAX_NAMED])
        more = f" and {len(found) - _MAX_NAMED} more" if len(found) > _MAX_NAMED else ""
        return corrupt_read(self.url, named + more, found[0][1], self.advice)

    def _worlds(self, worlds: np.ndarray) -> str:
        ids = [int(self.world_ids[w]) for w in worlds[:8]]
        return f"world ids {ids}{'...' if len(worlds) > 8 else ''}"

    def _damaged(self, worlds: np.ndarray, frames: np.ndarray) -> list[tuple[str, BaseException]]:
        """Re-read the selection one inner chunk at a time: the damaged ones, described."""
        inner_w, inner_t = int(self.arr.chunks[0]), int(self.arr.chunks[1])
        outer_w, outer_t = (int(s) for s in (self.arr.shards or self.arr.chunks)[:2])
        found: list[tuple[str, BaseException]] = []
        probes = 0
        for w0 in np.unique(worlds // inner_w) * inner_w:
            for t0 in np.unique(frames // inner_t) * inner_t:
                probes += 1
                if probes > _MAX_PROBES:
                    return found
                box = (slice(w0, w0 + inner_w), slice(t0, min(t0 + inner_t, self.arr.shape[1])))
                try:
                    self.arr[box]
                except Exception as err:
                    file = chunk_file(self.arr, (w0 // outer_w, t0 // outer_t)
                                      + (0,) * (self.ndim - 2))
                    ids = [int(i) for i in self.world_ids[w0:w0 + inner_w]]
                    who = (f"world {ids[0]} (index {w0})" if len(ids) == 1
                           else f"worlds {ids} (indices {w0}..{w0 + len(ids) - 1})")
                    found.append((f"{self.name} [{who}, frames {t0}..{box[1].stop - 1}] "
                                  f"(file {file})", err))
        return found


class WorldVariable:
    """A world variable's values, read on demand (a dask array's source, the header's
    reader): a chunk of a variable stored whole that is missing, or any chunk that does
    not read, raises :class:`~flyarchive.errors.CorruptArchiveError` naming the variable,
    the worlds and the file (:func:`~flyarchive.store.chunk_holes.read_whole`).

    Attributes:
        arr: The ``(world,)`` array.
        name: Its name.
        url: The archive, as the user gave it.
        world_ids: ``(world,)`` the archive's world ids.
    """

    def __init__(self, arr: zarr.Array, name: str, url: str, world_ids: np.ndarray) -> None:
        self.arr, self.name, self.url, self.world_ids = arr, name, url, np.asarray(world_ids)
        self.shape = tuple(int(n) for n in arr.shape)
        self.dtype = arr.dtype
        self.ndim = arr.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        return read_whole(self.arr, self.name, key, self.url, self.world_ids)

    def read(self) -> np.ndarray:
        """Every value."""
        return self[slice(None)]


def _box(key: tuple[Any, ...]) -> tuple[slice, ...] | None:
    """A selection of ints and slices of step 1 as slices, where arrays of indices may pick
    along the axes after ``world`` and ``time`` (read whole: a chunk holds them all);
    None for any other."""
    box = []
    for axis, k in enumerate(key):
        if isinstance(k, int):
            box.append(slice(k, k + 1))
        elif isinstance(k, slice) and k.step in (None, 1):
            box.append(k)
        elif axis >= 2 and isinstance(k, np.ndarray) and k.ndim == 1 and k.size:
            box.append(slice(int(k.min()), int(k.max()) + 1))
        else:
            return None
    return tuple(box)


def committed_frames(arr: zarr.Array, name: str, n_frames: np.ndarray, n_time: int,
                     world_ids: np.ndarray, url: str,
                     storage_options: Mapping[str, Any] | None = None, *,
                     archive_id: str | None = None, advice: str | None = None
                     ) -> CommittedFrames:
    """The getter of a state array ``(world, time, ...)`` exactly as :func:`read_dataset`
    reads it (frames past ``n_frames`` NaN, through the array's shard reader, committed
    frames checked, every read checking that the archive is still the one whose
    ``archive_id`` is given): what a reader of whole worlds calls without dask.

    Args:
        arr: The array, opened with :func:`~flyarchive.store.reader.fused_reads`.
        name: Its variable name.
        n_frames: ``(world,)`` int64 committed frames, as read when the archive was opened.
        n_time: Frames along ``time``: the largest of ``n_frames``.
        world_ids: ``(world,)`` ids, for messages.
        url, storage_options: The archive, for reads and messages.
        archive_id: The ``archive_id`` of the archive opened (None: it has none).
        advice: What its errors say to do (None: an archive's).
    """
    masked = None if (n_frames == n_time).all() else n_frames
    reader = _shard_reader(arr, n_frames, OpenedArchive(str(url), archive_id))
    return CommittedFrames(arr, name, masked, n_time, world_ids, url, storage_options,
                           reader=reader, committed=n_frames, advice=advice)


def _shard_reader(arr: zarr.Array, n_frames: np.ndarray, opened: OpenedArchive
                  ) -> ShardReader | None:
    """The shard reader of a state array ``(world, time, ...)``, keeping the indexes of
    the shards below every world's ``n_frames`` while the archive is still ``opened``
    (every read checks it); None where zarr reads (an array not
    sharded as flyarchive writes it, or a zarr release whose sharding internals differ:
    ``tests/query/test_shard_reader.py`` fails then)."""
    if not ShardReader.supports(arr):
        return None
    try:
        return ShardReader(arr, settled=(1, settled_shards(n_frames, int(arr.shards[1]))),
                           opened=opened)
    except (TypeError, AttributeError):
        return None


def _dask_chunks(arr: zarr.Array, n_time: int) -> tuple[int, ...]:
    """Whole shards of worlds by several time chunks (about TARGET_CHUNK_BYTES), the frames
    split evenly between the time chunks of the dask array."""
    shard_w = int((arr.shards or arr.chunks)[0])
    frames = max(int(arr.chunks[1]), 1)
    frame_bytes = shard_w * int(np.prod(arr.shape[2:], dtype=np.int64)) * arr.dtype.itemsize
    per_chunk = max(1, TARGET_CHUNK_BYTES // max(frame_bytes * frames, 1))
    blocks = -(-max(n_time, 1) // frames)  # chunks of frames along time
    pieces = -(-blocks // per_chunk)
    return (shard_w, frames * -(-blocks // pieces), *(int(s) for s in arr.shape[2:]))


def _token(url: str, storage_options: Mapping[str, Any] | None, name: str, arr: zarr.Array,
           n_frames: np.ndarray | None, n_time: int, attrs: Mapping[str, Any]) -> str:
    """A name for the dask array that changes whenever the data it reads can: the archive
    (URL, storage, root attributes: ``created``, ``archive_id``...), the array's metadata,
    and every world's committed frames."""
    from dask.base import tokenize

    described = json.dumps({"url": url, "storage_options": storage_options or {},
                            "attrs": attrs, "array": arr.metadata.to_dict(), "n_time": n_time},
                           sort_keys=True, default=repr)
    committed = b"" if n_frames is None else n_frames.tobytes()
    return f"flyarchive-{name}-{tokenize(described, committed)}"


def _attrs(arr: zarr.Array) -> tuple[dict[str, Any], dict[str, Any]]:
    """A variable's attributes and encoding, as xarray decodes them: the CF ``coordinates``
    attribute (the coordinates are read as such) and the storage marker
    :data:`~flyarchive.schema.WHOLE_ATTR` (how its chunks were written, not what it means:
    netCDF, for one, refuses a boolean attribute) move to the encoding."""
    attrs = dict(arr.attrs)
    encoding = {name: attrs.pop(name) for name in ("coordinates", WHOLE_ATTR) if name in attrs}
    return attrs, encoding


def committed_getter(values: Any) -> CommittedFrames | None:
    """The archive getter (:class:`CommittedFrames`) a dask-backed state array of a dataset
    that :func:`read_dataset` made reads through (None: none, e.g. an array in memory)."""
    graph = getattr(getattr(values, "data", values), "dask", None)
    if graph is None:
        return None

    def find(value: Any, depth: int = 0) -> CommittedFrames | None:
        if isinstance(value, CommittedFrames):
            return value
        if depth > 4:
            return None
        inner = [getattr(value, "value", None), *getattr(value, "args", ())]
        if isinstance(value, (tuple, list)):
            inner += list(value)
        for item in inner:
            if item is not None and (found := find(item, depth + 1)) is not None:
                return found
        return None

    for task in dict(graph).values():
        getter = find(task)
        if getter is not None:
            return getter
    return None


def read_dataset(url: str, storage_options: Mapping[str, Any] | None,
                 group: zarr.Group) -> xr.Dataset:
    """The archive as a lazy dataset: coordinates read, state as masked dask arrays.

    Reads the root ``zarr.json`` (with the consolidated copy of every array's metadata),
    ``n_frames``, and the coordinates. When the consolidated copy lags behind
    ``n_frames`` (a writer died between its last two steps, or is between them now),
    the arrays' own metadata is read instead: committed frames are never hidden.

    Args:
        url: The archive.
        storage_options: Passed to fsspec.
        group: The group, opened with
            :func:`~flyarchive.store.opener.open_for_reading`.

    Returns:
        Dataset cut to the largest ``n_frames`` along ``time``, ``n_frames`` in memory
        (clipped to the stored frames), not yet validated against the schema.

    Raises:
        OSError, CorruptArchiveError...: as reading ``n_frames`` or a coordinate raises
        them (the caller names what failed).
    """
    import dask.array as da
    import xarray as xr

    group, arrays, n_frames, n_time, coordinates = committed_coordinates(url, storage_options, group)
    variables = {}
    if n_frames is not None:
        variables["n_frames"] = xr.Variable(("world",), n_frames, dict(arrays["n_frames"].attrs))
    coords = {name: xr.Variable(dims_of(arrays[name]), values, dict(arrays[name].attrs))
              for name, values in coordinates.items()}
    attrs = group.attrs.asdict()
    advice = damage_advice(url, attrs) if isinstance(attrs.get(DERIVED_ATTR), Mapping) else None
    for name, arr in arrays.items():
        dims = dims_of(arr)
        if name in coords or name == "n_frames":
            continue
        token = _token(url, storage_options, name, arr, n_frames, n_time, attrs)
        if is_state(dims) and n_frames is not None:
            world_ids = coords["world"].values if "world" in coords else np.arange(len(n_frames))
            getter = committed_frames(arr, name, n_frames, n_time, world_ids, url,
                                      storage_options, archive_id=attrs.get("archive_id"),
                                      advice=advice)
            data = da.from_array(getter, chunks=_dask_chunks(arr, n_time), asarray=False,
                                 inline_array=True, meta=np.empty((0,) * arr.ndim, arr.dtype),
                                 name=token)
        elif is_world_var(name, dims):  # small, lazy; a chunk missing is damage
            world_ids = coords["world"].values if "world" in coords else np.arange(arr.shape[0])
            data = da.from_array(WorldVariable(arr, name, url, world_ids), chunks=arr.chunks,
                                 asarray=False, inline_array=True, name=token,
                                 meta=np.empty((0,), arr.dtype))
        else:  # times of frames: small, lazy
            data = da.from_zarr(arr, chunks=arr.shards or arr.chunks, name=token)[time_cut(arr, n_time)]
        variables[name] = xr.Variable(dims, data, *_attrs(arr))
    return xr.Dataset(variables, coords=coords, attrs=attrs)


def read_header(url: str, storage_options: Mapping[str, Any] | None,
                group: zarr.Group) -> ArchiveHeader:
    """The archive's header (:mod:`flyarchive.store.header`): what :func:`read_dataset`
    reads at open, the same values, without xarray or dask. Other variables than state
    are read whole on first use (committed frames); state is not read.

    Args and Raises: as :func:`read_dataset`.
    """
    group, arrays, n_frames, n_time, coordinates = committed_coordinates(url, storage_options, group)
    variables: dict[str, HeaderVariable] = {}
    if n_frames is not None:
        variables["n_frames"] = HeaderVariable("n_frames", ("world",), n_frames.dtype,
                                               n_frames.shape, arrays["n_frames"].attrs,
                                               values=n_frames)
    for name, values in coordinates.items():
        variables[name] = HeaderVariable(name, dims_of(arrays[name]), values.dtype, values.shape,
                                         arrays[name].attrs, values=values)
    for name, arr in arrays.items():
        if name in variables:
            continue
        dims = dims_of(arr)
        shape = tuple(n_time if d == "time" else n for d, n in zip(dims, arr.shape))
        if is_state(dims):
            read = None
        elif is_world_var(name, dims):
            world_ids = coordinates.get("world", np.arange(arr.shape[0]))
            read = WorldVariable(arr, name, url, world_ids).read
        else:
            read = (lambda arr=arr: np.asarray(arr[time_cut(arr, n_time)]))  # noqa: E731
        variables[name] = HeaderVariable(name, dims, arr.dtype, shape, _attrs(arr)[0], read=read)
    return ArchiveHeader(group.attrs.asdict(), variables, coords=tuple(coordinates), group=group)


def open_header(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None,
                *, group: Any = None) -> ArchiveHeader:
    """Open an archive's header: its attributes, ``n_frames``, coordinates and per-world
    variables, checked and validated as :func:`flyarchive.open_archive` does, without
    importing xarray or dask (:mod:`flyarchive.store.header`). What a render plans with;
    states are read by :class:`~flyarchive.store.reader.StateReader` (renders) or
    :func:`~flyarchive.open_archive`.

    Args:
        url, storage_options: As :func:`flyarchive.open_archive`.
        group: The archive's group, opened and checked already (``header.group`` of an
            earlier header, ``StateReader.group``); None: opened here.

    Raises:
        As :func:`flyarchive.open_archive` when opening.
    """
    header = read_archive(as_url(url), storage_options, read_header, group)
    validate(header)
    return header


def read_archive(url: str, storage_options: Mapping[str, Any] | None,
                 read: Callable[..., _Read], group: Any = None) -> _Read:
    """``read(url, storage_options, group)`` of the checked group (opened here unless
    given), looked at twice should a writer have changed the archive under the first
    look; errors named."""
    if group is None:  # the arrays' own metadata is checked in read's first round
        group = open_for_reading(url, storage_options, own_later=True)
    for attempt in (1, 2):
        try:
            return read(url, storage_options, group)
        except (OSError, TimeoutError) as err:
            if isinstance(err, FlyarchiveError):
                raise
            if not isinstance(err, FileNotFoundError):
                raise unavailable(url, err) from None
            if attempt == 2:
                raise damaged_metadata(url, group, err) from None
        except SchemaError:  # names its file: looking again would not change it
            raise
        except Exception as err:  # zarr/xarray report damaged metadata in many ways
            if attempt == 2:
                raise unreadable(url, group, err) from None
    raise AssertionError("unreachable")


def damaged_metadata(url: str, group: zarr.Group, err: BaseException) -> SchemaError:
    """The error for an archive whose arrays' metadata cannot be read, naming them."""
    bad = []
    for name in _EXPECTED:
        try:
            group[name]
        except KeyError:
            if name in ("qpos", "n_frames", "time", "world", "dof"):
                bad.append(f"{name!r} (missing)")
        except Exception:
            bad.append(f"{name!r} (unreadable metadata)")
    if any("'qpos' (missing)" == b for b in bad):
        return SchemaError(
            f"The archive at {url!r} has no variable 'qpos' (its zarr.json is missing). "
            "It cannot be replayed; restore the file from a backup."
        )
    return SchemaError(
        f"The archive at {url!r} has damaged metadata in {', '.join(bad) or 'an array'} "
        f"({type(err).__name__}: {err}). Run `flyarchive verify {url}`; restore the damaged "
        "zarr.json files from a backup."
    )


def unreadable(url: str, group: zarr.Group, err: BaseException) -> FlyarchiveError:
    """The error for an archive that xarray cannot open: a damaged chunk of a coordinate
    when one is found (named, with its file), else damaged metadata."""

    for name in ("time", "world", "n_frames", "dof", "mocap", "xyz", "wxyz"):
        try:
            arr = group[name]
        except Exception:
            continue
        found = damaged_chunks(arr, limit=1)
        if found:
            if isinstance(found[0].error, UnsafeFileError):  # names its file already
                return found[0].error
            return corrupt_read(url, found[0].describe(), found[0].error)
    return err if isinstance(err, FlyarchiveError) else damaged_metadata(url, group, err)


_EXPECTED = ("qpos", "mocap_pos", "mocap_quat", "n_frames", "time", "world", "dof", "mocap")
