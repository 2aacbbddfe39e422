"""Where an OpenGL render plan runs (the twin of :mod:`flyarchive.distribute.warp_runs`):
(world, frame segment) tasks (:func:`flyarchive.render.opengl.render_segment`), each
rendered and encoded on its own, then a join task per (world, camera)
(:func:`~flyarchive.render.opengl.join_segments`) that concatenates the segments without
re-encoding; in this process (one segment per video), or on a Dask cluster
(:class:`~flyarchive.distribute.cluster.connect`: the caller's client or cluster, a
scheduler's, or a local cluster of one single-core worker process per core).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flyarchive.distribute.cluster import cancel_quietly, connect, scatter_model, task_result
from flyarchive.render.diagnostics import progress_bar
from flyarchive.render.plan import Job, RenderPlan
from flyarchive.render.renderers import close_thread_renderers

#: What a run calls with each finished video's manifest entry.
OnVideo = Callable[[dict[str, Any]], None]


def run_plan(plan: RenderPlan, blob: bytes, parts: str, *, client: Any = None,
             scheduler: str | None = None, n_workers: int | None = None,
             in_process: bool = False, on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """Render every segment, join every video; returns the manifest entries.

    Args:
        plan: What to render, with backend ``"opengl"``.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (:attr:`flyarchive.video.workspace.RunFolder.url`), which
            the caller holds for the whole run and removes afterwards.
        client, scheduler, n_workers: Where to run (see :class:`connect`).
        in_process: Render in this process.
        on_video: Called in this process with each video's entry as soon as the video is
            finished under its final name (any thread; it must be quick), so that a render
            stopped later keeps it listed (:class:`flyarchive.video.manifest.ManifestJournal`).

    Raises:
        RenderFailedError: a task failed on the cluster (a worker died, or raised an
            error that is not a flyarchive error); the message names the world.
        Any flyarchive error a task raised (e.g. CorruptArchiveError).
    """
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
    from flyarchive.render.opengl import join_segments, render_segment

    entries = []
    segments = list(plan.segments(None))
    try:
        bar = progress_bar(len(segments), plan.options.progress, what="segments", unit="task",
                           items=segments)
        done: dict[tuple[Job, str], list[str]] = {}
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

    from flyarchive.render.opengl import join_segments, render_segment

    blob_future = scatter_model(client, blob)
    segments = list(plan.segments(len(client.scheduler_info().get("workers", {})) or 1))
    futures = {
        client.submit(render_segment, plan, blob_future, parts, job, k0, k1, pure=False): (job, k0, k1)
        for job, k0, k1 in segments
    }
    left = {job: sum(j == job for j, _, _ in segments) for job in plan.jobs}
    joins: dict[Any, tuple[Job, str]] = {}
    try:
        results: dict[tuple[Job, int], list[str]] = {}
        entries: dict[tuple[Job, str], dict[str, Any]] = {}
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
