"""Drivers: run a render plan in this process or on a Dask cluster, per backend.

CPU (OpenGL): (world, frame segment) tasks, each rendered and encoded on its own, then a
join task per (world, camera) that concatenates the segments without re-encoding. Warp
backends: groups of whole videos, balanced by frames, each rendered by
:func:`flyarchive.distribute.warp_pipeline.render_jobs`; where they run is a
:class:`Placement` (:func:`placement`):

- ``"gpu"``: one group per GPU: in this process when one GPU is used (no Dask, no
  second process: the least set-up), else on a local cluster of one worker process
  per GPU (:mod:`flyarchive.distribute.gpus`), or on the workers of the cluster given
  that hold the resource ``GPU`` (passed to ``client.submit`` explicitly: Dask drops
  ``annotate`` resources during graph optimization, dask #7036);
- ``"warp-cpu"``: one group per worker of a local cluster of single-core worker
  processes (one per core), or on the workers of the cluster given.

A group whose worker dies is run again by Dask on another worker; it skips the videos
that its first run finished (they are complete under their final names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flyarchive.distribute.caches import close_thread_renderers
from flyarchive.distribute.cluster import cancel_quietly, connect, scatter_model, task_result
from flyarchive.distribute.diagnostics import progress_bar
from flyarchive.distribute.placement import Placement, placement, runs_here
from flyarchive.distribute.plan import RenderPlan

#: What a driver calls with each finished video's manifest entry.
OnVideo = Callable[[dict[str, Any]], None]

__all__ = ["OnVideo", "run_plan", "run_warp_plan", "runs_here", "placement", "Placement", "task_result",
           "cancel_quietly"]


def run_plan(plan: RenderPlan, blob: bytes, parts: str, *, client: Any = None,
             scheduler: str | None = None, n_workers: int | None = None,
             in_process: bool = False, gpus: Sequence[int] | None = None,
             on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """Render every segment, join every video; returns the manifest entries.

    Args:
        plan: What to render.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (:attr:`flyarchive.video.workspace.RunFolder.url`), which
            the caller holds for the whole run and removes afterwards.
        client, scheduler, n_workers: Where to run (see :class:`connect`).
        in_process: Render in this process.
        gpus: GPUs of this machine to use (backend ``"gpu"``; see :func:`placement`).
        on_video: Called in this process with each video's entry as soon as the video is
            finished under its final name (any thread; it must be quick), so that a render
            stopped later keeps it listed (:class:`flyarchive.video.manifest.ManifestJournal`).

    Raises:
        RenderFailedError: a task failed on the cluster (a worker died, or raised an
            error that is not a flyarchive error); the message names the world.
        Any flyarchive error a task raised (e.g. CorruptArchiveError).
    """
    if plan.options.backend != "cpu":
        return run_warp_plan(plan, blob, parts, client=client, scheduler=scheduler,
                             n_workers=n_workers, in_process=in_process, gpus=gpus,
                             on_video=on_video)
    if in_process:
        return _run_here(plan, blob, parts, on_video or _ignore)
    with connect(client, scheduler, n_workers) as dask_client:
        return _run_dask(plan, blob, parts, dask_client, on_video or _ignore)


def _ignore(entry: dict[str, Any]) -> None:
    pass


def _run_here(plan: RenderPlan, blob: bytes, parts: str, on_video: OnVideo
              ) -> list[dict[str, Any]]:
    """One segment per video (nothing to parallelize here), each video joined as soon as
    it is rendered, so that a stop keeps the videos finished before it."""
    from flyarchive.distribute.cpu_tasks import join_segments, render_segment

    entries = []
    segments = list(plan.segments(None))
    try:
        bar = progress_bar(len(segments), plan.options.progress, what="segments", unit="task",
                           items=segments)
        done: dict[tuple[Any, str], list[str]] = {}
        for job, k0, k1 in segments if bar is None else bar:
            for camera, url in zip(plan.cameras, render_segment(plan, blob, parts, job, k0, k1)):
                done.setdefault((job, camera), []).append(url)
            if k1 < job.stop:
                continue
            for camera in plan.cameras:
                entry = join_segments(plan, parts, job, camera, done.pop((job, camera)))
                if entry is not None:  # None: kept from an earlier render
                    entries.append(entry)
                    on_video(entry)
        return entries
    finally:
        close_thread_renderers()  # free this thread's GL context


def _run_dask(plan: RenderPlan, blob: bytes, parts: str, client: Any, on_video: OnVideo
              ) -> list[dict[str, Any]]:
    """Segments on the cluster; each video's join is submitted as soon as its segments are
    done, so videos finish (and are kept on a stop) while others still render."""
    from distributed import as_completed

    from flyarchive.distribute.cpu_tasks import join_segments, render_segment

    blob_future = scatter_model(client, blob)
    segments = list(plan.segments(len(client.scheduler_info().get("workers", {})) or 1))
    futures = {
        client.submit(render_segment, plan, blob_future, parts, job, k0, k1, pure=False): (job, k0, k1)
        for job, k0, k1 in segments
    }
    left = {job: sum(j == job for j, _, _ in segments) for job in plan.jobs}
    joins: dict[Any, tuple[Any, str]] = {}
    try:
        results: dict[tuple[Any, int], list[str]] = {}
        entries: dict[tuple[Any, str], dict[str, Any]] = {}
        done = as_completed(futures, loop=client.loop)
        bar = progress_bar(len(futures) + len(plan.jobs) * len(plan.cameras),
                           plan.options.progress, what="tasks", unit="task", items=done)
        for future in done if bar is None else bar:
            if future in joins:
                job, camera = joins[future]
                entries[(job, camera)] = task_result(
                    future, f"world {job.world_id}, camera {camera!r} (joining segments)")
                if entries[(job, camera)] is not None:  # None: kept from an earlier render
                    on_video(entries[(job, camera)])
                continue
            job, k0, k1 = futures[future]
            results[(job, k0)] = task_result(future, f"world {job.world_id}, frames {k0}..{k1 - 1}")
            left[job] -= 1
            if left[job]:
                continue
            keys = sorted(k for (j, k) in results if j == job)
            for c, camera in enumerate(plan.cameras):
                join = client.submit(join_segments, plan, parts, job, camera,
                                     [results[(job, k)][c] for k in keys], pure=False)
                joins[join] = (job, camera)
                done.add(join)
        return [e for e in (entries[(job, camera)] for job in plan.jobs for camera in plan.cameras)
                if e is not None]
    except BaseException:
        cancel_quietly(client, [*futures, *joins])
        raise


# ----------------------------------------------------------------------------- Warp backends
def run_warp_plan(plan: Any, blob: bytes, parts: str | None = None, *, client: Any = None,
                  scheduler: str | None = None, n_workers: int | None = None,
                  in_process: bool = False, gpus: Sequence[int] | None = None,
                  on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """Render a plan on the Warp backend of ``plan.options.backend``; the manifest entries.

    Where: :func:`placement`. On ``"gpu"`` every visible GPU is used by default (one
    worker process each, on a local cluster started and stopped here; one GPU renders
    in this process); with a client or scheduler, groups of whole videos go to its
    workers that hold the resource ``GPU`` (start them with ``--resources GPU=1``, one
    per GPU). On ``"warp-cpu"`` render threads in this process (one per core), a local
    cluster of ``n_workers`` single-core worker processes, or the workers of the
    cluster given do.

    Args:
        plan: :class:`flyarchive.distribute.plan.RenderPlan` with a Warp backend.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (see :func:`render_jobs`).
        client: A ``distributed.Client``.
        scheduler: A scheduler address, used when ``client`` is None.
        n_workers: ``"warp-cpu"``: worker processes of a local cluster (0 or 1: in this
            process, one thread; None: one render thread per core in this process).
        in_process: Render in this process (when no client or scheduler is given).
        gpus: CUDA device numbers of the GPUs to use (``"gpu"``, no client or scheduler;
            default: all).
        on_video: Called in this process with each finished video's entry (see
            :func:`run_plan`).

    Returns:
        One entry per (world, camera) in ``plan.jobs`` order, then camera order:
        ``{"world", "camera", "path", "frames", "first_frame", "fps", "size"}``.

    Raises:
        RenderBackendError: no CUDA device for ``"gpu"``, or no worker of the cluster
            offers the ``GPU`` resource.
        RenderOptionsError: ``gpus`` names a GPU that is not visible.
        RenderFailedError: a group failed on a worker (the message names its worlds and
            the worker).
        OutputExistsError, VideoEncodeError, StorageError.
    """
    from flyarchive.distribute import warp_runs

    where = placement(plan.options.backend, len(plan.jobs), client=client, scheduler=scheduler,
                      n_workers=n_workers, in_process=in_process, gpus=gpus)
    if where.where == "here":
        return warp_runs.render_here(plan, blob, parts, where.device, on_video=on_video)
    if where.where == "threads":
        return warp_runs.render_threads(plan, blob, parts, where.n_workers or 1,
                                        on_video=on_video)
    with connect(client, scheduler, where.n_workers,
                 gpu_workers=list(where.gpu_workers) or None) as dask_client:
        return warp_runs.render_on_dask(plan, blob, parts, dask_client,
                                        own_cluster=where.where == "local-gpus",
                                        on_video=on_video)
