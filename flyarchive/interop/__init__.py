"""Bridges to other projects' models and formats.

- :mod:`flyarchive.interop.nmf`: NeuroMechFly (flygym 2.1) on flat ground with a
  tracking camera, walking from flygym's bundled recorded fly kinematics; used by
  ``flyarchive demo``, benchmarks and tests. Needs ``pip install 'flyarchive[flygym]'``.
- :mod:`flyarchive.interop.flygym_sim`: flyarchive's recorders as ``sim.recorder`` of
  flygym 2.1 simulations; archives read back as flygym ``RecordedTrajectory`` objects.
- :mod:`flyarchive.interop.flygym_npz`: flygym ``RecordedTrajectory`` ``.npz`` files.

These three are public (users call them by module); internal:

- :mod:`flyarchive.interop.npz_export`: worlds of an archive out as flygym ``.npz`` files
  (``flyarchive export-npz``);
- :mod:`flyarchive.interop.poses`: positions out as ``movement`` poses datasets and NWB
  files with ``ndx-pose`` (``flyarchive export-poses``);
- :mod:`flyarchive.interop.nwb`: the NWB files: poses, joint angles, leg phases, world
  variables and the lab's metadata (checked; YAML), one file per world.

An archive's worlds read back as flygym ``RecordedTrajectory`` objects are the recorders'
(:mod:`flyarchive.recorders.trajectories`): the bridges import the recorders, never the
other way round. Nothing here is imported by ``import flyarchive``.
"""
