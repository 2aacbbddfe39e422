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
    - ``"opengl"``: in this process, one thread, with ``in_process`` or on one core;
      otherwise a local cluster of ``n_workers`` single-core worker processes (None: one
      per core). Render threads of this process, one GL context each, do not scale:
      two threads drawing NeuroMechFly with ``mujoco.Renderer`` on the 2-core VM gave
      6.9 frames/s against one thread's 6.3, and ``flyarchive render`` of 2 x 250
      frames ran at 9.3 frames/s on two render threads against 16.1 on a local cluster
      of two worker processes, start-up included (``bench_cpu_replay.py``, idle);
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
        if in_process or (n_workers is None and cores <= 1):
            return Placement("here")
        return Placement("local", n_workers=n_workers)
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


def runs_here(backend: str, n_videos: int, *, client: Any = None, scheduler: str | None = None,
              n_workers: int | None = None, in_process: bool = False,
              gpus: Sequence[int] | None = None, visible: Sequence[Any] | None = None) -> bool:
    """Whether :func:`flyarchive.distribute.api.run_plan` renders in this process rather than on Dask
    (:func:`placement`; ``visible`` replaces the GPUs found on this machine)."""
    where = placement(backend, n_videos, client=client, scheduler=scheduler,
                      n_workers=n_workers, in_process=in_process, gpus=gpus, visible=visible)
    return where.where in ("here", "threads")
