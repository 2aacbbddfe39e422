"""Archive -> mp4 on OpenGL (backend ``"opengl"``): a (world, frame segment) read, rendered
and encoded on its own (:func:`render_segment`), and the join of one video's segments
without re-encoding (:func:`join_segments`); every video of a plan in this thread
(:func:`render_here`); on a Dask cluster the segments and joins are tasks
(:mod:`flyarchive.distribute.api`). The twin of :mod:`flyarchive.render.warp_pipeline`.

- read: the segment's states through the archive's
  :class:`~flyarchive.store.reader.StateReader` (:func:`world_states`; one per archive,
  kept by the process, :mod:`flyarchive.render.renderer_cache`), as the Warp pipeline reads
  them, as stored (bit-exact);
- render: one frame at a time (:func:`world_frames`: every output of a world's frames;
  :func:`mosaic_frames`: the tiles of a mosaic), overlays burnt in on the host
  (:mod:`flyarchive.replay.overlay_text`), on the thread's kept
  :class:`~flyarchive.replay.opengl_frames.OpenGLRenderer` (:mod:`flyarchive.render.renderer_cache`);
- encode: one :class:`~flyarchive.video.output_files.OutputWriter` per camera, published into
  the run's parts folder; the join copies the mp4 streams and joins the maps into the
  final outputs.

A frame whose state holds NaN or infinity is black, and its maps say "nothing there"
(depth 0, segmentation 0), as on the Warp backends. Tasks carry plain values: the plan,
MJB model bytes (scattered once), frame ranges.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive import config
from flyarchive.models import model_from_bytes
from flyarchive.render.diagnostics import progress_bar
from flyarchive.render.output_plan import map_attributes
from flyarchive.render.plan import Job, OnVideo, RenderPlan
from flyarchive.render.renderer_cache import (
    archive_header,
    close_thread_renderers,
    opengl_renderer,
    state_reader,
)
from flyarchive.replay.mosaic_tiles import tile_frames
from flyarchive.replay.overlay_text import burn_text
from flyarchive.replay.output_kinds import depth_to_counts, ids_to_counts, map_outputs
from flyarchive.schema import finite_frames
from flyarchive.video.mosaic import is_mosaic
from flyarchive.video.mp4 import VideoOptions
from flyarchive.video.workspace import RunFolder, filesystem, scratch_dir

if TYPE_CHECKING:
    from flyarchive.replay.opengl_frames import OpenGLRenderer

#: One world's states over a range of frames: qpos ``(n, nq)``, mocap poses or None.
States = tuple[np.ndarray, "np.ndarray | None", "np.ndarray | None"]


# ----------------------------------------------------------------------------- in this process
def render_here(plan: RenderPlan, blob: bytes, parts: str, *, on_video: OnVideo | None = None
                ) -> list[dict[str, Any]]:
    """Every video of ``plan`` in this thread; its manifest entries, in plan order.

    One segment per video (nothing to parallelize here), each video joined as soon as it
    is rendered and ``on_video`` called with its entry, so that a stop keeps the videos
    finished before it. The thread's GL context is freed at the end.

    Args:
        plan: What to render, with backend ``"opengl"``.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (:attr:`flyarchive.video.workspace.RunFolder.url`),
            which the caller holds for the whole run and removes afterwards.
        on_video: Called with each video's entry as soon as the video is finished under
            its final name (:class:`flyarchive.video.manifest.ManifestJournal`).
    """
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
                    if on_video is not None:
                        on_video(entry)
        return entries
    finally:
        close_thread_renderers()  # free this thread's GL context


# ----------------------------------------------------------------------------- read
def world_states(url: str, storage_options: Mapping[str, Any] | None, world_index: int,
                 start: int, stop: int, archive_id: str | None = None) -> States:
    """The stored states of frames ``[start, stop)`` (committed) of one world, as stored
    (float64 stays float64: bit-exact replay).

    Raises:
        CorruptArchiveError: stored bytes fail their checksum, do not decode, or are
            missing (names the variable, worlds, frames and file).
    """
    states = state_reader(url, storage_options, archive_id, stop).read_boxes(
        [(world_index, world_index + 1, start, stop)])
    return states["qpos"], states.get("mocap_pos"), states.get("mocap_quat")


# ----------------------------------------------------------------------------- render
def world_frames(renderer: OpenGLRenderer, states: States, outputs: Sequence[str],
                 depth_scale: float, texts: Sequence[str] | None = None
                 ) -> Iterator[tuple[np.ndarray | None, dict[str, np.ndarray]]]:
    """Render a world's frames one at a time (memory: one frame).

    Args:
        renderer: An :class:`~flyarchive.replay.opengl_frames.OpenGLRenderer` making ``outputs``.
        states: The frames' states.
        outputs: What to make.
        depth_scale: Model units per depth count.
        texts: One overlay text per frame, or None.

    Yields:
        ``(rgb, maps)`` per frame: ``(n_cameras, H, W, 3)`` uint8 (None without RGB) and
        ``{name: (n_cameras, H, W) uint16 counts}`` for each map output.
    """
    qpos, mocap_pos, mocap_quat = states
    valid = finite_frames(qpos, mocap_pos, mocap_quat)
    maps = map_outputs(outputs)
    ncam, (height, width) = len(renderer.cameras), renderer.size
    for k in range(len(qpos)):
        rgb, counts = None, {}
        if not valid[k]:
            rgb = np.zeros((ncam, height, width, 3), np.uint8) if "rgb" in outputs else None
            counts = {n: np.zeros((ncam, height, width), np.uint16) for n in maps}
        else:
            pose = (qpos[k], None if mocap_pos is None else mocap_pos[k],
                    None if mocap_quat is None else mocap_quat[k])
            if maps:
                made = renderer.render_outputs(*pose)
                rgb = made.get("rgb")
                counts = {n: depth_to_counts(made[n], depth_scale) if n == "depth"
                          else ids_to_counts(made[n]) for n in maps}
            else:
                rgb = renderer.render_frame(*pose)
            if texts is not None and rgb is not None:
                for image in rgb:
                    burn_text(image, texts[k])
        yield rgb, counts


def mosaic_frames(renderer: OpenGLRenderer, tiles: Sequence[States | None], n_frames: int,
                  mosaic: tuple[int, int], texts: Sequence[Sequence[str] | None]
                  ) -> Iterator[np.ndarray]:
    """Render the mosaic frames of a segment one at a time.

    Args:
        renderer: An RGB :class:`~flyarchive.replay.opengl_frames.OpenGLRenderer` at the tile size.
        tiles: Per tile, its world's states from the segment's first frame on (fewer
            than ``n_frames`` when the world's recording ends earlier), or None (blank).
        n_frames: Frames of the segment.
        mosaic: ``(rows, cols)``.
        texts: Per tile, one label text per frame of its states, or None.

    Yields:
        ``(n_cameras, rows * H, cols * W, 3)`` uint8 per frame; blank tiles black.
    """
    ncam, (height, width) = len(renderer.cameras), renderer.size
    valid = [None if t is None else finite_frames(*t) for t in tiles]
    for k in range(n_frames):
        images = np.zeros((len(tiles), ncam, height, width, 3), np.uint8)
        for t, states in enumerate(tiles):
            if states is None or k >= len(states[0]) or not valid[t][k]:  # type: ignore[index]
                continue
            qpos, mocap_pos, mocap_quat = states
            renderer.render_frame(qpos[k], None if mocap_pos is None else mocap_pos[k],
                                  None if mocap_quat is None else mocap_quat[k], out=images[t])
            if texts[t] is not None:
                for image in images[t]:
                    burn_text(image, texts[t][k])  # type: ignore[index]
        yield np.stack([tile_frames(images[:, c], *mosaic) for c in range(ncam)])


def _segment_frames(plan: RenderPlan, blob: bytes, job: Job, start: int, stop: int
                    ) -> tuple[tuple[int, int], Iterator[tuple[Any, dict[str, np.ndarray]]]]:
    """The RGB frame size of a segment and its frames, rendered lazily: ``(rgb, maps)``
    per frame (:func:`world_frames`)."""
    from flyarchive.video.mosaic import mosaic_size
    from flyarchive.replay.overlay_text import OverlayText

    options = plan.options
    so, archive_id = plan.storage_options, plan.archive_id
    overlay = None
    if options.overlays or is_mosaic(job):
        overlay = OverlayText(archive_header(plan.url, so, archive_id, stop), options.overlays,
                              label_world=is_mosaic(job), size=options.size)
    if not is_mosaic(job):
        states = world_states(plan.url, so, job.world_index, start, stop, archive_id)
        renderer = opengl_renderer(blob, plan.cameras, options.size, options.outputs)
        texts = None if overlay is None else overlay.texts(job.world_index, start, stop)
        return options.size, world_frames(renderer, states, options.outputs,
                                          options.depth_scale or 1.0, texts)
    assert overlay is not None
    tiles: list[States | None] = []
    texts: list[list[str] | None] = []
    for tile in job.tiles:
        last = stop if tile is None else min(stop, tile.stop)
        if tile is None or last <= start:
            tiles.append(None)
            texts.append(None)
            continue
        tiles.append(world_states(plan.url, so, tile.world_index, start, last, archive_id))
        texts.append(overlay.texts(tile.world_index, start, last))
    renderer = opengl_renderer(blob, plan.cameras, options.size)
    mosaic = (job.rows, job.cols)
    frames = ((rgb, {}) for rgb in mosaic_frames(renderer, tiles, stop - start, mosaic, texts))
    return mosaic_size(options.size, mosaic), frames


# ----------------------------------------------------------------------------- encode
def render_segment(plan: RenderPlan, blob: bytes, parts: str, job: Job, start: int,
                   stop: int) -> list[str]:
    """Render frames ``[start, stop)`` of one world (or mosaic) from every camera, encode
    one segment per camera and output into the run's parts folder ``parts``; returns each
    camera's segment URL (camera order; its maps are beside it, :func:`_part_urls`).

    A worker of flyarchive's own LocalCluster renders on one core of several: its
    encoder gets one thread (when the encoder's threads are not set).

    Raises:
        RenderFailedError: the run was given up (its parts folder is gone); nothing is
            left behind.
    """
    from flyarchive.video.output_files import OutputWriter

    options, so = plan.options, plan.out_storage_options
    size, frames = _segment_frames(plan, blob, job, start, stop)
    video = options.video
    if config.is_worker() and video.threads is None:
        video = VideoOptions(video.crf, video.preset, 1, video.keyframe_interval)
    urls: list[dict[str, str]] = []
    world = None if is_mosaic(job) else job.world_id
    with tempfile.TemporaryDirectory(prefix="flyarchive-seg-", dir=scratch_dir()) as tmp, \
            ExitStack() as stack:
        model = model_from_bytes(blob)
        writers = [stack.enter_context(OutputWriter(
            Path(tmp) / str(c), "part", options.outputs, fps=plan.fps, size=size,
            n_frames=stop - start, video=video, map_size=options.size,
            map_attrs=map_attributes(options, model, world, camera, start, plan.fps)))
            for c, camera in enumerate(plan.cameras)]
        for rgb, maps in frames:  # memory: one frame
            for c, writer in enumerate(writers):
                writer.write(None if rgb is None else rgb[c:c + 1],
                             {n: m[c:c + 1] for n, m in maps.items()})
        stack.close()
        RunFolder.check_open(parts, so)
        for writer, camera in zip(writers, plan.cameras):
            part = _part_urls(parts, job, camera, start, options.outputs)
            urls.append(part)
            writer.publish(part, so, overwrite=True)
    if not RunFolder.is_open(parts, so):  # given up while writing: take the parts back
        _remove_quietly([u for part in urls for n, u in part.items() if n != "key"], so)
        raise RunFolder.given_up(parts)
    return [part["key"] for part in urls]


def _part_urls(parts: str, job: Job, camera: str, start: int, outputs: tuple[str, ...]
               ) -> dict[str, str]:
    """Where a segment's outputs of one camera go in the parts folder; ``"key"`` names the
    segment (its mp4, whether or not RGB is an output)."""
    from flyarchive.video.maps import map_url
    from flyarchive.video.output_files import output_urls

    key = output_urls(parts, job, camera)["rgb"][: -len(".mp4")] + f".{start:09d}.mp4"
    return {"key": key, **{n: key if n == "rgb" else map_url(key, n) for n in outputs}}


def _remove_quietly(urls: list[str], storage_options: Mapping[str, Any]) -> None:
    for url in urls:
        fs, path = filesystem(url, storage_options)
        try:
            fs.rm(path, recursive=True) if url.endswith(".zarr") else fs.rm_file(path)
        except OSError:
            pass


def join_segments(plan: RenderPlan, parts: str, job: Job, camera: str,
                  segments: list[str]) -> dict[str, Any] | None:
    """Join one video's segments into its final place: the mp4 segments by stream copy,
    the maps' segments into one array each; its manifest entry (None, and nothing
    published, for a video kept from an earlier render, :attr:`RenderPlan.kept`).

    Each joined output is staged in the run's parts folder ``parts`` and renamed into
    place (local disk), or uploaded with its metadata last (object stores): a final name
    never holds a partial video or map.
    """
    from flyarchive.video.manifest import output_root, video_entry
    from flyarchive.video.maps import join_maps, map_url, publish_map
    from flyarchive.video.mp4 import concat_segments
    from flyarchive.video.output_files import write_output

    outputs = plan.options.outputs
    finals = plan.output_urls(job, camera)
    so = plan.out_storage_options
    fs, _ = filesystem(plan.out, so)
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
                fs.get_file(filesystem(url, so)[1], str(local))
                local_parts.append(local)
            joined["rgb"] = Path(tmp) / "joined.mp4"
            concat_segments(local_parts, joined["rgb"])
        for name in [n for n in outputs if n != "rgb"]:
            local_parts = [_download_folder(fs, filesystem(map_url(u, name), so)[1],
                                            Path(tmp) / f"{i:06d}.{name}") for i, u in enumerate(segments)]
            joined[name] = Path(tmp) / f"joined.{name}.zarr"
            join_maps(local_parts, joined[name], first_frame=job.start)
        RunFolder.check_open(parts, so)
        for name, local in joined.items():
            publish = write_output if name == "rgb" else publish_map
            publish(local, finals[name], so, overwrite=plan.options.overwrite,
                    staging_dir=RunFolder.staging(parts, so), root=output_root(plan.out))
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
