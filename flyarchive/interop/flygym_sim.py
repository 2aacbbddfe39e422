"""flyarchive's recorders inside flygym 2.1 simulations.

flygym's ``Simulation`` and ``GPUSimulation`` call two methods of ``sim.recorder``:
``record_as_needed(state)`` (from ``sim.record_as_needed()``) and ``reset()`` (from
``sim.reset()``); users read ``recorder.trajectory`` (CPU) or
``recorder.trajectories`` and ``recorder.world_ids`` (GPU). flyarchive's
:class:`~flyarchive.TrajectoryRecorder` and
:class:`~flyarchive.recorders.WarpTrajectoryRecorder` have all of them, so
swapping flygym's recorder for flyarchive's is one line::

    sim.recorder = flyarchive.TrajectoryRecorder("run.zarr", sim.mj_model,
                                                 model_source=sim.world.mjcf_root)

or, with the settings of ``sim.set_trajectory_recorder``, :func:`set_trajectory_recorder`,
which keeps the world's spec (``sim.world.mjcf_root``) as the model's portable form by
default: the archive then replays on any MuJoCo release, not only the one that recorded it.

Differences from flygym's recorders, by design: frames go to the archive (and stay
there: ``reset()`` after frames were recorded commits them and ends the recording,
instead of discarding them), and the frame schedule is drift-free (frame ``k`` at
the first step at or after ``k * playback_speed / output_fps``; see the README).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from flyarchive.errors import LayoutMismatchError, ModelLoadError, SelectionError
from flyarchive.recorders.trajectories import read_trajectories

__all__ = ["read_trajectories", "set_trajectory_recorder", "WORLD_SPEC"]

#: ``model_source`` of :func:`set_trajectory_recorder` by default: the simulation's world's
#: spec (``sim.world.mjcf_root``).
WORLD_SPEC = "world-spec"


def set_trajectory_recorder(
    sim: Any,
    url: str,
    *,
    playback_speed: float = 0.2,
    output_fps: int = 25,
    worlds: Sequence[int] | None = None,
    model_source: Any = WORLD_SPEC,
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
        model_source: The model's portable form to keep beside the archive (see
            :class:`~flyarchive.TrajectoryRecorder`). Default (:data:`WORLD_SPEC`): the
            world's spec, ``sim.world.mjcf_root``; if it cannot be kept (it does not
            compile to ``sim.mj_model``, a file it names is missing), a ``RuntimeWarning``
            says why and only the MJB is kept. None: only the MJB (bound to this MuJoCo
            release). Not made when appending (``mode="a"``): the archive keeps its own.
        **options: More recorder options (``mode``, ``storage_options``, ``chunk_frames``...).

    Returns:
        The recorder, also set as ``sim.recorder``.

    Raises:
        SelectionError: ``worlds`` for a CPU simulation.
        ModelLoadError, LayoutMismatchError: a ``model_source`` given that cannot be kept.
    """
    common = dict(playback_speed=playback_speed, output_fps=output_fps, **options)
    if not hasattr(sim, "mjw_data") and worlds is not None:
        raise SelectionError(
            f"worlds={list(worlds)!r} is for GPU simulations; a flygym Simulation has one world."
        )
    from flyarchive import recorders

    def make(source: Any) -> Any:
        if hasattr(sim, "mjw_data"):
            return recorders.WarpTrajectoryRecorder(url, sim.mj_model, sim.n_worlds,
                                                    worlds=worlds, model_source=source, **common)
        return recorders.TrajectoryRecorder(url, sim.mj_model, source="flygym",
                                            model_source=source, **common)

    if not (isinstance(model_source, str) and model_source == WORLD_SPEC):
        recorder = make(model_source)
    elif options.get("mode") == "a" or getattr(getattr(sim, "world", None), "mjcf_root",
                                                None) is None:
        recorder = make(None)
    else:
        try:
            recorder = make(sim.world.mjcf_root)
        except (ModelLoadError, LayoutMismatchError) as err:
            warnings.warn(
                f"flyarchive keeps only the compiled model (MJB) of {url!r}, bound to this MuJoCo "
                f"release: the world's spec (sim.world.mjcf_root) cannot be kept as its portable "
                f"form ({err}).", RuntimeWarning, stacklevel=2)
            recorder = make(None)
    sim.recorder = recorder
    return recorder
