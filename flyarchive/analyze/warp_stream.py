"""Positions of a whole window into host memory as fast as a GPU allows: reading, upload,
kinematics and copy-back overlapped (:func:`load_positions`).

The window's frames, flattened world by world, are cut into batches of the engine's size
(:class:`~flyarchive.analyze.warp_positions.WarpKinematics`; whole shards of worlds when a
batch holds several). Reader threads read batches ahead straight through the store's
shard reader (:mod:`~flyarchive.store.window_reader`: one getter call per run of whole
worlds, frames past ``n_frames`` NaN; decoding runs outside the GIL, so the threads read
in parallel). On CUDA each batch then goes

    host -> pinned staging slot -> (upload stream) device slot
         -> (compute stream) Data.qpos, kinematics, keypoint gather -> device out slot
         -> (copy stream) pinned out slot -> (copy threads) the result array

with three slots of each, so that batch k + 1 is staged (by staging threads) while batch k
uploads, batch k - 1 computes and comes back; CUDA events order the streams, and the host
waits only for a slot it is about to reuse. Copy threads move each batch from its pinned
out slot (one of :data:`OUT_SLOTS`) into the result as soon as it has arrived, while the
next batches go on; the pipeline waits for them only before it reuses that out slot, and
at the end. On Warp's CPU device the same steps run one after another (the readers still
read ahead, the copies still run beside them). The result is one host array
``(world, time, K, 3 | 7)`` float32.
"""

from __future__ import annotations

import os
import time as clock
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze.keypoints import KeypointRequest, PointSpec
from flyarchive.analyze.prepare import Prepared, as_positions, check_backend, prepare
from flyarchive.store.window_reader import ProcessWindowReader, WindowReader, window_reader

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

#: Reader threads by default when worker processes decode (each read's jobs go to several
#: workers; more threads waiting for them only contend for the GIL).
PROCESS_READERS = 8

#: Pinned out slots on CUDA: batches whose copy into the result may still run while the
#: next ones are computed and come back.
OUT_SLOTS = 4


@dataclass
class StreamStats:
    """What a :func:`load_positions` run measured.

    Attributes:
        frames: Frames computed (worlds x frames of the window).
        batches: Batches of the engine's size.
        seconds: Wall time from the first read to the last copy, s (setup excluded).
        setup_seconds: Finding the engine and its pipeline's buffers (the ones kept
            from an earlier call), or building them (model upload, device arrays, pinned
            slots, kernels), and starting the readers, s.
        engine: ``"kept"`` (an earlier call's engine served) or ``"built"``.
        prepare_seconds: Opening the archive, finding the model and the keypoints, s.
        call_seconds: The whole call, s (what the caller waited for).
        read_seconds: Time reader threads spent reading, summed over threads, s.
        read_wait_seconds: Time the pipeline waited for a batch's state to be read, s
            (the read is the bound when this is most of ``seconds``).
        stage_seconds: Copying each batch's state into its (pinned) staging slot, s.
        upload_seconds: Host to device copies, summed over batches, s (CUDA: timed by
            CUDA events on the upload stream; Warp's CPU device: the copy into ``Data``).
        kinematics_seconds: ``kinematics`` and the keypoint gather, summed, s (CUDA:
            events on the compute stream).
        download_seconds: Device to (pinned) host copies of the keypoints, summed, s.
        copy_out_seconds: Copying each batch from its pinned out slot into the result
            array, summed over the copy threads, s (beside the other stages).
        copy_wait_seconds: Time the pipeline waited for those copies (before reusing an
            out slot, and for the last ones at the end), s.
        reader: ``"shards"`` (the archive's getters, :mod:`~flyarchive.store.window_reader`),
            ``"processes"`` (the same in worker processes) or ``"dask"``.
        peak_device_bytes: Largest device memory held by Warp's memory pool during the
            run (CUDA with a memory pool; None elsewhere).
        peak_device_used_bytes: Largest memory in use on the whole device (every
            process), sampled once per batch (CUDA; None elsewhere).
        pinned_bytes: Pinned host memory of the staging and copy-back slots.
    """

    frames: int = 0
    batches: int = 0
    seconds: float = 0.0
    setup_seconds: float = 0.0
    engine: str = ""
    prepare_seconds: float = 0.0
    call_seconds: float = 0.0
    read_seconds: float = 0.0
    read_wait_seconds: float = 0.0
    stage_seconds: float = 0.0
    upload_seconds: float = 0.0
    kinematics_seconds: float = 0.0
    download_seconds: float = 0.0
    copy_out_seconds: float = 0.0
    copy_wait_seconds: float = 0.0
    reader: str = ""
    peak_device_bytes: int | None = None
    peak_device_used_bytes: int | None = None
    pinned_bytes: int = 0


