"""Distribute: where render work runs. How one process renders is :mod:`flyarchive.render`'s.

- :mod:`flyarchive.distribute.api`: :func:`render_videos` (the public entry point): the
  archive opened once, the plan made, run where it belongs: in this process (through
  :mod:`flyarchive.render` alone), or on a Dask cluster (OpenGL: segments, then joins);
- :mod:`flyarchive.distribute.frames`: :func:`render_frames` (the public entry point of
  lazy frames);
- :mod:`flyarchive.distribute.placement`: where a plan runs, decided from the backend,
  the videos and the machine;
- :mod:`flyarchive.distribute.warp_runs`: a Warp plan on Dask workers, groups of whole
  videos, one per worker;
- :mod:`flyarchive.distribute.cluster`: the caller's client or cluster, a scheduler's, or
  a LocalCluster started here (:func:`~flyarchive.distribute.cluster.local_cluster`: the
  command line starts it early and passes it on);
- :mod:`flyarchive.distribute.gpus`: the GPUs of this machine, one worker per GPU with
  its share of the cores;
- :mod:`flyarchive.distribute.worker_setup`: the preload of flyarchive's worker processes;
- :mod:`flyarchive.distribute.warm`: Warp imported and initialized early, beside the
  archive's opening.

Internal: the public names are re-exported by ``flyarchive``; ``import flyarchive``
imports none of this (``flyarchive.render_videos`` loads it on first use).
"""
