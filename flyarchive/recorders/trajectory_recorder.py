"""The public :class:`TrajectoryRecorder` (``flyarchive.TrajectoryRecorder``): the record
stage's (:class:`flyarchive.record.cpu_recorder.TrajectoryRecorder`) writing flyarchive's
archives (:data:`~flyarchive.recorders.stored_archives.ARCHIVES`)."""

from __future__ import annotations

from flyarchive.record import cpu_recorder
from flyarchive.recorders.stored_archives import ARCHIVES


class TrajectoryRecorder(cpu_recorder.TrajectoryRecorder):
    __doc__ = cpu_recorder.TrajectoryRecorder.__doc__
    archives = ARCHIVES
