"""flyarchive's recorders inside flygym 2.1 simulations.

flygym's ``Simulation`` and ``GPUSimulation`` call two methods of ``sim.recorder``:
``record_as_needed(state)`` (from ``sim.record_as_needed()``) and ``reset()`` (from
``sim.reset()``); users read ``recorder.trajectory`` (CPU) or
``recorder.trajectories`` and ``recorder.world_ids`` (GPU). flyarchive's
:class:`~flyarchive.TrajectoryRecorder` and
:class:`~flyarchive.recorders.WarpTrajectoryRecorder` have all of them, so
swapping flygym's recorder for flyarchive's is one line::

    sim.recorder = flyarchive.TrajectoryRecorder("run.zarr", sim.mj_model)

or, with the settings of ``sim.set_trajectory_recorder``, :func:`set_trajectory_recorder`.

Differences from flygym's recorders, by design: frames go to the archive (and stay
there: ``reset()`` after frames were recorded commits them and ends the recording,
instead of discarding them), and the frame schedule is drift-free (frame ``k`` at
the first step at or after ``k * playback_speed / output_fps``; see the README).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flyarchive.errors import SelectionError
from flyarchive.interop.trajectories import read_trajectories

__all__ = ["read_trajectories", "set_trajectory_recorder"]


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
        from flyarchive.recorders import WarpTrajectoryRecorder

        recorder: Any = WarpTrajectoryRecorder(url, sim.mj_model, sim.n_worlds, worlds=worlds,
                                               **common)
    else:
        if worlds is not None:
            raise SelectionError(
                f"worlds={list(worlds)!r} is for GPU simulations; a flygym Simulation has one "
                "world."
            )
        from flyarchive.recorders import TrajectoryRecorder

        recorder = TrajectoryRecorder(url, sim.mj_model, source="flygym", **common)
    sim.recorder = recorder
    return recorder
