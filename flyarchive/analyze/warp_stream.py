"""Positions of a whole window into host memory as fast as a GPU allows: reading, upload,
kinematics and copy-back overlapped (:func:`load_positions`).

The window's frames, flattened world by world, are cut into batches of the engine's size
(:class:`~flyarchive.analyze.warp_positions.WarpKinematics`). Reader threads read batches
ahead through the archive's own readers (the lazy dataset's getters, one block each,
frames past ``n_frames`` NaN; decoding runs outside the GIL, so the threads read in
parallel). On CUDA each batch then goes

    host -> pinned staging slot -> (upload stream) device slot
         -> (compute stream) Data.qpos, kinematics, keypoint gather -> device out slot
         -> (copy stream) pinned out slot -> (copy threads) the result array

with two slots of each, so that batch k + 1 uploads while batch k computes and batch
k - 1 comes back; CUDA events order the streams, and the host waits only for a slot it is
about to reuse. On Warp's CPU device the same steps run one after another (the readers
still read ahead). The result is one host array ``(world, time, K, 3 | 7)`` float32.
"""

from __future__ import annotations

import time as clock
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze.keypoints import KeypointRequest, PointSpec
from flyarchive.analyze.prepare import Prepared, as_positions, check_backend, prepare

if TYPE_CHECKING:
    import mujoco
    import xarray as xr


@dataclass
class StreamStats:
    """What a :func:`load_positions` run measured.

    Attributes:
        frames: Frames computed (worlds x frames of the window).
        batches: Batches of the engine's size.
        seconds: Wall time from the first read to the last copy, s (setup excluded).
        setup_seconds: Building the engine (model upload, buffers, kernels), s.
        read_seconds: Time reader threads spent reading, summed over threads, s.
        peak_device_bytes: Largest device memory held by Warp's memory pool during the
            run (CUDA with a memory pool; None elsewhere).
        pinned_bytes: Pinned host memory of the staging and copy-back slots.
    """

    frames: int = 0
    batches: int = 0
    seconds: float = 0.0
    setup_seconds: float = 0.0
    read_seconds: float = 0.0
    peak_device_bytes: int | None = None
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
    stats: StreamStats | None = None,
) -> xr.DataArray | xr.Dataset:
    """Positions of an archive's window computed into host memory at once, with the
    reading, upload, kinematics and copy-back overlapped (see the module's docstring).

    Args:
        source: The archive's URL, or its dataset from :func:`flyarchive.open_archive`.
        bodies ... backend: As :func:`flyarchive.positions`; ``backend`` ``"gpu"`` or
            ``"warp-cpu"`` (``"cpu"`` computes the lazy array).
        batch_frames: Frames per batch (default: 65,536 on CUDA, 4,096 on the CPU).
        readers: Reader (and copy) threads (default: the cores this process may use).
        stats: Filled with what the run measured.

    Returns:
        As :func:`flyarchive.positions`, backed by a numpy array (float32 on Warp).

    Raises:
        As :func:`flyarchive.positions`.
    """
    import os

    check_backend(backend)
    request = KeypointRequest.of(bodies, sites, points, leg=leg, segment=segment, fly=fly)
    prepared = prepare(source, request, worlds=worlds, time=time, model=model,
                       storage_options=storage_options)
    if backend == "cpu":
        from flyarchive.analyze.prepare import lazy_positions

        return as_positions(prepared, lazy_positions(prepared, orientations, backend).compute(),
                            orientations, backend)
    stats = stats if stats is not None else StreamStats()
    readers = readers or len(os.sched_getaffinity(0))
    values = _Stream(prepared, orientations, backend, batch_frames, readers, stats).run()
    return as_positions(prepared, values, orientations, backend)


def _concatenate(pieces: list[Any]) -> Any:
    import dask.array as da

    return da.concatenate(pieces) if isinstance(pieces[0], da.Array) else np.concatenate(pieces)


