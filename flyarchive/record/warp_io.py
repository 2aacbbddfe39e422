"""The Warp recorder's buffers and its background writer.

- :func:`gather_frame` (a Warp kernel) copies the selected worlds' state into slot
  ``k`` of a device buffer of frames.
- :class:`Frames` is such a buffer, on the device or pinned on the host.
- :class:`BackgroundWriter` is the thread that checks host buffers (NaN, time order)
  and commits them with :meth:`~flyarchive.record.sink.ArchiveSink.write`, in hand-off order.
- :class:`Session` holds both for a started recorder (and for its finalizer).
- :func:`check_data` and :func:`parse_worlds` check what a recorder is given: the
  mujoco-warp ``Data`` (its device arrays) and the worlds to record.

This module imports ``warp``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flyarchive.clock import Timing
from flyarchive.errors import LayoutMismatchError, RecordingError, SelectionError
from flyarchive.layout import ModelLayout
from flyarchive.record.common import release_writer
from flyarchive.schema import finite_frames
from flyarchive.archive_spec import FrameBlock
from flyarchive.record.sink import ArchiveSink
from flyarchive.warp_log import import_warp

wp = import_warp("WarpTrajectoryRecorder")


@wp.kernel
def gather_frame(
    worlds: wp.array(dtype=wp.int32),  # (nsel,) world ids, device
    slot: int,  # frame slot in the buffers
    qpos: wp.array2d(dtype=wp.float32),  # (nworld, nq), device
    mocap_pos: wp.array2d(dtype=wp.vec3),  # (nworld, nmocap), device
    mocap_quat: wp.array2d(dtype=wp.quat),  # (nworld, nmocap), device, w,x,y,z
    time: wp.array(dtype=wp.float32),  # (nworld,), device, seconds
    out_qpos: wp.array3d(dtype=wp.float32),  # (nsel, chunk, nq), device
    out_mocap_pos: wp.array3d(dtype=wp.vec3),  # (nsel, chunk, nmocap), device
    out_mocap_quat: wp.array3d(dtype=wp.quat),  # (nsel, chunk, nmocap), device
    out_time: wp.array2d(dtype=wp.float32),  # (nsel, chunk), device
):
    w, i = wp.tid()
    src = worlds[w]
    if i < qpos.shape[1]:
        out_qpos[w, slot, i] = qpos[src, i]
    if i < mocap_pos.shape[1]:
        out_mocap_pos[w, slot, i] = mocap_pos[src, i]
        out_mocap_quat[w, slot, i] = mocap_quat[src, i]
    if i == 0:
        out_time[w, slot] = time[src]


@dataclass(frozen=True)
class Frames:
    """``chunk`` frames of ``nsel`` worlds as Warp arrays (device buffer or host slot)."""

    qpos: Any  # wp.array (nsel, chunk, nq) float32
    mocap_pos: Any  # wp.array (nsel, chunk, nmocap) vec3
    mocap_quat: Any  # wp.array (nsel, chunk, nmocap) quat
    time: Any  # wp.array (nsel, chunk) float32

    @classmethod
    def empty(
        cls, nsel: int, chunk: int, nq: int, nmocap: int, device: Any, pinned: bool
    ) -> "Frames":
        def alloc(shape: tuple[int, ...], dtype: Any) -> Any:
            return wp.empty(shape, dtype=dtype, device=device, pinned=pinned)

        return cls(
            alloc((nsel, chunk, nq), wp.float32), alloc((nsel, chunk, nmocap), wp.vec3),
            alloc((nsel, chunk, nmocap), wp.quat), alloc((nsel, chunk), wp.float32),
        )

    def copy_from(self, other: "Frames") -> None:
        for name in ("qpos", "mocap_pos", "mocap_quat", "time"):
            src = getattr(other, name)
            if src.size:
                wp.copy(getattr(self, name), src)

    def block(self, frames: np.ndarray, nmocap: int, timing: Timing) -> FrameBlock:
        """The first ``len(frames)`` frames as host numpy views (host slots only).

        ``frames`` are their indices on the schedule; ``sim_time`` is world 0's.
        """
        n = len(frames)
        return FrameBlock(
            timing.frame_times(frames),
            self.qpos.numpy()[:, :n],
            self.mocap_pos.numpy()[:, :n] if nmocap else None,
            self.mocap_quat.numpy()[:, :n] if nmocap else None,
            sim_time=self.time.numpy()[0, :n].astype(np.float64),
            frame=frames,
        )


def _first_non_finite(block: FrameBlock) -> np.ndarray:
    """Per world, the index of its first frame holding NaN/inf in ``block`` (n if none)."""
    n = len(block.time)
    bad = ~finite_frames(block.qpos, block.mocap_pos, block.mocap_quat, frame_dims=2)
    return np.where(bad.any(axis=1), bad.argmax(axis=1), n)


def _head(block: FrameBlock, n: int) -> FrameBlock:
    def cut(a: np.ndarray | None, axis: int) -> np.ndarray | None:
        return None if a is None else (a[:n] if axis == 0 else a[:, :n])

    return FrameBlock(block.time[:n], block.qpos[:, :n], cut(block.mocap_pos, 1),
                      cut(block.mocap_quat, 1), cut(block.sim_time, 0), cut(block.frame, 0))


class BackgroundWriter:
    """A thread that commits host slots to the archive in hand-off order.

    Args:
        writer: The archive writer (used only by the thread once started).
        slots: Host slots to cycle through.
        nmocap: Mocap bodies per world.
        timing: The frame schedule (for scheduled times).
        last_time: Simulation time of the archive's last committed frame, s (None: none).
    """

    def __init__(self, writer: ArchiveSink, slots: Sequence[Frames], nmocap: int,
                 timing: Timing, last_time: float | None) -> None:
        self.writer = writer
        self.nmocap = nmocap
        self.timing = timing
        self.last_time = -np.inf if last_time is None else last_time
        self.committed = writer.n_frames
        self.world_frames = np.full(writer.n_worlds, writer.n_frames, dtype=np.int64)
        self.diverged: dict[int, int] = {}
        self.error: BaseException | None = None
        self.notices: list[str] = []
        self._work: queue.Queue[tuple[Frames, np.ndarray, Any] | None] = queue.Queue()
        self._free: queue.Queue[Frames] = queue.Queue()
        for slot in slots:
            self._free.put(slot)
        self._thread = threading.Thread(
            target=self._run, name="flyarchive-warp-writer", daemon=True
        )
        self._thread.start()

    def take_free(self) -> Frames:
        """A host slot that no write uses; blocks while every slot is in flight."""
        return self._free.get()

    def submit(self, slot: Frames, frames: np.ndarray, event: Any) -> None:
        """Queue the first ``len(frames)`` frames of ``slot`` (schedule indices ``frames``)."""
        self._work.put((slot, frames, event))

    def drain(self) -> None:
        """Wait until every submitted slot is written (or skipped after an error)."""
        self._work.join()

    def stop(self) -> None:
        self._work.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                self._work.task_done()
                return
            slot, frames, event = item
            try:
                if self.error is None:
                    if event is not None:
                        wp.synchronize_event(event)
                    times = slot.time.numpy()[:, :len(frames)].astype(np.float64)
                    self._write(slot.block(frames, self.nmocap, self.timing), times)
            except BaseException as err:  # re-raised on the caller's thread
                self.error = err
            finally:
                self._free.put(slot)
                self._work.task_done()

    def _write(self, block: FrameBlock, times: np.ndarray) -> None:
        """Commit the frames up to the first whose times are out of order, then raise."""
        same = (times == times[:1]).all(axis=0)
        later = np.diff(np.concatenate([[self.last_time], times[0]])) > 0
        on_time = self._on_schedule(times[0], np.asarray(block.time, dtype=np.float64))
        ok = same & later & on_time
        n_ok = len(ok) if ok.all() else int(np.argmin(ok))
        if n_ok:
            self._commit(_head(block, n_ok))
            self.last_time = float(times[0, n_ok - 1])
        if n_ok < len(ok):
            if same[n_ok] and later[n_ok]:
                raise self._schedule_error(float(times[0, n_ok]), float(block.time[n_ok]),
                                           int(block.frame[n_ok]))
            raise self._order_error(times[:, n_ok], bool(same[n_ok]), int(block.frame[n_ok]))

    def _on_schedule(self, sim_time: np.ndarray, scheduled: np.ndarray) -> np.ndarray:
        """Per frame: taken at the step it was due (the first at or after its scheduled
        time, on the simulation's clock), as far as the device's float32 clock tells:
        it rounds at every step, so the bound widens with the time (by the share of a
        step that one rounding may be)."""
        dt = self.timing.timestep
        ulp = np.spacing(np.abs(sim_time).astype(np.float32)).astype(np.float64)
        bound = 2 * dt + np.abs(sim_time) * ulp / dt
        return np.abs(sim_time - scheduled) <= bound

    def _schedule_error(self, sim_time: float, scheduled: float, frame: int) -> RecordingError:
        return RecordingError(
            f"Frames for {self.writer.url!r} were refused: frame {frame}, due at t={scheduled!r} "
            f"s of the simulation, was taken at t={sim_time!r} s. The recorder counts steps: "
            "call recorder.record_as_needed(data) once after every mujoco_warp.step (and once "
            "before the first), never fewer or more. The frames before it are committed.")

    def _order_error(self, times: np.ndarray, same: bool, frame: int) -> RecordingError:
        ids = self.writer.world_ids
        if same:
            what = (f"the simulation went back in time: frame {frame} was taken at "
                    f"t={float(times[0])!r} s, after a frame at t={self.last_time!r} s. It was "
                    "reset or its state restored (call recorder.reset() when it restarts, which "
                    "ends the recording; flygym's sim.reset() does)")
        else:
            listed = ", ".join(f"world {w}: t={float(t)!r} s" for w, t in zip(ids, times))
            what = (f"the recorded worlds are at different simulation times at frame {frame} "
                    f"({listed}); a frame holds every world at one time: step and reset all "
                    "worlds together")
        return RecordingError(
            f"Frames for {self.writer.url!r} were refused: {what}. flyarchive never splices two "
            f"runs into one time axis. Record the new run into a new archive (another URL) or "
            "a new world block, or pass mode='w' to replace this archive."
        )

    def _commit(self, block: FrameBlock) -> None:
        t0 = self.writer.n_frames
        t1 = t0 + len(block.time)
        first_bad = _first_non_finite(block)
        new = [w for w in np.flatnonzero(first_bad < len(block.time))
               if self.writer.world_ids[w] not in self.diverged]
        for w in new:
            self.world_frames[w] = t0 + first_bad[w]
            self.diverged[self.writer.world_ids[w]] = int(t0 + first_bad[w])
        keep = np.isin(self.writer.world_ids, list(self.diverged))
        n_frames = np.where(keep, self.world_frames, t1)
        self.writer.write(block, n_frames=n_frames)
        self.world_frames = n_frames
        self.committed = t1
        if new:
            ids = [self.writer.world_ids[w] for w in new]
            sim_time = block.time if block.sim_time is None else block.sim_time
            at = float(sim_time[first_bad[new[0]]])
            self.notices.append(
                f"The state of world(s) {ids} holds NaN or infinity from frame(s) "
                f"{[self.diverged[i] for i in ids]} on (t≈{at:g} s); "
                "their simulation diverged. Their frames before it are committed, their "
                "n_frames stops there, and the other worlds go on being recorded."
            )


class Session:
    """The buffers and writer thread of a started recorder; its finalizer holds this.

    Args:
        writer: The archive writer (the background thread uses it).
        device_frames: The device buffer the frames are gathered into.
        background: The writer thread.
        chunk_frames: Frames per buffer.
    """

    def __init__(self, writer: ArchiveSink, device_frames: Frames, background: BackgroundWriter,
                 chunk_frames: int) -> None:
        self.writer, self.device_frames, self.background = writer, device_frames, background
        self.frames = np.empty(chunk_frames, dtype=np.int64)  # schedule index of each slot
        self.slot = 0
        self.closed = False

    def hand_off(self) -> None:
        """Copy the device buffer to a free host slot and queue it for writing."""
        slot = self.background.take_free()
        slot.copy_from(self.device_frames)
        device = self.device_frames.qpos.device
        event = device.stream.record_event() if device.is_cuda else None
        self.background.submit(slot, self.frames[:self.slot].copy(), event)
        self.slot = 0

    def close(self) -> None:
        """Commit what is recorded and stop the writer thread (errors stay in background)."""
        if self.closed:
            return
        try:
            if self.background.error is None and self.slot:
                self.hand_off()
        finally:
            self.closed = True
            self.background.stop()
            release_writer(self.writer)

    def close_and_report(self) -> None:
        """:meth:`close`, then raise what the writer thread failed with (for finalizers)."""
        self.close()
        if self.background.error is not None:
            raise self.background.error


def parse_worlds(worlds: Sequence[int] | None, nworld: int) -> tuple[int, ...]:
    """The world ids to record: ``worlds``, checked, or every world of ``nworld``.

    Raises:
        SelectionError: an id outside ``[0, nworld)``, an id named twice, or none.
    """
    if worlds is None:
        return tuple(range(nworld))
    ids = tuple(int(w) for w in worlds)
    outside = [w for w in ids if not 0 <= w < nworld]
    if not ids or outside or len(set(ids)) != len(ids):
        raise SelectionError(
            f"worlds={list(worlds)!r} must be unique world ids in [0, {nworld}) "
            f"(the simulation has nworld={nworld}); outside: {outside}. "
            "Pass at least one id, each once, or None for all worlds."
        )
    return ids


def check_data(d: Any, nworld: int, layout: ModelLayout, url: str) -> str:
    """Check a mujoco-warp ``Data`` against the recorder; return the numpy dtype name of qpos.

    Raises:
        RecordingError: for another number of worlds, or arrays that are missing or of
            another dtype (not a mujoco_warp.Data).
        LayoutMismatchError: for another model's state (nq, nmocap).
    """
    qpos = getattr(d, "qpos", None)
    if qpos is not None and qpos.ndim == 2 and qpos.shape[0] != nworld:
        raise RecordingError(
            f"The recorder for {url!r} has {nworld} worlds (nworld); the Data passed has "
            f"{qpos.shape[0]}. Pass the mujoco_warp.Data the recorder was created for; nothing "
            "of this call was recorded."
        )
    want = {
        "qpos": ((nworld, layout.nq), wp.float32),
        "mocap_pos": ((nworld, layout.nmocap), wp.vec3),
        "mocap_quat": ((nworld, layout.nmocap), wp.quat),
        "time": ((nworld,), wp.float32),
    }
    for name, (shape, dtype) in want.items():
        arr = getattr(d, name, None)
        if arr is None or tuple(arr.shape) != shape or arr.dtype != dtype:
            got = None if arr is None else (tuple(arr.shape), wp.types.type_repr(arr.dtype))
            kind = LayoutMismatchError if arr is not None and arr.dtype == dtype else RecordingError
            raise kind(
                f"mjw_data.{name} is {got}; the recorder for {url!r} expects shape {shape} of "
                f"{wp.types.type_repr(dtype)} (nworld={nworld}, nq={layout.nq}, "
                f"nmocap={layout.nmocap}). Pass the mujoco_warp.Data of the model the "
                "recorder was created with, and the same nworld."
            )
    return str(np.dtype(wp.dtype_to_numpy(d.qpos.dtype)))
