"""The one archive a viewer shows: opened once (and again when it was replaced), its world
table, its states read per world and kept in a bounded cache, and its model.

The viewer reads what every other reader reads, with the same checks: the header through
:func:`flyarchive.store.dataset.open_header` (attributes, coordinates, ``n_frames``,
world variables: no xarray, no dask), before the server listens; states through the getters the lazy
dataset of :func:`flyarchive.open_archive` reads with
(:func:`~flyarchive.store.dataset.committed_frames`: frames past ``n_frames`` NaN,
damaged chunks named, every read checking that the archive is still the one opened),
called directly by worker processes into shared memory (:data:`READ_PROCESSES`), without a
dask graph per read (50 worlds of 1000 NeuroMechFly frames: 2-3x faster than through
dask); and the model through
:func:`flyarchive.models.load_kept_model` (a file given: :func:`flyarchive.models.load_model_file`).
The lazy dataset itself (xarray and dask: seconds of imports on a 2-core machine) is
opened only for what needs it (keypoint traces: :meth:`ViewedArchive.dataset`), checked
to be the archive whose header the page shows.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from flyarchive.errors import ArchiveReplacedError, SelectionError, StorageError
from flyarchive.lru import LRUCache

#: Bytes of states kept in memory (whole worlds: 1000 NeuroMechFly frames are 0.58 MB).
CACHE_BYTES = 512 << 20
#: Worlds whose states are kept, at most (below :data:`CACHE_BYTES`, whichever comes first).
WORLDS_KEPT = 100_000
#: The state variables the viewer reads, when the archive has them.
STATES = ("qpos", "mocap_pos", "mocap_quat")
#: Worker processes that read states for the viewer (None: one per usable core, at most
#: 4; 0: the request's own thread reads). A read in the server's process holds its GIL
#: for the Python work around each decoded chunk (about half of a read), and every other
#: request and the event loop wait for it: 50 NeuroMechFly worlds of 1000 frames took
#: 90-130 ms alone, and under 50 browsing clients the requests queued for seconds (more
#: reader threads were slower still). Workers read into shared memory; the server only
#: waits.
READ_PROCESSES: int | None = None
#: Seconds a request waits for the archive's check (:meth:`ViewedArchive.check_same`)
#: before it is told that the storage does not answer.
CHECK_WAIT_S = 5.0


def _columns(header: Any) -> dict[str, np.ndarray]:
    """The world table's columns of an archive's header: ``world``, ``n_frames``, then each
    per-world variable (sorted by name)."""
    columns: dict[str, np.ndarray] = {
        "world": np.asarray(header["world"].values, dtype=np.int64),
        "n_frames": np.asarray(header["n_frames"].values, dtype=np.int64)}
    for name, var in sorted(header.data_vars.items()):  # the same order every time
        if var.dims == ("world",) and name != "n_frames":
            columns[str(name)] = np.asarray(var.values)
    return columns


def _column_attrs(header: Any) -> dict[str, dict[str, Any]]:
    """Each world variable's attributes (its ``units``...), by column."""
    return {str(name): dict(var.attrs) for name, var in header.data_vars.items()
            if var.dims == ("world",) and name != "n_frames"}


