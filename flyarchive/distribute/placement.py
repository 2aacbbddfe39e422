"""Where a render plan runs (:func:`placement`), decided from the backend, the number of
videos and the machine, before anything heavy is imported: the command line asks it
once, and starts the local cluster it names early
(:func:`flyarchive.distribute.cluster.local_cluster`), whose client it passes to the render.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """Where a plan renders.

    Attributes:
        where: ``"here"`` (this process, one thread), ``"threads"`` (this process,
            ``n_workers`` render threads: on Warp's CPU device, or OpenGL contexts),
            ``"local-gpus"`` (a local cluster of one worker process per GPU of
            ``gpu_workers``), ``"local"`` (a local cluster of ``n_workers`` single-core
            worker processes; None: one per core) or ``"cluster"`` (the client or
            scheduler given).
        device: The Warp device of ``"here"`` (``"cuda:1"``, ``"cpu"``); None on OpenGL.
        n_workers: Render threads of ``"threads"``, worker processes of ``"local"``.
        gpu_workers: The :class:`~flyarchive.distribute.gpus.GpuWorker` s of ``"local-gpus"``.
    """

    where: str
    device: str | None = None
    n_workers: int | None = None
    gpu_workers: tuple[Any, ...] = ()


def placement(backend: str, n_videos: int, *, client: Any = None, scheduler: str | None = None,
              n_workers: int | None = None, in_process: bool = False,
              gpus: Sequence[int] | None = None, visible: Sequence[Any] | None = None,
              cpus: Sequence[int] | None = None) -> Placement:
    """Where :func:`flyarchive.distribute.api.run_plan` renders a plan of ``n_videos`` (world) videos.

    - a client or scheduler given: there;
    - ``"opengl"``: in this process, one thread, with ``in_process``; a local cluster of
      ``n_workers`` single-core worker processes when ``n_workers`` is given; by default
      one render thread per core in this process, each with its own GL context (MuJoCo
      draws without the GIL; a 2-core VM, NeuroMechFly, 2 videos: a local cluster's
      worker processes took seconds to start before their first frame), one thread on
      one core, and a local cluster of one worker per core where the GL backend cannot
      make contexts in threads (``MUJOCO_GL=glfw``, :func:`threads_make_contexts`);
    - ``"gpu"``: the GPUs of ``gpus`` (default: every visible GPU, found without a CUDA
      context here: :func:`flyarchive.distribute.gpus.visible_gpus`; ``visible``
      replaces that list), at most one per video: one GPU (or ``in_process``) renders
      in this process, on that GPU; several, on a local cluster of one worker process
      per GPU, each with its share of ``cpus`` (default: this process's cores);
    - ``"warp-cpu"``: by default one render thread per core (at most one per video) in
      this process: Warp's CPU kernels release the GIL, and threads share the imports,
      the loaded kernels and the model (a 2-core VM, NeuroMechFly: a whole
      ``flyarchive render`` of 2 videos took 16.8 s on a local cluster of 2 worker
      processes, most of it their start); ``n_workers`` >= 2: a local cluster of that
      many single-core worker processes; in this process, one thread, when
      ``n_workers`` is 0 or 1, with ``in_process``, one core or one video.

    Raises:
        RenderBackendError: ``"gpu"`` and no GPU is visible.
        RenderOptionsError: ``gpus`` names a GPU that is not visible, is empty or repeats one.
    """
    if client is not None or scheduler is not None:
        return Placement("cluster")
    if backend not in ("gpu", "warp-cpu"):  # OpenGL
        cores = os.cpu_count() or 1
        if in_process:
            return Placement("here")
        if n_workers is not None or not threads_make_contexts():
            return Placement("local", n_workers=n_workers)
        return Placement("threads", n_workers=cores) if cores > 1 else Placement("here")
    if backend == "gpu":
        from flyarchive.distribute import gpus as gpu_placement

        shown = gpu_placement.visible_gpus() if visible is None else list(visible)
        chosen = gpu_placement.choose_gpus(gpus, shown)[:max(1, n_videos)]
        if in_process or len(chosen) == 1:
            return Placement("here", device=f"cuda:{chosen[0].ordinal}")
        workers = gpu_placement.gpu_workers(chosen, cpus=cpus)
        return Placement("local-gpus", gpu_workers=tuple(workers))
    n = (os.cpu_count() or 1) if n_workers is None else n_workers
    if in_process or n <= 1 or n_videos <= 1:
        return Placement("here", device="cpu")
    if n_workers is None:
        return Placement("threads", device="cpu", n_workers=min(n, n_videos))
    return Placement("local", n_workers=n)


def threads_make_contexts() -> bool:
    """Whether render threads can make OpenGL contexts of their own: the headless backends
    (EGL, OSMesa; :func:`flyarchive.config.gl_backend`), not GLFW (whose windows, and so
    contexts, are made on the main thread only) nor another platform's default."""
    from flyarchive.config import gl_backend

    return gl_backend() in ("egl", "osmesa")


def runs_here(backend: str, n_videos: int, *, client: Any = None, scheduler: str | None = None,
              n_workers: int | None = None, in_process: bool = False,
              gpus: Sequence[int] | None = None, visible: Sequence[Any] | None = None) -> bool:
    """Whether :func:`flyarchive.distribute.api.run_plan` renders in this process rather than on Dask
    (:func:`placement`; ``visible`` replaces the GPUs found on this machine)."""
    where = placement(backend, n_videos, client=client, scheduler=scheduler,
                      n_workers=n_workers, in_process=in_process, gpus=gpus, visible=visible)
    return where.where in ("here", "threads")
