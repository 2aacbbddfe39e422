"""Run render plans on Dask (or in this process): the only place stages meet at scale.

Tasks carry plain values: the archive URL, MJB model bytes (scattered once), frame
ranges. Each worker process keeps one opened archive and one renderer per model,
cameras and size. CPU tasks are (world, frame segment) pieces, each rendered and
encoded on its own; a join task per (world, camera) concatenates the segments
without re-encoding.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import mujoco
import numpy as np

from flyarchive.cluster import LOCAL_DASHBOARD, connect
from flyarchive.errors import FlyarchiveError, OutputExistsError, RenderFailedError
from flyarchive.workspace import RunFolder, is_local_fs, scratch_dir
from flyarchive.workspace import filesystem as _filesystem

__all__ = [
    "RenderPlan", "preflight", "run_plan", "render_segment", "join_segments", "render_block",
    "connect", "absolute_url", "task_result", "cancel_quietly", "given_up_error", "local_staging",
    "LOCAL_DASHBOARD",
]


def absolute_url(url: str | os.PathLike[str]) -> str:
    """``url`` as it means the same in every process and folder, to send to workers.

    A local path (plain, ``file://`` or ``local://``) gets ``~`` expanded and becomes
    absolute against this process's working folder; a Dask worker started elsewhere
    would read it against its own. Other URLs (``s3://``, ``memory://``, chained
    ``a::b``) are returned as they are. Symbolic links are kept, not resolved.
    """
    text = os.fspath(url)
    if "::" in text:
        return text
    protocol, sep, rest = text.partition("://")
    if not sep:
        return os.path.abspath(os.path.expanduser(text))
    if protocol in ("file", "local"):
        return f"{protocol}://{os.path.abspath(os.path.expanduser(rest))}"
    return text


@dataclass(frozen=True)
class RenderPlan:
    """What to render and where (plain values, sent to workers)."""

    url: str
    storage_options: dict[str, Any]
    cameras: tuple[str, ...]
    out: str
    out_storage_options: dict[str, Any]
    fps: float
    options: Any  # render.RenderOptions
    jobs: tuple[Any, ...]  # render.VideoJob

    def video_url(self, world_id: int, camera: str) -> str:
        from flyarchive.video import safe_video_path

        return safe_video_path(self.out, world_id, camera)

    def segments(self, n_workers: int | None = 1) -> Iterator[tuple[Any, int, int]]:
        """(job, start, stop) for every segment, in playing order per job.

        Segments are at most ``options.segment_frames`` long, shorter (down to 25
        frames) when that gives each of ``n_workers`` workers about four tasks.
        ``n_workers=None`` (rendering in this process): one segment per video.
        """
        total = sum(job.n_frames for job in self.jobs)
        if n_workers is None:
            step = max((job.n_frames for job in self.jobs), default=1)
        else:
            step = max(min(self.options.segment_frames, 25),
                       min(self.options.segment_frames, -(-total // (4 * max(n_workers, 1)))))
        for job in self.jobs:
            for k0 in range(job.start, job.stop, step):
                yield job, k0, min(k0 + step, job.stop)


def preflight(plan: RenderPlan, model: mujoco.MjModel) -> None:
    """Fail before any work: cameras, frame size, and outputs in the way.

    Raises:
        CameraNotFoundError, StorageError (an unknown protocol).
        FrameSizeError: a size H.264 or (backend ``"cpu"``) OpenGL cannot take.
        OutputExistsError: videos exist and ``overwrite`` is off, or (local disk) a folder
            is where a video goes (even with ``overwrite``).
    """
    from flyarchive.models import camera_ids
    from flyarchive.video import parse_video_size

    parse_video_size(plan.options.size)
    if plan.options.backend == "cpu":  # OpenGL's limit, found before any work
        from flyarchive.replay.cpu import _parse_size as parse_render_size

        parse_render_size(plan.options.size)
    camera_ids(model, plan.cameras)
    fs, _ = _filesystem(plan.out, plan.out_storage_options)
    finals = [plan.video_url(j.world_id, c) for j in plan.jobs for c in plan.cameras]
    paths = {u: _filesystem(u, plan.out_storage_options)[1] for u in finals}
    folders = [u for u, p in paths.items() if os.path.isdir(p)] if is_local_fs(fs) else []
    if folders:
        raise OutputExistsError(
            f"{len(folders)} video path(s) are folders, e.g. {folders[0]!r}. Remove or rename "
            "them, or choose another output folder."
        )
    existing = [] if plan.options.overwrite else [u for u, p in paths.items() if fs.exists(p)]
    if existing:
        raise OutputExistsError(
            f"{len(existing)} video(s) already exist, e.g. {existing[0]!r}. Pass overwrite=True "
            "(--overwrite) to replace them, or choose another output folder."
        )


# ----------------------------------------------------------------------------- workers
_local = threading.local()
_renderers: list[Any] = []  # cached renderers, closed at exit before EGL is terminated


def _close_renderers() -> None:
    while _renderers:
        _renderers.pop().close()


def _close_thread_renderers() -> None:
    """Close the renderers cached for this thread (frees its GL contexts); other threads
    keep theirs (e.g. the threads of a dask computation of :func:`render_block`)."""
    cache = _local.__dict__.get("renderers", {})
    for renderer in cache.values():
        renderer.close()
        if renderer in _renderers:
            _renderers.remove(renderer)
    cache.clear()


@functools.lru_cache(maxsize=8)
def _model_from_bytes(digest: str, blob: bytes) -> mujoco.MjModel:
    with tempfile.TemporaryDirectory(prefix="flyarchive-model-", dir=scratch_dir()) as tmp:
        path = Path(tmp) / f"{digest}.mjb"
        path.write_bytes(blob)
        return mujoco.MjModel.from_binary_path(str(path))


def model_from_bytes(blob: bytes) -> mujoco.MjModel:
    """The model from its MJB bytes (see :func:`flyarchive.render.model_bytes`), cached."""
    return _model_from_bytes(hashlib.sha256(blob).hexdigest(), blob)


def _archive(url: str, storage_options: Mapping[str, Any]) -> Any:
    from flyarchive.query import open_archive

    cache = _local.__dict__.setdefault("archives", {})
    key = (url, json.dumps(storage_options, sort_keys=True, default=str))
    if key not in cache:
        # Small reads (n_frames, time) on this thread: inside a task, Dask's default would
        # send them to the cluster and let this worker start other segments meanwhile.
        with dask.config.set(scheduler="synchronous"):
            cache[key] = open_archive(url, storage_options or None)
    return cache[key]


def _cpu_renderer(blob: bytes, cameras: tuple[str, ...], size: tuple[int, int]) -> Any:
    from flyarchive.replay.cpu import CpuRenderer, pin_rasterizer_threads

    cache = _local.__dict__.setdefault("renderers", {})
    key = (hashlib.sha256(blob).hexdigest(), cameras, tuple(size))
    if key not in cache:
        if os.environ.get("FLYARCHIVE_WORKER"):
            pin_rasterizer_threads(1)
        _close_thread_renderers()
        cache[key] = CpuRenderer(model_from_bytes(blob), cameras, size)
        if not _renderers:  # after MuJoCo's own atexit (eglTerminate): runs before it
            atexit.register(_close_renderers)
        _renderers.append(cache[key])
    return cache[key]


def _states(url: str, storage_options: Mapping[str, Any], world_index: int,
            start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    from flyarchive.query import corrupt_read

    ds = _archive(url, storage_options).isel(world=world_index, time=slice(start, stop))
    names = [n for n in ("qpos", "mocap_pos", "mocap_quat") if n in ds]
    try:
        # In this thread: inside a Dask task, the default would send the reads to the
        # cluster and let this task's thread start other segments meanwhile.
        values = dask.compute(*[ds[n].data for n in names], scheduler="synchronous")
    except ValueError as err:  # a checksum mismatch or undecodable chunk
        what = f"{'/'.join(names)} of world index {world_index}, frames {start}..{stop - 1}"
        raise corrupt_read(url, what, err) from None
    return (values[0], None, None) if len(values) == 1 else (values[0], values[1], values[2])


def _part_url(parts: str, world_id: int, camera: str, start: int) -> str:
    from flyarchive.video import safe_video_path

    return safe_video_path(parts, world_id, camera)[: -len(".mp4")] + f".{start:09d}.mp4"


def local_staging(url: str, storage_options: Mapping[str, Any]) -> str | None:
    """The local path of a run's parts folder, where final videos are staged; None off disk."""
    fs, path = _filesystem(url, storage_options)
    return path if is_local_fs(fs) else None


def given_up_error(parts: str) -> RenderFailedError:
    """The error of a task whose run was given up (Ctrl-C, an error elsewhere, a dead
    client): nobody waits for it, and it writes nothing."""
    return RenderFailedError(
        f"The render run of {parts!r} was given up (its parts folder is gone); this segment "
        "is not kept."
    )


def render_segment(plan: RenderPlan, blob: bytes, parts: str, job: Any, start: int,
                   stop: int) -> list[str]:
    """Render frames ``[start, stop)`` of one world from every camera and encode one
    segment per camera into the run's parts folder ``parts``; returns the segment URLs
    (camera order).

    Raises:
        RenderFailedError: the run was given up (its parts folder is gone); nothing is
            left behind.
    """
    from flyarchive.video import VideoOptions, VideoWriter, write_output

    qpos, mocap_pos, mocap_quat = _states(plan.url, plan.storage_options, job.world_index, start, stop)
    renderer = _cpu_renderer(blob, plan.cameras, plan.options.size)
    video = plan.options.video
    if os.environ.get("FLYARCHIVE_WORKER") and video.threads is None:
        video = VideoOptions(video.crf, video.preset, 1, video.keyframe_interval)
    so = plan.out_storage_options
    urls = []
    with tempfile.TemporaryDirectory(prefix="flyarchive-seg-", dir=scratch_dir()) as tmp, \
            ExitStack() as stack:
        locals_ = [Path(tmp) / f"{c}.mp4" for c in range(len(plan.cameras))]
        writers = [stack.enter_context(VideoWriter(p, plan.fps, plan.options.size, options=video))
                   for p in locals_]
        for frame in renderer.iter_frames(qpos, mocap_pos, mocap_quat):  # memory: one frame
            for writer, image in zip(writers, frame):
                writer.write(image)
        stack.close()
        if not RunFolder.is_open(parts, so):
            raise given_up_error(parts)
        for local, camera in zip(locals_, plan.cameras):
            url = _part_url(parts, job.world_id, camera, start)
            write_output(local, url, so, overwrite=True)
            urls.append(url)
    if not RunFolder.is_open(parts, so):  # given up while writing: take the parts back
        _remove_quietly(urls, so)
        raise given_up_error(parts)
    return urls


def _remove_quietly(urls: list[str], storage_options: Mapping[str, Any]) -> None:
    for url in urls:
        fs, path = _filesystem(url, storage_options)
        try:
            fs.rm_file(path)
        except OSError:
            pass


def join_segments(plan: RenderPlan, parts: str, job: Any, camera: str,
                  segments: list[str]) -> dict[str, Any]:
    """Concatenate one video's segments (stream copy) into its final place.

    The joined file is staged in the run's parts folder ``parts`` and renamed into place
    (local disk), or uploaded in one PUT (object stores): a final name never holds a
    partial video.
    """
    from flyarchive.video import concat_segments, write_output

    final = plan.video_url(job.world_id, camera)
    so = plan.out_storage_options
    fs, _ = _filesystem(plan.out, so)
    with tempfile.TemporaryDirectory(prefix="flyarchive-join-", dir=scratch_dir()) as tmp:
        local_parts = []
        for i, url in enumerate(segments):
            local = Path(tmp) / f"{i:06d}.mp4"
            fs.get_file(_filesystem(url, so)[1], str(local))
            local_parts.append(local)
        joined = Path(tmp) / "joined.mp4"
        concat_segments(local_parts, joined)
        if not RunFolder.is_open(parts, so):
            raise given_up_error(parts)
        write_output(joined, final, so, overwrite=plan.options.overwrite,
                     staging_dir=local_staging(parts, so))
    _remove_quietly(segments, so)
    return {"world": job.world_id, "camera": camera, "path": final, "frames": job.n_frames,
            "first_frame": job.start, "fps": plan.fps, "size": list(plan.options.size)}


def render_block(url: str, storage_options: dict[str, Any], blob: bytes, camera: str,
                 size: tuple[int, int], world_index: int, start: int, stop: int, *,
                 committed: int | None = None) -> np.ndarray:
    """Frames ``[start, stop)`` of one world and camera, ``(stop - start, H, W, 3)`` uint8.

    Frames at or past ``committed`` (the world's ``n_frames``; None: read it from the
    archive's mask) and frames holding NaN are black.
    """
    n = stop - start
    out = np.zeros((max(n, 0), *size, 3), dtype=np.uint8)
    last = stop if committed is None else min(stop, committed)
    if last <= start:
        return out
    qpos, mocap_pos, mocap_quat = _states(url, storage_options, world_index, start, last)
    valid = np.isfinite(qpos).all(axis=1)
    renderer = _cpu_renderer(blob, (camera,), size)
    for k in np.flatnonzero(valid):
        renderer.render_frame(qpos[k], None if mocap_pos is None else mocap_pos[k],
                              None if mocap_quat is None else mocap_quat[k], out=out[k:k + 1])
    return out


# ----------------------------------------------------------------------------- drivers
def run_plan(plan: RenderPlan, blob: bytes, parts: str, *, client: Any = None,
             scheduler: str | None = None, n_workers: int | None = None,
             in_process: bool = False) -> list[dict[str, Any]]:
    """Render every segment, join every video; returns the manifest entries.

    Args:
        plan: What to render.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (:attr:`flyarchive.workspace.RunFolder.url`), which
            the caller holds for the whole run and removes afterwards.
        client, scheduler, n_workers: Where to run (see :class:`connect`).
        in_process: Render in this process.

    Raises:
        RenderFailedError: a task failed on the cluster (a worker died, or raised an
            error that is not a flyarchive error); the message names the world.
        Any flyarchive error a task raised (e.g. CorruptArchiveError).
    """
    if plan.options.backend != "cpu":
        from flyarchive.replay.gpu_videos import run_warp_plan

        return run_warp_plan(plan, blob, parts, client=client, scheduler=scheduler,
                             n_workers=n_workers, in_process=in_process)
    if in_process:
        return _run_here(plan, blob, parts)
    with connect(client, scheduler, n_workers) as dask_client:
        return _run_dask(plan, blob, parts, dask_client)


def _progress(items: Iterable[Any], total: int, show: bool, what: str) -> Iterable[Any]:
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, total=total, desc=what, unit="task")


def _run_here(plan: RenderPlan, blob: bytes, parts: str) -> list[dict[str, Any]]:
    done: dict[tuple[Any, str], list[str]] = {}
    segments = list(plan.segments(None))  # nothing to parallelize here: whole videos
    try:
        for job, k0, k1 in _progress(segments, len(segments), plan.options.progress, "segments"):
            for camera, url in zip(plan.cameras, render_segment(plan, blob, parts, job, k0, k1)):
                done.setdefault((job, camera), []).append(url)
        return [join_segments(plan, parts, job, camera, urls) for (job, camera), urls in done.items()]
    finally:
        _close_thread_renderers()  # free this thread's GL context


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
        for future in _progress(done, len(futures), plan.options.progress, "segments"):
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


def scatter_model(client: Any, blob: bytes) -> Any:
    """Send the MJB bytes to every worker once; the future of them.

    The key is the bytes' SHA-256, so a later render with the same model reuses what
    the workers hold, and Dask does not tokenize the bytes itself (0.4 s for
    NeuroMechFly's 23 MB, measured here, against 0.03 s for hashlib).
    """
    key = f"flyarchive-model-{hashlib.sha256(blob).hexdigest()}"
    return client.scatter({key: blob}, broadcast=True)[key]
