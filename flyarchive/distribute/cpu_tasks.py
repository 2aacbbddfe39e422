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
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive import config
from flyarchive.distribute.caches import close_thread_renderers, thread_renderers
from flyarchive.distribute.output_plan import map_attributes
from flyarchive.distribute.plan import RenderPlan
from flyarchive.errors import CorruptArchiveError, RenderFailedError
from flyarchive.models import model_from_bytes
from flyarchive.schema import finite_frames
from flyarchive.video.mosaic import is_mosaic
from flyarchive.video.workspace import RunFolder, is_local_fs, scratch_dir
from flyarchive.video.workspace import filesystem as _filesystem
from flyarchive.video.mp4 import VideoOptions

__all__ = [
    "render_segment", "join_segments", "render_block", "close_thread_renderers",
    "given_up_error", "local_staging",
]


# ----------------------------------------------------------------------------- workers
_local = threading.local()


def _archive(url: str, storage_options: Mapping[str, Any], archive_id: str | None = None) -> Any:
    """This thread's opened archive at ``url``; opened again when it is not the archive
    ``archive_id`` (the one the render planned with: it was replaced at the same URL
    since this thread opened it)."""
    import dask

    from flyarchive.query import open_archive

    cache = _local.__dict__.setdefault("archives", {})
    key = (url, json.dumps(storage_options, sort_keys=True, default=str))
    if key in cache and archive_id is not None and cache[key].attrs.get("archive_id") != archive_id:
        del cache[key]
    if key not in cache:
        # Small reads (n_frames, time) on this thread: inside a task, Dask's default would
        # send them to the cluster and let this worker start other segments meanwhile.
        with dask.config.set(scheduler="synchronous"):
            cache[key] = open_archive(url, storage_options or None)
    return cache[key]


def _cpu_renderer(blob: bytes, cameras: tuple[str, ...], size: tuple[int, int],
                  outputs: tuple[str, ...] = ("rgb",)) -> Any:
    """This thread's OpenGL renderer for a model, cameras, size and outputs (built once, kept)."""
    from flyarchive.replay.opengl import CpuRenderer, pin_rasterizer_threads

    def make() -> Any:
        if config.is_worker():
            pin_rasterizer_threads(1)
        return CpuRenderer(model_from_bytes(blob), cameras, size, outputs=outputs)

    key = (hashlib.sha256(blob).hexdigest(), tuple(cameras), tuple(size), tuple(outputs))
    return thread_renderers().get(key, make)


def _states(url: str, storage_options: Mapping[str, Any], world_index: int,
            start: int, stop: int, archive_id: str | None = None
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    import dask

    from flyarchive.store.reader import corrupt_read

    ds = _archive(url, storage_options, archive_id).isel(world=world_index,
                                                         time=slice(start, stop))
    names = [n for n in ("qpos", "mocap_pos", "mocap_quat") if n in ds]
    try:
        # In this thread: inside a Dask task, the default would send the reads to the
        # cluster and let this task's thread start other segments meanwhile.
        values = dask.compute(*[ds[n].data for n in names], scheduler="synchronous")
    except CorruptArchiveError:  # names its variable, worlds, frames and file already
        raise
    except ValueError as err:  # a checksum mismatch or undecodable chunk
        what = f"{'/'.join(names)} of world index {world_index}, frames {start}..{stop - 1}"
        raise corrupt_read(url, what, err) from None
    return (values[0], None, None) if len(values) == 1 else (values[0], values[1], values[2])


def _part_urls(parts: str, job: Any, camera: str, start: int, outputs: tuple[str, ...]
               ) -> dict[str, str]:
    """Where a segment's outputs of one camera go in the parts folder; ``"key"`` names the
    segment (its mp4, whether or not RGB is an output)."""
    from flyarchive.video.maps import map_url
    from flyarchive.video.outputs import output_urls

    key = output_urls(parts, job, camera)["rgb"][: -len(".mp4")] + f".{start:09d}.mp4"
    return {"key": key, **{n: key if n == "rgb" else map_url(key, n) for n in outputs}}


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
    """Render frames ``[start, stop)`` of one world (or mosaic) from every camera, encode
    one segment per camera and output into the run's parts folder ``parts``; returns each
    camera's segment URL (camera order; its maps are beside it, :func:`_part_urls`).

    Raises:
        RenderFailedError: the run was given up (its parts folder is gone); nothing is
            left behind.
    """
    from flyarchive.video.outputs import OutputWriter

    options, so = plan.options, plan.out_storage_options
    outputs = tuple(getattr(options, "outputs", ("rgb",)))
    size, frames = _segment_frames(plan, blob, job, start, stop)
    video = options.video
    if config.is_worker() and video.threads is None:
        video = VideoOptions(video.crf, video.preset, 1, video.keyframe_interval)
    urls: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="flyarchive-seg-", dir=scratch_dir()) as tmp, \
            ExitStack() as stack:
        model = model_from_bytes(blob)
        writers = [stack.enter_context(OutputWriter(
            Path(tmp) / str(c), "part", outputs, fps=plan.fps, size=size, n_frames=stop - start,
            video=video, map_size=options.size,
            map_attrs=map_attributes(options, model, _world(job), camera, start, plan.fps)))
            for c, camera in enumerate(plan.cameras)]
        for rgb, maps in frames:  # memory: one frame
            for c, writer in enumerate(writers):
                writer.write(None if rgb is None else rgb[c:c + 1],
                             {n: m[c:c + 1] for n, m in maps.items()})
        stack.close()
        if not RunFolder.is_open(parts, so):
            raise given_up_error(parts)
        for writer, camera in zip(writers, plan.cameras):
            part = _part_urls(parts, job, camera, start, outputs)
            urls.append(part)
            writer.publish(part, so, overwrite=True)
    if not RunFolder.is_open(parts, so):  # given up while writing: take the parts back
        _remove_quietly([u for part in urls for n, u in part.items() if n != "key"], so)
        raise given_up_error(parts)
    return [part["key"] for part in urls]


