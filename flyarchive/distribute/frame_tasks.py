"""Blocks of frames for :func:`flyarchive.render_frames`, on any backend and with any
outputs: one task renders frames ``[start, stop)`` of one world and camera.

OpenGL renderers are kept per thread (:mod:`flyarchive.distribute.caches`); a Warp
renderer is kept per process and used by one task at a time (a lock), on the device of
its backend.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import numpy as np

from flyarchive.distribute.caches import RendererCache
from flyarchive.models import model_from_bytes
from flyarchive.schema import finite_frames

__all__ = ["render_block_outputs", "empty_outputs"]

_warp = RendererCache()
_warp_lock = threading.Lock()
#: States per batch of the Warp renderer of these tasks, at most (a block is rendered in
#: batches of at most this many).
_WARP_BATCH = 16


def empty_outputs(n: int, size: tuple[int, int], outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Outputs of ``n`` frames that show nothing: black RGB, NaN depth, segmentation -1."""
    made = {"rgb": lambda: np.zeros((n, *size, 3), np.uint8),
            "depth": lambda: np.full((n, *size), np.nan, np.float32),
            "segmentation": lambda: np.full((n, *size), -1, np.int32)}
    return {name: made[name]() for name in outputs}


def render_block_outputs(url: str, storage_options: dict[str, Any], blob: bytes, camera: str,
                         size: tuple[int, int], world_index: int, start: int, stop: int, *,
                         committed: int | None = None, backend: str = "cpu",
                         outputs: tuple[str, ...] = ("rgb",),
                         depth_scale: float | None = None) -> dict[str, np.ndarray]:
    """Outputs of frames ``[start, stop)`` of one world and camera.

    Returns:
        ``{"rgb": (n, H, W, 3) uint8, "depth": (n, H, W) float32 model units (NaN: no
        hit), "segmentation": (n, H, W) int32 geom ids (-1: none)}``, the keys of
        ``outputs``. Frames at or past ``committed`` (the world's ``n_frames``) and frames
        holding NaN show nothing (:func:`empty_outputs`).
    """
    from flyarchive.distribute.cpu_tasks import _cpu_renderer, _states

    out = empty_outputs(max(stop - start, 0), size, outputs)
    last = stop if committed is None else min(stop, committed)
    if last <= start:
        return out
    qpos, mocap_pos, mocap_quat = _states(url, storage_options, world_index, start, last)
    rows = np.flatnonzero(finite_frames(qpos, mocap_pos, mocap_quat))
    if not len(rows):
        return out
    pick = lambda a: None if a is None else a[rows]  # noqa: E731
    if backend == "cpu":
        renderer = _cpu_renderer(blob, (camera,), size, outputs)
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
    from flyarchive.distribute.warp_pipeline import warp_device

    device = warp_device(backend)
    key = (hashlib.sha256(blob).hexdigest(), camera, tuple(size), device, outputs, depth_scale)

    def make() -> Any:
        from flyarchive.replay.warp import WarpBatchRenderer

        return WarpBatchRenderer(model_from_bytes(blob), camera, size, batch_worlds=_WARP_BATCH,
                                 device=device, outputs=outputs, depth_scale=depth_scale)

    blocks = []
    with _warp_lock:
        renderer = _warp.get(key, make)
        for k in range(0, len(qpos), _WARP_BATCH):
            part = slice(k, k + _WARP_BATCH)
            blocks.append(renderer.render_outputs(
                qpos[part], None if mocap_pos is None else mocap_pos[part],
                None if mocap_quat is None else mocap_quat[part]))
    return {name: np.concatenate([b[name][:, 0] for b in blocks]) for name in outputs}
