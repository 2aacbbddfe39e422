"""Record: sample simulation state when a frame is due and hand it to the store.

- :mod:`~flyarchive.record.cpu`: :class:`TrajectoryRecorder`, for one or several
  ``mujoco.MjData`` (and flygym's ``Simulation``);
- :mod:`~flyarchive.record.warp`: :class:`WarpTrajectoryRecorder`, for mujoco-warp
  ``Data`` of many worlds on one Warp device (and flygym's ``GPUSimulation``), with its
  device buffers and background writer in :mod:`~flyarchive.record.warp_io`;
- :mod:`~flyarchive.record.common`: what both share (time order, resumed reruns,
  commit when abandoned);
- :mod:`~flyarchive.record.spec`: what is fixed when an archive is created
  (:class:`ArchiveSpec`) and a block of frames to commit (:class:`FrameBlock`): what a
  recorder hands to the store, checked before anything is written;
- :mod:`~flyarchive.record.trajectories`: a recording read back as flygym
  ``RecordedTrajectory`` objects (the recorders' ``trajectory``).

Internal: the public names are re-exported by ``flyarchive``.

Recorders never touch zarr: they write through :class:`flyarchive.store.ArchiveWriter`.
"""
