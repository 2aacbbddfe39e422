"""What the CPU and Warp recorders share: time order, resumed reruns, commit at exit, read-back.

- :class:`TimeGuard` refuses a simulation that goes back in time: a recording is
  one run, and two runs are never spliced into one time axis.
- :class:`CommittedTail` is the last committed frame of an archive a recorder
  appends to. A simulation that starts before it is a rerun of the recorded one
  (e.g. after a crash): its frames up to that one are skipped, and its state at
  that frame must equal the committed one, or the rerun is refused.
- :func:`commit_when_abandoned` commits what a recorder buffered when it is
  garbage-collected or the interpreter exits before ``close()`` (flygym never
  closes ``sim.recorder``), with a ``ResourceWarning``.
- :func:`read_back` reads a recording back as flygym ``RecordedTrajectory`` objects.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from flyarchive.codecs import parse_codec
from flyarchive.errors import RecordingError
from flyarchive.record.sink import ArchiveSink

#: Archive attribute of the Warp recorder (before archives stored ``frame``): index on
#: the frame schedule of the archive's frame 0.
FIRST_FRAME_ATTR = "first_frame"

_ADVICE = ("Record the new run into a new archive (another URL) or a new world block, or "
           "pass mode='w' to replace this archive.")


class TimeGuard:
    """Refuses a simulation time earlier than the one of the previous call.

    Args:
        url: The archive, for messages.
        timestep: Simulation timestep, s; times closer than half of it are equal.
    """

    def __init__(self, url: str, timestep: float) -> None:
        self.url = url
        self.tolerance = 0.5 * timestep
        self.last: float | None = None

    def check(self, time: float) -> None:
        """Raise :class:`RecordingError` if ``time`` is before the last one seen.

        Does not remember ``time``: call :meth:`update` once the call is accepted.
        """
        if self.last is not None and time < self.last - self.tolerance:
            raise RecordingError(
                f"The simulation went back in time: it is at t={time!r} s after t={self.last!r} s "
                f"(the recording into {self.url!r}). The simulation restarted or its state was "
                f"restored; flyarchive never splices two runs into one time axis, and nothing "
                f"of this call was recorded. {_ADVICE} With flygym, sim.reset() ends the "
                "recording: attach a new recorder after it."
            )

    def update(self, time: float) -> None:
        self.last = time


@dataclass(frozen=True)
class CommittedTail:
    """The last committed frame of the worlds a recorder appends to.

    Attributes:
        url: The archive.
        frame: Its index on the frame schedule.
        sim_time: Simulation time at which it was recorded, s.
        qpos: ``(worlds, nq)`` as stored.
        mocap_pos: ``(worlds, nmocap, 3)`` or None.
        mocap_quat: ``(worlds, nmocap, 4)`` or None.
        bound: Largest difference allowed between a rerun's state and the stored one
            (0 for a lossless archive, the codec's bound for ``"abs:<bound>"``).
    """

    url: str
    frame: int
    sim_time: float
    qpos: np.ndarray
    mocap_pos: np.ndarray | None
    mocap_quat: np.ndarray | None
    bound: float

    @classmethod
    def read(cls, writer: ArchiveSink) -> "CommittedTail | None":
        """The writer's last committed frame, or None when it has none."""
        last = writer.last_frame()
        if last is None:
            return None
        if last.frame is not None:
            frame = int(last.frame[0])
        else:  # written before archives stored frame indices
            frame = int(writer.attrs.get(FIRST_FRAME_ATTR, 0)) + writer.n_frames - 1
        sim_time = last.time if last.sim_time is None else last.sim_time
        codec = writer.attrs.get("codec", {})
        spec = codec.get("spec", "lossless") if isinstance(codec, dict) else "lossless"
        return cls(
            writer.url, frame, float(sim_time[0]), last.qpos[:, 0],
            None if last.mocap_pos is None else last.mocap_pos[:, 0],
            None if last.mocap_quat is None else last.mocap_quat[:, 0],
            parse_codec(spec) or 0.0,
        )

    def check_rerun(self, world_ids: tuple[int, ...], time: float, qpos: np.ndarray,
                    mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None) -> None:
        """Raise unless a rerun's state at this frame equals the committed one.

        Args:
            world_ids: The worlds, for messages.
            time: The rerun's simulation time, s.
            qpos: ``(worlds, nq)``; mocap arrays ``(worlds, nmocap, 3|4)`` or None.

        Raises:
            RecordingError: naming the worlds that differ and by how much.
        """
        diff = np.zeros(len(world_ids))
        for stored, state in ((self.qpos, qpos), (self.mocap_pos, mocap_pos),
                              (self.mocap_quat, mocap_quat)):
            if stored is not None and state is not None:
                delta = np.abs(np.asarray(state, stored.dtype).astype(np.float64) - stored)
                diff = np.maximum(diff, np.nan_to_num(delta, nan=np.inf).reshape(len(diff), -1)
                                  .max(axis=1, initial=0.0))
        bad = np.flatnonzero(diff > self.bound)
        if bad.size:
            raise RecordingError(
                f"The simulation restarted before the last committed frame of {self.url!r} "
                f"(frame {self.frame}, t={self.sim_time!r} s) and, at that frame (t={time!r} s), "
                f"its state differs from the committed one in world(s) "
                f"{[world_ids[i] for i in bad]} (by up to {float(diff[bad].max()):.3g}): it is "
                f"another run, not a rerun of the recorded one. Nothing was appended. {_ADVICE}"
            )

    def missed(self, time: float) -> RecordingError:
        """The error for a rerun that passed this frame without a call at its step."""
        return RecordingError(
            f"The simulation restarted before the last committed frame of {self.url!r} "
            f"(frame {self.frame}, t={self.sim_time!r} s) and is now at t={time!r} s without "
            "having been recorded at that frame, so flyarchive cannot check that it reruns the "
            f"recorded simulation. Nothing was appended. Call record_as_needed after every step, "
            f"or continue from a state at t >= {self.sim_time!r} s. {_ADVICE}"
        )


def ended_by_reset(url: str, n_frames: int) -> str:
    """The message for a recorder used after :meth:`reset` ended its recording."""
    return (
        f"The simulation was reset after {n_frames} frames were recorded into {url!r}; they "
        "are committed and the recording has ended, because flyarchive never splices two "
        "runs into one time axis. Record the restarted simulation with a new recorder: "
        "another URL, or mode='w' to replace the archive (with flygym: sim.recorder = "
        "flyarchive.TrajectoryRecorder(new_url, sim.mj_model, ...))."
    )


def read_back(url: str, storage_options: Any, session: Any, n_frames: int,
              flush: Callable[[], None], read: Callable[..., list[Any]]) -> list[Any]:
    """A recorder's worlds as flygym ``RecordedTrajectory`` objects (its ``.trajectories``).

    Every recorded frame is committed first (``flush``, unless the session is closed).

    Args:
        url, storage_options: The recorder's archive.
        session: The recorder's session (``.closed``, ``.writer.world_ids``); None: not
            started.
        n_frames: Frames the recorder recorded.
        flush: The recorder's ``flush``.

    Raises:
        RuntimeError: if no frame was recorded yet (as flygym's recorder).
        MissingDependencyError: if flygym is not installed.
    """
    if session is None or n_frames == 0:
        raise RuntimeError(f"No frames have been recorded yet into {url!r}.")
    if not session.closed:
        flush()
    return read(url, storage_options, worlds=session.writer.world_ids)


def release_writer(writer: ArchiveSink) -> None:
    """Let go of what a writer holds (its claim on the archive), once its frames are committed."""
    writer.close()


# ---------------------------------------------------------------------------- abandoned recorders
_LIVE: set[weakref.finalize] = set()
_AT_EXIT: list[bool] = [False]
_BEFORE_EXIT: dict[Callable[[], None], None] = {}  # what to run first at exit, in order


def commit_when_abandoned(recorder: object, close: Callable[[], Any], url: str,
                          before_exit: Callable[[], None]) -> weakref.finalize:
    """Run ``close`` if ``recorder`` is garbage-collected or the interpreter exits first;
    at exit, ``before_exit`` first (the store's :meth:`~flyarchive.record.sink.Archives.before_exit`).

    ``close`` must not refer to ``recorder`` (or it would never be collected). It runs
    at most once, with a ``ResourceWarning``; :func:`forget` the result when the
    recorder is closed properly. At exit it runs before Python shuts down the thread
    pools that zarr writes through.
    """
    finalizer = weakref.finalize(recorder, _abandoned, close, url)
    finalizer.atexit = False  # run by _at_exit below, in a known order
    _LIVE.difference_update([f for f in _LIVE if not f.alive])
    _LIVE.add(finalizer)
    _BEFORE_EXIT[before_exit] = None
    if not _AT_EXIT[0]:
        _register_exit_hook()
        _AT_EXIT[0] = True
    return finalizer


def _register_exit_hook() -> None:
    """Run :func:`_at_exit` when Python exits, while zarr can still write.

    zarr writes local files through thread pools, and Python shuts thread pools down
    before ``atexit`` handlers run (``concurrent.futures`` registers that with
    ``threading._register_atexit``, as this does, so this hook, registered later,
    runs first). Without that private hook (another Python), ``atexit`` is the fallback.
    """
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(_at_exit)
            return
    except RuntimeError:  # Python is already shutting down
        pass
    atexit.register(_at_exit)


def forget(finalizer: weakref.finalize | None) -> None:
    """Cancel :func:`commit_when_abandoned` for a recorder closed properly."""
    if finalizer is not None:
        finalizer.detach()
        _LIVE.discard(finalizer)


def _abandoned(close: Callable[[], Any], url: str) -> None:
    warnings.warn(
        f"A flyarchive recorder writing {url!r} was not closed; its buffered frames are being "
        "committed now, as it is garbage-collected or Python exits. Use it in a `with` block "
        "or call recorder.close() when the simulation ends (frames are lost if the process "
        "is killed before).",
        ResourceWarning, stacklevel=2,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no event loop runs in this thread
        _close_quietly(close, url)
    else:  # collected inside an event loop (zarr's, Dask's), where zarr cannot wait: commit
        # from a thread of its own, which Python waits for before it exits
        threading.Thread(target=_close_quietly, args=(close, url),
                         name="flyarchive-commit-abandoned").start()


def _close_quietly(close: Callable[[], Any], url: str) -> None:
    try:
        close()
    except Exception as err:  # nobody can catch it here; say what was lost
        warnings.warn(
            f"Committing the buffered frames of the unclosed recorder for {url!r} failed "
            f"({type(err).__name__}: {err}); the archive keeps the frames committed before.",
            RuntimeWarning, stacklevel=2,
        )


def _at_exit() -> None:
    if any(finalizer.alive for finalizer in _LIVE):
        for prepare in list(_BEFORE_EXIT):
            prepare()
    for finalizer in list(_LIVE):
        finalizer()
    _LIVE.clear()
