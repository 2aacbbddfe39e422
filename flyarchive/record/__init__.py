"""Record: sample simulation state when a frame is due and hand it to the store.

- :mod:`~flyarchive.record.cpu_recorder`: :class:`TrajectoryRecorder`, for one or several
  ``mujoco.MjData`` (and flygym's ``Simulation``);
- :mod:`~flyarchive.record.warp_recorder`: :class:`WarpTrajectoryRecorder`, for mujoco-warp
  ``Data`` of many worlds on one Warp device (and flygym's ``GPUSimulation``), with its
  device buffers and background writer in :mod:`~flyarchive.record.warp_io`;
- :mod:`~flyarchive.record.common`: what both share (time order, resumed reruns,
  commit when abandoned);
- :mod:`~flyarchive.record.sink`: what a recorder needs of the archives it writes
  (protocols the store implements; :mod:`flyarchive.recorders` binds the public
  recorders to the store).

Internal: the public names are re-exported by ``flyarchive``.

Recorders never touch zarr, and import only the base modules: they build an
:class:`~flyarchive.archive_spec.ArchiveSpec` (a base module, read by the store too) and
hand :class:`~flyarchive.archive_spec.FrameBlock` s to a sink
(:class:`flyarchive.store.ArchiveWriter`, given to them by :mod:`flyarchive.recorders`).
"""
