"""flyarchive's recorders inside flygym 2.1 simulations.

flygym's ``Simulation`` and ``GPUSimulation`` call two methods of ``sim.recorder``:
``record_as_needed(state)`` (from ``sim.record_as_needed()``) and ``reset()`` (from
``sim.reset()``); users read ``recorder.trajectory`` (CPU) or
``recorder.trajectories`` and ``recorder.world_ids`` (GPU). flyarchive's
:class:`~flyarchive.TrajectoryRecorder` and
:class:`~flyarchive.record.warp.WarpTrajectoryRecorder` have all of them, so
swapping flygym's recorder for flyarchive's is one line::

    sim.recorder = flyarchive.TrajectoryRecorder("run.zarr", sim.mj_model)

or, with the settings of ``sim.set_trajectory_recorder``, :func:`set_trajectory_recorder`.

Differences from flygym's recorders, by design: frames go to the archive (and stay
there: ``reset()`` after frames were recorded commits them and ends the recording,
instead of discarding them), and the frame schedule is drift-free (frame ``k`` at
the first step at or after ``k * playback_speed / output_fps``; see the README).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flyarchive.errors import SelectionError, missing_dependency
from flyarchive.query import open_archive

__all__ = ["read_trajectories", "set_trajectory_recorder"]


def read_trajectories(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    worlds: Sequence[int] | None = None,
) -> list[Any]:
    """Committed frames of worlds of an archive as flygym ``RecordedTrajectory`` objects.

    Args:
        url: Archive URL.
        storage_options: Passed to fsspec.
        worlds: World ids (default: every world), in the order returned.

    Returns:
        One ``flygym.recording.RecordedTrajectory`` per world: ``time`` (n,) the
        simulation time of each frame (``sim_time``; ``time`` for archives without it),
        ``qpos`` (n, nq) and mocap poses as stored, ``output_fps``, ``playback_speed``
        and ``world_id``. Only committed frames.

    Raises:
        MissingDependencyError: if flygym is not installed.
        SelectionError: for a world id that is not in the archive.
    """
    try:
        from flygym.recording import RecordedTrajectory
    except ImportError:
        raise missing_dependency("flygym", "flygym", "Reading flygym trajectories") from None
    ds = open_archive(url, storage_options)
    ids = [int(w) for w in ds.world.values]
    chosen = ids if worlds is None else [int(w) for w in worlds]
    unknown = [w for w in chosen if w not in ids]
    if unknown:
        raise SelectionError(f"World(s) {unknown} are not in {url!r}; it has worlds {ids[:20]}.")
    fps = float(ds.attrs["output_fps"])
    times = ds["sim_time"] if "sim_time" in ds.variables else ds["time"]
    out = []
    for w in chosen:
        one = ds.sel(world=w)
        n = int(one.n_frames)
        mocap = "mocap_pos" in ds
        out.append(RecordedTrajectory(
            time=np.asarray(times.values[:n]),
            qpos=np.asarray(one.qpos.values[:n]),
            output_fps=int(fps) if fps.is_integer() else fps,  # type: ignore[arg-type]
            playback_speed=float(ds.attrs["playback_speed"]),
            world_id=w,
            mocap_pos=np.asarray(one.mocap_pos.values[:n]) if mocap else None,
            mocap_quat=np.asarray(one.mocap_quat.values[:n]) if mocap else None,
        ))
    return out


def set_trajectory_recorder(
    sim: Any,
    url: str,
    *,
    playback_speed: float = 0.2,
    output_fps: int = 25,
    worlds: Sequence[int] | None = None,
    **options: Any,
) -> Any:
    """Attach a flyarchive recorder to a flygym simulation, as ``sim.set_trajectory_recorder``.

    Args:
        sim: A ``flygym.Simulation`` (gets a :class:`~flyarchive.TrajectoryRecorder`) or a
            ``flygym.warp.GPUSimulation`` (a ``WarpTrajectoryRecorder``).
        url: Where to write the archive.
        playback_speed: Video seconds per simulated second.
        output_fps: Video frames per second.
        worlds: GPU only: world ids to record (default all).
        **options: More recorder options (``mode``, ``storage_options``, ``chunk_frames``...).

    Returns:
        The recorder, also set as ``sim.recorder``.

    Raises:
        SelectionError: ``worlds`` for a CPU simulation.
    """
    common = dict(playback_speed=playback_speed, output_fps=output_fps, **options)
    if hasattr(sim, "mjw_data"):
        from flyarchive.record.warp import WarpTrajectoryRecorder

        recorder: Any = WarpTrajectoryRecorder(url, sim.mj_model, sim.n_worlds, worlds=worlds,
                                               **common)
    else:
        if worlds is not None:
            raise SelectionError(
                f"worlds={list(worlds)!r} is for GPU simulations; a flygym Simulation has one "
                "world."
            )
        from flyarchive.record.cpu import TrajectoryRecorder

        recorder = TrajectoryRecorder(url, sim.mj_model, source="flygym", **common)
    sim.recorder = recorder
    return recorder