def load_positions(
    source: str | xr.Dataset,
    bodies: str | Iterable[str] | None = None,
    sites: str | Iterable[str] | None = None,
    points: Mapping[str, PointSpec] | None = None,
    *,
    leg: Any = None,
    segment: Any = None,
    fly: Any = None,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    orientations: bool = False,
    backend: str = "gpu",
    batch_frames: int | None = None,
    readers: int | None = None,
    read_processes: int | None = None,
    stats: StreamStats | None = None,
) -> xr.DataArray | xr.Dataset:
    """Positions of an archive's window computed into host memory at once, with the
    reading, upload, kinematics and copy-back overlapped (see the module's docstring).

    Args:
        source: The archive's URL, or its dataset from :func:`flyarchive.open_archive`.
        bodies ... backend: As :func:`flyarchive.positions`; ``backend`` ``"gpu"`` or
            ``"warp-cpu"`` (``"cpu"`` computes the lazy array).
        batch_frames: Frames per batch (default: 65,536 on CUDA, 4,096 on the CPU, cut
            to whole shards of worlds where a batch holds several).
        readers: Reader threads (default: the cores this process may use when they
            decode, :data:`PROCESS_READERS` at most when worker processes do and the
            threads only wait for them); copy and staging threads: 4 at most.
        read_processes: Worker processes decoding the state for the reader threads
            (:class:`~flyarchive.store.window_reader.ProcessWindowReader`); 0: the threads
            decode; None: as :func:`~flyarchive.store.window_reader.window_reader` chooses
            (processes on 8 cores or more for a window of a million frames or more).
        stats: Filled with what the run measured.

    Returns:
        As :func:`flyarchive.positions`, backed by a numpy array (float32 on Warp).

    Raises:
        As :func:`flyarchive.positions`.
    """
    began = clock.perf_counter()
    check_backend(backend)
    request = KeypointRequest.of(bodies, sites, points, leg=leg, segment=segment, fly=fly)
    warming = _warm_up(backend)
    try:
        prepared = prepare(source, request, worlds=worlds, time=time, model=model,
                           storage_options=storage_options)
    finally:
        if warming is not None:
            warming.result()  # Warp is never imported or initialized by two threads at once
    if backend == "cpu":
        from flyarchive.analyze.prepare import lazy_positions

        return as_positions(prepared, lazy_positions(prepared, orientations, backend).compute(),
                            orientations, backend)
    stats = stats if stats is not None else StreamStats()
    stats.prepare_seconds = clock.perf_counter() - began
    values = _Stream(prepared, orientations, backend, batch_frames, readers, stats,
                     read_processes).run()
    result = as_positions(prepared, values, orientations, backend)
    stats.call_seconds = clock.perf_counter() - began
    return result


def _warm_up(backend: str) -> Future[None] | None:
    """On a Warp backend, import Warp and mujoco-warp and initialize the device on a thread
    of their own while the archive is opened and the model found (in a fresh process: the
    kept model checked in a child process, the archive's header read), instead of after;
    None on ``"cpu"``. Its failures are left to the engine, which reports them."""
    if backend == "cpu":
        return None

    def work() -> None:
        try:
            from flyarchive.analyze.warp_positions import device_of, wp

            wp.init()
            device = wp.get_device(device_of(backend))
            if device.is_cuda:
                device.context  # noqa: B018  (creates the primary context)
        except Exception:  # noqa: BLE001 - the engine reports what is missing
            pass

    pool = ThreadPoolExecutor(1, thread_name_prefix="flyarchive-warm-warp")
    future = pool.submit(work)
    pool.shutdown(wait=False)  # its thread ends with the work
    return future


