"""Writing archives: :class:`ArchiveWriter` creates, appends and commits frames.

Commit protocol (one writer per archive, or per block of worlds):
  0. read the writer's claim: still its own, or the archive was deleted, moved or
     replaced while it wrote, and nothing more is written (``ArchiveReplacedError``);
  1. grow the arrays' time extent (metadata only; new frames read as NaN);
  2. write the frames' chunks (whole shards when the block is chunk-aligned), and
  3. their times (``time``, ``sim_time``, ``frame``), steps 2 and 3 together;
  4. write ``n_frames`` for the block's worlds: the commit marker;
  5. (one writer per archive) rewrite the root ``zarr.json`` with every array's
     metadata consolidated in it, ``time`` extents cut to the largest ``n_frames``
     (:mod:`~flyarchive.store.consolidated`), so that readers open with one request.
The writes of a step go concurrently (on S3 one round trip, not one per object); a
step starts once every write of the one before it has finished, failed ones included.
The writer opens its arrays once and keeps what it writes (their metadata, the
consolidated copy's members): it reads nothing back.
Every state in between is a valid archive: extents only grow, and grow before
anything is committed, so ``n_frames`` never exceeds an array's extent, and frames
below ``n_frames`` are never changed. A crash between steps leaves frames past
``n_frames``, which readers mask, and a consolidated copy that is behind the commit
markers, never ahead of them (readers then read the arrays' own metadata). Archives
written by several writers (``capacity_frames``) are consolidated once, at creation:
their extents never change. On local disk zarr writes each object through a
temporary file and a rename, and S3 PUTs are atomic, so a rewritten shard is
either the old or the new one: committed frames are never lost.

Creation: a creator first claims the archive (:func:`flyarchive.store.claims.claim_archive`,
exclusive: of two creators of one URL exactly one goes on, the other writes
nothing), then looks at what is at the URL, then writes the root group, the
arrays, and ``n_frames`` last. What each mode does with what it finds:

- nothing (or only claims): created;
- an archive: ``"a"`` appends, ``"w-"`` refuses, ``"w"`` replaces it;
- an interrupted creation (flyarchive attributes, no ``n_frames``, no chunk of
  recorded state): ``"a"`` creates the archive anew (holding the claim proves that
  no other process is creating it), ``"w-"`` refuses;
- a damaged archive (chunks of recorded state but no ``n_frames``): refused
  (:class:`~flyarchive.errors.CorruptArchiveError`) unless ``"w"``: nothing that
  holds recorded frames is ever deleted without ``mode="w"``;
- anything else (files flyarchive did not write): refused by every mode
  (:func:`~flyarchive.store.creation.foreign`).

A refused creation leaves nothing behind.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.storage

from flyarchive.clock import Timing
from flyarchive.errors import (
    ArchiveExistsError,
    ArchiveInUseError,
    ArchiveReplacedError,
    FlyarchiveError,
    StorageError,
)
from flyarchive.layout import ModelLayout
from flyarchive.schema import STATE_VARS, TIME_COORDS
from flyarchive.store import storage_errors
from flyarchive.store.claims import (
    WRITER_KEY,
    block_keys,
    claim_archive,
    claim_block,
    read_claim,
    register,
    release,
)
from flyarchive.store.consolidated import consolidate, members_metadata, write_consolidated
from flyarchive.store.creation import (
    appended_attrs,
    check_against,
    check_commits,
    claims_group,
    clear,
    foreign,
    inventory,
    refusal,
    refuse_strangers,
    release_quietly,
    root_attrs,
    tidy_local,
    undo,
)
from flyarchive.store.location import (
    access_denied,
    as_url,
    archive_exists,
    exists_error,
    is_local,
    local_path,
    open_store,
    parse_mode,
    settled,
    sync,
)
from flyarchive.store.nodes import Created, create_arrays
from flyarchive.store.opener import open_for_writing
from flyarchive.store.reader import fused_array
from flyarchive.archive_spec import ArchiveSpec, FrameBlock


# ----------------------------------------------------------------------------- the writer
def _opened_arrays(group: zarr.Group, state: tuple[str, ...]) -> dict[str, zarr.Array]:
    """The arrays of an existing archive that a writer writes or checks (those present
    of its ``state`` arrays and of the time coordinates, and ``world``), each opened once,
    written through zarr's fused codec pipeline (:func:`~flyarchive.store.reader.fused_array`)."""
    arrays = {}
    for name in (*state, "time", *TIME_COORDS):
        arr = group.get(name)
        if arr is not None:
            arrays[name] = fused_array(arr)
    arrays["world"] = group["world"]
    return arrays


