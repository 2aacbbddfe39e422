"""Where a Warp render plan runs (the twin of :mod:`flyarchive.distribute.opengl_runs`):
:func:`run_plan` asks :func:`~flyarchive.distribute.placement.placement`, then renders in
this process on one device (:func:`render_here`), on render threads sharing Warp's CPU
device (:func:`render_threads`), or as groups of whole videos, balanced by frames
(:func:`split_groups`), on Dask workers (:func:`render_on_dask`: one group per able worker,
one progress bar for them all). Each group is rendered by
:func:`flyarchive.render.warp.render_jobs`.

- ``"gpu"``: one group per GPU: in this process when one GPU is used (no Dask, no
  second process: the least set-up), else on a local cluster of one worker process
  per GPU (:mod:`flyarchive.distribute.gpus`), or on the workers of the cluster given
  that hold the resource ``GPU`` (passed to ``client.submit`` explicitly: Dask drops
  ``annotate`` resources during graph optimization, dask #7036);
- ``"warp-cpu"``: render threads in this process, or one group per worker of a local
  cluster of single-core worker processes, or of the cluster given.

A group whose worker dies is run again by Dask on another worker; it skips the videos
that its first run finished (they are complete under their final names).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from flyarchive.distribute.cluster import cancel_quietly, connect, scatter_model, task_result
from flyarchive.distribute.placement import placement
from flyarchive.distribute.warm import wait_for_warm_up
from flyarchive.errors import RenderBackendError, RenderFailedError
from flyarchive.render.diagnostics import PipelineProfile, StageTimer, progress_bar
from flyarchive.render.plan import Job, RenderPlan

#: What a run calls with each finished video's manifest entry.
OnVideo = Callable[[dict[str, Any]], None]


def run_plan(plan: RenderPlan, blob: bytes, parts: str | None = None, *, client: Any = None,
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
        plan: What to render, with a Warp backend.
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
            :func:`flyarchive.distribute.opengl_runs.run_plan`).

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
    where = placement(plan.options.backend, len(plan.jobs), client=client, scheduler=scheduler,
                      n_workers=n_workers, in_process=in_process, gpus=gpus)
    if where.where == "here":
        return render_here(plan, blob, parts, where.device, on_video=on_video)
    if where.where == "threads":
        return render_threads(plan, blob, parts, where.n_workers or 1, on_video=on_video)
    with connect(client, scheduler, where.n_workers,
                 gpu_workers=list(where.gpu_workers) or None) as dask_client:
        return render_on_dask(plan, blob, parts, dask_client,
                              own_cluster=where.where == "local-gpus", on_video=on_video)


def split_groups(jobs: Sequence[Job], batch_worlds: int, n_groups: int) -> list[tuple[Job, ...]]:
    """Split jobs, in order, into at most ``n_groups`` groups of whole videos.

    Each group holds about the same number of frames, rounded up to whole batches, so
    only a group's last batch can be partial (a partial batch costs a full one).

    Returns:
        Non-empty tuples of jobs; concatenated, they are ``jobs``.
    """
    ends = np.cumsum([job.n_frames for job in jobs])  # frames up to the end of each job
    total = int(ends[-1]) if len(ends) else 0
    cuts: list[int] = [0]
    for i in range(1, max(1, n_groups)):
        target = round(i * total / n_groups / batch_worlds) * batch_worlds
        cut = int(np.argmin(np.abs(ends - target))) + 1  # jobs before the cut
        if cuts[-1] < cut < len(jobs):
            cuts.append(cut)
    cuts.append(len(jobs))
    return [tuple(jobs[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]


def render_here(plan: RenderPlan, blob: bytes, parts: str | None, device: str, *,
                on_video: Callable[[dict[str, Any]], None] | None = None
                ) -> list[dict[str, Any]]:
    """Every video in this thread, on ``device`` (``"cpu"`` or ``"cuda:k"``); ``on_video``
    gets each finished video's entry (from an encoder thread).

    Raises:
        RenderBackendError: a CUDA device was asked for and Warp sees none.
    """
    from flyarchive.render.warp import render_jobs, warp_device

    wait_for_warm_up()  # Warp is not imported and initialized by two threads at once
    if device.startswith("cuda"):
        warp_device("gpu")  # checks that Warp sees a CUDA device
    return render_jobs(plan, blob, plan.jobs, device, parts=parts, on_video=on_video)


def render_threads(plan: RenderPlan, blob: bytes, parts: str | None, n_threads: int, *,
                   on_video: Callable[[dict[str, Any]], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Every video in this process on Warp's CPU device: groups of whole videos, balanced
    by frames, one per thread, each with its own renderer (kept for the next call).

    Warp's CPU kernels run without the GIL, so the threads render on as many cores
    (each builds its renderer and submits its first batch alone: Warp loads modules on
    first launch, see :func:`~flyarchive.render.warp.render_jobs`). A failed
    group stops the others at their next batch; its error is raised.

    Raises:
        As :func:`flyarchive.render.warp.render_jobs`.
    """
    import contextvars

    from flyarchive.render.warp import batch_worlds_of, render_jobs

    wait_for_warm_up()
    groups = split_groups(plan.jobs, batch_worlds_of(plan.options), n_threads)
    bar = progress_bar(sum(job.n_frames for job in plan.jobs), plan.options.progress)
    failed: list[BaseException] = []
    results: list[list[dict[str, Any]]] = [[] for _ in groups]

    def on_frames(n: int) -> None:
        if failed:
            raise RenderFailedError("Stopped: another group of videos failed.")
        if bar is not None:
            bar.update(n)

    def run(i: int, group: tuple[Job, ...]) -> None:
        try:
            results[i] = render_jobs(plan, blob, group, "cpu", parts=parts,
                                     on_frames=on_frames, slot=i, on_video=on_video)
        except BaseException as err:
            failed.append(err)

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, i, group),
                                name=f"flyarchive-render-{i}", daemon=True)
               for i, group in enumerate(groups)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException as err:  # Ctrl-C: the threads stop at their next batch
        failed.append(err)
        for thread in threads:
            thread.join()
        raise
    finally:
        if bar is not None:
            bar.close()
    if failed:
        raise next((e for e in failed if not isinstance(e, RenderFailedError)), failed[0])
    return [entry for group in results for entry in group]


