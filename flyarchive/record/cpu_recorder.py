"""Record CPU MuJoCo simulations (one or several ``MjData``) into an archive."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import mujoco
import numpy as np

from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import LayoutMismatchError, NonFiniteStateError, OptionsError, RecordingError
from flyarchive.layout import ModelLayout, layout_difference
from flyarchive.models import model_bytes, portable_model
from flyarchive.record.common import (
    CommittedTail,
    TimeGuard,
    commit_when_abandoned,
    ended_by_reset,
    forget,
    read_back,
    release_writer,
)
from flyarchive.schema import finite_frames
from flyarchive.archive_spec import ArchiveSpec, FrameBlock, absolute_url, as_url, parse_mode
from flyarchive.record.sink import ArchiveSink, Archives


def _n_world_vars(world_vars: Mapping[str, Any]) -> int:
    """Worlds implied by the first world variable (1 without any), to check options early."""
    for values in world_vars.values():
        shape = np.shape(values)
        return shape[0] if shape and shape[0] > 0 else 1
    return 1


class FrameBuffer:
    """Host buffer of up to ``chunk_frames`` frames for ``n_worlds`` worlds.

    Args:
        n_worlds: Worlds per frame.
        chunk_frames: Capacity in frames.
        nq: Generalized coordinates per world.
        nmocap: Mocap bodies per world (0 for none).
        dtype: Storage dtype.
    """

    def __init__(self, n_worlds: int, chunk_frames: int, nq: int, nmocap: int, dtype: Any) -> None:
        self.frame = np.empty(chunk_frames, dtype=np.int64)
        self.sim_time = np.empty(chunk_frames, dtype=np.float64)
        self.qpos = np.empty((n_worlds, chunk_frames, nq), dtype=dtype)
        self.mocap_pos = np.empty((n_worlds, chunk_frames, nmocap, 3), dtype=dtype) if nmocap else None
        self.mocap_quat = np.empty((n_worlds, chunk_frames, nmocap, 4), dtype=dtype) if nmocap else None
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size == len(self.frame)

    def block(self, timing: Timing) -> FrameBlock:
        """The buffered frames (views, valid until the next :meth:`clear`)."""
        n = self.size
        return FrameBlock(
            timing.frame_times(self.frame[:n]), self.qpos[:, :n],
            None if self.mocap_pos is None else self.mocap_pos[:, :n],
            None if self.mocap_quat is None else self.mocap_quat[:, :n],
            sim_time=self.sim_time[:n], frame=self.frame[:n],
        )

    def clear(self) -> None:
        self.size = 0


def _keeps(attrs: Any, portable: Any) -> bool:
    """The archive (its root ``attrs``) keeps this portable model already."""
    from flyarchive.models.entries import PORTABLE_MODEL_ATTR, portable_entry

    kept = attrs.get(PORTABLE_MODEL_ATTR) if isinstance(attrs, dict) else None
    return isinstance(kept, dict) and kept.get("sha256") == portable_entry(portable)["sha256"]


class _Session:
    """The writer and buffer of a started recorder; its finalizer holds this, not the recorder."""

    def __init__(self, writer: ArchiveSink, buffer: FrameBuffer, timing: Timing) -> None:
        self.writer, self.buffer, self.timing = writer, buffer, timing
        self.closed = False

    def flush(self) -> None:
        if not self.buffer.size:
            return
        before = self.writer.n_frames
        try:
            self.writer.write(self.buffer.block(self.timing))
        finally:  # committed, even if interrupted after (Ctrl-C in step 5): never again
            if self.writer.n_frames != before:
                self.buffer.clear()

    def close(self) -> None:
        if self.closed:
            return
        said = getattr(self.writer, "lost", False)  # the archive went: a commit said so
        try:
            if not said:  # (its buffered frames have no place to go, and it was said)
                self.flush()
        finally:
            self.closed = True
            release_writer(self.writer)


class TrajectoryRecorder:
    """Records the kinematic state of CPU simulations at the video cadence.

    A drop-in for flygym 2.1's recorder: call :meth:`record_as_needed` after every
    step (it returns True when it recorded a frame), or attach it to a flygym
    ``Simulation`` (``sim.recorder = TrajectoryRecorder(url, sim.mj_model)``), whose
    ``reset()`` and ``record_as_needed()`` call it; :attr:`trajectory` reads the
    recording back as a flygym ``RecordedTrajectory``. Frames are buffered on the host
    (one chunk at most) and committed every ``chunk_frames`` frames, on :meth:`close`
    (also when used as a context manager), and, with a ``ResourceWarning``, when an
    unclosed recorder is garbage-collected or Python exits.

    Frame ``k`` of the schedule is recorded at the first call at or after ``k x
    playback_speed / output_fps`` simulated seconds (see :mod:`flyarchive.clock`); the
    archive stores its scheduled time (``time``), the time it was recorded at
    (``sim_time``) and ``k`` (``frame``).

    One recorder, one run: a simulation that goes back in time (restarted, or restored
    to an earlier state) is refused, never spliced. With ``mode="a"``, a simulation
    that starts before the archive's last committed frame is taken for a rerun of the
    recorded one (e.g. after a crash): frames up to that one are skipped, and its state
    there must equal the committed one, else the rerun is refused.

    Args:
        url: Where to write: a local path or any fsspec URL.
        model: The compiled model being simulated.
        output_fps: Video frame rate, frames per second.
        playback_speed: Video seconds per simulated second.
        chunk_frames: Frames per chunk and per flush; a crash loses at most this many.
        world_ids: World index of each ``MjData`` passed to :meth:`record_as_needed`
            (default ``0..n-1``).
        mode: ``"w-"`` (default) refuses an existing archive, ``"w"`` replaces it,
            ``"a"`` appends after its last committed frame.
        storage_options: Passed to fsspec.
        codec: ``"lossless"`` (default), ``"portable"`` or ``"abs:<bound>"``. Appending
            (``mode="a"``) needs the archive's own: another is refused.
        dtype: Storage dtype (default float64, bit-exact with MuJoCo's state). Appending
            needs the archive's own: another is refused.
        source: Recorded in the attributes.
        attrs: User metadata stored in the archive's attributes.
        world_vars: Per-world user variables, ``{name: (n_worlds,) array}``.
        world_block: ``(start, stop)``: write only these world indices of an archive
            created beforehand with ``ArchiveSpec(capacity_frames=...)``, alongside other
            processes writing other blocks (e.g. one per GPU). Needs ``mode="a"``.
        takeover: With ``world_block``, take over this block's claim after a crash.
        store_model: Keep ``model`` (its exact MJB bytes, as it is when the recorder is
            made) beside the archive as ``models/<sha256>.mjb``, so that replay needs no
            model on this MuJoCo release (default). False: keep no MJB. An archive appended
            to (``mode="a"``) keeps the models it was created with.
        model_source: What ``model`` was compiled from, kept beside the archive as its
            portable form (``models/<sha256>.mjz``), so that any MuJoCo release can replay
            it: an MJCF ``.xml`` path (with its files where it names them), a
            ``mujoco.MjSpec`` (a flygym world's ``world.mjcf_root``), or a spec zip
            (``.mjz``/``.zip``). Made now (:func:`flyarchive.models.portable_model`) and
            checked to compile to ``model``'s layout, bodies and ``qpos0``. None: only the
            MJB is kept, bound to this MuJoCo release.

    Raises:
        ArchiveExistsError: if ``mode="w-"`` and something is at ``url`` (checked at once).
        SchemaError, CodecSpecError, TimingError, OptionsError: for options that cannot
            work (checked at once, before anything is written).
        ModelLoadError: ``model_source`` cannot be made portable (a file it names is
            missing...); LayoutMismatchError: it does not compile to ``model``.
        ArchiveInUseError: from the first :meth:`record_as_needed` when another writer
            holds the archive.
        RecordingError: from :meth:`record_as_needed`, for another number of ``MjData``
            than the recorder's worlds, ``MjData`` at different times, a simulation that
            went back in time, or a rerun that differs from the recorded run; nothing of
            that call is recorded.
        LayoutMismatchError: from :meth:`record_as_needed`, for ``MjData`` of another model.
        SchemaError: from :meth:`record_as_needed` with ``mode="a"``, when the archive was
            recorded with another timing, codec or dtype (nothing is written).
        NonFiniteStateError: from :meth:`record_as_needed` when a world's state holds
            NaN or infinity; nothing of that frame is buffered, and every frame before it
            is committed by :meth:`close`.
    """

    #: The archives it writes (:class:`~flyarchive.record.sink.Archives`): the store's, in
    #: the public recorder (:mod:`flyarchive.recorders`); this class alone writes nowhere.
    archives: ClassVar[Archives | None] = None

    def __init__(
        self,
        url: str,
        model: mujoco.MjModel,
        *,
        output_fps: float = 25,
        playback_speed: float = 0.2,
        chunk_frames: int = 100,
        world_ids: Sequence[int] | None = None,
        mode: str = "w-",
        storage_options: Mapping[str, Any] | None = None,
        codec: str = "lossless",
        dtype: str = "float64",
        source: str = "mujoco",
        attrs: Mapping[str, Any] | None = None,
        world_vars: Mapping[str, np.ndarray] | None = None,
        world_block: tuple[int, int] | None = None,
        takeover: bool = False,
        store_model: bool = True,
        model_source: Any = None,
    ) -> None:
        if self.archives is None:
            raise TypeError(f"{type(self).__name__} of flyarchive.record writes nowhere: use "
                            f"flyarchive.{type(self).__name__} (bound to archives).")
        if world_block is not None and parse_mode(mode) != "a":
            raise OptionsError("world_block writes into an existing archive: pass mode='a'.")
        self._block = dict(world_block=world_block, takeover=takeover)
        self.url = absolute_url(as_url(url))  # (the current folder may change meanwhile)
        self.layout = ModelLayout.from_model(model)
        self.timing = Timing(float(model.opt.timestep), output_fps, playback_speed)
        nq, nmocap = self.layout.nq, self.layout.nmocap
        self._shapes = ((nq,), (nmocap, 3), (nmocap, 4))  # of qpos, mocap_pos, mocap_quat
        self._models = [model]  # models whose MjData are recorded: this one, or of its layout
        self._options = dict(mode=parse_mode(mode), storage_options=storage_options,
                             takeover=takeover)
        self._spec_args = dict(
            dtype=dtype, source=source, chunk_frames=chunk_frames, codec=codec,
            attrs=dict(attrs or {}), world_vars=dict(world_vars or {}),
            model=model_bytes(model) if store_model else None,
            portable=None if model_source is None else portable_model(model_source, model=model),
        )
        # Every option is checked now, before the first frame and before any storage.
        spec = self._spec(range(_n_world_vars(self._spec_args["world_vars"]))
                          if world_ids is None else world_ids)
        self._world_ids = None if world_ids is None else spec.world_ids
        self._session: _Session | None = None
        self._finalizer: Any = None
        self._clock: FrameClock | None = None
        self._guard = TimeGuard(self.url, self.timing.timestep)
        self._tail: CommittedTail | None = None  # last committed frame, until the first call
        self._rerun: CommittedTail | None = None  # a rerun's frame still to check
        self._recorded = 0  # frames recorded by this recorder
        self._closed = False
        self._reset_after: str | None = None  # the message once reset() ended the recording
        self.archives.check_location(self.url, parse_mode(mode), storage_options)

    # -- properties -----------------------------------------------------------------

    @property
    def n_frames(self) -> int:
        """Frames recorded so far (committed and buffered)."""
        if self._session is None:
            return 0
        return self._session.writer.n_frames + self._session.buffer.size

    @property
    def committed_frames(self) -> int:
        """Frames committed to the archive (safe from a crash)."""
        return 0 if self._session is None else self._session.writer.n_frames

    @property
    def trajectories(self) -> list[Any]:
        """Every recorded world as a flygym ``RecordedTrajectory``, read from the archive.

        Buffered frames are committed first. ``time`` is each frame's simulation time.

        Raises:
            RuntimeError: if no frame was recorded yet (as flygym's recorder).
            MissingDependencyError: if flygym is not installed.
        """
        return read_back(self.url, self._options["storage_options"], self._session,
                         self.n_frames, self.flush,
                         self.archives.read_trajectories)

    @property
    def trajectory(self) -> Any:
        """The recorded world as a flygym ``RecordedTrajectory`` (flygym's ``.trajectory``).

        Raises:
            RuntimeError: if no frame was recorded yet, or several worlds were (use
                :attr:`trajectories`).
        """
        trajectories = self.trajectories
        if len(trajectories) != 1:
            raise RuntimeError(
                f"The recorder holds {len(trajectories)} worlds; .trajectory is for one. "
                "Use .trajectories (one RecordedTrajectory per world)."
            )
        return trajectories[0]

    # -- recording --------------------------------------------------------------------

    def record_as_needed(self, mj_data: mujoco.MjData | Sequence[mujoco.MjData]) -> bool:
        """Record the state of ``mj_data`` (one or several worlds) if a frame is due.

        Args:
            mj_data: One ``MjData`` per world, the same ones in the same order at every
                call, all at the same simulation time.

        Returns:
            True if a frame was recorded.

        Raises:
            RecordingError, LayoutMismatchError, NonFiniteStateError: see the class;
                nothing of the call is recorded.
            RuntimeError: after :meth:`close`.
        """
        datas = _as_datas(mj_data, self.url)
        if self._reset_after is not None:
            raise RecordingError(self._reset_after)
        if self._closed:
            raise RuntimeError(f"The recorder for {self.url!r} is closed; create a new one.")
        n = len(datas) if self._session is None else self._session.buffer.qpos.shape[0]
        time = self._check_datas(datas, n)
        if self._session is None:
            self._check_models(datas)  # before the archive is created
            self._start(datas)
        self._guard.check(time)
        if self._clock is None:
            self._begin(time)
        assert self._clock is not None
        frame = self._clock.due_frame(self._clock.step_of(time))
        if frame is not None:  # the states are read: they must be of the recorder's model
            self._check_models(datas)
        recorded = False
        if frame is not None and self._rerun is not None:
            self._check_rerun(frame, time, datas)
        elif frame is not None:
            self._buffer(frame, time, datas)
            recorded = True
        self._guard.update(time)
        return recorded

    def _check_models(self, datas: list[mujoco.MjData]) -> None:
        """Raise :class:`LayoutMismatchError` for an ``MjData`` of a model whose state
        means something else: another number of coordinates or mocap bodies, or other
        joints (names, types, order) or mocap bodies. A model other than the recorder's
        but of its layout (the same model loaded again) is accepted, and remembered."""
        nq, nmocap = self.layout.nq, self.layout.nmocap
        for w, data in enumerate(datas):
            model = data.model
            if any(model is known for known in self._models):
                continue
            if (data.qpos.shape, data.mocap_pos.shape, data.mocap_quat.shape) != self._shapes:
                raise LayoutMismatchError(
                    f"MjData {w} has nq={data.qpos.shape[0]}, nmocap={data.mocap_pos.shape[0]}; "
                    f"the recorder for {self.url!r} was created for a model with nq={nq}, "
                    f"nmocap={nmocap}. Pass MjData of the recorder's model "
                    "(mujoco.MjData(model)); nothing of this call was recorded.")
            detail = layout_difference(self.layout, ModelLayout.from_model(model),
                                       what=f"MjData {w}'s model")
            if detail is not None:
                raise LayoutMismatchError(
                    f"MjData {w} is of another model than the recorder for {self.url!r}: "
                    f"{detail.replace('archive', 'recorder')}. Pass MjData of the "
                    "recorder's model (mujoco.MjData(model)); nothing of this call was recorded.")
            self._models.append(model)

    def _check_datas(self, datas: list[mujoco.MjData], n: int) -> float:
        """Check the worlds passed against the recording; return their simulation time."""
        if not datas:
            raise RecordingError(f"No MjData were passed to the recorder for {self.url!r}; "
                                 "pass one per world.")
        if len(datas) != n:
            raise RecordingError(
                f"The recorder for {self.url!r} has {n} worlds; {len(datas)} MjData were "
                f"passed. Pass the same {n} MjData (one per world, in the same order) at "
                "every call; nothing of this call was recorded."
            )
        times = [d.time for d in datas]
        if max(times) - min(times) > self._guard.tolerance:
            ids = self._world_ids or range(n)
            listed = ", ".join(f"world {w}: t={t!r} s" for w, t in zip(ids, times))
            raise RecordingError(
                f"The MjData passed are at different simulation times ({listed}); a frame "
                "holds every world at one time. Step all worlds together, once per call, and "
                "reset them together (MuJoCo resets an MjData by itself when its state becomes "
                "NaN or infinite: look for its warning 'Nan, Inf or huge value'); nothing of this "
                "call was recorded."
            )
        return times[0]

    def _buffer(self, frame: int, time: float, datas: list[mujoco.MjData]) -> None:
        assert self._session is not None and self._clock is not None
        session = self._session
        buf, i = session.buffer, session.buffer.size
        if session.writer.block is not None and frame != session.writer.n_frames + i:
            raise RecordingError(
                f"Frame {frame} of the schedule is due, but the world block of {self.url!r} "
                f"holds frame {session.writer.n_frames + i} next: archives written by several "
                "processes need every frame. Call record_as_needed after every step."
            )
        for w, data in enumerate(datas):
            buf.qpos[w, i] = data.qpos
            if buf.mocap_pos is not None and buf.mocap_quat is not None:
                buf.mocap_pos[w, i] = data.mocap_pos
                buf.mocap_quat[w, i] = data.mocap_quat
        self._check_finite(i, time)
        buf.frame[i], buf.sim_time[i] = frame, time
        buf.size += 1
        self._clock.advance(frame)
        self._recorded += 1
        if buf.full:
            self.flush()

    def _check_rerun(self, frame: int, time: float, datas: list[mujoco.MjData]) -> None:
        assert self._rerun is not None and self._clock is not None and self._session is not None
        rerun = self._rerun
        if frame != rerun.frame:
            raise rerun.missed(time)
        mocap = self.layout.nmocap > 0
        rerun.check_rerun(
            self._session.writer.world_ids, time, np.stack([d.qpos for d in datas]),
            np.stack([d.mocap_pos for d in datas]) if mocap else None,
            np.stack([d.mocap_quat for d in datas]) if mocap else None,
        )
        self._rerun = None  # the rerun matches: record from the next frame on
        self._clock.advance(frame)

    def _check_finite(self, i: int, time: float) -> None:
        assert self._session is not None
        buf = self._session.buffer
        mocap = buf.mocap_pos is not None and buf.mocap_quat is not None
        bad = ~finite_frames(buf.qpos[:, i], buf.mocap_pos[:, i] if mocap else None,
                             buf.mocap_quat[:, i] if mocap else None)
        if bad.any():
            worlds = [self._session.writer.world_ids[w] for w in np.flatnonzero(bad)]
            raise NonFiniteStateError(
                f"The state of world(s) {worlds} holds NaN or infinity at t={time!r} s "
                f"(frame {self.n_frames}); the simulation diverged. The frame was not recorded; "
                f"the {self.n_frames} frames before it are kept. Reduce the timestep or fix the "
                "controller, and close() the recorder to commit what was recorded."
            )

    # -- life cycle -------------------------------------------------------------------

    def _spec(self, world_ids: Sequence[int]) -> ArchiveSpec:
        return ArchiveSpec(self.layout, self.timing, world_ids, **self._spec_args)  # type: ignore[arg-type]

    def _start(self, datas: list[mujoco.MjData]) -> None:
        n_worlds = len(datas)
        world_ids = self._world_ids or tuple(range(n_worlds))
        if len(world_ids) != n_worlds:
            raise RecordingError(
                f"world_ids has {len(world_ids)} entries for {n_worlds} MjData; pass one id "
                "per MjData."
            )
        if self._block["world_block"] is not None:
            writer = self.archives.append(
                self.url, self.layout, storage_options=self._options["storage_options"],
                timing=self.timing, codec=self._spec_args["codec"],
                dtype=self._spec_args["dtype"], **self._block,
            )
        else:
            writer = self.archives.create(self.url, self._spec(world_ids), **self._options)
        buffer = FrameBuffer(n_worlds, writer.chunk_frames, self.layout.nq, self.layout.nmocap,
                             writer.dtype)
        self._session = session = _Session(writer, buffer, self.timing)
        self._finalizer = commit_when_abandoned(self, session.close, self.url,
                                                self.archives.before_exit)
        if writer.n_worlds != n_worlds:
            forget(self._finalizer)
            session.close()
            self._session = None
            raise RecordingError(
                f"The archive at {self.url!r} has {writer.n_worlds} worlds; "
                f"{n_worlds} MjData were passed."
            )
        self._tail = CommittedTail.read(writer)
        portable = self._spec_args["portable"]
        if self._tail is not None and portable is not None and \
                not _keeps(getattr(writer, "attrs", None), portable):
            warnings.warn(
                f"model_source was not kept: {self.url!r} was recorded before, and appending "
                "keeps the models the archive keeps. Keep it with `flyarchive model attach "
                f"{self.url} --model SOURCE`.", RuntimeWarning, stacklevel=4)

    def _begin(self, time: float) -> None:
        """Set the frame clock at the first call (and after a reset before any frame)."""
        tail = self._tail
        if tail is None:
            self._clock = FrameClock(self.timing)
        elif time < tail.sim_time - self._guard.tolerance:  # a rerun from an earlier state
            self._rerun = tail
            self._clock = FrameClock(self.timing, next_frame=tail.frame)
        else:
            self._guard.update(tail.sim_time)
            self._clock = FrameClock(self.timing, next_frame=tail.frame + 1)

    def reset(self) -> None:
        """The simulation restarts (flygym's ``Simulation.reset()`` calls this).

        Before this recorder recorded a frame: the next call starts the recording at the
        restarted simulation's time. After: the recorded frames are committed and the
        recording ends (a later :meth:`record_as_needed` raises :class:`RecordingError`):
        a restarted simulation is another run, which goes into another archive, never
        spliced after this one. :attr:`trajectory` still reads what was recorded.
        """
        if self._closed:
            return
        if not self._recorded:
            self._clock, self._rerun = None, None
            self._guard.last = None
            return
        n_frames = self.n_frames
        self.close()
        self._reset_after = ended_by_reset(self.url, n_frames)

    def flush(self) -> None:
        """Commit the buffered frames to the archive."""
        if self._session is not None and not self._session.closed:
            self._session.flush()

    def close(self) -> None:
        """Commit what is buffered; the recorder takes no more frames."""
        if self._closed:
            return
        self._closed = True
        forget(self._finalizer)
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> "TrajectoryRecorder":
        return self

    def __exit__(self, exc_type: object, error: BaseException | None, *rest: object) -> None:
        if error is None:
            self.close()
            return
        try:  # the block's error is the one to see: closing may fail for the same cause
            self.close()
        except Exception as also:
            error.add_note(f"Closing the recorder failed too: {type(also).__name__}: {also}")


def _as_datas(mj_data: Any, url: str) -> list[mujoco.MjData]:
    """``record_as_needed``'s argument as a list of ``MjData``.

    Raises:
        RecordingError: it is neither an ``MjData`` nor a sequence of them.
    """
    if isinstance(mj_data, mujoco.MjData):
        return [mj_data]
    single = isinstance(mj_data, (str, bytes, np.ndarray)) or not hasattr(mj_data, "__iter__")
    datas = [mj_data] if single else list(mj_data)
    for w, data in enumerate(datas):
        if not isinstance(data, mujoco.MjData):
            raise RecordingError(
                f"The recorder for {url!r} records mujoco.MjData (one, or a list of one per "
                f"world); {'it was given' if single else f'item {w} is'} "
                f"{type(data).__name__}. Pass the simulation's MjData (e.g. sim.data, "
                "[mujoco.MjData(model) ...]); nothing of this call was recorded.")
    return datas
