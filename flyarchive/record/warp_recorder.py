"""Record mujoco-warp simulations (``nworld`` worlds on one Warp device) into an archive.

The simulation never waits for the recorder and the device is read back only once,
at the first call (``d.time``, unless ``start_step`` is given):

- Steps are counted on the host (:meth:`WarpTrajectoryRecorder.record_as_needed`
  is called once per step), and the frame schedule (:class:`flyarchive.clock.FrameClock`)
  runs on that count, not on ``d.time``.
- When a frame is due, one small kernel gathers ``qpos``, ``mocap_pos``,
  ``mocap_quat`` and ``time`` of the selected worlds into slot ``k`` of a device
  buffer of ``chunk_frames`` frames. Nothing is synchronized.
- When the buffer is full it is copied to one of two host buffers (pinned on CUDA,
  asynchronous on the device's stream) and handed to a background thread
  (:mod:`flyarchive.record.warp_io`) that waits for the copy, checks the frames (NaN,
  time order) and commits them. With both host buffers in flight the next hand-off
  blocks until one is free: slow storage slows the simulation, it never drops
  frames. Memory: one device buffer and two host buffers of ``chunk_frames`` frames
  of the selected worlds.

This module imports ``warp`` at import time; ``import flyarchive`` does not import it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import mujoco
import numpy as np

from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import (
    FlyarchiveError,
    OptionsError,
    RecordingError,
    SelectionError,
    StorageError,
)
from flyarchive.layout import ModelLayout
from flyarchive.models import model_bytes, portable_model
from flyarchive.record.common import (
    FIRST_FRAME_ATTR,
    CommittedTail,
    commit_when_abandoned,
    ended_by_reset,
    forget,
    read_back,
    release_writer,
)
from flyarchive.archive_spec import ArchiveSpec, absolute_url, as_url, parse_mode
from flyarchive.record.sink import Archives
from flyarchive.warp_log import import_warp

wp = import_warp("WarpTrajectoryRecorder")

from flyarchive.record.warp_io import (  # noqa: E402  (after the check that warp is there)
    BackgroundWriter,
    Frames,
    Session,
    check_data,
    gather_frame,
    parse_worlds,
)


class WarpTrajectoryRecorder:
    """Records the kinematic state of selected worlds of a mujoco-warp simulation.

    Call :meth:`record_as_needed` exactly once per simulation step (after every
    ``mujoco_warp.step``, and, to record the initial state, once before the first).
    Steps are counted on the host, so no call but the first reads anything back from
    the device; a frame is gathered on the device when the schedule says it is due
    (frame ``k`` at the first step at or after ``k x playback_speed / output_fps``
    simulated seconds). Frames go to the archive every ``chunk_frames`` frames from a
    background thread, on :meth:`flush` and :meth:`close` (also when used as a context
    manager), and, with a ``ResourceWarning``, when an unclosed recorder is
    garbage-collected or Python exits. The archive is the same as the CPU recorder's,
    with ``source = "mujoco-warp"`` and the device dtype (float32); ``sim_time`` is
    ``d.time`` of the first recorded world at each frame, as float64.

    A drop-in for flygym 2.1's GPU recorder: ``sim.recorder =
    WarpTrajectoryRecorder(url, sim.mj_model, sim.n_worlds, worlds=...)`` in a
    ``GPUSimulation``, whose ``reset()`` calls :meth:`reset`; :attr:`trajectories` and
    :attr:`world_ids` are flygym's.

    The gather kernel runs on the device's current stream, after the steps queued
    on it: step and record on the same stream. Kernels are launched outside any
    CUDA graph the caller uses for stepping.

    Non-finite state: the frames are checked on the host before they are written.
    A world whose ``qpos`` or mocap pose holds NaN or infinity keeps the frames
    before the first such frame: its ``n_frames`` stops there (readers mask the
    rest), a ``RuntimeWarning`` names it on the next call, and
    :attr:`diverged_worlds` lists it. The other worlds go on being recorded.

    Time order: frames whose ``d.time`` is not after the previous frame's (the
    simulation was reset without :meth:`reset`), or differs between the recorded
    worlds, are refused: the frames before them are committed, and the next call
    raises :class:`RecordingError`. With ``mode="a"``, a simulation that starts before
    the archive's last committed frame is taken for a rerun of the recorded one: its
    frames up to that one are skipped, and its state there (read back once) must
    equal the committed one, else the rerun is refused.

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
        codec: ``"lossless"`` (default), ``"portable"`` or ``"abs:<bound>"``. Appending
            (``mode="a"``) needs the archive's own codec, and a float32 archive (the
            device's dtype): another is refused at the first call.
        attrs: User metadata stored in the archive's attributes.
        world_vars: Per-world user variables, ``{name: (len(worlds),) array}``.
        start_step: Steps the simulation has taken at the first call. None (default):
            read from ``d.time`` at the first call (one read from the device).
        takeover: Take over the archive's claim from a writer that crashed on another
            host (one that died on this host is taken over without it).
        store_model: Keep ``model`` (its exact MJB bytes, as it is when the recorder is
            made) beside the archive as ``models/<sha256>.mjb``, so that replay needs no
            model on this MuJoCo release (default). False: keep no MJB.
        model_source: What ``model`` was compiled from, kept beside the archive as its
            portable form (``models/<sha256>.mjz``), so that any MuJoCo release can replay
            it: an MJCF ``.xml`` path, a ``mujoco.MjSpec`` (a flygym world's
            ``world.mjcf_root``) or a spec zip (``.mjz``/``.zip``); checked now to compile
            to ``model`` (:func:`flyarchive.models.portable_model`). None: only the MJB.

    Raises:
        ArchiveExistsError: if ``mode="w-"`` and something is at ``url`` (checked at once).
        SelectionError: for world ids outside ``[0, nworld)``, repeated, or none.
        SchemaError, CodecSpecError, TimingError, OptionsError: for options that cannot
            work (checked at once, before anything is written).
        ModelLoadError: ``model_source`` cannot be made portable (a file it names is
            missing...); LayoutMismatchError: it does not compile to ``model``.
        MissingDependencyError: when ``warp`` is not installed (on import of this module).
    """

    #: The archives it writes (:class:`~flyarchive.record.sink.Archives`): the store's, in
    #: the public recorder (:mod:`flyarchive.recorders`); this class alone writes nowhere.
    archives: ClassVar[Archives | None] = None

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
        start_step: int | None = None,
        takeover: bool = False,
        store_model: bool = True,
        model_source: Any = None,
    ) -> None:
        if self.archives is None:
            raise TypeError(f"{type(self).__name__} of flyarchive.record writes nowhere: use "
                            f"flyarchive.{type(self).__name__} (bound to archives).")
        self.url = absolute_url(as_url(url))  # (the current folder may change meanwhile)
        self.layout = ModelLayout.from_model(model)
        self.timing = Timing(float(model.opt.timestep), output_fps, playback_speed)
        self.nworld = int(nworld)
        if self.nworld < 1:
            raise OptionsError(f"nworld must be at least 1, got {nworld!r}.")
        self.world_ids = parse_worlds(worlds, self.nworld)
        # Every archive option is checked now, before the first frame and before any storage.
        ArchiveSpec(self.layout, self.timing, self.world_ids, dtype="float32",
                    source="mujoco-warp", chunk_frames=chunk_frames, codec=codec,
                    attrs=dict(attrs or {}), world_vars=dict(world_vars or {}))
        parse_mode(mode)
        if int(chunk_frames) < 1 or (start_step is not None and int(start_step) < 0):
            raise OptionsError(
                f"chunk_frames must be at least 1 and start_step at least 0, "
                f"got chunk_frames={chunk_frames!r}, start_step={start_step!r}."
            )
        if attrs and FIRST_FRAME_ATTR in attrs:
            raise OptionsError(
                f"The attribute name {FIRST_FRAME_ATTR!r} is the recorder's; rename it."
            )
        self.chunk_frames = int(chunk_frames)
        self._options = dict(mode=mode, storage_options=storage_options, takeover=takeover)
        self._spec_args = dict(
            codec=codec, attrs=dict(attrs or {}), world_vars=dict(world_vars or {}),
            model=model_bytes(model) if store_model else None,
            portable=None if model_source is None else portable_model(model_source, model=model),
        )
        self._start_step = None if start_step is None else int(start_step)
        self._step = 0
        self._session: Session | None = None
        self._finalizer: Any = None
        self._clock: FrameClock | None = None
        self._tail: CommittedTail | None = None
        self._rerun: CommittedTail | None = None
        self._worlds_device: Any = None
        self._first_index = 0
        self._recorded = 0
        self._closed = False
        self._reset_after: str | None = None
        self.archives.check_location(self.url, parse_mode(mode), storage_options)

    # -- properties ---------------------------------------------------------------

    @property
    def n_frames(self) -> int:
        """Frames recorded so far: committed, in flight and in the device buffer."""
        return self._first_index + self._recorded

    @property
    def committed_frames(self) -> int:
        """Frames committed to the archive (safe from a crash)."""
        return 0 if self._session is None else self._session.background.committed

    @property
    def diverged_worlds(self) -> dict[int, int]:
        """``{world id: frames kept}`` of worlds whose state became NaN or infinite."""
        return {} if self._session is None else dict(self._session.background.diverged)

    @property
    def trajectories(self) -> list[Any]:
        """Each recorded world as a flygym ``RecordedTrajectory`` (flygym's ``.trajectories``).

        Every recorded frame is committed first (waits for the device and the writes).

        Raises:
            RuntimeError: if no frame was recorded yet (as flygym's recorder).
            MissingDependencyError: if flygym is not installed.
        """
        return read_back(self.url, self._options["storage_options"], self._session,
                         self.n_frames, self.flush,
                         self.archives.read_trajectories)

    # -- recording ----------------------------------------------------------------

    def record_as_needed(self, mjw_data: Any) -> bool:
        """Count one simulation step and gather a frame on the device if one is due.

        Call once after every ``mujoco_warp.step`` (and once before the first step to
        record the initial state). Blocks only when a full buffer is handed off while
        both host buffers are still being written.

        Args:
            mjw_data: The ``mujoco_warp.Data`` being stepped, ``nworld`` worlds.

        Returns:
            True if a frame was recorded at this step.

        Raises:
            RecordingError: for a ``Data`` with another number of worlds, after
                :meth:`reset` ended the recording, or when the writer thread refused
                frames out of time order (frames before them are committed).
            LayoutMismatchError: for a ``Data`` of another model.
            StorageError: if writing an earlier chunk failed (frames committed before
                stay committed; the recorder takes no more frames).
            RuntimeError: after :meth:`close`.
        """
        self._check_usable()
        dtype = check_data(mjw_data, self.nworld, self.layout, self.url)
        if self._clock is None:
            first = self._first_step(mjw_data)
            if self._session is None:
                self._start(mjw_data, dtype, first)
            self._begin(first)
        assert self._clock is not None and self._session is not None
        step = self._step
        self._step += 1
        frame = self._clock.due_frame(step)
        if frame is None:
            return False
        if self._rerun is not None:
            self._check_rerun(frame, step, mjw_data)
            return False
        session, frames = self._session, self._session.device_frames
        wp.launch(
            gather_frame,
            dim=(len(self.world_ids), max(self.layout.nq, self.layout.nmocap)),
            inputs=[self._worlds_device, session.slot, mjw_data.qpos, mjw_data.mocap_pos,
                    mjw_data.mocap_quat, mjw_data.time, frames.qpos, frames.mocap_pos,
                    frames.mocap_quat, frames.time],
            device=frames.qpos.device,
        )
        session.frames[session.slot] = frame
        session.slot += 1
        self._clock.advance(frame)
        self._recorded += 1
        if session.slot == self.chunk_frames:
            session.hand_off()
        return True

    def flush(self) -> None:
        """Commit every recorded frame to the archive; waits for the device and the writes.

        Raises:
            StorageError, RecordingError: if a write failed or frames were refused.
        """
        self._check_usable()
        if self._session is None:
            return
        if self._session.slot:
            self._session.hand_off()
        self._session.background.drain()
        self._check_usable()

    def reset(self) -> None:
        """The simulation restarts (flygym's ``GPUSimulation.reset()`` calls this).

        Before this recorder recorded a frame: the next call reads the restarted
        simulation's step from ``d.time``. After: the recorded frames are committed and
        the recording ends (a later :meth:`record_as_needed` raises
        :class:`RecordingError`): a restarted simulation is another run, which goes into
        another archive, never spliced after this one.

        Raises:
            StorageError, RecordingError: if committing the recorded frames failed.
        """
        if self._closed:
            return
        if not self._recorded:
            self._clock, self._rerun, self._start_step = None, None, None
            return
        n_frames = self.n_frames
        self.close()
        self._reset_after = ended_by_reset(self.url, n_frames)

    def close(self) -> None:
        """Commit what is recorded and stop the writer thread; takes no more frames.

        Raises:
            StorageError, RecordingError: if a write failed (what was committed before
                stays committed).
        """
        self._close(raise_errors=True)

    def _close(self, *, raise_errors: bool) -> None:
        if self._closed:
            return
        self._closed = True
        forget(self._finalizer)
        session = self._session
        if session is None:
            return
        session.close()
        self._emit_notices()
        if raise_errors and session.background.error is not None:
            self._raise_writer_error(session.background.error)

    def __enter__(self) -> "WarpTrajectoryRecorder":
        return self

    def __exit__(self, exc_type: object, error: BaseException | None, *rest: object) -> None:
        if error is None:
            self._close(raise_errors=True)
            return
        try:  # the block's error is the one to see: closing may fail for the same cause
            self._close(raise_errors=False)
        except Exception as also:
            error.add_note(f"Closing the recorder failed too: {type(also).__name__}: {also}")

    # -- internals ----------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._reset_after is not None:
            raise RecordingError(self._reset_after)
        if self._closed:
            raise RuntimeError(f"The recorder for {self.url!r} is closed; create a new one.")
        if self._session is None:
            return
        self._emit_notices()
        if self._session.background.error is not None:
            self._raise_writer_error(self._session.background.error)

    def _emit_notices(self) -> None:
        notices = [] if self._session is None else self._session.background.notices
        while notices:
            warnings.warn(notices.pop(0), RuntimeWarning, stacklevel=4)

    def _raise_writer_error(self, err: BaseException) -> None:
        committed = self.committed_frames
        if isinstance(err, RecordingError):
            raise RecordingError(
                f"{err} The archive keeps its {committed} committed frames; this recorder "
                "takes no more frames."
            ) from err
        assert self._session is not None
        first = int(self._session.writer.attrs.get(FIRST_FRAME_ATTR, 0))
        resume_step = self.timing.frame_step(first + committed)
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

    def _start(self, d: Any, dtype: str, step: int) -> None:
        first = self.timing.frames_before_step(step + 1) - 1  # the frame the first call records
        attrs = {**self._spec_args["attrs"], FIRST_FRAME_ATTR: first}
        spec = ArchiveSpec(
            self.layout, self.timing, self.world_ids, dtype=dtype, source="mujoco-warp",
            chunk_frames=self.chunk_frames, **{**self._spec_args, "attrs": attrs},
        )
        writer = self.archives.create(self.url, spec, **self._options)  # type: ignore[arg-type]
        if writer.world_ids != self.world_ids:
            release_writer(writer)
            raise SelectionError(
                f"The archive at {self.url!r} holds worlds {list(writer.world_ids)}; the recorder "
                f"was asked for {list(self.world_ids)}. Pass worlds={list(writer.world_ids)}."
            )
        self._tail = CommittedTail.read(writer)
        self._first_index = writer.n_frames
        device = d.qpos.device
        self._worlds_device = wp.array(np.asarray(self.world_ids, dtype=np.int32), dtype=wp.int32,
                                       device=device)
        shape = (len(self.world_ids), self.chunk_frames, self.layout.nq, self.layout.nmocap)
        pinned = bool(device.is_cuda)
        slots = [Frames.empty(*shape, device="cpu", pinned=pinned) for _ in range(2)]
        background = BackgroundWriter(writer, slots, self.layout.nmocap, self.timing,
                                      None if self._tail is None else self._tail.sim_time)
        device_frames = Frames.empty(*shape, device=device, pinned=False)
        self._session = session = Session(writer, device_frames, background, self.chunk_frames)
        self._finalizer = commit_when_abandoned(self, session.close_and_report, self.url,
                                                self.archives.before_exit)

    def _first_step(self, d: Any) -> int:
        """The step of the simulation at this call: ``start_step``, or read from ``d.time``."""
        if self._start_step is not None:
            return self._start_step
        time = float(d.time.numpy()[self.world_ids[0]])
        return round(time / self.timing.timestep)

    def _begin(self, step: int) -> None:
        """Set the step counter and the frame clock (at the first call, or after a reset)."""
        self._step = step
        tail = self._tail
        if tail is None:  # the first call records the latest frame due by then, as on CPU
            self._clock = FrameClock(self.timing)
            return
        if step < self.timing.frame_step(tail.frame):  # a rerun from an earlier state
            self._rerun = tail
            self._clock = FrameClock(self.timing, next_frame=tail.frame)
            return
        due = self.timing.frame_step(tail.frame + 1)
        if due < step:
            raise RecordingError(
                f"The archive at {self.url!r} has {self._first_index} committed frames; its next "
                f"frame is due at step {due}, but the simulation is at step {step} "
                f"(start_step). Frames in between would be missing. Restart from a state at "
                f"or before step {due}, or record into a new archive."
            )
        self._clock = FrameClock(self.timing, next_frame=tail.frame + 1)

    def _check_rerun(self, frame: int, step: int, d: Any) -> None:
        """Compare a rerun's state at the archive's last frame with it (one device read)."""
        rerun, clock = self._rerun, self._clock
        assert rerun is not None and clock is not None
        time = step * self.timing.timestep
        if frame != rerun.frame:
            raise rerun.missed(time)
        ids = list(self.world_ids)
        mocap = self.layout.nmocap > 0
        rerun.check_rerun(
            self.world_ids, time, d.qpos.numpy()[ids],
            d.mocap_pos.numpy()[ids] if mocap else None,
            d.mocap_quat.numpy()[ids] if mocap else None,
        )
        self._rerun = None
        clock.advance(frame)
