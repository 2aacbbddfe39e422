"""Render: the pipelines, how one process turns an archive into videos: states read from
the archive, frames drawn by the renderers of :mod:`flyarchive.replay`, encoded by
:mod:`flyarchive.video`. Where that work runs (this process, a local cluster, a given
scheduler, GPUs) is decided by :mod:`flyarchive.distribute`; nothing here imports it.

The two pipelines, side by side, each read states, render, encode, and each renders a
whole plan in this process:

- :mod:`flyarchive.render.opengl_pipeline`: backend ``"opengl"``: segments of a world's
  frames read, rendered one frame at a time (overlays and mosaics composed on the host), encoded, and
  joined without re-encoding (every video of a plan in this thread: ``render_here``; on a
  Dask cluster, as tasks of :mod:`flyarchive.distribute.api`);
- :mod:`flyarchive.render.warp_pipeline`: backends ``"gpu"`` and ``"warp-cpu"``: batches of states
  read ahead, rendered on the device, handed to :mod:`flyarchive.render.encoders` (one
  ffmpeg per video, fed by encoder threads); in this thread (``render_jobs``) or on
  render threads sharing Warp's CPU device (``render_threads``).

What they share:

- :mod:`flyarchive.render.options`: what is rendered, :class:`RenderOptions`;
- :mod:`flyarchive.render.plan`: the plan (:class:`RenderPlan`, its jobs, :class:`Batch`
  es of :class:`Piece` s, groups of whole videos), checked before any work;
- :mod:`flyarchive.render.output_plan`: depth and segmentation maps, mosaics and overlays,
  checked and planned;
- :mod:`flyarchive.render.resume`: the plan of what a stopped render left to do;
- :mod:`flyarchive.render.renderer_cache`: what a process keeps between tasks: its renderers
  (one cache for every backend) and the archives it reads;
- :mod:`flyarchive.render.frame_blocks`: blocks of frames of :func:`flyarchive.render_frames`;
- :mod:`flyarchive.render.diagnostics`: progress bars, :class:`PipelineProfile`;
- :mod:`flyarchive.render.threads`: render threads of this process, run and stopped
  together.

Internal: the public names are re-exported by ``flyarchive`` (``RenderOptions``,
``PipelineProfile``); ``import flyarchive`` imports none of this.
"""
