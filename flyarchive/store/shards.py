"""Reading boxes of a sharded zarr array: every shard fetched once, its inner chunks
decoded with zarr's own codec objects straight into the output, and the indexes of
shards that can no longer change kept for the life of the reader.

zarr reads a selection shard by shard: the whole shard in one request when the
selection covers it, else its index, then the inner chunks' byte ranges (coalesced).
:class:`ShardReader` makes the same requests (through the same store), but decodes
each inner chunk with the array's inner codec chain (CRC-32C checked, pcodec bounded:
:mod:`~flyarchive.store.decoders`) directly into one output array, where zarr decodes
into a chunk buffer, copies into a shard buffer and copies again into the result; on
a remote store the shards of one read are fetched concurrently. Nothing here writes,
and the bytes on disk are plain zarr v3.

A shard's index changes whenever a writer rewrites the shard. Writers append after
the smallest ``n_frames`` of their worlds and never rewrite frames below it
(:class:`~flyarchive.store.writer.ArchiveWriter`, the import's resume), so a shard whose
frames all lie below the smallest ``n_frames`` of the whole archive (read when the
dataset was opened) is never written again: its index is cached (``settled``); any
other shard's index is read again on every read.

That holds while the archive stays the one that was opened. A writer with ``mode="w"``
replaces it (root ``zarr.json`` deleted first, a new one with a new ``archive_id``
written before any new shard): kept indexes would then point into the new shards, and
fresh reads would mix its data with the old ``n_frames``. So every read, once its
requests are answered, reads the ``archive_id`` of the root ``zarr.json`` (one request:
its head the first time, then the ~50 bytes where it was) and raises
:class:`~flyarchive.errors.ArchiveReplacedError` if it is not the one opened: a read that passes
fetched nothing written after the old root was deleted. ``n_frames`` and the arrays'
metadata were read at open, after the root: the check covers them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.codecs.sharding import ShardingCodec

from flyarchive.errors import ArchiveReplacedError
from flyarchive.store.decoders import direct_decoder
from flyarchive.store import storage_errors
from flyarchive.store.location import sync
from flyarchive.zarr_internals import (
    ArraySpec,
    ArrayV3Metadata,
    Buffer,
    array_config,
    decode_shard_index,
    default_buffer_prototype,
    shard_layout,
    shard_layout_supported,
    store_supports_sync_io,
)

_PROTOTYPE = default_buffer_prototype()
_EMPTY = np.uint64(2**64 - 1)  # an inner chunk never written (zarr's sharding spec)
#: Bytes of the root ``zarr.json`` read to find its ``archive_id`` (about 500 bytes in;
#: the whole file is read when the head does not hold it).
_HEAD = 2048
#: The first ``archive_id`` key of a root ``zarr.json``: that of its attributes, which
#: precede the consolidated metadata (a key inside a JSON string has escaped quotes).
_ARCHIVE_ID = re.compile(rb'"archive_id"\s*:\s*"([^"\\]*)"')


def settled_shards(n_frames: np.ndarray | None, shard_frames: int) -> int:
    """How many leading shards along ``time`` can no longer change: those whose frames
    all lie below the smallest ``n_frames`` of the archive.

    Args:
        n_frames: ``(world,)`` committed frames of every world of the archive, as read
            when it was opened (None: none are settled).
        shard_frames: Frames per shard.
    """
    if n_frames is None or n_frames.size == 0 or shard_frames <= 0:
        return 0
    return int(n_frames.min()) // shard_frames


@dataclass(frozen=True)
class OpenedArchive:
    """The archive a reader was opened on.

    Args:
        url: Its URL, for messages.
        archive_id: The ``archive_id`` of its root attributes when it was opened (None:
            it had none, an archive written before the attribute existed).
    """

    url: str
    archive_id: str | None


@dataclass(frozen=True)
class NeverWritten:
    """An inner chunk that a read covered and found empty: its shard is missing, or the
    shard's index marks it never written (offset and length ``2**64 - 1``). It reads as
    the fill value; whether that is legal is the caller's question
    (:mod:`~flyarchive.store.chunk_holes`: inside ``n_frames`` it is damage).

    Attributes:
        region: ``(start, stop)`` indices it covers along each axis, inside the array.
        key: The key of its shard in the store, e.g. ``"qpos/c/0/1/0"``.
        shard_missing: True when the whole shard is missing.
    """

    region: tuple[tuple[int, int], ...]
    key: str
    shard_missing: bool


@dataclass
class _Shard:
    """One shard a read touches: its key, the inner chunks wanted, what was fetched."""

    coords: tuple[int, ...]
    key: str
    spans: tuple[range, ...]  # per axis, the global inner-chunk coordinates wanted
    whole: bool  # every inner chunk of the shard is wanted: one request
    # the stored bytes of each wanted inner chunk, in the order of itertools.product(*spans)
    # (None: never written); empty until fetched
    data: list[np.ndarray | None] = field(default_factory=list)


class ShardReader:
    """Reads boxes of one sharded zarr array (a ``sharding_indexed`` codec alone).

    Args:
        arr: The array.
        settled: ``time`` axis and the number of leading shards along it whose indexes
            may be cached (see :func:`settled_shards`); None caches nothing.
        opened: The archive ``arr`` belongs to (at the top of its store path), whose
            identity every read checks; None checks nothing (a plain zarr array).

    Raises (from :meth:`read`): what zarr's decoders and the store raise for the same
    bytes (CorruptArchiveError for a checksum or decode failure, the store's errors);
    ArchiveReplacedError (a StorageError) when the archive was replaced (or deleted)
    since ``opened``.
    """

    def __init__(self, arr: zarr.Array, *, settled: tuple[int, int] | None = None,
                 opened: OpenedArchive | None = None) -> None:
        self._arr = arr
        codec = arr.metadata.codecs[0]
        self.shape = tuple(int(s) for s in arr.shape)
        self.shard_shape = tuple(int(s) for s in arr.shards)
        self.chunk_shape = tuple(int(s) for s in codec.chunk_shape)
        self.dtype = arr.dtype
        self.fill_value = arr.fill_value
        self.store = arr.store_path.store
        self._prefix = arr.store_path
        # the array's path in the store: a chunk's key is it, "/" and the encoded chunk key
        # (as ``StorePath / key`` makes it, without normalizing again on every read)
        self._path_slash = f"{arr.store_path.path}/" if arr.store_path.path else ""
        self._encode_key = arr.metadata.encode_chunk_key
        shard_spec = ArraySpec(shape=self.shard_shape, dtype=arr.metadata.dtype,
                               fill_value=arr.metadata.fill_value,
                               config=array_config(arr), prototype=_PROTOTYPE)
        self._codec: ShardingCodec = codec
        layout = shard_layout(codec, shard_spec)
        self._per_shard, self._chunk_spec = layout.per_shard, layout.chunk_spec
        self._transform, self._index_size = layout.transform, layout.index_size
        self._index_range = layout.index_range
        self._coalesce = {"max_gap_bytes": shard_spec.config.sharding_coalesce_max_gap_bytes,
                          "max_coalesced_bytes": shard_spec.config.sharding_coalesce_max_bytes}
        self._sync_io = store_supports_sync_io(self.store)
        self._settled = settled
        self._opened = opened
        self._known: tuple[int, bytes] | None = None  # where the root holds the archive_id
        parent = arr.store_path.path.rpartition("/")[0]
        self._root_key = f"{parent}/zarr.json" if parent else "zarr.json"
        self._indexes: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()
        self._into = direct_decoder(self._transform.codecs, self._chunk_spec)

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to a Dask worker as the array and what may be cached; the worker keeps
        its own indexes."""
        return _rebuild, (self._arr, self._settled, self._opened)

    @staticmethod
    def supports(arr: zarr.Array) -> bool:
        """Whether ``arr`` is sharded the way this reader reads (one sharding codec whose
        inner chains run synchronously, as zarr's fused pipeline needs too)."""
        codecs = arr.metadata.codecs if isinstance(arr.metadata, ArrayV3Metadata) else ()
        if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec) or arr.shards is None:
            return False
        sharding = codecs[0]
        return shard_layout_supported(sharding)

    # ------------------------------------------------------------------ reading
    def read(self, box: Sequence[slice], *,
             never_written: list[NeverWritten] | None = None) -> np.ndarray:
        """The values in ``box``: one slice of step 1 per axis, inside the array.

        Args:
            box: The selection.
            never_written: If given, each inner chunk of the box that holds nothing (no
                shard, or an index entry never written) is appended to it: found from the
                requests the read makes anyway, none more.

        Returns:
            A new array of the box's shape (inner chunks never written read as the
            array's fill value).
        """
        starts = [int(s.start) for s in box]
        stops = [max(int(s.stop), int(s.start)) for s in box]
        out = np.empty([b - a for a, b in zip(starts, stops)], dtype=self.dtype)
        if out.size == 0:
            return out
        shards = self._plan(starts, stops)
        try:
            if self._sync_io:  # one shard's bytes at a time: the same memory, reused
                with self._batch():
                    for shard in shards:
                        self._drive_sync(shard.key, self._steps(shard))
                        self._decode(shard, out, starts, stops, never_written)
                        shard.data = []
                self._check_archive()
                return out
            sync(self._fetch_all(shards))  # the shards' requests concurrently, then the root
            for shard in shards:
                self._decode(shard, out, starts, stops, never_written)
            return out
        except Exception as err:
            if self._opened is not None and not isinstance(err, ArchiveReplacedError):
                self._replaced_under(err)
            raise

    def load_indexes(self) -> int:
        """Read and keep now the index of every settled shard (:func:`settled_shards`), so
        that later reads fetch only inner chunks; shards never written, or whose index fails
        its checksum, are left to the reads (which report them). Returns the indexes kept.

        Raises:
            ArchiveReplacedError: the archive was replaced (or deleted) since it was opened
                (what was read is forgotten).
        """
        if self._settled is None:
            return 0
        axis, count = self._settled
        grid = [range(-(-n // s)) for n, s in zip(self.shape, self.shard_shape)]
        grid[axis] = range(min(count, len(grid[axis])))
        wanted = [c for c in itertools.product(*grid) if c not in self._indexes]
        keys = [self._path_slash + self._encode_key(c) for c in wanted]
        if self._sync_io:
            with self._batch():
                found = [_or_error(self._get_sync, key, self._index_range) for key in keys]
        else:
            found = sync(self._get_all(keys, self._index_range))
        for coords, raw in zip(wanted, found):
            if raw is not None and not isinstance(raw, BaseException):
                with contextlib.suppress(Exception):  # the reads report what is wrong
                    self._index(coords, raw)
        try:
            self._check_archive()
        except ArchiveReplacedError:
            with self._lock:
                self._indexes.clear()
            raise
        return len(self._indexes)

    def _batch(self) -> contextlib.AbstractContextManager[None]:
        """The store's reading batch (a local archive's reads share their lookups), or
        nothing."""
        batch = getattr(self.store, "reading_batch", None)
        return batch() if batch is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ identity
    def _same_archive(self) -> Generator[Any, Any, None]:
        """The identity check, as steps for the drivers: the head of the root
        ``zarr.json`` (the whole file if the head does not say), its ``archive_id``
        compared with the one opened; once found, only the bytes of its key and value
        (about 50: the same bytes at the same place, a new archive has another id).

        Raises:
            ArchiveReplacedError: the archive was replaced or deleted since it was opened.
        """
        opened = self._opened
        if opened is None:
            return
        known = self._known
        if known is not None:  # the bytes where the archive_id was: still the same?
            got = yield RangeByteRequest(known[0], known[0] + len(known[1]))
            if got is not None and got.to_bytes() == known[1]:
                return
        head = yield RangeByteRequest(0, _HEAD)
        raw = head.to_bytes() if head is not None else b""
        found = _ARCHIVE_ID.search(raw)
        if found is not None:
            now: str | None = found.group(1).decode("ascii", "replace")
            if now == opened.archive_id:
                self._known = (found.start(), found.group(0))
        else:
            whole = (yield None) if len(raw) >= _HEAD else head
            if whole is None:
                raise _replaced(opened, "its root zarr.json is gone: the archive was deleted, "
                                        "or is being replaced now")
            try:
                attrs = json.loads(whole.to_bytes()).get("attributes", {})
                now = attrs.get("archive_id") if isinstance(attrs, dict) else ""
            except (ValueError, AttributeError):
                now = ""  # not a group's metadata any more
        if now != opened.archive_id:
            raise _replaced(opened, f"its archive_id is now {now!r}, it was "
                                    f"{opened.archive_id!r}")

    def check_archive(self) -> None:
        """Check now that the archive is still the one opened (:meth:`_same_archive`), for a
        reader that answers from values it kept; raises as it does."""
        self._check_archive()

    def _check_archive(self) -> None:
        """Run :meth:`_same_archive` now, with the store's own kind of reads."""
        if self._sync_io:
            self._drive_sync(self._root_key, self._same_archive())
        else:
            sync(self._drive(self._root_key, self._same_archive()))

    def _replaced_under(self, err: BaseException) -> None:
        """After a failed read: raise the replacement if that is what happened (a kept
        index read into a new shard fails its checksum); else return (``err`` stands). Not
        asked when nothing answered: the storage would not answer this either."""
        if storage_errors.unreachable(err) or isinstance(err, TimeoutError):
            return
        for _ in range(2):  # a file replaced as it was opened: look once more
            try:
                self._check_archive()
            except ArchiveReplacedError as replaced:
                raise replaced from None
            except Exception:  # noqa: BLE001 - the storage fails too: the first error stands
                continue
            return

    def _plan(self, starts: list[int], stops: list[int]) -> list[_Shard]:
        spans = [range(a // s, -(-b // s)) for a, b, s in zip(starts, stops, self.shard_shape)]
        shards = []
        total = math.prod(self._per_shard)
        for coords in itertools.product(*spans):
            ranges = tuple(range(max(a, c * s) // k, -(-min(b, (c + 1) * s) // k))
                           for c, a, b, s, k in zip(coords, starts, stops, self.shard_shape,
                                                    self.chunk_shape))
            key = self._path_slash + self._encode_key(coords)
            shards.append(_Shard(coords, key, ranges,
                                 whole=math.prod(map(len, ranges)) == total))
        return shards

    def _cacheable(self, coords: tuple[int, ...]) -> bool:
        if self._settled is None:
            return False
        axis, count = self._settled
        return coords[axis] < count

    def _index(self, coords: tuple[int, ...], raw: Buffer) -> Any:
        index = decode_shard_index(self._codec, raw, self._per_shard)  # CRC-32C checked
        if self._cacheable(coords):
            with self._lock:
                self._indexes[coords] = index
        return index

    def _ranges(self, shard: _Shard, index: Any) -> list[list[int]]:
        """``[offset, length]`` of each wanted inner chunk (in the order of
        ``shard.data``); the offset of one never written is ``2**64 - 1``."""
        local = tuple(slice(r.start - c * n, r.stop - c * n)
                      for r, c, n in zip(shard.spans, shard.coords, self._per_shard))
        found: list[list[int]] = index.offsets_and_lengths[local].reshape(-1, 2).tolist()
        return found

    def _split(self, shard: _Shard, buf: Buffer) -> None:
        """A whole shard's bytes: its index decoded, its wanted inner chunks kept."""
        size = self._index_size
        raw = buf[len(buf) - size:] if self._codec.index_location == "end" else buf[:size]
        index = self._index(shard.coords, raw)
        stored = buf.as_numpy_array()
        shard.data = [None if start == _EMPTY else stored[start:start + length]
                      for start, length in self._ranges(shard, index)]

    def _steps(self, shard: _Shard) -> Generator[Any, Any, None]:
        """One shard's fetch, written once for both drivers (:meth:`_drive_sync`,
        :meth:`_drive`): yields each request — a byte range (None: the whole object) or a
        list of ranges (one coalesced read) — and is sent its result (a buffer or None; a
        list of ``(i, buffer)``)."""
        if shard.whole:
            buf = yield None
            if buf is not None:
                self._split(shard, buf)
            return
        index = self._indexes.get(shard.coords)
        if index is None:
            raw = yield self._index_range
            if raw is None:
                return  # no shard: fill value
            index = self._index(shard.coords, raw)
        found = self._ranges(shard, index)
        shard.data = [None] * len(found)
        wanted = [(i, RangeByteRequest(start, start + length))
                  for i, (start, length) in enumerate(found) if start != _EMPTY]
        if len(wanted) == 1:  # one request, nothing to coalesce
            buf = yield wanted[0][1]
            if buf is not None:
                shard.data[wanted[0][0]] = buf.as_numpy_array()
        elif wanted:
            for j, buf in (yield [r for _, r in wanted]):
                if buf is not None:
                    shard.data[wanted[j][0]] = buf.as_numpy_array()

    def _drive_sync(self, key: str, steps: Generator[Any, Any, None]) -> None:
        """Run ``steps`` (:meth:`_steps`, :meth:`_same_archive`) on ``key`` with the
        store's synchronous reads."""
        with contextlib.suppress(StopIteration):
            request = next(steps)
            while True:
                request = steps.send(self._get_sync(key, request))

    async def _fetch_all(self, shards: list[_Shard]) -> None:
        await asyncio.gather(*(self._drive(shard.key, self._steps(shard)) for shard in shards))
        await self._drive(self._root_key, self._same_archive())  # after every answer

    async def _drive(self, key: str, steps: Generator[Any, Any, None]) -> None:
        with contextlib.suppress(StopIteration):
            request = next(steps)
            while True:
                request = steps.send(await self._get(key, request))

    def _get_sync(self, key: str, request: Any) -> Any:
        if not isinstance(request, list):
            return self.store.get_sync(key, prototype=_PROTOTYPE, byte_range=request)
        with _shard_gone():
            return list(self.store.get_ranges_sync(key, request, prototype=_PROTOTYPE,
                                                   **self._coalesce))
        return []

    async def _get_all(self, keys: list[str], request: Any) -> list[Any]:
        """``request`` of each key at once: its result, or the error it raised."""
        return await asyncio.gather(*(self._get(key, request) for key in keys),
                                    return_exceptions=True)

    async def _get(self, key: str, request: Any) -> Any:
        if not isinstance(request, list):
            return await self.store.get(key, prototype=_PROTOTYPE, byte_range=request)
        got: list[tuple[int, Buffer | None]] = []
        with _shard_gone():
            async for part in self.store.get_ranges(key, request, prototype=_PROTOTYPE,
                                                    **self._coalesce):
                got.extend(part)
        return got

    # ------------------------------------------------------------------ decoding
    def _decode(self, shard: _Shard, out: np.ndarray, starts: list[int], stops: list[int],
                never_written: list[NeverWritten] | None = None) -> None:
        """Each fetched inner chunk of ``shard`` decoded into its place in ``out`` (the box
        ``starts..stops``): straight into it when the chunk lies whole in the box; those
        never written filled (and listed in ``never_written``, if given)."""
        places, cuts = [], []  # per axis: where each chunk goes in out; what of it (None: all)
        for span, a, b, k in zip(shard.spans, starts, stops, self.chunk_shape):
            places.append([slice(max(a, c * k) - a, min(b, c * k + k) - a) for c in span])
            cuts.append([None if a <= c * k and c * k + k <= b
                         else slice(max(a, c * k) - c * k, min(b, c * k + k) - c * k)
                         for c in span])
        into = self._into
        stored = shard.data or itertools.repeat(None)  # nothing fetched: no shard there
        for coords, place, cut, raw in zip(itertools.product(*shard.spans),
                                           itertools.product(*places),
                                           itertools.product(*cuts), stored):
            target = out[place]
            if raw is None:
                target[...] = self.fill_value
                if never_written is not None:
                    region = tuple((c * k, min(c * k + k, n))
                                   for c, k, n in zip(coords, self.chunk_shape, self.shape))
                    never_written.append(NeverWritten(region, shard.key, not shard.data))
            elif into is not None and not any(cut) and target.flags.c_contiguous:
                into(raw, target)
            elif into is not None:  # a chunk cut by the box (the last frames): whole, then cut
                whole = np.empty(self._chunk_spec.shape, dtype=self.dtype)
                into(raw, whole)
                target[...] = whole[tuple(slice(None) if c is None else c for c in cut)]
            else:
                decoded = self._transform.decode_chunk(_PROTOTYPE.buffer.from_array_like(raw),
                                                       self._chunk_spec).as_numpy_array()
                target[...] = decoded[tuple(slice(None) if c is None else c for c in cut)]


def _replaced(opened: OpenedArchive, detail: str) -> ArchiveReplacedError:
    """The error for a read of ``opened`` once it was replaced or deleted."""
    url = opened.url
    return ArchiveReplacedError(
        f"The archive at {url!r} was replaced after it was opened ({detail}). The opened "
        "dataset reads none of it, so that no result mixes two archives. Call "
        f"open_archive({url!r}) again to read the archive that is there now."
    )


def _or_error(get: Callable[..., Any], *args: Any) -> Any:
    try:
        return get(*args)
    except Exception as err:  # noqa: BLE001 - left to the reads, which report it
        return err


def _rebuild(arr: zarr.Array, settled: tuple[int, int] | None,
             opened: OpenedArchive | None) -> ShardReader:
    return ShardReader(arr, settled=settled, opened=opened)


@contextlib.contextmanager
def _shard_gone() -> Iterator[None]:
    """As zarr: a coalesced read of a shard deleted since its index was read gives what
    it got (the rest reads as fill value); any other failure is raised."""
    try:
        yield
    except BaseExceptionGroup as group:
        if group.split(FileNotFoundError)[1] is not None:
            raise
