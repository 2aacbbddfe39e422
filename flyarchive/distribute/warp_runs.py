"""Warp render plans on Dask workers (the backends ``"gpu"`` and ``"warp-cpu"``): groups of
whole videos, balanced by frames (:func:`flyarchive.render.plan.split_groups`), one per able
worker (:func:`render_on_dask`, one progress bar for them all), each rendered there by
:func:`render_group` through :func:`flyarchive.render.warp_pipeline.render_jobs`. Whether a plan
runs here or on Dask is :func:`flyarchive.distribute.placement.placement`'s choice, made
in :func:`flyarchive.distribute.api.render_videos`; in this process it renders through
:mod:`flyarchive.render.warp_pipeline` alone.

- ``"gpu"``: one group per GPU worker: of a local cluster of one worker process per GPU
  (:mod:`flyarchive.distribute.gpus`), or of the cluster given, those that hold the
  resource ``GPU`` (passed to ``client.submit`` explicitly: Dask drops ``annotate``
  resources during graph optimization, dask #7036);
- ``"warp-cpu"``: one group per worker of a local cluster of single-core worker
  processes, or of the cluster given.

A group whose worker dies is run again by Dask on another worker; it skips the videos
that its first run finished (they are complete under their final names).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flyarchive.models.shipping import scatter_model
from flyarchive.distribute.cluster import cancel_quietly, task_result
from flyarchive.errors import RenderBackendError
from flyarchive.render.diagnostics import PipelineProfile, StageTimer, progress_bar
from flyarchive.render.plan import Job, OnVideo, RenderPlan, split_groups


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
    from flyarchive.render.warp_pipeline import render_jobs, warp_device

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
                   own_cluster: bool = False, on_video: OnVideo | None = None
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
    from flyarchive.render.warp_pipeline import batch_worlds_of

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