class _Stream:
    """One run of the pipeline (see the module's docstring) with the process's engine
    for the window's model, keypoints and device
    (:func:`~flyarchive.analyze.warp_positions.warp_engine`): its pinned slots and CUDA
    streams are kept with it, so that the next call with the same window builds nothing.
    """

    def __init__(self, prepared: Prepared, orientations: bool, backend: str,
                 batch: int | None, readers: int | None, stats: StreamStats,
                 read_processes: int | None = None) -> None:
        started = clock.perf_counter()
        self.prepared, self.stats, self.readers = prepared, stats, readers
        names = ["qpos"] + (["mocap_pos", "mocap_quat"] if prepared.model.model.nmocap else [])
        # The readers first: worker processes (when they read) start, import and open the
        # archive while this process imports Warp and finds or builds the engine.
        self.reader = window_reader(prepared.ds, prepared.whole, names, read_processes)
        from flyarchive.analyze.warp_positions import warp_engine, wp

        self.wp = wp
        stats.reader = "shards" if isinstance(self.reader, WindowReader) else \
            "processes" if isinstance(self.reader, ProcessWindowReader) else "dask"
        if not readers:
            cores = len(os.sched_getaffinity(0))
            self.readers = min(cores, PROCESS_READERS) if stats.reader == "processes" else cores
        self.engine = warp_engine(prepared.model.model, prepared.model.sha256,
                                  prepared.keypoints, orientations, backend, batch)
        stats.engine = "built" if self.engine.created >= started else "kept"
        self.cuda = bool(self.engine.device.is_cuda)
        self.n_time, self.n_worlds = int(prepared.ds.sizes["time"]), int(prepared.ds.sizes["world"])
        self.n_rows = self.n_worlds * self.n_time
        self.width = len(prepared.keypoints) * self.engine.channels
        self._timed: list[tuple[str, Any, Any]] = []  # (stage, start event, end event) on CUDA
        self._setup_seconds = clock.perf_counter() - started

    def _buffers(self) -> None:
        """The engine's slots (pinned, and on CUDA device ones) and streams: those kept
        with it, or made now and kept (the caller holds the engine's lock)."""
        kept = self.engine.kept
        if "stream_slots" not in kept:
            kept["stream_slots"] = [self._slot() for _ in range(3 if self.cuda else 1)]
            kept["stream_outs"] = [self._out_slot() for _ in range(OUT_SLOTS if self.cuda else 1)]
            if self.cuda:
                kept["stream_streams"] = (self.wp.Stream(self.engine.device),
                                          self.wp.Stream(self.engine.device))
        self._slots, self._outs = kept["stream_slots"], kept["stream_outs"]
        if self.cuda:
            self._upload_stream, self._copy_stream = kept["stream_streams"]
        for slot in self._slots:
            slot["events"] = {}  # the last run's have all happened
        for out in self._outs:
            out["copies"], out["downloaded"] = [], None
        self.stats.pinned_bytes = 0 if not self.cuda else sum(
            int(b.capacity) for b in [*(b for s in self._slots for b in s["in"].values()),
                                      *(o["host"] for o in self._outs)])

    def _slot(self) -> dict[str, Any]:
        """Host (and on CUDA device) buffers of one batch in flight."""
        data, engine = self.engine.data, self.engine
        names = [n for n in ("qpos", "mocap_pos", "mocap_quat") if getattr(data, n).size]
        slot: dict[str, Any] = {"in": {n: engine.host_buffer(getattr(data, n)) for n in names},
                                "events": {}}
        if self.cuda:
            with self.wp.ScopedDevice(engine.device):
                slot["device_in"] = {n: self.wp.empty_like(getattr(data, n)) for n in names}
                slot["device_out"] = self.wp.empty_like(engine.out)
        return slot

    def _out_slot(self) -> dict[str, Any]:
        """A host (pinned on CUDA) buffer batches come back into, its rows as a numpy
        view, and the copies into the result still reading it."""
        host = self.engine.host_buffer(self.engine.out)
        return {"host": host, "rows": host.numpy().reshape(-1, self.width), "copies": [],
                "downloaded": None}

    # ------------------------------------------------------------------------- reading
    def _read(self, r0: int, r1: int) -> tuple[dict[str, np.ndarray], float]:
        """The state of rows ``[r0, r1)`` (NaN past each world's ``n_frames``), read in
        this thread (:mod:`~flyarchive.store.window_reader`; decoding runs outside the
        GIL, so the threads read in parallel), and the seconds it took."""
        began = clock.perf_counter()
        state = self.reader.read(r0, r1)
        return state, clock.perf_counter() - began

    def _batch(self) -> int:
        """Frames per batch: the engine's, cut to whole worlds when it holds several,
        and to whole shards of worlds when it holds several of them."""
        batch = self.engine.batch
        if 0 < self.n_time <= batch:  # whole worlds per batch: each read is one block
            batch -= batch % self.n_time
            shard = self._shard_worlds() * self.n_time
            if shard and batch >= shard and batch != self.n_rows:
                batch -= batch % shard
        return batch

    def _shard_worlds(self) -> int:
        """Worlds per shard of the archive's ``qpos`` (0: unknown)."""
        getters = getattr(self.reader, "getters", None)
        arr = getattr(getters.get("qpos"), "arr", None) if getters else None
        shards = getattr(arr, "shards", None) or getattr(arr, "chunks", None)
        return int(shards[0]) if shards else 0

    # ------------------------------------------------------------------------- the run
    def run(self) -> np.ndarray:
        """The window's keypoints ``(world, time, K, 3 | 7)`` float32 (host), holding the
        engine's lock throughout (one run per engine at a time)."""
        with self.engine.lock:
            began = clock.perf_counter()
            self._buffers()
            self.stats.setup_seconds = self._setup_seconds + clock.perf_counter() - began
            return self._run()

    def _run(self) -> np.ndarray:
        batch = self._batch()
        bounds = [(r0, min(self.n_rows, r0 + batch)) for r0 in range(0, self.n_rows, batch)]
        result = np.empty((self.n_rows, self.width), dtype=np.float32)
        started = clock.perf_counter()
        # Copies into the result have threads of their own: queued behind the reads ahead
        # on the readers' threads, they would hold the pipeline up.
        self._copiers = min(4, self.readers)
        with ThreadPoolExecutor(self.readers, thread_name_prefix="flyarchive-read") as readers, \
                ThreadPoolExecutor(self._copiers, thread_name_prefix="flyarchive-copy") as pool, \
                ThreadPoolExecutor(self._copiers, thread_name_prefix="flyarchive-stage") as stagers:
            self._stagers = stagers
            reads: dict[int, Future[Any]] = {}
            staged: dict[int, list[Future[Any]]] = {}  # batch -> its pieces being staged
            ahead = self.readers + len(self._slots)
            for k, (r0, r1) in enumerate(bounds):
                for j in range(k, min(len(bounds), k + ahead)):
                    if j not in reads and j not in staged:
                        reads[j] = readers.submit(self._read, *bounds[j])
                if k not in staged:
                    staged[k] = self._stage(k, reads.pop(k), r1 - r0)
                began = clock.perf_counter()
                for piece in staged.pop(k):
                    piece.result()
                self.stats.stage_seconds += clock.perf_counter() - began
                out = self._outs[k % len(self._outs)]
                self._wait_copies(out)  # its previous batch is in the result
                self._queue(self._slots[k % len(self._slots)], out, r1 - r0)
                if k + 1 < len(bounds) and reads[k + 1].done():  # staged while k runs
                    staged[k + 1] = self._stage(k + 1, reads.pop(k + 1),
                                                bounds[k + 1][1] - bounds[k + 1][0])
                self._copy_later(out, (r0, r1), result, pool)
                self._sample_device()
            for out in self._outs:
                self._wait_copies(out)
        self.stats.frames, self.stats.batches = self.n_rows, len(bounds)
        self.stats.seconds = clock.perf_counter() - started
        self.stats.peak_device_bytes = self._peak_device_bytes()
        self._device_stage_seconds()
        if self.engine.channels == 7:
            view = result.reshape(self.n_rows, -1, 7)
            view[..., 3:] = self.engine.turn(view[..., 3:])
        return result.reshape(self.n_worlds, self.n_time, -1, self.engine.channels)

    def _stage(self, k: int, read: Future[Any], n: int) -> list[Future[Any]]:
        """Once batch ``k`` (``n`` rows) is read and its slot's pinned buffers no longer
        feed an upload, copy its state into them in pieces on the staging threads; returns
        the pieces (the state lives until they are done)."""
        waited = clock.perf_counter()
        state, seconds = read.result()
        self.stats.read_wait_seconds += clock.perf_counter() - waited
        self.stats.read_seconds += seconds
        slot = self._slots[k % len(self._slots)]
        up = slot["events"].get("uploaded")
        if up is not None:  # the slot's pinned buffers still feed its last upload
            self.wp.synchronize_event(up)
        return [self._stagers.submit(np.copyto, slot["in"][name].numpy()[a:b], values[a:b])
                for name, values in state.items() for a, b in self._spans(n)]

    def _queue(self, slot: dict[str, Any], out: dict[str, Any], n: int) -> None:
        """Queue the batch staged in ``slot`` (``n`` rows): upload, kinematics, gather,
        copy-back into ``out`` (on CUDA, on three streams, without waiting)."""
        wp, engine = self.wp, self.engine
        state = slot["in"]
        if not self.cuda:
            t0 = clock.perf_counter()
            for name in state:
                wp.copy(getattr(engine.data, name), slot["in"][name],
                        count=n * int(np.prod(slot["in"][name].shape[1:])))
            t1 = clock.perf_counter()
            engine.launch()
            wp.synchronize_device(engine.device)
            t2 = clock.perf_counter()
            wp.copy(out["host"], engine.out, count=n * self.width)
            self.stats.upload_seconds += t1 - t0
            self.stats.kinematics_seconds += t2 - t1
            self.stats.download_seconds += clock.perf_counter() - t2
            return
        self._queue_cuda(slot, out, n)

    def _queue_cuda(self, slot: dict[str, Any], out: dict[str, Any], n: int) -> None:
        wp, engine, events, state = self.wp, self.engine, slot["events"], slot["in"]
        compute = engine.device.stream
        if "consumed" in events:  # the device slot still feeds the last batch's kinematics
            self._upload_stream.wait_event(events["consumed"])
        up_began = self._timing_event(self._upload_stream)
        for name in state:
            count = n * int(np.prod(slot["in"][name].shape[1:]))
            wp.copy(slot["device_in"][name], slot["in"][name], count=count,
                    stream=self._upload_stream)
        events["uploaded"] = self._timing_event(self._upload_stream)
        self._timed.append(("upload", up_began, events["uploaded"]))
        compute.wait_event(events["uploaded"])
        for name in state:
            wp.copy(getattr(engine.data, name), slot["device_in"][name],
                    count=n * int(np.prod(slot["in"][name].shape[1:])), stream=compute)
        events["consumed"] = compute.record_event()
        if "downloaded" in events:  # the out slot must have reached the host
            compute.wait_event(events["downloaded"])
        kin_began = self._timing_event(compute)
        with wp.ScopedStream(compute):
            engine.launch()
            wp.copy(slot["device_out"], engine.out, count=n * self.width, stream=compute)
        computed = self._timing_event(compute)
        self._timed.append(("kinematics", kin_began, computed))
        self._copy_stream.wait_event(computed)
        down_began = self._timing_event(self._copy_stream)
        wp.copy(out["host"], slot["device_out"], count=n * self.width, stream=self._copy_stream)
        events["downloaded"] = out["downloaded"] = self._timing_event(self._copy_stream)
        self._timed.append(("download", down_began, events["downloaded"]))

    def _timing_event(self, stream: Any) -> Any:
        """A CUDA event recorded on ``stream`` now, with timing (for the stage times)."""
        return stream.record_event(self.wp.Event(self.engine.device, enable_timing=True))

    def _device_stage_seconds(self) -> None:
        """Sum the CUDA-event times of each stage into the stats (after the run)."""
        if not self._timed:
            return
        self.wp.synchronize_device(self.engine.device)
        for stage, began, ended in self._timed:
            seconds = self.wp.get_event_elapsed_time(began, ended) / 1000.0
            setattr(self.stats, f"{stage}_seconds",
                    getattr(self.stats, f"{stage}_seconds") + seconds)
        self._timed = []

    def _sample_device(self) -> None:
        """Note the memory in use on the whole device (CUDA), for the peak."""
        device = self.engine.device
        if not self.cuda:
            return
        used = int(device.total_memory) - int(device.free_memory)
        peak = self.stats.peak_device_used_bytes or 0
        self.stats.peak_device_used_bytes = max(peak, used)

    def _copy_later(self, out: dict[str, Any], rows: tuple[int, int], result: np.ndarray,
                    pool: ThreadPoolExecutor) -> None:
        """Copy the batch of rows ``rows`` from ``out`` into ``result`` on the copy
        threads, in pieces, each once the batch has come back (without waiting here)."""
        r0, r1 = rows
        out["copies"] = [pool.submit(self._copy_piece, out["downloaded"], result[r0 + a:r0 + b],
                                     out["rows"][a:b])
                         for a, b in self._spans(r1 - r0)]

    def _spans(self, n: int) -> list[tuple[int, int]]:
        """Rows ``[0, n)`` cut into a span per copy (or staging) thread."""
        step = max(1, -(-n // self._copiers))
        return [(a, min(n, a + step)) for a in range(0, n, step)]

    def _copy_piece(self, downloaded: Any, into: np.ndarray, rows: np.ndarray) -> float:
        """One piece of a copy into the result, once its batch is on the host (CUDA:
        ``downloaded`` has happened); returns the copy's seconds."""
        if downloaded is not None:
            self.wp.synchronize_event(downloaded)
        began = clock.perf_counter()
        np.copyto(into, rows)
        return clock.perf_counter() - began

    def _wait_copies(self, out: dict[str, Any]) -> None:
        """Wait until the copies out of ``out`` are done (it is about to be reused)."""
        began = clock.perf_counter()
        for copy in out["copies"]:
            self.stats.copy_out_seconds += copy.result()
        out["copies"] = []
        self.stats.copy_wait_seconds += clock.perf_counter() - began

    def _peak_device_bytes(self) -> int | None:
        wp, device = self.wp, self.engine.device
        if not self.cuda or not wp.is_mempool_enabled(device):
            return None
        return int(wp.get_mempool_used_mem_high(device))
