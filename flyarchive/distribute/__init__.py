"""Distribute: render plans run in this process or on a Dask cluster, per backend.

- :mod:`~flyarchive.distribute.api`: :func:`render_videos`, :func:`render_frames`,
  :class:`RenderOptions` (the public entry points);
- :mod:`~flyarchive.distribute.plan`: what to render, checked before any work, cut into
  segments (OpenGL) or batches and groups (Warp);
- :mod:`~flyarchive.distribute.drivers`: where a plan runs (:func:`runs_here`);
- :mod:`~flyarchive.distribute.cluster`: the caller's client, a scheduler's, or a
  LocalCluster started here;
- :mod:`~flyarchive.distribute.cpu_tasks`: OpenGL tasks (segments, joins, frame blocks);
- :mod:`~flyarchive.distribute.warp_pipeline` and :mod:`~flyarchive.distribute.encoders`:
  the Warp pipeline of one process (read, render, encode);
- :mod:`~flyarchive.video.workspace`: run folders, scratch space, publishing;
- :mod:`~flyarchive.distribute.caches`: renderers kept between tasks;
- :mod:`~flyarchive.distribute.diagnostics`: progress bars, :class:`PipelineProfile`.

Nothing here is imported by ``import flyarchive`` (``flyarchive.render_videos`` and
the other names load it on first use).
"""
