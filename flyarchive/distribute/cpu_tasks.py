"""CPU (OpenGL) render tasks: a (world, frame segment) rendered and encoded on its own,
a join of one video's segments without re-encoding, and blocks of frames for
:func:`flyarchive.render_frames`.

Tasks carry plain values: the archive URL, MJB model bytes (scattered once), frame
ranges. Each worker thread keeps its opened archives and its last renderer
(:mod:`flyarchive.distribute.caches`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import dask
import numpy as np

from flyarchive import config
from flyarchive.distribute.caches import close_thread_renderers, thread_renderers
from flyarchive.distribute.plan import RenderPlan
from flyarchive.errors import RenderFailedError
from flyarchive.models import model_from_bytes
from flyarchive.schema import finite_frames
from flyarchive.video.workspace import RunFolder, is_local_fs, scratch_dir
from flyarchive.video.workspace import filesystem as _filesystem

__all__ = [
    "render_segment", "join_segments", "render_block", "close_thread_renderers",
    "given_up_error", "local_staging",
]


# ----------------------------------------------------------------------------- workers
_local = threading.local()


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
    """This thread's OpenGL renderer for a model, cameras and size (built once, kept)."""
    from flyarchive.replay.opengl import CpuRenderer, pin_rasterizer_threads

    def make() -> Any:
        if config.is_worker():
            pin_rasterizer_threads(1)
        return CpuRenderer(model_from_bytes(blob), cameras, size)

    key = (hashlib.sha256(blob).hexdigest(), tuple(cameras), tuple(size))
    return thread_renderers().get(key, make)


def _states(url: str, storage_options: Mapping[str, Any], world_index: int,
            start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    from flyarchive.store.reader import corrupt_read

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
    if config.is_worker() and video.threads is None:
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
    from flyarchive.video.manifest import video_entry

    final = plan.video_url(job, camera)
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
    return video_entry(plan, job, camera, final)


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
    valid = finite_frames(qpos, mocap_pos, mocap_quat)
    renderer = _cpu_renderer(blob, (camera,), size)
    for k in np.flatnonzero(valid):
        renderer.render_frame(qpos[k], None if mocap_pos is None else mocap_pos[k],
                              None if mocap_quat is None else mocap_quat[k], out=out[k:k + 1])
    return out
