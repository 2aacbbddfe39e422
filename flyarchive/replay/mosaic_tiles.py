"""Frames composed on the host: text burnt into RGB frames, and tiles joined into a mosaic.

The OpenGL backend composes here with numpy; the Warp backends do the same on the device
(:mod:`flyarchive.replay.warp_compose`), pixel for pixel alike. Text is white, in the
font of :mod:`flyarchive.replay.font`, on a box of the frame darkened to half (every
channel halved), at :data:`TEXT_X`, :data:`TEXT_Y` from the top left corner; only whole
characters are drawn (:func:`max_chars`: what does not fit is left out, never cut through
a glyph).
"""

from __future__ import annotations

import numpy as np

from flyarchive.errors import FrameSizeError
from flyarchive.replay.font import CELL_H, CELL_W, GLYPHS, text_codes

#: Top left corner of burnt-in text, pixels from the frame's left and top edges.
TEXT_X, TEXT_Y = 2, 2


def text_width(n_chars: int) -> int:
    """Pixels that ``n_chars`` characters take across."""
    return n_chars * CELL_W


def burn_text(frame: np.ndarray, text: str, x: int = TEXT_X, y: int = TEXT_Y) -> None:
    """Burn ``text`` into an RGB frame in place (see the module for the look).

    Args:
        frame: ``(H, W, 3)`` uint8 RGB, host memory; modified.
        text: ASCII text (other characters show as ``?``); empty: nothing changes.
        x, y: Top left corner of the text, pixels.
    """
    height, width = frame.shape[:2]
    text = text[:max_chars((height, width), x, y)]
    if not text:
        return
    codes = text_codes([text], len(text))[0]
    mask = np.hstack(GLYPHS[codes])[: height - y, : width - x].astype(bool)
    box = frame[y:y + mask.shape[0], x:x + mask.shape[1]]
    box >>= 1
    box[mask] = 255


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


def max_chars(size: tuple[int, int], x: int = TEXT_X, y: int = TEXT_Y) -> int:
    """Whole characters that fit across a frame of ``size = (H, W)`` from ``(x, y)``: 0
    when a glyph's 7 rows do not fit below ``y`` (the last character's blank column may
    fall outside the frame)."""
    height, width = size
    if y + CELL_H - 1 > height or x >= width:
        return 0
    return max(0, (width - x + 1) // CELL_W)