class _Stream:
    """One run of the pipeline (see the module's docstring)."""

    def __init__(self, prepared: Prepared, orientations: bool, backend: str,
                 batch: int | None, readers: int, stats: StreamStats) -> None:
        from flyarchive.analyze.warp_positions import WarpKinematics, device_of, wp

        started = clock.perf_counter()
        self.wp, self.prepared, self.stats, self.readers = wp, prepared, stats, readers
        self.engine = WarpKinematics(prepared.model.model, prepared.keypoints, orientations,
                                     device=device_of(backend), batch=batch)
        self.cuda = bool(self.engine.device.is_cuda)
        self.n_time, self.n_worlds = int(prepared.ds.sizes["time"]), int(prepared.ds.sizes["world"])
        self.n_rows = self.n_worlds * self.n_time
        self.width = len(prepared.keypoints) * self.engine.channels
        self._slots = [self._slot() for _ in range(2 if self.cuda else 1)]
        stats.setup_seconds = clock.perf_counter() - started
        stats.pinned_bytes = 0 if not self.cuda else sum(
            int(b.capacity) for s in self._slots for b in (*s["in"].values(), s["out"]))

    def _slot(self) -> dict[str, Any]:
        """Host (and on CUDA device) buffers of one batch in flight."""
        data, engine = self.engine.data, self.engine
        names = [n for n in ("qpos", "mocap_pos", "mocap_quat") if getattr(data, n).size]
        slot: dict[str, Any] = {"in": {n: engine.host_buffer(getattr(data, n)) for n in names},
                                "out": engine.host_buffer(engine.out), "events": {}}
        if self.cuda:
            with self.wp.ScopedDevice(engine.device):
                slot["device_in"] = {n: self.wp.empty_like(getattr(data, n)) for n in names}
                slot["device_out"] = self.wp.empty_like(engine.out)
        return slot

    # ------------------------------------------------------------------------- reading
    def _read(self, r0: int, r1: int) -> tuple[dict[str, np.ndarray], float]:
        """The state of rows ``[r0, r1)`` (NaN past each world's ``n_frames``), read in
        this thread through the archive's readers (decoding runs outside the GIL)."""
        began = clock.perf_counter()
        ds = self.prepared.ds
        names = ["qpos"] + (["mocap_pos", "mocap_quat"] if self.engine.nmocap else [])
        state = {}
        for name in names:
            data = ds[name].data
            pieces = []
            row = r0
            while row < r1:  # whole worlds at once where the batch holds them
                w, t = divmod(row, self.n_time)
                if t == 0 and r1 - row >= self.n_time:
                    take = (r1 - row) // self.n_time
                    part = data[w:w + take]
                    row += take * self.n_time
                else:
                    stop = min(self.n_time, t + r1 - row)
                    part = data[w:w + 1, t:stop]
                    row += stop - t
                pieces.append(part.reshape((-1, *data.shape[2:])))
            block = pieces[0] if len(pieces) == 1 else _concatenate(pieces)
            state[name] = np.asarray(block.compute(scheduler="synchronous")
                                     if hasattr(block, "compute") else block)
        return state, clock.perf_counter() - began

    # ------------------------------------------------------------------------- the run
    def run(self) -> np.ndarray:
        batch = self.engine.batch
        if 0 < self.n_time <= batch:  # whole worlds per batch: each read is one block
            batch -= batch % self.n_time
        bounds = [(r0, min(self.n_rows, r0 + batch)) for r0 in range(0, self.n_rows, batch)]
        result = np.empty((self.n_rows, self.width), dtype=np.float32)
        started = clock.perf_counter()
        with ThreadPoolExecutor(self.readers, thread_name_prefix="flyarchive-positions") as pool:
            reads: dict[int, Future[Any]] = {}
            ahead = self.readers + len(self._slots)
            for k, (r0, r1) in enumerate(bounds):
                for j in range(k, min(len(bounds), k + ahead)):
                    if j not in reads:
                        reads[j] = pool.submit(self._read, *bounds[j])
                state, seconds = reads.pop(k).result()
                self.stats.read_seconds += seconds
                slot = self._slots[k % len(self._slots)]
                self._finish(slot, result, pool)  # its previous batch, if any
                self._queue(slot, state, r1 - r0)
                slot["rows"] = (r0, r1)
            for slot in self._slots:
                self._finish(slot, result, pool)
        self.stats.frames, self.stats.batches = self.n_rows, len(bounds)
        self.stats.seconds = clock.perf_counter() - started
        self.stats.peak_device_bytes = self._peak_device_bytes()
        if self.engine.channels == 7:
            view = result.reshape(self.n_rows, -1, 7)
            view[..., 3:] = self.engine.turn(view[..., 3:])
        return result.reshape(self.n_worlds, self.n_time, -1, self.engine.channels)

    def _queue(self, slot: dict[str, Any], state: dict[str, np.ndarray], n: int) -> None:
        """Queue batch ``state`` (``n`` rows) through ``slot``: upload, kinematics,
        gather, copy-back (on CUDA, on three streams, without waiting)."""
        wp, engine = self.wp, self.engine
        up = slot["events"].get("uploaded")
        if up is not None:  # the slot's pinned buffers still feed its last upload
            wp.synchronize_event(up)
        for name, values in state.items():
            slot["in"][name].numpy()[:n] = values
        if not self.cuda:
            for name in state:
                wp.copy(getattr(engine.data, name), slot["in"][name],
                        count=n * int(np.prod(slot["in"][name].shape[1:])))
            engine.launch()
            wp.copy(slot["out"], engine.out, count=n * self.width)
            return
        self._queue_cuda(slot, state, n)

    def _queue_cuda(self, slot: dict[str, Any], state: dict[str, np.ndarray], n: int) -> None:
        wp, engine, events = self.wp, self.engine, slot["events"]
        device = engine.device
        if not hasattr(self, "_upload_stream"):
            self._upload_stream, self._copy_stream = wp.Stream(device), wp.Stream(device)
        compute = device.stream
        if "consumed" in events:  # the device slot still feeds the last batch's kinematics
            self._upload_stream.wait_event(events["consumed"])
        for name in state:
            count = n * int(np.prod(slot["in"][name].shape[1:]))
            wp.copy(slot["device_in"][name], slot["in"][name], count=count,
                    stream=self._upload_stream)
        events["uploaded"] = self._upload_stream.record_event()
        compute.wait_event(events["uploaded"])
        for name in state:
            wp.copy(getattr(engine.data, name), slot["device_in"][name],
                    count=n * int(np.prod(slot["in"][name].shape[1:])), stream=compute)
        events["consumed"] = compute.record_event()
        if "downloaded" in events:  # the out slot must have reached the host
            compute.wait_event(events["downloaded"])
        with wp.ScopedStream(compute):
            engine.launch()
            wp.copy(slot["device_out"], engine.out, count=n * self.width, stream=compute)
        computed = compute.record_event()
        self._copy_stream.wait_event(computed)
        wp.copy(slot["out"], slot["device_out"], count=n * self.width, stream=self._copy_stream)
        events["downloaded"] = self._copy_stream.record_event()

    def _finish(self, slot: dict[str, Any], result: np.ndarray, pool: ThreadPoolExecutor) -> None:
        """Copy the slot's last batch (if any) from its host buffer into ``result``, in
        pieces on the pool's threads; waits for them (the slot is about to be reused)."""
        rows = slot.pop("rows", None)
        if rows is None:
            return
        if self.cuda:
            self.wp.synchronize_event(slot["events"]["downloaded"])
        host = slot["out"].numpy().reshape(-1, self.width)
        r0, r1 = rows
        step = max(1, -(-(r1 - r0) // self.readers))
        parts = [pool.submit(np.copyto, result[a:min(r1, a + step)], host[a - r0:min(r1, a + step) - r0])
                 for a in range(r0, r1, step)]
        for part in parts:
            part.result()

    def _peak_device_bytes(self) -> int | None:
        wp, device = self.wp, self.engine.device
        if not self.cuda or not wp.is_mempool_enabled(device):
            return None
        return int(wp.get_mempool_used_mem_high(device))
