"""The window readers of the store's state reader family: the state of a window of an
archive (worlds by a span of frames) read in big blocks of rows, for positions and gait
(:mod:`~flyarchive.analyze.warp_stream`, :mod:`~flyarchive.analyze.cpu_processes`) and
the viewer; renders read the boxes of their batches through
:class:`~flyarchive.store.reader.StateReader`, whose window is the whole archive. Every
reader of the family reads through the group that
:func:`~flyarchive.store.opener.open_for_reading` opened, and one interface holds them
all: :class:`RowReader` (``read(r0, r1)``: rows of the window; ``read_boxes(boxes)``:
boxes of its worlds by frames, :data:`Box`), the window readers made by
:func:`window_reader`.

:class:`WindowReader` (threads of the caller) reads straight through the store's getters
(:class:`~flyarchive.store.dataset.CommittedFrames`, the same objects the lazy dataset
reads with, their :class:`~flyarchive.store.shards.ShardReader` reading whole shards and
decoding each inner chunk into its place), with no dask graph per read.

A read of rows ``[r0, r1)`` (the window's frames flattened world by world) is one call
of the getter per run of consecutive worlds held whole (and one per partial world at the
ends): a few Python calls per shard, the decoding outside the GIL, so reader threads
read in parallel. Frames past a world's ``n_frames`` read as NaN (the getter masks them,
as for the lazy array). When the window cannot be found in the archive's getters (a
dataset not read from an archive, or cut in ways other than worlds and a time span),
:func:`window_reader` returns a :class:`DaskWindowReader` instead.

Threads share the GIL for the Python work around each decoded chunk, so past a few
cores they stop scaling. :class:`ProcessWindowReader` reads with worker processes
instead (spawned once per process of the caller, one per usable core, kept for the
next reads): each is sent a job as JSON (the archive's URL and storage options, its
``archive_id``, the array's name, the boxes of worlds and frames, the name and layout
of a ``multiprocessing.shared_memory`` block the caller owns) over a pipe, opens the
archive itself (kept for the next jobs) and decodes through the same getters into that
block; no array is pickled. A worker opens the archive through its header
(:func:`~flyarchive.store.dataset.open_header`: no xarray, no dask), each array's getter
made as :func:`~flyarchive.store.dataset.read_dataset` makes it: measured on the 2-core VM,
opening a 4096-world archive and reading one world in a fresh worker took 0.62-0.74 s and
78 MB against 1.53-1.60 s and 210 MB through the lazy dataset. The caller masks frames past its own ``n_frames`` (those
of the dataset it opened) and raises a worker's error as the same flyarchive error. A
job may name a handler (``"handler": "module:function"`` of flyarchive, e.g. the positions
of :mod:`~flyarchive.analyze.cpu_processes`) that gets the job and its getters instead.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from flyarchive.store.dataset import committed_getter
from flyarchive.store.reader import Box, box_rows, row_boxes

if TYPE_CHECKING:
    import xarray as xr


#: Frames of a window from which :func:`window_reader` reads with processes by itself
#: (``processes=None``), on a machine with at least :data:`AUTO_CORES` usable cores.
AUTO_FRAMES = 1_000_000
AUTO_CORES = 8


class RowReader(Protocol):
    """What every reader of the family does (the window readers here, and the renders'
    :class:`~flyarchive.store.reader.StateReader`, whose window is the whole archive):
    boxes of the window's state arrays, ``{name: (rows, ...)}`` as stored, box after box,
    and rows ``[r0, r1)`` of the window (its frames flattened world by world: the boxes
    :func:`~flyarchive.store.reader.row_boxes` gives)."""

    n_time: int

    def read(self, r0: int, r1: int) -> dict[str, np.ndarray]:
        ...

    def read_boxes(self, boxes: Sequence[Box]) -> dict[str, np.ndarray]:
        ...


class WindowReader:
    """Reads rows of a window's state (see the module's docstring).

    Args:
        getters: ``{name: getter}`` of the state arrays to read (``(world, time, ...)``
            array-likes of the whole archive).
        worlds: ``(W,)`` the window's worlds, as indices of the getters' ``world`` axis.
        start, stop: The window's frames, ``[start, stop)`` of the getters' ``time`` axis.
    """

    def __init__(self, getters: dict[str, Any], worlds: np.ndarray, start: int, stop: int
                 ) -> None:
        self.getters, self.worlds, self.start, self.stop = getters, worlds, start, stop
        self.n_time = stop - start

    def read(self, r0: int, r1: int) -> dict[str, np.ndarray]:
        """Rows ``[r0, r1)`` of each state array: ``{name: (r1 - r0, ...)}`` as stored
        (dtype of the archive), NaN past each world's ``n_frames``."""
        return self.read_boxes(row_boxes(r0, r1, self.n_time))

    def read_boxes(self, boxes: Sequence[Box]) -> dict[str, np.ndarray]:
        """The rows of ``boxes`` (:data:`Box`), as :meth:`read`: one getter call per run
        of consecutive archive worlds of a box."""
        pieces = list(_getter_runs(boxes, self.worlds))
        state = {}
        for name, getter in self.getters.items():
            parts = [getter[w0:w1, self.start + t0:self.start + t1].reshape(-1, *getter.shape[2:])
                     for w0, w1, t0, t1 in pieces]
            state[name] = parts[0] if len(parts) == 1 else \
                np.concatenate(parts) if parts else np.empty((0, *getter.shape[2:]), getter.dtype)
        return state