# ----------------------------------------------------------------------------- on Dask
def render_group(plan: RenderPlan, blob: bytes, jobs: tuple[Job, ...], parts: str | None,
                 topic: str | None, share: tuple[int, int] | None = None,
                 videos_topic: str | None = None
                 ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """A Dask task: one group of whole videos on the worker's Warp device; their manifest
    entries and the worker's stage timings.

    With a ``topic``, frames rendered are reported as events to the client, which shows
    the one progress bar; the worker shows none. ``share`` ``(i, k)``: this worker is
    number ``i`` of ``k`` GPU workers of one host whose cores it was not given; it
    renders on block ``i`` of ``k`` of them (:func:`flyarchive.distribute.gpus.share_of`),
    and as many encoders, for the task. With a ``videos_topic``, each finished video's
    entry is reported as an event to the client, which lists it in the manifest at once
    (a stop keeps it).

    When Dask runs the task again (its first worker died), the videos that the first
    run finished are complete under their final names: without ``overwrite`` they are
    kept and not rendered again.
    """
    from flyarchive.render.warp import render_jobs, warp_device

    on_frames = on_video = None
    if topic is not None or videos_topic is not None:
        from distributed import get_worker

        worker = get_worker()
        if topic is not None:
            on_frames = lambda n: worker.log_event(topic, n)  # noqa: E731
        if videos_topic is not None:
            on_video = lambda entry: worker.log_event(videos_topic, entry)  # noqa: E731
    quiet = dataclasses.replace(plan, options=dataclasses.replace(plan.options, progress=False))
    done = _finished_before(plan, jobs, parts)
    todo = tuple(job for job in jobs if job not in done)
    entries: list[dict[str, Any]] = []
    with _cores(share), PipelineProfile() as profile:
        if todo:
            entries = render_jobs(quiet, blob, todo, warp_device(plan.options.backend),
                                  parts=parts, on_frames=on_frames, on_video=on_video)
    if done:
        entries = _in_job_order(plan, jobs, entries, done)
        if on_frames is not None:
            on_frames(sum(job.n_frames for job in done))
    return entries, profile.results


def _finished_before(plan: RenderPlan, jobs: tuple[Job, ...], parts: str | None) -> set[Job]:
    """Jobs of this group whose videos an earlier run of the task finished (every camera).

    The first run of a group leaves a marker in the run's parts folder; only a later
    run, and only without ``overwrite`` (then no video of the plan existed when the run
    began), looks for finished videos.
    """
    if parts is None:
        return set()
    from flyarchive.video.workspace import RunFolder, filesystem

    fs, path = filesystem(parts, plan.out_storage_options)
    first = jobs[0]  # groups are disjoint runs of jobs: their first jobs differ
    marker = f"{path}/groups/{first.world_id}-{first.start}"
    if not fs.exists(marker):
        if not fs.exists(path):  # the run was given up (an error elsewhere): write nothing
            raise RunFolder.given_up(parts)
        fs.makedirs(f"{path}/groups", exist_ok=True)
        fs.pipe_file(marker, b"")
        return set()
    if plan.options.overwrite:
        return set()
    out_fs = filesystem(plan.out, plan.out_storage_options)[0]
    return {job for job in jobs
            if all(out_fs.exists(filesystem(url, plan.out_storage_options)[1])
                   for c in plan.cameras for url in plan.output_urls(job, c).values())}


def _in_job_order(plan: RenderPlan, jobs: tuple[Job, ...], rendered: list[dict[str, Any]],
                  done: set[Job]) -> list[dict[str, Any]]:
    from flyarchive.video.manifest import video_entry

    made = {e["path"]: e for e in rendered}
    expected = [video_entry(plan, job, camera, plan.output_urls(job, camera))
                for job in jobs for camera in plan.cameras]
    return [made.get(entry["path"], entry) for entry in expected]


@contextmanager
def _cores(share: tuple[int, int] | None) -> Iterator[None]:
    """Run this process on its share of the host's cores for the block (see
    :func:`render_group`); nothing when ``share`` is None or the process is pinned."""
    from flyarchive.distribute import gpus

    if share is None or share[1] <= 1 or not hasattr(os, "sched_getaffinity"):
        yield
        return
    before = gpus.usable_cpus()
    if len(before) < (os.cpu_count() or 1):  # already given cores: keep them
        yield
        return
    gpus.pin_process(gpus.share_of(before, *share))
    try:
        yield
    finally:
        gpus.pin_process(before)


def render_on_dask(plan: RenderPlan, blob: bytes, parts: str | None, client: Any, *,
                   own_cluster: bool = False,
                   on_video: Callable[[dict[str, Any]], None] | None = None
                   ) -> list[dict[str, Any]]:
    """One group of whole videos per able worker (``"gpu"``: those with the resource
    ``GPU``), balanced by frames; the manifest entries in plan order.

    ``own_cluster``: the workers are flyarchive's own, each given its cores; otherwise
    GPU workers that share a host split its cores (:func:`render_group`). ``on_video`` gets
    each finished video's entry as the workers report it (in the client's event loop).

    Raises:
        RenderBackendError: no worker offers the resource ``GPU`` (``"gpu"``).
        RenderFailedError: a group failed (the message names its worlds and the worker).
    """
    from flyarchive.render.warp import batch_worlds_of

    workers = client.scheduler_info().get("workers", {})
    resources = {"GPU": 1} if plan.options.backend == "gpu" else {}
    able = [a for a, w in workers.items()
            if all(w.get("resources", {}).get(k, 0) >= v for k, v in resources.items())]
    if not able:
        raise RenderBackendError(
            f"None of the cluster's {len(workers)} worker(s) offers the resource 'GPU', so "
            f"backend={plan.options.backend!r} batches cannot be placed. Start workers with "
            "`dask worker SCHEDULER --nthreads 1 --resources GPU=1` (one per GPU), or pass "
            "no client to render on this machine's GPUs."
        )
    groups = split_groups(plan.jobs, batch_worlds_of(plan.options), len(able))
    shares = {} if own_cluster else _host_shares(able, workers)
    blob_future = scatter_model(client, blob)
    # One group per worker, placed explicitly: the scheduler would put the first tasks
    # together on the worker holding the data (every worker holds the model).
    timer = StageTimer()  # the profiles active here get the workers' timings
    bar = progress_bar(sum(job.n_frames for job in plan.jobs), plan.options.progress)
    topic = videos_topic = None
    if bar is not None:
        topic = f"flyarchive-progress-{os.getpid()}-{time.monotonic_ns()}"
        client.subscribe_topic(topic, lambda event: bar.update(event[1]))
    if on_video is not None:
        videos_topic = f"flyarchive-videos-{os.getpid()}-{time.monotonic_ns()}"
        client.subscribe_topic(videos_topic, lambda event: on_video(event[1]))
    placed = [able[i % len(able)] for i in range(len(groups))]
    futures = [
        client.submit(render_group, plan, blob_future, group, parts, topic, shares.get(worker),
                      videos_topic, resources=resources or None, workers=[worker],
                      allow_other_workers=True, pure=False)
        for group, worker in zip(groups, placed)
    ]
    try:
        entries: list[dict[str, Any]] = []
        for future, group, worker in zip(futures, groups, placed):
            what = f"worlds {_worlds(group)} (placed on worker {worker})"
            done, stages = task_result(future, what)
            entries.extend(done)
            timer.add_results(stages)
        return entries
    except BaseException:
        cancel_quietly(client, futures)
        raise
    finally:
        if videos_topic is not None:
            client.unsubscribe_topic(videos_topic)
        if bar is not None:
            client.unsubscribe_topic(topic)
            bar.close()


def _worlds(group: Sequence[Job]) -> str:
    ids = [job.world_id for job in group]
    return str(ids) if len(ids) <= 8 else f"[{ids[0]}, {ids[1]}, ... {ids[-1]}] ({len(ids)})"


def _host_shares(able: list[str], workers: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(i, k)`` per worker: its number among the ``k`` able single-thread workers of its
    host (workers with more threads run other work too: left alone)."""
    by_host: dict[str, list[str]] = {}
    for address in able:
        info = workers[address]
        if info.get("nthreads", 1) == 1:
            by_host.setdefault(str(info.get("host")), []).append(address)
    return {a: (i, len(group)) for group in by_host.values() for i, a in enumerate(group)}
