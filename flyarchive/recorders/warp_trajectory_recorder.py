"""The public :class:`WarpTrajectoryRecorder` (``flyarchive.WarpTrajectoryRecorder``): the
record stage's (:class:`flyarchive.record.warp_recorder.WarpTrajectoryRecorder`) writing
flyarchive's archives (:data:`~flyarchive.recorders.stored_archives.ARCHIVES`). This module
imports Warp: the package and ``flyarchive`` load it on first use of the name."""

from __future__ import annotations

from flyarchive.record import warp_recorder
from flyarchive.recorders.stored_archives import ARCHIVES


class WarpTrajectoryRecorder(warp_recorder.WarpTrajectoryRecorder):
    __doc__ = warp_recorder.WarpTrajectoryRecorder.__doc__
    archives = ARCHIVES
