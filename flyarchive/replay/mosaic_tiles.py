"""Tiles joined into one mosaic frame on the host (:func:`tile_frames`, the OpenGL
backend); the Warp backends join them on the device, converting to I420 on the way
(:mod:`flyarchive.replay.warp_compose`), pixel for pixel alike."""

from __future__ import annotations

import numpy as np

from flyarchive.errors import FrameSizeError


def tile_frames(tiles: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Join ``rows * cols`` frames into one mosaic frame, row by row.

    Args:
        tiles: ``(rows * cols, H, W, 3)`` uint8 RGB; tile ``t`` goes to row ``t // cols``,
            column ``t % cols``.

    Returns:
        ``(rows * H, cols * W, 3)`` uint8 RGB, a new array.

    Raises:
        FrameSizeError: the number of tiles is not ``rows * cols``.
    """
    n, height, width, channels = tiles.shape
    if n != rows * cols:
        raise FrameSizeError(f"A {rows}x{cols} mosaic takes {rows * cols} tiles, got {n}.")
    grid = tiles.reshape(rows, cols, height, width, channels).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(grid).reshape(rows * height, cols * width, channels)