def _getter_runs(boxes: Sequence[Box], worlds: np.ndarray
                 ) -> Iterator[tuple[int, int, int, int]]:
    """``(g0, g1, t0, t1)``: each box's worlds as runs of consecutive getter worlds
    ``[g0, g1)`` (``worlds``: the window's, as the getters' indices), window frames
    ``[t0, t1)``."""
    for w0, w1, t0, t1 in boxes:
        k = w0
        while k < w1:
            run = 1
            while k + run < w1 and worlds[k + run] == worlds[k] + run:
                run += 1
            yield int(worlds[k]), int(worlds[k]) + run, t0, t1
            k += run


class DaskWindowReader:
    """Rows of a window's state through its dask arrays (any dataset; slower: a graph per
    read, run in the calling thread)."""

    def __init__(self, ds: xr.Dataset, names: list[str]) -> None:
        self.arrays = {name: ds[name].data for name in names}
        self.n_time = int(ds.sizes["time"])

    def read(self, r0: int, r1: int) -> dict[str, np.ndarray]:
        """Rows ``[r0, r1)`` of each state array (see :class:`RowReader`)."""
        return self.read_boxes(row_boxes(r0, r1, self.n_time))

    def read_boxes(self, boxes: Sequence[Box]) -> dict[str, np.ndarray]:
        """The rows of ``boxes`` (see :class:`RowReader`)."""
        state = {}
        for name, data in self.arrays.items():
            if not boxes:
                state[name] = np.empty((0, *data.shape[2:]), data.dtype)
                continue
            parts = [data[w0:w1, t0:t1] for w0, w1, t0, t1 in boxes]
            parts = [p.reshape((-1, *data.shape[2:])) for p in parts]
            if hasattr(parts[0], "compute"):
                import dask.array as da

                block = parts[0] if len(parts) == 1 else da.concatenate(parts)
                state[name] = np.asarray(block.compute(scheduler="synchronous"))
            else:
                state[name] = np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])
        return state


