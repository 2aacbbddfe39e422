"""The public recorders, bound to flyarchive's archives (an application: it may import
every stage), and their recordings read back.

- :mod:`flyarchive.recorders.stored_archives`: :class:`StoredArchives`, the store behind
  the record stage's sink protocols, and :data:`ARCHIVES`, the one the recorders write;
- :mod:`flyarchive.recorders.trajectory_recorder`: :class:`TrajectoryRecorder` (MuJoCo
  ``MjData``, flygym's ``Simulation``);
- :mod:`flyarchive.recorders.warp_trajectory_recorder`: :class:`WarpTrajectoryRecorder`
  (mujoco-warp ``Data``, flygym's ``GPUSimulation``), loaded on first use of its name (its
  module imports Warp);
- :mod:`flyarchive.recorders.trajectories`: an archive's worlds read back as flygym
  ``RecordedTrajectory`` objects (the recorders' ``.trajectory``,
  ``flyarchive.read_trajectories``).

The record stage's recorders write nowhere on their own (:mod:`flyarchive.record` imports
only the base modules); the bridges of :mod:`flyarchive.interop` use these.
"""

from __future__ import annotations

import importlib
from typing import Any

from flyarchive.recorders.stored_archives import ARCHIVES, StoredArchives
from flyarchive.recorders.trajectory_recorder import TrajectoryRecorder

#: Names loaded on first use, and their modules.
_LAZY = {"WarpTrajectoryRecorder": "flyarchive.recorders.warp_trajectory_recorder"}


def __getattr__(name: str) -> Any:
    """:class:`WarpTrajectoryRecorder` on first use (its module imports Warp)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