def _state_getters(header: Any, url: str, storage_options: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
    """The getters of the archive's state arrays (:data:`STATES` it has), through the
    group its ``header`` was read with: name -> ``(world, time, ...)`` array-like, read by
    ``getter[world_index]`` (stored dtype, NaN past the world's ``n_frames``)."""
    from flyarchive.store.dataset import committed_frames
    from flyarchive.store.reader import fused_reads

    n_frames = np.asarray(header["n_frames"].values, dtype=np.int64)
    world_ids = np.asarray(header["world"].values)
    n_time = int(header.sizes["time"])
    with fused_reads():
        arrays = {name: header.group[name] for name in STATES if name in header}
    return {name: committed_frames(arr, name, n_frames, n_time, world_ids, url, storage_options,
                                   archive_id=header.attrs.get("archive_id"))
            for name, arr in arrays.items()}


def _rows_reader(getters: Mapping[str, Any], worlds: Sequence[int], processes: int,
                 archive_id: str | None) -> Any:
    """The store's window reader of every frame of ``worlds`` (indices of the getters'
    worlds; world ``k`` of them is rows ``[k * n_time, (k + 1) * n_time)``): with
    ``processes`` worker processes, else the caller's thread."""
    from flyarchive.store.window_reader import ProcessWindowReader, WindowReader

    shape = next(iter(getters.values())).shape if getters else (0, 0)
    threads = WindowReader(dict(getters), np.asarray(worlds, dtype=np.int64), 0, int(shape[1]))
    if processes <= 0 or not getters:
        return threads
    return ProcessWindowReader(threads, archive_id, processes, indexes=True)


def _read_processes(processes: int | None, url: str) -> int:
    """Worker processes for ``url``'s states (see :data:`READ_PROCESSES`): none for an
    archive another process cannot open (``memory://``)."""
    import os

    if url.startswith("memory://"):
        return 0
    if processes is None:
        return max(1, min(4, len(os.sched_getaffinity(0))))
    return max(0, int(processes))


def start_readers(processes: int) -> None:
    """Start the worker processes now (their imports take a second or two), so that the
    first read does not wait for them."""
    if processes > 0:
        from flyarchive.store.window_reader import start_workers

        start_workers(processes)


def _archive_id_now(url: str, storage_options: Mapping[str, Any] | None) -> str | None:
    """The ``archive_id`` of the archive at ``url`` now (None: none there, or unreadable)."""
    from flyarchive.store.opener import open_for_reading

    try:
        group = open_for_reading(url, storage_options, attributes_only=True)
        return str(group.attrs.get("archive_id", ""))
    except Exception:  # noqa: BLE001 - gone, or half written: the message says so
        return None


def load_viewed_model(url: str, storage_options: Mapping[str, Any] | None,
                      model_path: str | None) -> Any:
    """The model to pose and render with: the file given, else the one kept beside the
    archive (untrusted input: :func:`flyarchive.models.load_kept_model` loads it in a
    short-lived child process first).

    Raises:
        ModelLoadError: no model file at ``model_path``, or no kept model (the viewer
            then shows the table and traces only).
        CorruptArchiveError, UnsafeModelError: a damaged or unsafe kept model.
    """
    from flyarchive.models import load_kept_model, load_model_file

    if model_path:
        return load_model_file(model_path)
    return load_kept_model(url, storage_options)


class ViewedArchive:
    """An opened archive and what the viewer keeps of it.

    Attributes:
        url: As given to ``flyarchive view``.
        generation: Incremented each time the archive is opened (again).
        attrs: The archive's attributes (from its header).
        ds: The dataset (:func:`flyarchive.open_archive`), opened on first use
            (:meth:`dataset`).
        world_ids: ``(n_worlds,)`` int64.
        times: ``(n_times,)`` float64 simulated seconds of the frames.
        columns: World table columns: ``world``, ``n_frames``, then each per-world
            variable, name -> ``(n_worlds,)`` values.
        column_attrs: Each world variable's attributes (``units``...), by column.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 processes: int | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.processes = _read_processes(READ_PROCESSES if processes is None else processes, url)
        self.generation = 0
        self._lock = threading.RLock()
        self._kept_states: LRUCache[int, dict[str, np.ndarray]] = LRUCache(
            WORLDS_KEPT, max_weight=CACHE_BYTES, weight=_nbytes, name=f"states of {url!r}")
        self._ds: Any = None
        self._getters: dict[str, Any] = {}
        self._opening = threading.Lock()  # one opening of the dataset at a time
        self._checker = ThreadPoolExecutor(1, thread_name_prefix="flyarchive-view-check")
        self._checking: Future[None] | None = None
        self.open()

    # ------------------------------------------------------------------ opening
    def open(self) -> None:
        """Open (or open again) the archive's header and its state arrays; forget everything
        read from the last one (the dataset is opened again on first use).

        Raises:
            As :func:`flyarchive.store.dataset.open_header`.
        """
        from flyarchive.store.dataset import open_header

        header = open_header(self.url, self.storage_options or None)
        getters = _state_getters(header, self.url, self.storage_options or None)
        columns = _columns(header)
        world_ids, n_frames = columns["world"], columns["n_frames"]
        with self._lock:
            self.attrs = header.attrs
            self.world_ids, self.n_frames, self.columns = world_ids, n_frames, columns
            self.column_attrs = _column_attrs(header)
            self.times = np.asarray(header["time"].values, dtype=np.float64)
            self.dofs = [str(d) for d in header["dof"].values]
            self._index = {int(w): i for i, w in enumerate(world_ids)}
            self._getters = getters
            self._kept_states.clear()
            self._ds = None
            self.generation += 1
        if self.processes == 0:  # else the workers read theirs (ProcessWindowReader(indexes=))
            from flyarchive.store.window_reader import load_indexes

            threading.Thread(target=load_indexes, args=(getters,), daemon=True,
                             name="flyarchive-view-indexes").start()

    def dataset(self) -> Any:
        """The lazy dataset (:func:`flyarchive.open_archive`), for what reads more than
        whole worlds' states (keypoint traces), opened on first use.

        Raises:
            ArchiveReplacedError: the archive there now is not the one whose header the page
                shows (another ``archive_id``).
            As :func:`flyarchive.open_archive`.
        """
        import flyarchive

        with self._opening:
            with self._lock:
                ds, generation, opened_id = self._ds, self.generation, self.archive_id
            if ds is None:
                ds = flyarchive.open_archive(self.url, self.storage_options or None)
                now = str(ds.attrs.get("archive_id", ""))
                if now != opened_id:
                    raise self._replaced(now)
                with self._lock:
                    if generation == self.generation:
                        self._ds = ds
        return ds

    @property
    def ds(self) -> Any:
        """:meth:`dataset`."""
        return self.dataset()

    @property
    def fps(self) -> float:
        return float(self.attrs["output_fps"])

    @property
    def archive_id(self) -> str:
        return str(self.attrs.get("archive_id", ""))

    def check_same(self) -> None:
        """Check that the archive is still the one opened: about 50 bytes of its root
        ``zarr.json`` (its ``archive_id``), read before every answer from the archive,
        kept states included. One check at a time: a request that comes while one is
        under way waits for it, at most :data:`CHECK_WAIT_S` (storage that does not
        answer is said at once, while the check goes on in the background).

        Raises:
            ArchiveReplacedError: it was replaced or deleted since it was opened.
            StorageError: the storage did not answer (in :data:`CHECK_WAIT_S`).
        """
        with self._lock:
            future = self._checking
            if future is None or future.done():
                future = self._checking = self._checker.submit(self._check_now)
        try:
            future.result(timeout=CHECK_WAIT_S)
        except FutureTimeout:
            raise StorageError(
                f"The storage of {self.url!r} has not answered for {CHECK_WAIT_S:g} s (the "
                "viewer goes on asking).") from None

    def _check_now(self) -> None:
        from flyarchive.store.storage_errors import translated

        with self._lock:
            qpos = self._getters.get("qpos")
        if qpos is None:
            return
        with self._reading(), translated(self.url, self.storage_options or None):
            if qpos.reader is not None:
                qpos.reader.check_archive()
            elif qpos.shape[0] and qpos.shape[1]:
                qpos[0, 0:1, 0:1]  # a read through zarr checks it too

    def columns_now(self) -> dict[str, np.ndarray]:
        """The world table's columns as the archive holds them now (its header read
        again), to tell the page what changed since the archive was opened: frames a
        writer appended (``n_frames``), world variables added or replaced.

        Raises:
            ArchiveReplacedError: the archive there now is another one.
            As :func:`flyarchive.store.dataset.open_header`.
        """
        import warnings

        from flyarchive.store.dataset import open_header

        with warnings.catch_warnings():  # an archive being written again: said as replaced
            warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr")
            header = open_header(self.url, self.storage_options or None)
        now = str(header.attrs.get("archive_id", ""))
        if now != self.archive_id:
            raise self._replaced(now)
        return _columns(header)

    def _replaced(self, now: str | None = None) -> ArchiveReplacedError:
        """The error for an archive replaced since the viewer opened it (``now``: the
        ``archive_id`` there now; None: looked up)."""
        if now is None:
            now = _archive_id_now(self.url, self.storage_options or None)
        detail = ("it is gone, or being written again now" if now is None else
                  f"its archive_id is now {now!r}, it was {self.archive_id!r}")
        return ArchiveReplacedError(
            f"The archive at {self.url!r} was replaced after the viewer opened it ({detail}). "
            "Open it again to see the archive that is there now.")

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Reads of states: a replaced archive said as the viewer says it."""
        try:
            yield
        except ArchiveReplacedError:
            raise self._replaced() from None

    # ------------------------------------------------------------------ states
    def index_of(self, worlds: Sequence[int]) -> list[int]:
        """Positions of world ids in the archive.

        Raises:
            SelectionError: an id the archive does not hold.
        """
        missing = [w for w in worlds if int(w) not in self._index]
        if missing:
            raise SelectionError(
                f"The archive has no world {missing[0]!r}; it holds {len(self.world_ids)} worlds "
                f"with ids {int(self.world_ids.min())} to {int(self.world_ids.max())}.")
        return [self._index[int(w)] for w in worlds]

    def states(self, worlds: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Every frame of each world: ``qpos`` ``(n_times, nq)`` as stored (NaN past its
        ``n_frames``), and ``mocap_pos`` / ``mocap_quat`` when the archive has them.

        Worlds not in the cache are read in one window of those worlds (a world reads only
        its own inner chunks) by the store's window reader through the archive's getters
        (as :func:`flyarchive.open_archive` reads them, without dask): by
        :attr:`processes` worker processes (:data:`READ_PROCESSES`), else on this thread.
        Values are as stored (float32 from a GPU recording).

        Raises:
            SelectionError: an unknown world id.
            ArchiveReplacedError: the archive was replaced or deleted since it was opened.
            CorruptArchiveError: damaged or missing stored bytes (naming the worlds, frames
                and file).
            StorageError: the storage failed to answer.
        """
        self.index_of(worlds)  # unknown ids refused first
        with self._lock:
            generation, getters, index = self.generation, self._getters, self._index
            missing = sorted({int(w) for w in worlds if int(w) not in self._kept_states})
        fresh = {}
        if missing:
            rows = _rows_reader(getters, [index[w] for w in missing], self.processes,
                                self.archive_id)
            with self._reading():
                got = rows.read(0, len(missing) * rows.n_time)
            n_time = rows.n_time
            # each world its own copy: a world kept must not keep the whole read alive
            fresh = {world: {name: np.array(values[k * n_time:(k + 1) * n_time])
                             for name, values in got.items()}
                     for k, world in enumerate(missing)}
            del got
            self._keep(generation, fresh)
        with self._lock:
            got = [fresh.get(int(w)) or self._kept_states.peek(int(w)) for w in worlds]
            if generation == self.generation:  # each world shown: the most recently used
                for w, arrays in zip(worlds, got):
                    if arrays is not None and int(w) in self._kept_states:
                        self._kept_states.get(int(w), lambda arrays=arrays: arrays)
        return [g for g in got if g is not None]

    def _keep(self, generation: int, fresh: Mapping[int, dict[str, np.ndarray]]) -> None:
        with self._lock:
            if generation != self.generation:
                return  # read from an archive that was opened again meanwhile
            for world, arrays in fresh.items():
                self._kept_states.put(world, arrays)  # the oldest go past CACHE_BYTES

    @property
    def state_values(self) -> int:
        """Values of one frame of one world's states (``nq``, plus 7 per mocap body)."""
        with self._lock:
            getters = list(self._getters.values())
        return sum(int(np.prod(g.shape[2:], dtype=np.int64)) for g in getters)

    def frame_window(self, start: float | None, end: float | None) -> slice:
        """The frames whose times lie in ``[start, end]`` (None: open on that side).

        Raises:
            SelectionError: a time that is no finite number, ``start`` after ``end``, or
                no frame between them.
        """
        for name, value in (("start", start), ("end", end)):
            if value is not None and not math.isfinite(value):
                raise SelectionError(f"{name} must be a finite number of seconds, not {value!r}.")
        if start is not None and end is not None and start > end:
            raise SelectionError(f"start {start:g} s is after end {end:g} s; give a start at "
                                 "or before the end.")
        lo = 0 if start is None else int(np.searchsorted(self.times, start, side="left"))
        hi = len(self.times) if end is None else int(np.searchsorted(self.times, end, side="right"))
        if hi <= lo:
            shown = (f"from {self.times[0]:g} to {self.times[-1]:g} s" if len(self.times)
                     else "none")
            raise SelectionError(f"No frame lies between {_bound(start, 'the start')} and "
                                 f"{_bound(end, 'the end')}; the archive's frames: {shown}.")
        return slice(lo, hi)


def _bound(seconds: float | None, open_side: str) -> str:
    """A window's bound in words: ``2 s``, or ``open_side`` when it has none."""
    return open_side if seconds is None else f"{seconds:g} s"


def _nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    """Bytes of one world's state arrays."""
    return sum(a.nbytes for a in arrays.values())