def window_reader(ds: xr.Dataset, whole: xr.Dataset | None, names: list[str],
                  processes: int | None = None
                  ) -> WindowReader | ProcessWindowReader | DaskWindowReader:
    """The fastest reader of the window ``ds``'s state arrays ``names``: through the
    archive's getters when the window is found in them, else through dask.

    Args:
        ds: The window: the archive's dataset cut to some worlds and a span of frames.
        whole: The dataset ``ds`` was cut from, as opened
            (:func:`flyarchive.open_archive`); None: unknown (read through dask).
        names: State arrays to read, e.g. ``["qpos"]``.
        processes: Worker processes reading the getters' archive
            (:class:`ProcessWindowReader`); 0: threads of the caller
            (:class:`WindowReader`); None: processes, one per usable core, when there are
            at least :data:`AUTO_CORES` of them, the window holds at least
            :data:`AUTO_FRAMES` frames and its archive can be opened by another process
            (not a ``memory://`` one).
    """
    located = _locate(ds, whole, names)
    if located is None:
        return DaskWindowReader(ds, names)
    getters, worlds, (start, stop) = located
    threads = WindowReader(getters, worlds, start, stop)
    url = getattr(getters[names[0]], "url", None)
    if not isinstance(url, str) or url.startswith("memory://"):
        return threads
    cores = len(os.sched_getaffinity(0))
    if processes is None:
        big = worlds.size * (stop - start) >= AUTO_FRAMES
        processes = cores if cores >= AUTO_CORES and big else 0
    if processes <= 0:
        return threads
    archive_id = whole.attrs.get("archive_id") if whole is not None else None
    return ProcessWindowReader(threads, archive_id, processes)


def _locate(ds: xr.Dataset, whole: xr.Dataset | None, names: list[str]
            ) -> tuple[dict[str, Any], np.ndarray, tuple[int, int]] | None:
    """The getters of ``names`` and where the window lies in them (world indices, frames
    ``[start, stop)``); None when the window is not a set of worlds by a span of frames
    of one archive's getters."""
    if whole is None:
        return None
    getters = {name: committed_getter(whole[name]) for name in names}
    first = getters[names[0]]
    if any(g is None for g in getters.values()) or first is None:
        return None
    if any(g.shape[:2] != first.shape[:2] for g in getters.values()):  # type: ignore[union-attr]
        return None
    ids = np.asarray(first.world_ids)
    if (whole.sizes["world"], whole.sizes["time"]) != first.shape[:2] or \
            not np.array_equal(np.asarray(whole.world.values), ids):
        return None  # the dataset given was cut already
    where = {int(w): i for i, w in enumerate(ids)}
    asked = [int(w) for w in ds.world.values]
    if any(w not in where for w in asked):
        return None
    times, all_times = np.asarray(ds.time.values), np.asarray(whole.time.values)
    if times.size == 0:
        return None
    start = int(np.searchsorted(all_times, times[0]))
    stop = start + times.size
    if stop > all_times.size or not np.array_equal(all_times[start:stop], times):
        return None
    indices = np.array([where[w] for w in asked], dtype=np.int64)
    return getters, indices, (start, stop)  # type: ignore[return-value]



