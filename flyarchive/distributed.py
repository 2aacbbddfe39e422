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
import uuid
from contextlib import ExitStack
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import mujoco
import numpy as np

from flyarchive.errors import OutputExistsError, missing_dependency

__all__ = [
    "RenderPlan", "preflight", "run_plan", "render_segment", "join_segments", "render_block",
    "connect",
]

#: Worker processes of the default LocalCluster: one core each (one Mesa rasterizer
#: thread, one x264 thread, one encoder thread on the Warp backends).
_WORKER_ENV = {"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "FLYARCHIVE_ENCODERS": "1", "FLYARCHIVE_WORKER": "1"}


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


def _filesystem(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(url, **dict(storage_options))


def preflight(plan: RenderPlan, model: mujoco.MjModel) -> None:
    """Fail before any work: cameras, frame size, EGL, and outputs that exist.

    Raises:
        CameraNotFoundError, FrameSizeError, RenderBackendError, OutputExistsError.
    """
    from flyarchive.models import camera_ids
    from flyarchive.video import parse_video_size

    parse_video_size(plan.options.size)
    camera_ids(model, plan.cameras)
    if plan.options.overwrite:
        return
    fs, _ = _filesystem(plan.out, plan.out_storage_options)
    existing = [u for j in plan.jobs for c in plan.cameras
                if fs.exists(_filesystem(u := plan.video_url(j.world_id, c), plan.out_storage_options)[1])]
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


@functools.lru_cache(maxsize=8)
def _model_from_bytes(digest: str, blob: bytes) -> mujoco.MjModel:
    with tempfile.TemporaryDirectory(prefix="flyarchive-model-") as tmp:
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
        for old in cache.values():
            old.close()
        cache.clear()
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


def _part_url(plan_out: str, run_id: str, world_id: int, camera: str, start: int) -> str:
    from flyarchive.video import safe_video_path

    base = safe_video_path(f"{plan_out}/.parts-{run_id}", world_id, camera)
    return base[: -len(".mp4")] + f".{start:09d}.mp4"


def render_segment(plan: RenderPlan, blob: bytes, run_id: str, job: Any, start: int, stop: int) -> list[str]:
    """Render frames ``[start, stop)`` of one world from every camera and encode one
    segment per camera; returns the segment URLs (camera order)."""
    from flyarchive.video import VideoOptions, VideoWriter, write_output

    qpos, mocap_pos, mocap_quat = _states(plan.url, plan.storage_options, job.world_index, start, stop)
    renderer = _cpu_renderer(blob, plan.cameras, plan.options.size)
    video = plan.options.video
    if os.environ.get("FLYARCHIVE_WORKER") and video.threads is None:
        video = VideoOptions(video.crf, video.preset, 1, video.keyframe_interval)
    urls = []
    with tempfile.TemporaryDirectory(prefix="flyarchive-seg-") as tmp, ExitStack() as stack:
        locals_ = [Path(tmp) / f"{c}.mp4" for c in range(len(plan.cameras))]
        writers = [stack.enter_context(VideoWriter(p, plan.fps, plan.options.size, options=video))
                   for p in locals_]
        for frame in renderer.iter_frames(qpos, mocap_pos, mocap_quat):  # memory: one frame
            for writer, image in zip(writers, frame):
                writer.write(image)
        stack.close()
        for local, camera in zip(locals_, plan.cameras):
            url = _part_url(plan.out, run_id, job.world_id, camera, start)
            write_output(local, url, plan.out_storage_options, overwrite=True)
            urls.append(url)
    return urls


def join_segments(plan: RenderPlan, job: Any, camera: str, parts: list[str]) -> dict[str, Any]:
    """Concatenate one video's segments (stream copy) into its final place."""
    from flyarchive.video import concat_segments, write_output

    final = plan.video_url(job.world_id, camera)
    fs, _ = _filesystem(plan.out, plan.out_storage_options)
    with tempfile.TemporaryDirectory(prefix="flyarchive-join-") as tmp:
        local_parts = []
        for i, url in enumerate(parts):
            local = Path(tmp) / f"{i:06d}.mp4"
            fs.get_file(_filesystem(url, plan.out_storage_options)[1], str(local))
            local_parts.append(local)
        joined = Path(tmp) / "joined.mp4"
        concat_segments(local_parts, joined)
        write_output(joined, final, plan.out_storage_options, overwrite=plan.options.overwrite)
    for url in parts:
        fs.rm_file(_filesystem(url, plan.out_storage_options)[1])
    return {"world": job.world_id, "camera": camera, "path": final, "frames": job.n_frames,
            "first_frame": job.start, "fps": plan.fps, "size": list(plan.options.size)}


def render_block(url: str, storage_options: dict[str, Any], blob: bytes, camera: str,
                 size: tuple[int, int], world_index: int, start: int, stop: int) -> np.ndarray:
    """Frames ``[start, stop)`` of one world and camera, ``(n, H, W, 3)`` uint8 (black past
    the world's committed frames)."""
    n = stop - start
    out = np.zeros((max(n, 0), *size, 3), dtype=np.uint8)
    if n <= 0:
        return out
    qpos, mocap_pos, mocap_quat = _states(url, storage_options, world_index, start, stop)
    valid = np.isfinite(qpos).all(axis=1)
    renderer = _cpu_renderer(blob, (camera,), size)
    for k in np.flatnonzero(valid):
        renderer.render_frame(qpos[k], None if mocap_pos is None else mocap_pos[k],
                              None if mocap_quat is None else mocap_quat[k], out=out[k:k + 1])
    return out


# ----------------------------------------------------------------------------- drivers
def run_plan(plan: RenderPlan, blob: bytes, *, client: Any = None, scheduler: str | None = None,
             n_workers: int | None = None, in_process: bool = False) -> list[dict[str, Any]]:
    """Render every segment, join every video; returns the manifest entries."""
    if plan.options.backend != "cpu":
        from flyarchive.replay.gpu_videos import run_warp_plan

        return run_warp_plan(plan, blob, client=client, scheduler=scheduler,
                             n_workers=n_workers, in_process=in_process)
    run_id = uuid.uuid4().hex[:12]
    if in_process:
        return _run_here(plan, blob, run_id)
    with connect(client, scheduler, n_workers) as dask_client:
        return _run_dask(plan, blob, run_id, dask_client)


def _progress(items: Iterable[Any], total: int, show: bool, what: str) -> Iterable[Any]:
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, total=total, desc=what, unit="task")


def _run_here(plan: RenderPlan, blob: bytes, run_id: str) -> list[dict[str, Any]]:
    parts: dict[tuple[Any, str], list[str]] = {}
    segments = list(plan.segments(None))  # nothing to parallelize here: whole videos
    try:
        for job, k0, k1 in _progress(segments, len(segments), plan.options.progress, "segments"):
            for camera, url in zip(plan.cameras, render_segment(plan, blob, run_id, job, k0, k1)):
                parts.setdefault((job, camera), []).append(url)
        videos = [join_segments(plan, job, camera, urls) for (job, camera), urls in parts.items()]
    finally:
        _remove_parts_dir(plan, run_id)
        _close_renderers()  # free this thread's GL context
        _local.__dict__.get("renderers", {}).clear()
    return videos


def _run_dask(plan: RenderPlan, blob: bytes, run_id: str, client: Any) -> list[dict[str, Any]]:
    from distributed import as_completed

    blob_future = scatter_model(client, blob)
    segments = list(plan.segments(len(client.scheduler_info().get("workers", {})) or 1))
    futures = {
        client.submit(render_segment, plan, blob_future, run_id, job, k0, k1, pure=False): (job, k0)
        for job, k0, k1 in segments
    }
    results: dict[tuple[Any, int], list[str]] = {}
    done = as_completed(futures, loop=client.loop)
    for future in _progress(done, len(futures), plan.options.progress, "segments"):
        results[futures[future]] = future.result()
    joins = []
    for job in plan.jobs:
        keys = sorted(k0 for (j, k0) in results if j == job)
        for c, camera in enumerate(plan.cameras):
            joins.append(client.submit(join_segments, plan, job, camera,
                                       [results[(job, k0)][c] for k0 in keys], pure=False))
    videos = client.gather(joins)
    _remove_parts_dir(plan, run_id)
    return videos


def scatter_model(client: Any, blob: bytes) -> Any:
    """Send the MJB bytes to every worker once; the future of them.

    The key is the bytes' SHA-256, so a later render with the same model reuses what
    the workers hold, and Dask does not tokenize the bytes itself (0.4 s for
    NeuroMechFly's 23 MB, measured here, against 0.03 s for hashlib).
    """
    key = f"flyarchive-model-{hashlib.sha256(blob).hexdigest()}"
    return client.scatter({key: blob}, broadcast=True)[key]


def _remove_parts_dir(plan: RenderPlan, run_id: str) -> None:
    fs, path = _filesystem(f"{plan.out}/.parts-{run_id}", plan.out_storage_options)
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


class connect:
    """Context manager: the given client, one connected to ``scheduler``, or a LocalCluster.

    The LocalCluster has ``n_workers`` (default: one per core) single-thread worker
    processes, each pinned to one core's worth of threads (``_WORKER_ENV``). Clients
    and clusters it made are closed on exit; a given client is left open.
    """

    def __init__(self, client: Any = None, scheduler: str | None = None,
                 n_workers: int | None = None) -> None:
        self._given, self._scheduler, self._n = client, scheduler, n_workers
        self._own: list[Any] = []

    def __enter__(self) -> Any:
        if self._given is not None:
            return self._given
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise missing_dependency("distributed", "dask", "Rendering on a Dask cluster") from None
        if self._scheduler:
            client = Client(self._scheduler)
        else:
            n = self._n or os.cpu_count() or 1
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                env=dict(_WORKER_ENV), silence_logs=40,
            )
            self._own.append(cluster)
            client = Client(cluster)
        self._own.insert(0, client)
        return client

    def __exit__(self, *exc: object) -> None:
        for thing in self._own:
            thing.close()