class ArchiveWriter:
    """Appends and commits frames to an archive. One writer per archive, or per block
    of worlds (see :mod:`flyarchive.store.claims`).

    Use :meth:`create` for a new archive or :meth:`append` to resume one, and
    :meth:`close` (or ``with``) when done: the writer holds the archive's claim until
    then (or until it is garbage-collected). A process that dies holding it leaves a
    claim that the next writer on the same host takes over; elsewhere, pass
    ``takeover=True``.
    """

    #: The state arrays it writes (those of them the archive has), the first one always.
    STATE: tuple[str, ...] = tuple(STATE_VARS)

    def __init__(
        self, group: zarr.Group, url: str, layout: ModelLayout,
        block: tuple[int, int] | None = None, *, claim: tuple[list[str], str] | None = None,
        created: Created | None = None,
    ) -> None:
        self._group = group
        self.url = url
        self.layout = layout
        # The arrays it writes, opened once: this writer alone changes their metadata
        # (it holds the archive's claim, or its block's in an archive whose extents are
        # fixed), so what it holds is what is stored.
        self._arrays = (_opened_arrays(group, self.STATE) if created is None
                        else {name: fused_array(arr) for name, arr in created.arrays.items()})
        self._state = [n for n in self.STATE if n in self._arrays]
        # Archives written before flyarchive stored sim_time and frame have only time.
        self._times = ["time"] + [n for n in TIME_COORDS if n in self._arrays]
        qpos = self._arrays[self._state[0]]
        self.chunk_frames: int = int(qpos.chunks[1])
        self.dtype = qpos.dtype
        self.block = block
        self._worlds = slice(*block) if block else slice(None)
        if created is None:
            marker, frames = check_commits(group, url, self._arrays, self._state)
            self._arrays["n_frames"] = marker
            frames = frames[self._worlds]
            self.world_ids: tuple[int, ...] = tuple(
                int(w) for w in self._arrays["world"][self._worlds])
        else:  # just written by this writer: no frame committed yet
            frames = np.zeros(len(created.world_ids), dtype=np.int64)[self._worlds]
            self.world_ids = tuple(created.world_ids[self._worlds])
        # Frames past the smallest commit are redone: a resumed simulation continues
        # from the same step for all its worlds.
        self.n_frames: int = int(frames.min()) if frames.size else 0
        # After an interrupted commit the arrays may have grown to different extents;
        # the next commit grows them all to one extent again.
        self._extent = max(
            [int(self._arrays[n].shape[1]) for n in self._state]
            + [int(self._arrays[n].shape[0]) for n in self._times]
        )
        self.attrs = group.attrs.asdict()
        # An appending writer of other releases than the archive's says so in the root
        # attributes its first commit writes (one writer per archive: it alone rewrites
        # them; archives of several writers are consolidated only at creation).
        if created is None and block is None:
            self.attrs = appended_attrs(self.attrs, self.n_frames) or self.attrs
        self._closed = False
        self._failed = False
        # metadata of every node, for step 5 (None: read at the first commit)
        self._members: dict[str, Any] | None = None if created is None else dict(created.members)
        self._consolidated = True  # False while the last consolidation failed
        self._last_commit = 0  # the largest n_frames of the last commit
        self._finalizer: weakref.finalize | None = None
        self._claim = claim
        self._lost = False  # the archive went (deleted, moved, replaced) while it wrote
        if claim is not None:
            self._finalizer = weakref.finalize(self, release_quietly, group.store, *claim)
            self._finalizer.atexit = False  # a recorder's exit hook commits, then closes
            register(claim[1], self)

    @classmethod
    def create(
        cls, url: str, spec: ArchiveSpec, *, mode: str = "w-",
        storage_options: Mapping[str, Any] | None = None, takeover: bool = False,
    ) -> "ArchiveWriter":
        """Create a new archive, or resume one when ``mode="a"``.

        Args:
            url: Where: a local path or any fsspec URL.
            spec: The archive's fixed properties.
            mode: ``"w-"`` create, refuse if anything is there (default); ``"w"`` replace
                the archive there (never files flyarchive did not write); ``"a"`` append
                to the archive there (creating it if absent, or if its creation was
                interrupted before anything was committed).
            storage_options: Passed to fsspec (e.g. S3 credentials, ``endpoint_url``).
            takeover: Take over the claim of a writer that crashed on another host.

        Raises:
            ArchiveExistsError: with ``mode="w-"`` when something is at ``url`` or another
                process is creating an archive there; with ``"a"`` when what is there is
                not a flyarchive archive.
            ArchiveInUseError: with ``"a"`` or ``"w"`` when another writer holds the archive.
            CorruptArchiveError: with ``"a"`` for a damaged archive (see :meth:`append`).
            LayoutMismatchError: with ``mode="a"`` when the archive's layout differs.
            SchemaError: with ``mode="a"`` when the archive's timing, codec or dtype differs
                from ``spec``'s (nothing is written).
        """
        parse_mode(mode)
        url = as_url(url)
        if is_local(url):
            from flyarchive.store.local_files import refuse_nested_archive

            refuse_nested_archive(local_path(url))
        try:
            with storage_errors.translated(url, storage_options):  # S3 faults
                return cls._create(url, spec, mode, storage_options, takeover)
        except PermissionError as err:
            raise access_denied(url, err) from None
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, OSError) as err:
            if isinstance(err, FlyarchiveError):
                raise
            raise StorageError(
                f"Cannot create an archive at {url!r} ({type(err).__name__}: {err}). "
                "Choose a location that is writable and whose parent is a folder."
            ) from None

    @classmethod
    def _create(
        cls, url: str, spec: ArchiveSpec, mode: str, storage_options: Mapping[str, Any] | None,
        takeover: bool,
    ) -> "ArchiveWriter":
        store = open_store(url, storage_options)
        if mode == "w-" and archive_exists(store):
            raise foreign(url) if sync(inventory(store)) == "other" else exists_error(url)
        if mode == "a" and sync(inventory(store)) == "archive":
            return cls.append(url, spec.layout, storage_options=storage_options,
                              timing=spec.timing, takeover=takeover, codec=spec.codec,
                              dtype=spec.dtype)
        local = local_path(url) if is_local(url) else None
        existed = local is not None and local.exists()
        try:
            writer = claim_archive(store, url, takeover=takeover)
        except ArchiveInUseError as err:
            tidy_local(local, existed)
            if mode != "w-":
                raise
            raise ArchiveExistsError(
                f"Another process is creating or writing an archive at {url!r} "
                f"({getattr(err, 'holder', 'another writer')}); flyarchive never overwrites "
                "without being asked. Choose another URL, or wait for it to finish and pass "
                "mode='a' to append to that archive."
            ) from None
        claim = ([WRITER_KEY], writer)
        ours = False  # True once everything at the location (but the claim) is this writer's
        try:
            there = sync(inventory(store))
            if there == "archive" and mode == "a":  # made between our look and our claim
                group = open_for_writing(url, storage_options)
                stored = check_against(group, url, spec.layout, spec.timing, codec=spec.codec,
                                       dtype=spec.dtype)
                return cls._opened(group, url, stored, claim)
            if there == "other" or (there != "empty" and (
                    mode == "w-" or (mode == "a" and there != "interrupted"))):
                raise exists_error(url) if there == "archive" else refusal(url, there)
            if there != "empty":
                refuse_strangers(store, url)
            ours = True
            if there != "empty":
                sync(clear(store))
            group = zarr.create_group(store, attributes=root_attrs(spec), zarr_format=3)
            created = create_arrays(group, spec)
            consolidate(group, n_time=None if spec.capacity_frames else 0,
                        members=created.members)
            return cls(group, url, spec.layout, claim=claim, created=created)
        except BaseException:
            undo(store, claim, ours)
            tidy_local(local, existed)
            raise

    @classmethod
    def append(
        cls, url: str, layout: ModelLayout, *,
        storage_options: Mapping[str, Any] | None = None, timing: Timing | None = None,
        world_block: tuple[int, int] | None = None, takeover: bool = False,
        codec: str | None = None, dtype: Any = None,
    ) -> "ArchiveWriter":
        """Open an existing archive to add frames after its last committed one.

        Without ``world_block`` the writer claims the whole archive until :meth:`close`.

        Args:
            world_block: ``(start, stop)`` world indices this writer owns, for archives
                created with ``capacity_frames`` and written by several processes; the
                block must follow shard boundaries and not overlap another writer's.
            takeover: Take over the claim of a writer that crashed (of this exact block
                with ``world_block``). A claim whose holder provably died on this host is
                taken over without it.
            codec, dtype: The codec spec and state dtype the caller writes with, checked
                against the archive's (None: not checked).

        Raises:
            ArchiveNotFoundError: if no archive is at ``url``.
            LayoutMismatchError: if ``layout`` differs from the archive's.
            SchemaError: if ``timing``, ``codec`` or ``dtype`` differs from the archive's,
                or a claim file is damaged.
            ArchiveInUseError: if another writer holds the archive (naming it).
            WorldBlockConflictError: if the block overlaps another writer's.
            CorruptArchiveError: if ``n_frames`` is missing, outside the time extent, or the
                committed times are not finite and increasing (nothing is written).
        """
        group = open_for_writing(url, storage_options)
        stored = check_against(group, url, layout, timing, codec=codec, dtype=dtype)
        if "n_frames" not in group or "qpos" not in group:
            there = sync(inventory(group.store))
            raise refusal(url, there if there != "archive" else "damaged")
        if world_block is None:
            claims_group(group, world_blocks=False)
            claim = ([WRITER_KEY], claim_archive(group.store, url, takeover=takeover))
            return cls._opened(group, url, stored, claim)
        claims = group.get("claims")
        if claims is None or not claims.attrs.get("world_blocks", True):
            raise ValueError(
                f"The archive at {url!r} was created for one writer. To write it from several "
                "processes, create it with ArchiveSpec(capacity_frames=...)."
            )
        qpos = group["qpos"]
        start, stop = (int(v) for v in world_block)
        shard, n_worlds = int((qpos.shards or qpos.chunks)[0]), int(qpos.shape[0])
        keys = block_keys(start, stop, shard, n_worlds)
        writer = claim_block(group.store, start, stop, shard, n_worlds, takeover=takeover, url=url)
        return cls._opened(group, url, stored, (keys, writer), block=(start, stop))

    @classmethod
    def _opened(
        cls, group: zarr.Group, url: str, layout: ModelLayout, claim: tuple[list[str], str],
        *, block: tuple[int, int] | None = None,
    ) -> "ArchiveWriter":
        """A writer for an archive whose claim is held; the claim is released if it fails."""
        try:
            return cls(group, url, layout, block, claim=claim)
        except BaseException:
            release(group.store, *claim)
            raise

    @property
    def n_worlds(self) -> int:
        return len(self.world_ids)

    def write(self, block: FrameBlock, *, n_frames: np.ndarray | None = None) -> None:
        """Append ``block`` (all worlds) after the last committed frame and commit it.

        Args:
            block: The frames, all worlds.
            n_frames: ``(worlds,)`` committed frames of each world after this block
                (default: all of them); for worlds whose recording ended earlier.

        Raises:
            ValueError: if the block's shapes do not fit the archive.
            RuntimeError: after :meth:`close`.
            StorageError: if the storage fails; frames committed before stay committed.
        """
        if self._closed:
            raise RuntimeError(
                f"The writer of {self.url!r} is closed; open another with ArchiveWriter.append "
                "(or a recorder with mode='a')."
            )
        n = self._check_block(block)
        if n == 0:
            return
        t0, t1 = self.n_frames, self.n_frames + n
        capacity = self._arrays["time"].shape[0]
        if self.block is not None and t1 > capacity:
            raise ValueError(
                f"Frames {t0}..{t1 - 1} do not fit the archive's capacity of {capacity} frames "
                "(fixed for several writers). Create it with a larger capacity_frames."
            )
        committed = np.full(self.n_worlds, t1) if n_frames is None else np.asarray(n_frames)
        try:
            self._check_held(t0)  # (step 0: see the module's docstring)
            sync(self._commit(block, t0, t1, committed.astype(np.int64)))
        except ArchiveReplacedError:
            self._failed = self._lost = True  # nothing more is written there, ever
            raise
        except (OSError, RuntimeError, TimeoutError, *storage_errors.client_errors()) as err:
            self._failed = True  # retrying is allowed, and so is a new writer taking over
            if isinstance(err, FileNotFoundError):  # the archive went during the commit?
                try:
                    self._check_held(t0)
                except ArchiveReplacedError:
                    self._lost = True
                    raise
                except Exception:  # noqa: BLE001 - the claim unreadable: the first error says
                    pass
            raise StorageError(
                f"Writing frames {t0}..{t1 - 1} to {self.url!r} failed ({err!r}). "
                f"The archive still holds its {t0} committed frames; retry or resume with mode='a'."
            ) from err
        self.n_frames = t1
        self._failed = False
        if self.block is None:
            grown = {n: self._arrays[n].metadata for n in self._state + self._times}
            self._consolidate(grown, int(committed.max()))

    async def _commit(self, block: FrameBlock, t0: int, t1: int, committed: np.ndarray) -> None:
        """Steps 1 to 4 of a commit (see the module's docstring). The writes of one step
        go concurrently; each step starts once every write of the step before it has
        finished, and a failure is raised only then (:func:`settled`)."""
        extent = max(t1, self._extent)
        grow = []
        for name in self._state + self._times:
            arr, axis = self._arrays[name].async_array, 0 if name in self._times else 1
            if arr.shape[axis] < extent:  # only ever grows: shrinking would delete chunks
                grow.append(arr.resize(tuple(extent if i == axis else d
                                             for i, d in enumerate(arr.shape))))
        await settled(grow)
        self._extent = extent
        writes = [self._arrays[name].async_array.setitem((self._worlds, slice(t0, t1)),
                                                         getattr(block, name))
                  for name in self._state]
        if self.block is None:  # several writers share the times written at creation
            writes += self._time_writes(block, t0, t1)
        await settled(writes)
        await self._arrays["n_frames"].async_array.setitem(self._worlds, committed)

    def _check_held(self, t0: int) -> None:
        """Raise if this writer's claim is no longer in the archive: the archive was deleted
        or moved away while it wrote (a write would make a fragment of one where it was),
        or replaced by another writer's (a write would splice two runs).

        Raises:
            ArchiveReplacedError: saying which, and that nothing more is written.
            SchemaError: the claim is damaged (:func:`~flyarchive.store.claims.read_claim`).
        """
        if self._lost:
            raise ArchiveReplacedError(self._lost_text(t0, "its claim went earlier"))
        if self._claim is None:
            return
        keys, writer = self._claim
        held = read_claim(self._group.store, keys[0], self.url)
        if held is None:
            raise ArchiveReplacedError(self._lost_text(
                t0, f"its claim {keys[0]} is gone: the archive was deleted or moved away "
                "while it recorded"))
        if held.writer != writer:
            raise ArchiveReplacedError(self._lost_text(
                t0, f"its claim {keys[0]} names another writer: the archive was replaced "
                "(or taken over) while it recorded"))

    def _lost_text(self, t0: int, why: str) -> str:
        return (f"The archive at {self.url!r} is no longer the one this writer records into: "
                f"{why}. Nothing more is written there (frames from {t0} on were not); the "
                f"{t0} frames committed before went with the archive. Record into another "
                "location, or resume the archive where it is now with mode='a'.")

    def _consolidate(self, changed: Mapping[str, Any], n_time: int) -> None:
        """Step 5 of a commit: the consolidated metadata, from what this writer holds.

        A failure is not the commit's: its frames are committed, and readers read the
        arrays' own metadata while the copy lags behind; the next commit (or
        :meth:`close`) writes it again.
        """
        try:
            if self._members is None:
                self._members = members_metadata(self._group)
            self._members.update(changed)
            write_consolidated(self._group, self._members, n_time, self.attrs)
            self._consolidated = True
        except (OSError, RuntimeError, TimeoutError, *storage_errors.client_errors()):
            self._consolidated = False
        self._last_commit = n_time

    @property
    def has_schedule(self) -> bool:
        """True if the archive stores ``sim_time`` and ``frame`` beside ``time``."""
        return len(self._times) > 1

    def _time_writes(self, block: FrameBlock, t0: int, t1: int) -> list[Any]:
        """The writes of step 3: frames ``t0..t1`` of ``time``, ``sim_time``, ``frame``."""
        sim_time = block.time if block.sim_time is None else block.sim_time
        where = slice(t0, t1)
        # An archive without sim_time keeps the simulation time in time, as it always did.
        writes = [self._arrays["time"].async_array.setitem(
            where, block.time if self.has_schedule else sim_time)]
        if self.has_schedule:
            writes.append(self._arrays["sim_time"].async_array.setitem(where, sim_time))
            if block.frame is not None:
                writes.append(self._arrays["frame"].async_array.setitem(
                    where, np.asarray(block.frame, dtype=np.int64)))
        return writes

    def last_frame(self) -> FrameBlock | None:
        """The last committed frame of this writer's worlds (one frame), or None if none.

        ``sim_time`` and ``frame`` are None for archives that do not store them.
        """
        n = self.n_frames
        if n == 0:
            return None
        cut = (self._worlds, slice(n - 1, n))
        have = {name: np.asarray(self._arrays[name][n - 1:n]) for name in self._times}
        frame = have.get("frame")
        return FrameBlock(
            have["time"], *(np.asarray(self._arrays[name][cut]) if name in self._arrays else None
                            for name in STATE_VARS),
            sim_time=have.get("sim_time"),
            frame=None if frame is None or frame[0] < 0 else frame,
        )

    def _check_block(self, block: FrameBlock) -> int:
        n = len(block.time)
        want = {"qpos": (self.n_worlds, n, self.layout.nq)}
        if self.layout.nmocap:
            want["mocap_pos"] = (self.n_worlds, n, self.layout.nmocap, 3)
            want["mocap_quat"] = (self.n_worlds, n, self.layout.nmocap, 4)
        for name, shape in want.items():
            got = getattr(block, name)
            if got is None or np.shape(got) != shape:
                raise ValueError(f"{name} has shape {np.shape(got)}; the archive needs {shape}.")
        return n

    @property
    def closed(self) -> bool:
        """True after :meth:`close`: the writer takes no more frames."""
        return self._closed

    @property
    def lost(self) -> bool:
        """True once a commit found the archive deleted, moved or replaced
        (``ArchiveReplacedError``): nothing more is written there."""
        return self._lost

    @property
    def abandoned(self) -> bool:
        """True once closed or after a failed commit: another writer of this process may
        then take its claim over (and this one takes no more frames)."""
        return self._closed or self._failed

    def taken_over(self) -> None:
        """Another writer took this writer's claim: take no more frames, release nothing."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()

    def close(self) -> None:
        """Release the writer's claim of the archive (or of its block); writes nothing (but
        the consolidated metadata, if the last commit failed to write it).

        Committed frames stay committed; call it once all frames are written. Safe to
        call again.

        Raises:
            StorageError: if the storage fails while the claim is released.
        """
        if not self._consolidated and not self._closed and not self._lost:
            self._consolidate({}, self._last_commit)
        self._closed = True
        held = self._finalizer.detach() if self._finalizer is not None else None
        if held is not None:
            with storage_errors.translated(self.url):  # S3 faults, in flyarchive's words
                release(*held[2])

    def __enter__(self) -> "ArchiveWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
