"""Blocks of frames for :func:`flyarchive.render_frames`, on any backend and with any
outputs: one task renders frames ``[start, stop)`` of one world and camera.

States are read as the video pipelines read them
(:func:`flyarchive.render.opengl_pipeline.world_states`); renderers are the process's kept ones
(:mod:`flyarchive.render.renderer_cache`): OpenGL per thread, Warp in the slot
:data:`~flyarchive.render.renderer_cache.BLOCKS_SLOT`, used by one task at a time (its lock),
on the device of its backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from flyarchive.models.shipping import ModelRef, mjb_of
from flyarchive.render.opengl_pipeline import world_states
from flyarchive.render.renderer_cache import BLOCKS_SLOT, opengl_renderer, warp_renderer, warp_slot
from flyarchive.replay import WARP_BACKENDS
from flyarchive.schema import finite_frames

#: States per batch of the Warp renderer of these tasks, at most (a block is rendered in
#: batches of at most this many).
WARP_BATCH = 16


def empty_outputs(n: int, size: tuple[int, int], outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Outputs of ``n`` frames that show nothing: black RGB, NaN depth, segmentation -1."""
    made = {"rgb": lambda: np.zeros((n, *size, 3), np.uint8),
            "depth": lambda: np.full((n, *size), np.nan, np.float32),
            "segmentation": lambda: np.full((n, *size), -1, np.int32)}
    return {name: made[name]() for name in outputs}


def render_block_outputs(url: str, storage_options: Mapping[str, Any], blob: bytes | ModelRef,
                         camera: str,
                         size: tuple[int, int], world_index: int, start: int, stop: int, *,
                         committed: int, backend: str,
                         outputs: tuple[str, ...] = ("rgb",), depth_scale: float | None = None,
                         archive_id: str | None = None) -> dict[str, np.ndarray]:
    """Outputs of frames ``[start, stop)`` of one world and camera.

    Args:
        blob: The model's MJB bytes, or their
            :class:`~flyarchive.models.shipping.ModelRef`.
        committed: The world's ``n_frames``: frames at or past it show nothing.
        archive_id: The archive's ``archive_id`` when planned (a process that opened an
            archive since replaced at ``url`` opens it again).

    Returns:
        ``{"rgb": (n, H, W, 3) uint8, "depth": (n, H, W) float32 model units (NaN: no
        hit), "segmentation": (n, H, W) int32 geom ids (-1: none)}``, the keys of
        ``outputs``. Frames at or past ``committed`` and frames holding NaN show nothing
        (:func:`empty_outputs`).
    """
    out = empty_outputs(max(stop - start, 0), size, outputs)
    last = min(stop, committed)
    if last <= start:
        return out
    qpos, mocap_pos, mocap_quat = world_states(url, storage_options, world_index, start, last,
                                               archive_id)
    rows = np.flatnonzero(finite_frames(qpos, mocap_pos, mocap_quat))
    if not len(rows):
        return out
    pick = lambda a: None if a is None else a[rows]  # noqa: E731
    blob = mjb_of(blob)
    if backend not in WARP_BACKENDS:  # OpenGL
        renderer = opengl_renderer(blob, (camera,), size, outputs)
        for k in rows:
            made = renderer.render_outputs(qpos[k], None if mocap_pos is None else mocap_pos[k],
                                           None if mocap_quat is None else mocap_quat[k])
            for name, value in made.items():
                out[name][k] = value[0]
        return out
    made = _warp_outputs(blob, camera, size, backend, outputs, depth_scale,
                         qpos[rows], pick(mocap_pos), pick(mocap_quat))
    for name, value in made.items():
        out[name][rows] = value
    return out


def _warp_outputs(blob: bytes, camera: str, size: tuple[int, int], backend: str,
                  outputs: tuple[str, ...], depth_scale: float | None, qpos: np.ndarray,
                  mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None
                  ) -> dict[str, np.ndarray]:
    """Every output of ``n`` states of one camera on this process's Warp renderer."""
    from flyarchive.render.warp_pipeline import warp_device

    cache, lock = warp_slot(BLOCKS_SLOT)
    blocks = []
    with lock:
        renderer = warp_renderer(cache, blob, camera, size, batch_worlds=WARP_BATCH,
                                 device=warp_device(backend), outputs=outputs,
                                 depth_scale=depth_scale)
        for k in range(0, len(qpos), WARP_BATCH):
            part = slice(k, k + WARP_BATCH)
            blocks.append(renderer.render_outputs(
                qpos[part], None if mocap_pos is None else mocap_pos[part],
                None if mocap_quat is None else mocap_quat[part]))
    return {name: np.concatenate([b[name][:, 0] for b in blocks]) for name in outputs}
