"""Drivers: run a render plan in this process or on a Dask cluster, per backend.

CPU (OpenGL): (world, frame segment) tasks, each rendered and encoded on its own, then a
join task per (world, camera) that concatenates the segments without re-encoding. Warp
backends: groups of whole videos, one per worker, each rendered by
:func:`flyarchive.distribute.warp_pipeline.render_jobs`; for ``"gpu"`` on workers that
hold the resource ``GPU`` (passed to ``client.submit`` explicitly: Dask drops
``annotate`` resources during graph optimization, dask #7036).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from flyarchive.distribute.caches import close_thread_renderers
from flyarchive.distribute.cluster import connect, scatter_model
from flyarchive.distribute.cpu_tasks import join_segments, render_segment
from flyarchive.distribute.diagnostics import PipelineProfile, StageTimer, progress_bar
from flyarchive.distribute.plan import RenderPlan, split_groups
from flyarchive.distribute.warp_pipeline import batch_worlds_of, render_jobs, warp_device
from flyarchive.errors import FlyarchiveError, RenderBackendError, RenderFailedError

__all__ = ["run_plan", "run_warp_plan", "runs_here", "task_result", "cancel_quietly"]


def run_plan(plan: RenderPlan, blob: bytes, parts: str, *, client: Any = None,
             scheduler: str | None = None, n_workers: int | None = None,
             in_process: bool = False) -> list[dict[str, Any]]:
    """Render every segment, join every video; returns the manifest entries.

    Args:
        plan: What to render.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (:attr:`flyarchive.video.workspace.RunFolder.url`), which
            the caller holds for the whole run and removes afterwards.
        client, scheduler, n_workers: Where to run (see :class:`connect`).
        in_process: Render in this process.

    Raises:
        RenderFailedError: a task failed on the cluster (a worker died, or raised an
            error that is not a flyarchive error); the message names the world.
        Any flyarchive error a task raised (e.g. CorruptArchiveError).
    """
    if plan.options.backend != "cpu":
        return run_warp_plan(plan, blob, parts, client=client, scheduler=scheduler,
                             n_workers=n_workers, in_process=in_process)
    if in_process:
        return _run_here(plan, blob, parts)
    with connect(client, scheduler, n_workers) as dask_client:
        return _run_dask(plan, blob, parts, dask_client)


def _run_here(plan: RenderPlan, blob: bytes, parts: str) -> list[dict[str, Any]]:
    done: dict[tuple[Any, str], list[str]] = {}
    segments = list(plan.segments(None))  # nothing to parallelize here: whole videos
    try:
        bar = progress_bar(len(segments), plan.options.progress, what="segments", unit="task",
                           items=segments)
        for job, k0, k1 in segments if bar is None else bar:
            for camera, url in zip(plan.cameras, render_segment(plan, blob, parts, job, k0, k1)):
                done.setdefault((job, camera), []).append(url)
        return [join_segments(plan, parts, job, camera, urls) for (job, camera), urls in done.items()]
    finally:
        close_thread_renderers()  # free this thread's GL context


def task_result(future: Any, what: str) -> Any:
    """The result of a Dask future; a failure that is not a flyarchive error (a worker
    that died, an unexpected exception) becomes a :class:`RenderFailedError` naming
    ``what`` (e.g. ``"world 3, frames 0..99"``)."""
    try:
        return future.result()
    except FlyarchiveError:
        raise
    except Exception as err:  # KilledWorker names the last worker that ran the task
        raise RenderFailedError(
            f"Rendering {what} failed on the Dask cluster ({type(err).__name__}: {err}) "
            "No video of it was written under its final name. Read that worker's log for "
            "the cause (memory limit, crash), then render again."
        ) from err


def _run_dask(plan: RenderPlan, blob: bytes, parts: str, client: Any) -> list[dict[str, Any]]:
    from distributed import as_completed

    blob_future = scatter_model(client, blob)
    segments = list(plan.segments(len(client.scheduler_info().get("workers", {})) or 1))
    futures = {
        client.submit(render_segment, plan, blob_future, parts, job, k0, k1, pure=False): (job, k0, k1)
        for job, k0, k1 in segments
    }
    joins: dict[Any, tuple[Any, str]] = {}
    try:
        results: dict[tuple[Any, int], list[str]] = {}
        done = as_completed(futures, loop=client.loop)
        bar = progress_bar(len(futures), plan.options.progress, what="segments", unit="task",
                           items=done)
        for future in done if bar is None else bar:
            job, k0, k1 = futures[future]
            what = f"world {job.world_id}, frames {k0}..{k1 - 1}"
            results[(job, k0)] = task_result(future, what)
        for job in plan.jobs:
            keys = sorted(k0 for (j, k0) in results if j == job)
            for c, camera in enumerate(plan.cameras):
                future = client.submit(join_segments, plan, parts, job, camera,
                                       [results[(job, k0)][c] for k0 in keys], pure=False)
                joins[future] = (job, camera)
        return [task_result(f, f"world {job.world_id}, camera {camera!r} (joining segments)")
                for f, (job, camera) in joins.items()]
    except BaseException:
        cancel_quietly(client, [*futures, *joins])
        raise


def cancel_quietly(client: Any, futures: list[Any]) -> None:
    """Cancel what is left of a failed or interrupted run (best effort)."""
    try:
        client.cancel(futures)
    except Exception:
        pass


def run_warp_plan(plan: Any, blob: bytes, parts: str | None = None, *, client: Any = None,
                  scheduler: str | None = None, n_workers: int | None = None,
                  in_process: bool = False) -> list[dict[str, Any]]:
    """Render a plan on the Warp backend of ``plan.options.backend``; the manifest entries.

    ``"gpu"``: without ``client`` and ``scheduler`` everything runs in this process (one
    process drives one GPU); with either, groups of whole videos go to Dask workers
    that hold the resource ``GPU`` (start them with ``--resources GPU=1``, one per GPU).

    ``"warp-cpu"``: Warp runs a CPU kernel on one core, so by default groups of whole
    videos go to a LocalCluster of ``n_workers`` single-core worker processes (one per
    core), or to the workers of ``client`` / ``scheduler``; ``in_process=True`` (or a
    single core) renders here.

    Args:
        plan: :class:`flyarchive.distribute.plan.RenderPlan` with a Warp backend.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (see :func:`render_jobs`).
        client: A ``distributed.Client``.
        scheduler: A scheduler address, used when ``client`` is None.
        n_workers: Worker processes of the LocalCluster (``"warp-cpu"`` only).
        in_process: Render in this process (when no client or scheduler is given).

    Returns:
        One entry per (world, camera) in ``plan.jobs`` order, then camera order:
        ``{"world", "camera", "path", "frames", "first_frame", "fps", "size"}``.

    Raises:
        RenderBackendError: no CUDA device for ``"gpu"`` here, or no worker of the
            cluster offers the ``GPU`` resource.
        RenderFailedError: a group failed on a worker (the message names its worlds).
        OutputExistsError, VideoEncodeError, StorageError.
    """
    if runs_here(plan.options.backend, len(plan.jobs), client=client, scheduler=scheduler,
                 n_workers=n_workers, in_process=in_process):
        return render_jobs(plan, blob, plan.jobs, warp_device(plan.options.backend), parts=parts)
    with connect(client, scheduler, n_workers) as dask_client:
        return _run_warp_dask(plan, blob, parts, dask_client)


def runs_here(backend: str, n_videos: int, *, client: Any = None, scheduler: str | None = None,
              n_workers: int | None = None, in_process: bool = False) -> bool:
    """Whether :func:`run_warp_plan` renders in this process rather than on Dask."""
    if client is not None or scheduler is not None:
        return False
    n = n_workers if n_workers is not None else (os.cpu_count() or 1)
    return backend == "gpu" or in_process or n <= 1 or n_videos <= 1


def _run_on_worker(plan: Any, blob: bytes, jobs: tuple[Any, ...], parts: str | None,
                   topic: str | None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """A Dask task: one group of videos on the worker's Warp device (checked there);
    their manifest entries and the worker's stage timings.

    With a ``topic``, frames rendered are reported as events to the client, which shows
    the one progress bar; the worker shows none.
    """
    on_frames = None
    if topic is not None:
        from distributed import get_worker

        worker = get_worker()
        on_frames = lambda n: worker.log_event(topic, n)  # noqa: E731
    quiet = dataclasses.replace(plan, options=dataclasses.replace(plan.options, progress=False))
    with PipelineProfile() as profile:
        entries = render_jobs(quiet, blob, jobs, warp_device(plan.options.backend), parts=parts,
                              on_frames=on_frames)
    return entries, profile.results


def _run_warp_dask(plan: Any, blob: bytes, parts: str | None, client: Any) -> list[dict[str, Any]]:
    workers = client.scheduler_info().get("workers", {})
    resources = {"GPU": 1} if plan.options.backend == "gpu" else {}
    able = [a for a, w in workers.items()
            if all(w.get("resources", {}).get(k, 0) >= v for k, v in resources.items())]
    if not able:
        raise RenderBackendError(
            f"None of the cluster's {len(workers)} worker(s) offers the resource 'GPU', so "
            f"backend={plan.options.backend!r} batches cannot be placed. Start workers with "
            "`dask worker SCHEDULER --nthreads 1 --resources GPU=1` (one per GPU), or pass "
            "no client to render in this process."
        )
    groups = split_groups(plan.jobs, batch_worlds_of(plan.options), len(able))
    blob_future = scatter_model(client, blob)
    # One group per worker, placed explicitly: the scheduler would put the first tasks
    # together on the worker holding the data (every worker holds the model).
    timer = StageTimer()  # the profiles active here get the workers' timings
    bar = progress_bar(sum(job.n_frames for job in plan.jobs), plan.options.progress)
    topic = None
    if bar is not None:
        topic = f"flyarchive-progress-{os.getpid()}-{time.monotonic_ns()}"
        client.subscribe_topic(topic, lambda event: bar.update(event[1]))
    futures = [
        client.submit(_run_on_worker, plan, blob_future, group, parts, topic,
                      resources=resources or None, workers=[able[i % len(able)]],
                      allow_other_workers=True, pure=False)
        for i, group in enumerate(groups)
    ]
    try:
        entries: list[dict[str, Any]] = []
        for future, group in zip(futures, groups):
            done, stages = task_result(future, f"worlds {[job.world_id for job in group]}")
            entries.extend(done)
            timer.add_results(stages)
        return entries
    except BaseException:
        cancel_quietly(client, futures)
        raise
    finally:
        if bar is not None:
            client.unsubscribe_topic(topic)
            bar.close()