def _world(job: Any) -> int | None:
    return None if is_mosaic(job) else job.world_id


def _segment_frames(plan: RenderPlan, blob: bytes, job: Any, start: int, stop: int
                    ) -> tuple[tuple[int, int], Iterator[tuple[Any, dict[str, np.ndarray]]]]:
    """The RGB frame size of a segment and its frames, rendered lazily: ``(rgb, maps)``
    per frame (:func:`flyarchive.distribute.cpu_frames.world_frames`)."""
    from flyarchive.distribute.cpu_frames import mosaic_frames, world_frames
    from flyarchive.video.mosaic import mosaic_size
    from flyarchive.video.overlay_text import OverlayText

    options = plan.options
    outputs = tuple(getattr(options, "outputs", ("rgb",)))
    items = tuple(getattr(options, "overlays", ()))
    overlay = None
    if items or is_mosaic(job):
        overlay = OverlayText(_archive(plan.url, plan.storage_options, plan.archive_id), items,
                              label_world=is_mosaic(job), size=options.size)
    if not is_mosaic(job):
        states = _states(plan.url, plan.storage_options, job.world_index, start, stop,
                         plan.archive_id)
        renderer = _cpu_renderer(blob, plan.cameras, options.size, outputs)
        texts = None if overlay is None else overlay.texts(job.world_index, start, stop)
        return options.size, world_frames(renderer, states, outputs, options.depth_scale or 1.0,
                                          texts)
    tiles, texts = [], []
    for tile in job.tiles:
        last = stop if tile is None else min(stop, tile.stop)
        if tile is None or last <= start:
            tiles.append(None)
            texts.append(None)
            continue
        tiles.append(_states(plan.url, plan.storage_options, tile.world_index, start, last,
                             plan.archive_id))
        texts.append(overlay.texts(tile.world_index, start, last))  # type: ignore[union-attr]
    renderer = _cpu_renderer(blob, plan.cameras, options.size)
    mosaic = (job.rows, job.cols)
    frames = ((rgb, {}) for rgb in mosaic_frames(renderer, tiles, stop - start, mosaic, texts))
    return mosaic_size(options.size, mosaic), frames


def _remove_quietly(urls: list[str], storage_options: Mapping[str, Any]) -> None:
    for url in urls:
        fs, path = _filesystem(url, storage_options)
        try:
            fs.rm(path, recursive=True) if url.endswith(".zarr") else fs.rm_file(path)
        except OSError:
            pass


def join_segments(plan: RenderPlan, parts: str, job: Any, camera: str,
                  segments: list[str]) -> dict[str, Any] | None:
    """Join one video's segments into its final place: the mp4 segments by stream copy,
    the maps' segments into one array each; its manifest entry (None, and nothing
    published, for a video kept from an earlier render, :attr:`RenderPlan.kept`).

    Each joined output is staged in the run's parts folder ``parts`` and renamed into
    place (local disk), or uploaded with its metadata last (object stores): a final name
    never holds a partial video or map.
    """
    from flyarchive.video import concat_segments, write_output
    from flyarchive.video.manifest import output_root, video_entry
    from flyarchive.video.maps import join_maps, map_url, publish_map

    outputs = tuple(getattr(plan.options, "outputs", ("rgb",)))
    finals = plan.output_urls(job, camera)
    so = plan.out_storage_options
    fs, _ = _filesystem(plan.out, so)
    taken = [map_url(u, n) if n != "rgb" else u for u in segments for n in outputs]
    if plan.is_kept(job, camera):
        _remove_quietly(taken, so)
        return None
    with tempfile.TemporaryDirectory(prefix="flyarchive-join-", dir=scratch_dir()) as tmp:
        joined: dict[str, Path] = {}
        if "rgb" in outputs:
            local_parts = []
            for i, url in enumerate(segments):
                local = Path(tmp) / f"{i:06d}.mp4"
                fs.get_file(_filesystem(url, so)[1], str(local))
                local_parts.append(local)
            joined["rgb"] = Path(tmp) / "joined.mp4"
            concat_segments(local_parts, joined["rgb"])
        for name in [n for n in outputs if n != "rgb"]:
            local_parts = [_download_folder(fs, _filesystem(map_url(u, name), so)[1],
                                            Path(tmp) / f"{i:06d}.{name}") for i, u in enumerate(segments)]
            joined[name] = Path(tmp) / f"joined.{name}.zarr"
            join_maps(local_parts, joined[name], first_frame=job.start)
        if not RunFolder.is_open(parts, so):
            raise given_up_error(parts)
        for name, local in joined.items():
            publish = write_output if name == "rgb" else publish_map
            publish(local, finals[name], so, overwrite=plan.options.overwrite,
                    staging_dir=local_staging(parts, so), root=output_root(plan.out))
    _remove_quietly(taken, so)
    return video_entry(plan, job, camera, finals)


def _download_folder(fs: Any, path: str, local: Path) -> Path:
    """Copy every file under ``path`` of ``fs`` into the local folder ``local``."""
    root = path.rstrip("/")
    for remote in fs.find(root):
        target = local / remote[len(root):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(remote, str(target))
    return local


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
