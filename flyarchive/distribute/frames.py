"""The public lazy-frames entry point: frames of one camera as dask-backed arrays
(:func:`render_frames`), rendered block by block (:mod:`flyarchive.render.frame_blocks`) where
they are computed; the model reaches the workers once
(:func:`~flyarchive.models.shipping.graph_model`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from flyarchive.models.shipping import graph_model
from flyarchive.distribute.api import replay_model
from flyarchive.errors import RenderOptionsError
from flyarchive.query.selection import select_frames
from flyarchive.store.location import absolute_url
from flyarchive.render.renderer_cache import keep_archive
from flyarchive.replay import BACKENDS, backend_name
from flyarchive.replay.sizes import MAX_GL_SIDE, parse_frame_size
from flyarchive.store.dataset import open_header

if TYPE_CHECKING:
    import xarray as xr


def render_frames(
    source: str,
    model: mujoco.MjModel | None = None,
    camera: str | None = None,
    *,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    size: tuple[int, int] = (240, 320),
    block_frames: int = 16,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "opengl",
    outputs: Sequence[str] | None = None,
    depth_scale: float | None = None,
) -> xr.DataArray | xr.Dataset:
    """Frames of one camera as lazy arrays over ``(world, time, y, x[, channel])``.

    Nothing is rendered until computed; computing a slice renders only the blocks of
    ``block_frames`` frames it touches, each a task that makes every output asked for
    from one kinematics pass per frame. The time axis runs from the first to the last
    selected frame of any world; frames past a world's ``n_frames`` (a ragged archive),
    and frames whose state is not finite, show nothing (black, NaN depth, segmentation
    -1). A local ``source`` is made absolute, so the graph computes on workers started in
    other folders. ``model`` None: the model kept beside the archive (as
    :func:`flyarchive.render_videos`). The model reaches the workers once
    (:func:`~flyarchive.models.shipping.graph_model`): with a default
    ``distributed.Client`` in this process, it is sent to its workers when this is called
    (once per client and model), and the frames compute on that client or in this process;
    else it is one key of each graph, never one copy per task.

    Args:
        backend: ``"opengl"`` (its old name ``"cpu"`` is accepted with a
            DeprecationWarning), ``"gpu"`` or ``"warp-cpu"`` (mujoco-warp; one renderer
            per process, used by one task at a time).
        outputs: None (default): return the RGB frames as one DataArray, as before. A
            sequence of names from :data:`flyarchive.replay.output_kinds.OUTPUTS`: return an
            ``xr.Dataset`` with one variable per output: ``rgb`` ``(world, time, y, x,
            channel)`` uint8, ``depth`` ``(world, time, y, x)`` float32 planar depth in
            model length units (NaN: no hit; on the Warp backends a multiple of
            ``depth_scale``), ``segmentation`` ``(world, time, y, x)`` int32 geom ids (-1:
            no geom).
        depth_scale: Warp backends: model units per depth count (None: the far plane /
            65534); the OpenGL depth is not quantized.

    Raises:
        CameraNotFoundError, LayoutMismatchError, SelectionError.
        ModelLoadError, CorruptArchiveError: no model given, and none (or a damaged one)
            kept beside the archive (UnsafeModelError: one that is not safe to load).
        FrameSizeError: ``size`` is not two positive integers (at most 16384 on ``"opengl"``).
        RenderOptionsError: an unknown backend or output, or ``block_frames`` that is not
            a whole number of at least 1.
    """
    import dask
    import dask.array as da
    import xarray as xr

    from flyarchive.render.frame_blocks import render_block_outputs
    from flyarchive.models import camera_ids
    from flyarchive.replay.output_kinds import check_segmentable, parse_depth_scale, parse_outputs

    backend = backend_name(backend)
    if backend not in BACKENDS:
        raise RenderOptionsError(
            f"Unknown backend {backend!r}. Backends: {', '.join(map(repr, BACKENDS))}.")
    if isinstance(block_frames, bool) or not isinstance(block_frames, (int, np.integer)) \
            or block_frames < 1:
        raise RenderOptionsError(
            f"block_frames must be an integer of at least 1, got {block_frames!r}.")
    names = ("rgb",) if outputs is None else parse_outputs(outputs)
    depth_scale = parse_depth_scale(depth_scale)
    size = parse_frame_size(size, max_side=MAX_GL_SIDE if backend == "opengl" else None)
    source = absolute_url(source)
    ds = open_header(source, storage_options)  # opened once here
    model, mjb = replay_model(source, ds, model, storage_options)
    keep_archive(source, storage_options, ds)  # what blocks computed in this process read
    camera_ids(model, () if camera is None else camera)
    if "segmentation" in names:
        check_segmentable(model)
    jobs = select_frames(ds, worlds, time)
    start, stop = min(j.start for j in jobs), max(j.stop for j in jobs)
    blob = graph_model(mjb)  # once, not per task nor per compute
    h, w = size
    trailing = {"rgb": ((h, w, 3), np.uint8), "depth": ((h, w), np.float32),
                "segmentation": ((h, w), np.int32)}
    rows: dict[str, list[Any]] = {name: [] for name in names}
    for job in jobs:
        blocks: dict[str, list[Any]] = {name: [] for name in names}
        for k0 in range(start, stop, block_frames):
            k1 = min(k0 + block_frames, stop)
            task = dask.delayed(render_block_outputs, pure=True)(
                source, dict(storage_options or {}), blob, camera, (h, w),
                job.world_index, k0, k1, committed=job.stop, backend=backend, outputs=names,
                depth_scale=depth_scale, archive_id=ds.attrs.get("archive_id"),
            )
            for name in names:
                shape, dtype = trailing[name]
                blocks[name].append(da.from_delayed(task[name], shape=(k1 - k0, *shape),
                                                    dtype=dtype))
        for name in names:
            rows[name].append(da.concatenate(blocks[name], axis=0))
    coords = {"world": [j.world_id for j in jobs], "time": ds.time.values[start:stop]}
    attrs = {"camera": camera, "output_fps": ds.attrs["output_fps"], "backend": backend}
    arrays = {
        name: xr.DataArray(da.stack(rows[name], axis=0),
                           dims=("world", "time", "y", "x", "channel")[:2 + len(trailing[name][0])],
                           coords={**coords, **({"channel": ["r", "g", "b"]} if name == "rgb" else {})},
                           name=camera if outputs is None else name, attrs=attrs)
        for name in names
    }
    if outputs is None:
        return arrays["rgb"]
    return xr.Dataset(arrays, attrs=attrs)