class ProcessWindowReader:
    """Reads rows of a window's state with worker processes into shared memory (see the
    module's docstring); the same results as :class:`WindowReader`.

    Args:
        threads: The window's reader in this process (its getters, worlds and frames).
        archive_id: The ``archive_id`` of the archive as the caller opened it; a worker
            that finds another raises ArchiveReplacedError.
        processes: Worker processes to use (started on first need, kept for later reads).
        indexes: Whether a worker that opens the archive reads the indexes of its settled
            shards ahead, on a thread of its own (:func:`load_indexes`): for reads of a
            world here and there (the viewer), each of which would otherwise read the
            index of every shard it touches the first time; reads of whole shards (the
            positions) need none.
    """

    def __init__(self, threads: WindowReader, archive_id: str | None, processes: int, *,
                 indexes: bool = False) -> None:
        self.threads, self.archive_id, self.indexes = threads, archive_id, indexes
        self.getters, self.worlds = threads.getters, threads.worlds
        self.start, self.stop, self.n_time = threads.start, threads.stop, threads.n_time
        self.pool = _pool(processes)
        first = next(iter(self.getters.values()))
        self.url, self.storage_options = first.url, dict(first.storage_options or {})
        shards = getattr(getattr(first, "arr", None), "shards", None)
        self.shard_worlds = int(shards[0]) if shards else 64

    def read(self, r0: int, r1: int) -> dict[str, np.ndarray]:
        """Rows ``[r0, r1)`` of each state array, as :meth:`WindowReader.read`."""
        return self.read_boxes(row_boxes(r0, r1, self.n_time))

    def read_boxes(self, boxes: Sequence[Box]) -> dict[str, np.ndarray]:
        """The rows of ``boxes``, as :meth:`WindowReader.read_boxes`."""
        n = box_rows(boxes)
        layout, size = {}, 0
        for name, getter in self.getters.items():
            inner = tuple(int(s) for s in getter.shape[2:])
            layout[name] = (size, inner, np.dtype(getter.dtype))
            size += n * int(np.prod(inner, dtype=np.int64)) * np.dtype(getter.dtype).itemsize
        if n <= 0:
            return {name: np.empty((0, *inner), dt) for name, (_, inner, dt) in layout.items()}
        parts = self.pieces(boxes)
        first = boxes[0][0] * self.n_time + boxes[0][2]  # its first row: the earliest first
        block = shared_memory.SharedMemory(create=True, size=size)
        try:
            self.pool.run([self.job(block.name, layout, part) for part in parts],
                          priority=first)
            # The arrays are views of a mapping of their own (MAP_POPULATE: mapped in one
            # call, not a page fault each), which lives as long as they do: no copy.
            # Elsewhere (no /dev/shm) they are copied out of the block.
            mapped = _mapping(block.name, populate=True)
            state = {}
            for name, (offset, inner, dtype) in layout.items():
                count = n * int(np.prod(inner, dtype=np.int64))
                values = np.frombuffer(block.buf if mapped is None else mapped, dtype, count,
                                       offset).reshape(n, *inner)
                state[name] = values.copy() if mapped is None else values
                del values
        finally:
            block.close()
            block.unlink()
        self.mask(state, boxes)
        return state

    def pieces(self, boxes: Sequence[Box]) -> list[list[tuple[int, int, int, int, int]]]:
        """The getter boxes of ``boxes`` (``(g0, g1, t0, t1, row)``, ``row`` their first
        row in the block), cut at shards of worlds, shared out for the workers."""
        cut_boxes, row = [], 0
        for w0, w1, t0, t1 in _getter_runs(boxes, self.worlds):
            while w0 < w1:
                cut = min(w1, (w0 // self.shard_worlds + 1) * self.shard_worlds)
                cut_boxes.append((w0, cut, t0, t1, row))
                row += (cut - w0) * (t1 - t0)
                w0 = cut
        count = max(1, min(len(cut_boxes), self.pool.size))
        return [cut_boxes[i::count] for i in range(count)]

    def job(self, block: str, layout: dict[str, Any], boxes: list[Any]) -> dict[str, Any]:
        """A worker's job (JSON): read ``boxes`` of this archive into shared ``block``."""
        return {"url": self.url, "storage_options": self.storage_options,
                "archive_id": self.archive_id, "block": block,
                "arrays": {n: [o, list(i), d.str] for n, (o, i, d) in layout.items()},
                "boxes": [[int(v) for v in b] for b in boxes],
                "start": int(self.start), "indexes": self.indexes}

    def mask(self, state: dict[str, np.ndarray], boxes: Sequence[Box]) -> None:
        """NaN at frames past each world's ``n_frames`` as this process opened them (the
        rows of ``boxes``)."""
        if not boxes:
            return
        worlds = np.concatenate([np.repeat(np.arange(w0, w1), t1 - t0)
                                 for w0, w1, t0, t1 in boxes])
        frames = np.concatenate([np.tile(np.arange(t0, t1), w1 - w0)
                                 for w0, w1, t0, t1 in boxes])
        for name, values in state.items():
            n_frames = getattr(self.getters[name], "n_frames", None)
            if n_frames is None or values.dtype.kind != "f":
                continue
            past = self.start + frames >= n_frames[self.worlds[worlds]]
            if past.any():
                values[past] = np.nan


class _Pool:
    """Worker processes, each a fresh Python (``python -P -c``, this process's ``sys.path``
    and nothing before it: nothing of the caller's ``__main__`` is run) answering JSON
    lines on its pipes, and one thread per worker feeding it jobs from a queue shared by
    every caller, lowest ``priority`` first (then in the order given): a window's early
    rows are read before its later ones, whichever reader thread asked first."""

    def __init__(self) -> None:
        self.size = 0
        self.pids: list[int] = []  # of every worker started (for benchmarks' CPU time)
        self.live: set[subprocess.Popen[bytes]] = set()  # the workers running now
        self.jobs: queue.PriorityQueue[tuple[tuple[int, int], dict[str, Any], Future[None]]] = \
            queue.PriorityQueue()
        self.lock = threading.Lock()
        self._order = itertools.count()
        self._start_error: BaseException | None = None  # why the last replacement failed

    def grow(self, size: int) -> None:
        with self.lock:
            while self.size < size:
                self._start()

    def _start(self) -> None:
        """Start a worker and its feeding thread (the caller holds the lock)."""
        # The caller's sys.path, in its order ("" is its working folder); -P: nothing put
        # before it (a flyarchive in the working folder must not shadow the caller's).
        path = os.pathsep.join(p or os.getcwd() for p in sys.path)
        worker = subprocess.Popen([sys.executable, "-P", "-c", _WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=path))
        try:
            threading.Thread(target=self._feed, args=(worker,), daemon=True,
                             name="flyarchive-state-worker").start()
        except RuntimeError:  # no thread to feed it: no worker
            worker.kill()
            worker.wait()
            raise
        self.pids.append(worker.pid)
        self.live.add(worker)
        self.size += 1

    def _replace(self, worker: subprocess.Popen[bytes]) -> None:
        """A fresh worker in the place of ``worker`` (which has died): started first, so
        that the pool never looks a worker short while the new one starts. When none can
        be started, the pool is a worker smaller; once it has none, every job waiting
        fails (and every later :meth:`run`) instead of waiting for ever."""
        with self.lock:
            try:
                self._start()
            except (OSError, RuntimeError) as err:  # no process or no thread to be had
                self._start_error = err
            self.size -= 1
            self.live.discard(worker)
            if not self.live:
                self._fail_waiting()

    def _fail_waiting(self) -> None:
        """Fail every job in the queue: no worker is left to take it (the caller holds
        the lock)."""
        while True:
            try:
                _, _, future = self.jobs.get_nowait()
            except queue.Empty:
                return
            future.set_exception(self._none_running())

    def _none_running(self) -> RuntimeError:
        return RuntimeError(
            "No state-reading worker process is running, and none could be started "
            f"({self._start_error}); read with threads (processes=0), or free processes "
            "or memory and read again.")

    def run(self, jobs: list[dict[str, Any]], priority: int = 0) -> None:
        """Run ``jobs`` on the workers (queued at ``priority``: lower runs first); raises
        the first job's error once every job is answered."""
        futures: list[Future[None]] = []
        with self.lock:  # a pool that has just lost its last worker takes no more jobs
            if not self.live:
                raise self._none_running()
            for job in jobs:
                futures.append(Future())
                self.jobs.put(((priority, next(self._order)), job, futures[-1]))
        errors = [err for future in futures if (err := future.exception()) is not None]
        if errors:
            raise errors[0]

    def _feed(self, worker: subprocess.Popen[bytes]) -> None:
        """A worker's thread: one job at a time from the queue, its answer to its future;
        when the worker has died, a fresh one takes its place (and this thread ends): the
        job fails if the worker died on it, else it goes back to the queue."""
        while True:
            key, job, future = self.jobs.get()
            if worker.poll() is not None:  # died while idle: nothing was sent
                self.jobs.put((key, job, future))
                self._replace(worker)
                return
            try:
                worker.stdin.write(json.dumps(job).encode() + b"\n")  # type: ignore[union-attr]
                worker.stdin.flush()  # type: ignore[union-attr]
                line = worker.stdout.readline()  # type: ignore[union-attr]
                # A whole line of a JSON object, else the worker died writing it (or wrote
                # what it never writes): the same as no answer.
                reply = json.loads(line) if line.endswith(b"\n") else None
            except (OSError, ValueError):
                reply = None
            if not isinstance(reply, dict):
                worker.kill()
                try:
                    self._replace(worker)  # before the caller hears of it
                finally:
                    future.set_exception(RuntimeError(
                        f"A state-reading worker process stopped (exit status "
                        f"{worker.wait()}) while it read; read again, or read with threads "
                        "(processes=0)."))
                return
            if "error" in reply:
                future.set_exception(_error(reply))
            else:
                future.set_result(None)


_POOL = _Pool()


def _pool(size: int) -> _Pool:
    _POOL.grow(size)
    return _POOL


def start_workers(processes: int) -> None:
    """Start this process's state-reading workers now, ``processes`` of them at least
    (their imports take a second or two on a busy machine), so that the first read
    does not wait for them (a server starting while its page loads)."""
    _pool(processes)


def _error(reply: dict[str, Any]) -> BaseException:
    """The exception a worker reported: the same flyarchive error, when it is one."""
    from flyarchive import errors

    kind, message = str(reply.get("error")), str(reply.get("message"))
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.FlyarchiveError):
        try:
            return cls(message)
        except TypeError:
            pass
    return RuntimeError(f"{kind}: {message}")


#: A job's handler in a worker: ``handler(job, {name: getter})``.
Handler = Callable[[dict[str, Any], dict[str, Any]], None]
#: What a worker runs: the loop of :func:`serve_jobs`.
_WORKER = "from flyarchive.store.window_reader import serve_jobs; serve_jobs()"


def serve_jobs() -> None:
    """A worker's loop: answer each job (a JSON line on stdin) with a JSON line, ``{}`` or
    ``{"error", "message"}``, on what was stdout (stdout itself goes to stderr, so that
    nothing else printed can garble the answers). A job naming a ``handler``
    (``"module:function"`` of flyarchive) is given to it with the job's getters
    (``{name: getter}``) instead of decoded."""
    # Ctrl-C in a terminal reaches every process of its group: the caller handles it, and
    # a worker ends when the caller's end of its pipe closes (no traceback of its own).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    # What the first job's opening of the archive imports, imported now: the caller
    # prepares the rest of its run meanwhile (on its own core) instead of waiting. The
    # archive is opened through its header (no xarray, no dask: half a second less to
    # start and about half the memory of a worker).
    from flyarchive.store import dataset  # noqa: F401

    opened: dict[str, Any] = {}
    for line in sys.stdin.buffer:
        try:
            _fill(json.loads(line), opened)
            reply: dict[str, Any] = {}
        except Exception as err:  # noqa: BLE001 - reported to the caller, raised there
            reply = {"error": type(err).__name__, "message": str(err)}
        answers.write(json.dumps(reply).encode() + b"\n")
        answers.flush()


def _fill(job: dict[str, Any], opened: dict[str, Any]) -> None:
    """Decode a job's boxes of each array into its shared-memory block (or give the job
    to its handler)."""
    key = json.dumps([job["url"], job["storage_options"]], sort_keys=True)
    archive = opened.get(key)
    if archive is None or archive["archive_id"] != job["archive_id"]:
        archive = _open(job["url"], job["storage_options"] or None, job["archive_id"])
        opened[key] = archive
    getters = archive["getters"]
    new = {name: _getter(archive, name) for name in job["arrays"] if name not in getters}
    getters.update(new)
    if new and job.get("indexes"):
        threading.Thread(target=load_indexes, args=(new,), daemon=True,
                         name="flyarchive-state-indexes").start()
    if "handler" in job:
        _handler(job["handler"])(job, getters)
        return
    block = attach_block(job["block"])
    try:
        for name, (offset, inner, dtype) in job["arrays"].items():
            _decode_boxes(getters[name], block.buf, offset, tuple(inner),
                          np.dtype(dtype), job["boxes"], job["start"])
    finally:
        block.close()


def _open(url: str, options: Mapping[str, Any] | None, archive_id: str | None
          ) -> dict[str, Any]:
    """The archive the caller opened, through its header (checked and validated as
    :func:`flyarchive.open_archive` does), or ArchiveReplacedError."""
    from flyarchive.store.dataset import open_header
    from flyarchive.store.opener import open_for_reading

    group = open_for_reading(url, options, archive_id=archive_id, own_later=True)
    header = open_header(url, options, group=group)
    return {"url": url, "options": options, "archive_id": header.attrs.get("archive_id"),
            "header": header, "getters": {}}


def _getter(archive: dict[str, Any], name: str) -> Any:
    """The getter of the state array ``name`` (``(world, time, ...)``), as the caller's
    :func:`~flyarchive.store.dataset.read_dataset` made it."""
    from flyarchive.errors import SchemaError
    from flyarchive.store.dataset import committed_frames
    from flyarchive.store.reader import fused_reads

    header = archive["header"]
    if name not in header or tuple(header[name].dims[:2]) != ("world", "time"):
        raise SchemaError(f"The archive at {archive['url']!r} has no state array {name!r}.")
    with fused_reads():
        arr = header.group[name]
    return committed_frames(arr, name, np.asarray(header["n_frames"].values, dtype=np.int64),
                            int(header.sizes["time"]), np.asarray(header["world"].values),
                            archive["url"], archive["options"],
                            archive_id=archive["archive_id"])


def load_indexes(getters: Mapping[str, Any]) -> None:
    """Read the settled shards' indexes of the getters' arrays ahead of the reads
    (:meth:`~flyarchive.store.shards.ShardReader.load_indexes`); what fails here is left
    to the reads, which report it."""
    for getter in getters.values():
        if getattr(getter, "reader", None) is not None:
            try:
                getter.reader.load_indexes()
            except Exception:  # noqa: BLE001 - replaced, unreadable: the reads report it
                return


def _handler(name: str) -> Handler:
    """The function ``"module:function"`` names (a module of flyarchive)."""
    module, _, function = name.partition(":")
    if not module.startswith("flyarchive.") or not function:
        raise ValueError(f"A job's handler must be 'flyarchive.<module>:<function>', not {name!r}.")
    found: Handler = getattr(importlib.import_module(module), function)
    return found


def _decode_boxes(getter: Any, buf: Any, offset: int, inner: tuple[int, ...],
                  dtype: np.dtype, boxes: list[list[int]], start: int) -> None:
    """Each box ``(w0, w1, t0, t1, row)`` of ``getter`` (frames from ``start``) into rows
    ``row...`` of the array at ``offset`` of ``buf``."""
    last = max(row + (w1 - w0) * (t1 - t0) for w0, w1, t0, t1, row in boxes)
    view = np.ndarray((last, *inner), dtype, buffer=buf, offset=offset)
    for w0, w1, t0, t1, row in boxes:
        n = (w1 - w0) * (t1 - t0)
        view[row:row + n] = getter[w0:w1, start + t0:start + t1].reshape(n, *inner)


class _Block:
    """A shared-memory block mapped in a worker: ``buf``, then ``close()``."""

    def __init__(self, buf: Any, owner: Any) -> None:
        self.buf, self._owner = buf, owner

    def close(self) -> None:
        buf, self.buf = self.buf, None
        try:
            if isinstance(self._owner, type(buf)) is False and isinstance(buf, memoryview):
                buf.release()
            self._owner.close()
        except BufferError:
            pass  # a view is still held (by an error's traceback): unmapped when it goes


def attach_block(name: str) -> _Block:
    """The caller's shared-memory block ``name``, mapped here without registering it
    with a resource tracker (which would unlink it when this worker exits)."""
    mapped = _mapping(name)
    if mapped is None:
        block = shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
        return _Block(block.buf, block)
    return _Block(memoryview(mapped), mapped)


def _mapping(name: str, populate: bool = False) -> Any:
    """A writable mapping (``mmap.mmap``) of shared-memory block ``name`` of its own,
    unmapped when the last array over it goes; None where blocks are not files under
    /dev/shm. ``populate``: map every page now (the block was written already)."""
    import mmap

    path = f"/dev/shm/{name.lstrip('/')}"
    if not os.path.exists(path):
        return None
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, 0, flags=flags)
    finally:
        os.close(fd)
