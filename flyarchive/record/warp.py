"""Record mujoco-warp simulations (``nworld`` worlds on one Warp device) into an archive.

The simulation never waits for the recorder and the device is never read back per
step:

- Steps are counted on the host (:meth:`WarpTrajectoryRecorder.record_as_needed`
  is called once per step), and the frame schedule (:class:`flyarchive.clock.FrameClock`)
  runs on that count, not on ``d.time``.
- When a frame is due, one small kernel gathers ``qpos``, ``mocap_pos``,
  ``mocap_quat`` and ``time`` of the selected worlds into slot ``k`` of a device
  buffer of ``chunk_frames`` frames. Nothing is synchronized.
- When the buffer is full it is copied to one of two host buffers (pinned on CUDA,
  asynchronous on the device's stream) and handed to a background thread that
  waits for the copy, checks the frames and commits them with
  :meth:`flyarchive.store.ArchiveWriter.write`. With both host buffers in flight
  the next hand-off blocks until one is free: slow storage slows the simulation,
  it never drops frames. Memory: one device buffer and two host buffers of
  ``chunk_frames`` frames of the selected worlds.

This module imports ``warp`` at import time; ``import flyarchive`` does not import it.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import FlyarchiveError, SelectionError, StorageError, missing_dependency
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock, refuse_existing

try:
    import warp as wp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_dependency("warp", "gpu", "WarpTrajectoryRecorder") from exc
from flyarchive.warp_log import configure_warp  # noqa: E402  (interop: Warp quiet unless verbose)

configure_warp(wp)

__all__ = ["WarpTrajectoryRecorder", "FIRST_FRAME_ATTR"]

#: Archive attribute: index on the frame schedule (frame ``k`` at ``k x interval``
#: simulated seconds) of the archive's frame 0. Non-zero when recording started
#: at ``start_step > 0``; resuming with ``mode="a"`` continues the schedule from it.
FIRST_FRAME_ATTR = "first_frame"


@wp.kernel
def _gather_frame(
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
class _Frames:
    """``chunk`` frames of ``nsel`` worlds as Warp arrays (device buffer or host slot)."""

    qpos: Any  # wp.array (nsel, chunk, nq) float32
    mocap_pos: Any  # wp.array (nsel, chunk, nmocap) vec3
    mocap_quat: Any  # wp.array (nsel, chunk, nmocap) quat
    time: Any  # wp.array (nsel, chunk) float32

    @classmethod
    def empty(
        cls, nsel: int, chunk: int, nq: int, nmocap: int, device: Any, pinned: bool
    ) -> "_Frames":
        def alloc(shape: tuple[int, ...], dtype: Any) -> Any:
            return wp.empty(shape, dtype=dtype, device=device, pinned=pinned)

        return cls(
            alloc((nsel, chunk, nq), wp.float32), alloc((nsel, chunk, nmocap), wp.vec3),
            alloc((nsel, chunk, nmocap), wp.quat), alloc((nsel, chunk), wp.float32),
        )

    def copy_from(self, other: "_Frames") -> None:
        for name in ("qpos", "mocap_pos", "mocap_quat", "time"):
            src = getattr(other, name)
            if src.size:
                wp.copy(getattr(self, name), src)

    def block(self, n: int, nmocap: int) -> FrameBlock:
        """The first ``n`` frames as host numpy views (host slots only); time of world 0."""
        return FrameBlock(
            self.time.numpy()[0, :n].astype(np.float64),
            self.qpos.numpy()[:, :n],
            self.mocap_pos.numpy()[:, :n] if nmocap else None,
            self.mocap_quat.numpy()[:, :n] if nmocap else None,
        )


def _first_non_finite(block: FrameBlock) -> np.ndarray:
    """Per world, the index of its first frame holding NaN/inf in ``block`` (n if none)."""
    n = len(block.time)
    bad = ~np.isfinite(block.qpos).all(axis=2)
    if block.mocap_pos is not None and block.mocap_quat is not None:
        bad |= ~np.isfinite(block.mocap_pos).all(axis=(2, 3))
        bad |= ~np.isfinite(block.mocap_quat).all(axis=(2, 3))
    return np.where(bad.any(axis=1), bad.argmax(axis=1), n)


class _BackgroundWriter:
    """A thread that commits host slots to the archive in hand-off order."""

    def __init__(self, writer: ArchiveWriter, slots: Sequence[_Frames], nmocap: int) -> None:
        self.writer = writer
        self.nmocap = nmocap
        self.committed = writer.n_frames
        self.world_frames = np.full(writer.n_worlds, writer.n_frames, dtype=np.int64)
        self.diverged: dict[int, int] = {}
        self.error: BaseException | None = None
        self.notices: list[str] = []
        self._work: queue.Queue[tuple[_Frames, int, Any] | None] = queue.Queue()
        self._free: queue.Queue[_Frames] = queue.Queue()
        for slot in slots:
            self._free.put(slot)
        self._thread = threading.Thread(
            target=self._run, name="flyarchive-warp-writer", daemon=True
        )
        self._thread.start()

    def take_free(self) -> _Frames:
        """A host slot that no write uses; blocks while every slot is in flight."""
        return self._free.get()

    def submit(self, slot: _Frames, n: int, event: Any) -> None:
        self._work.put((slot, n, event))

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
            slot, n, event = item
            try:
                if self.error is None:
                    if event is not None:
                        wp.synchronize_event(event)
                    self._write(slot.block(n, self.nmocap))
            except BaseException as err:  # re-raised on the caller's thread
                self.error = err
            finally:
                self._free.put(slot)
                self._work.task_done()

    def _write(self, block: FrameBlock) -> None:
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
            self.notices.append(
                f"The state of world(s) {ids} holds NaN or infinity from frame(s) "
                f"{[self.diverged[i] for i in ids]} on (t≈{block.time[first_bad[new[0]]]!r} s); "
                "their simulation diverged. Their frames before it are committed, their "
                "n_frames stops there, and the other worlds go on being recorded."
            )


class WarpTrajectoryRecorder:
    """Records the kinematic state of selected worlds of a mujoco-warp simulation.

    Call :meth:`record_as_needed` exactly once per simulation step (after every
    ``mujoco_warp.step``; the first call sees the state at step ``start_step``). Steps are
    counted on the host, so no call reads anything back from the device; a frame
    is gathered on the device when the schedule says it is due (frame ``k`` at the
    first step at or after ``k x playback_speed / output_fps`` simulated seconds).
    Frames go to the archive every ``chunk_frames`` frames from a background
    thread, and on :meth:`flush` and :meth:`close` (also when used as a context
    manager). The archive is the same as the CPU recorder's, with ``source =
    "mujoco-warp"`` and the device dtype (float32); the ``time`` coordinate is
    ``d.time`` of the first recorded world at each frame, as float64.

    The gather kernel runs on the device's current stream, after the steps queued
    on it: step and record on the same stream. Kernels are launched outside any
    CUDA graph the caller uses for stepping.

    Non-finite state: the frames are checked on the host before they are written.
    A world whose ``qpos`` or mocap pose holds NaN or infinity keeps the frames
    before the first such frame: its ``n_frames`` stops there (readers mask the
    rest), a ``RuntimeWarning`` names it on the next call, and
    :attr:`diverged_worlds` lists it. The other worlds go on being recorded.

    Args:
        url: Where to write: a local path or any fsspec URL.
        model: The compiled host model being simulated: only its layout and
            ``opt.timestep`` are used.
        nworld: Worlds in the mujoco-warp ``Data``.
        worlds: World ids to record, in ``[0, nworld)``, unique (default: all); they
            are the archive's ``world`` coordinate.
        output_fps: Video frame rate, frames per second.
        playback_speed: Video seconds per simulated second.
        chunk_frames: Frames per device buffer, chunk and write; a crash loses at most
            about three times this many.
        mode: ``"w-"`` (default) refuses an existing archive, ``"w"`` replaces it,
            ``"a"`` appends after its last committed frame.
        storage_options: Passed to fsspec.
        codec: ``"lossless"`` (default) or ``"abs:<bound>"``.
        attrs: User metadata stored in the archive's attributes.
        world_vars: Per-world user variables, ``{name: (len(worlds),) array}``.
        start_step: Steps the simulation has taken at the first call. With
            ``mode="a"`` a deterministic rerun from step 0 skips the committed frames,
            and a simulation restored from a checkpoint passes its step count.

    Raises:
        ArchiveExistsError: if ``mode="w-"`` and something is at ``url`` (checked at once).
        SelectionError: for world ids outside ``[0, nworld)``, repeated, or none.
        MissingDependencyError: when ``warp`` is not installed (on import of this module).
    """

    def __init__(
        self,
        url: str,
        model: mujoco.MjModel,
        nworld: int,
        *,
        worlds: Sequence[int] | None = None,
        output_fps: float = 25,
        playback_speed: float = 0.2,
        chunk_frames: int = 100,
        mode: str = "w-",
        storage_options: Mapping[str, Any] | None = None,
        codec: str = "lossless",
        attrs: Mapping[str, Any] | None = None,
        world_vars: Mapping[str, np.ndarray] | None = None,
        start_step: int = 0,
    ) -> None:
        self.url = str(url)
        self.layout = ModelLayout.from_model(model)
        self.timing = Timing(float(model.opt.timestep), output_fps, playback_speed)
        self.nworld = int(nworld)
        if self.nworld < 1:
            raise ValueError(f"nworld must be at least 1, got {nworld!r}.")
        self.world_ids = _parse_worlds(worlds, self.nworld)
        if int(chunk_frames) < 1 or int(start_step) < 0:
            raise ValueError(
                f"chunk_frames must be at least 1 and start_step at least 0, "
                f"got chunk_frames={chunk_frames!r}, start_step={start_step!r}."
            )
        if attrs and FIRST_FRAME_ATTR in attrs:
            raise ValueError(
                f"The attribute name {FIRST_FRAME_ATTR!r} is the recorder's; rename it."
            )
        self.chunk_frames = int(chunk_frames)
        self._options = dict(mode=mode, storage_options=storage_options)
        self._spec_args = dict(
            codec=codec, attrs=dict(attrs or {}), world_vars=dict(world_vars or {})
        )
        self._step = int(start_step)
        self._writer: ArchiveWriter | None = None
        self._background: _BackgroundWriter | None = None
        self._clock: FrameClock | None = None
        self._device_frames: _Frames | None = None
        self._worlds_device: Any = None
        self._slot = 0
        self._first_index = 0
        self._recorded = 0
        self._closed = False
        if mode == "w-":
            refuse_existing(self.url, storage_options)

    # -- properties ---------------------------------------------------------------

    @property
    def n_frames(self) -> int:
        """Frames recorded so far: committed, in flight and in the device buffer."""
        return self._first_index + self._recorded

    @property
    def committed_frames(self) -> int:
        """Frames committed to the archive (safe from a crash)."""
        return 0 if self._background is None else self._background.committed

    @property
    def diverged_worlds(self) -> dict[int, int]:
        """``{world id: frames kept}`` of worlds whose state became NaN or infinite."""
        return {} if self._background is None else dict(self._background.diverged)

    # -- recording ----------------------------------------------------------------

    def record_as_needed(self, mjw_data: Any) -> bool:
        """Count one simulation step and gather a frame on the device if one is due.

        Call once after every ``mujoco_warp.step`` (and, with ``start_step=0``, once
        before the first step to record the initial state). Blocks only when a full
        buffer is handed off while both host buffers are still being written.

        Args:
            mjw_data: The ``mujoco_warp.Data`` being stepped, ``nworld`` worlds.

        Returns:
            True if a frame was recorded at this step.

        Raises:
            StorageError: if writing an earlier chunk failed (frames committed before
                stay committed; the recorder takes no more frames).
            RuntimeError: after :meth:`close`.
        """
        self._check_usable()
        if self._writer is None:
            self._start(mjw_data)
        step = self._step
        self._step += 1
        if not self._clock.is_due(step):  # type: ignore[union-attr]
            return False
        frames = self._device_frames
        assert frames is not None
        wp.launch(
            _gather_frame,
            dim=(len(self.world_ids), max(self.layout.nq, self.layout.nmocap)),
            inputs=[self._worlds_device, self._slot, mjw_data.qpos, mjw_data.mocap_pos,
                    mjw_data.mocap_quat, mjw_data.time, frames.qpos, frames.mocap_pos,
                    frames.mocap_quat, frames.time],
            device=frames.qpos.device,
        )
        self._slot += 1
        self._recorded += 1
        if self._slot == self.chunk_frames:
            self._hand_off()
        return True

    def flush(self) -> None:
        """Commit every recorded frame to the archive; waits for the device and the writes.

        Raises:
            StorageError: if a write failed.
        """
        self._check_usable()
        if self._background is None:
            return
        if self._slot:
            self._hand_off()
        self._background.drain()
        self._check_usable()

    def close(self) -> None:
        """Commit what is recorded and stop the writer thread; takes no more frames.

        Raises:
            StorageError: if a write failed (what was committed before stays committed).
        """
        self._close(raise_errors=True)

    def _close(self, *, raise_errors: bool) -> None:
        if self._closed:
            return
        background = self._background
        try:
            if background is not None and background.error is None and self._slot:
                self._hand_off()
        finally:
            self._closed = True
            if background is not None:
                background.stop()
        if background is not None:
            self._emit_notices()
            if raise_errors and background.error is not None:
                self._raise_writer_error(background.error)

    def __enter__(self) -> "WarpTrajectoryRecorder":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._close(raise_errors=exc_type is None)

    # -- internals ----------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"The recorder for {self.url!r} is closed; create a new one.")
        background = self._background
        if background is None:
            return
        if background.notices:
            self._emit_notices()
        if background.error is not None:
            self._raise_writer_error(background.error)

    def _emit_notices(self) -> None:
        background = self._background
        while background is not None and background.notices:
            warnings.warn(background.notices.pop(0), RuntimeWarning, stacklevel=4)

    def _raise_writer_error(self, err: BaseException) -> None:
        committed = self.committed_frames
        resume_step = self.timing.frame_step(self._first_schedule + committed)
        message = (
            f"Writing frames to {self.url!r} failed in the background writer ({err}). "
            f"The archive keeps its {committed} committed frames; the recorder takes no more "
            "frames. Fix the storage, then record again with mode='a' from a simulation state "
            f"at step {resume_step} or earlier (start_step=its step)."
        )
        kind = type(err) if isinstance(err, FlyarchiveError) else StorageError
        if not isinstance(err, (OSError, FlyarchiveError)):
            raise RuntimeError(message) from err
        raise kind(message) from err

    @property
    def _first_schedule(self) -> int:
        assert self._writer is not None
        return int(self._writer.attrs.get(FIRST_FRAME_ATTR, 0))

    def _start(self, d: Any) -> None:
        dtype = _check_data(d, self.nworld, self.layout)
        first = self.timing.frames_before_step(self._step)
        spec = ArchiveSpec(
            self.layout, self.timing, self.world_ids, dtype=dtype, source="mujoco-warp",
            chunk_frames=self.chunk_frames,
            **{**self._spec_args, "attrs": {**self._spec_args["attrs"], FIRST_FRAME_ATTR: first}},
        )
        writer = ArchiveWriter.create(self.url, spec, **self._options)  # type: ignore[arg-type]
        if writer.world_ids != self.world_ids:
            raise SelectionError(
                f"The archive at {self.url!r} holds worlds {list(writer.world_ids)}; the recorder "
                f"was asked for {list(self.world_ids)}. Pass worlds={list(writer.world_ids)}."
            )
        self._writer = writer
        next_frame = self._first_schedule + writer.n_frames
        due = self.timing.frame_step(next_frame)
        if due < self._step:
            raise ValueError(
                f"The archive at {self.url!r} has {writer.n_frames} committed frames; its next "
                f"frame is due at step {due}, but the simulation is at step {self._step} "
                f"(start_step). Frames in between would be missing. Restart from a state at "
                f"or before step {due}, or record into a new archive."
            )
        self._first_index = writer.n_frames
        self._clock = FrameClock(self.timing, next_frame=next_frame)
        self._allocate(d.qpos.device, writer)

    def _allocate(self, device: Any, writer: ArchiveWriter) -> None:
        shape = (len(self.world_ids), self.chunk_frames, self.layout.nq, self.layout.nmocap)
        self._worlds_device = wp.array(np.asarray(self.world_ids, dtype=np.int32), dtype=wp.int32,
                                       device=device)
        self._device_frames = _Frames.empty(*shape, device=device, pinned=False)
        pinned = bool(device.is_cuda)
        slots = [_Frames.empty(*shape, device="cpu", pinned=pinned) for _ in range(2)]
        self._background = _BackgroundWriter(writer, slots, self.layout.nmocap)

    def _hand_off(self) -> None:
        """Copy the device buffer to a free host slot and queue it for writing."""
        background, frames = self._background, self._device_frames
        assert background is not None and frames is not None
        slot = background.take_free()
        slot.copy_from(frames)
        device = frames.qpos.device
        event = device.stream.record_event() if device.is_cuda else None
        background.submit(slot, self._slot, event)
        self._slot = 0


def _parse_worlds(worlds: Sequence[int] | None, nworld: int) -> tuple[int, ...]:
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


def _check_data(d: Any, nworld: int, layout: ModelLayout) -> str:
    """Check a mujoco-warp ``Data`` against the recorder; return the numpy dtype name of qpos."""
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
            raise ValueError(
                f"mjw_data.{name} is {got}; the recorder expects shape {shape} of "
                f"{wp.types.type_repr(dtype)} (nworld={nworld}, nq={layout.nq}, "
                f"nmocap={layout.nmocap}). Pass the mujoco_warp.Data of the model the "
                "recorder was created with, and the same nworld."
            )
    return str(np.dtype(wp.dtype_to_numpy(d.qpos.dtype)))
