"""Frames as replay makes them: sizes, pixel formats and array shapes.

Both renderers and the video writer check sizes here, so every stage refuses the same
sizes with the same words before any work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flyarchive.errors import FrameSizeError

#: Pixel formats of frames: ``"rgb24"`` frames ``(H, W, 3)``, or ``"yuv420p"`` frames
#: ``(H * 3 // 2, W)``: planar I420, H rows of luma then the ``(H/2, W/2)`` U and V
#: planes (BT.601, limited range), which x264 encodes unconverted.
PIXEL_FORMATS = ("rgb24", "yuv420p")
#: The largest framebuffer side common OpenGL drivers allocate.
MAX_GL_SIDE = 16384


def is_int(value: object) -> bool:
    """True for Python and numpy integers, not for bools."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def parse_frame_size(size: Any, *, even: bool = False, max_side: int | None = None
                     ) -> tuple[int, int]:
    """Check a frame size before anything is rendered.

    Args:
        size: ``(height, width)`` in pixels.
        even: Both sides must be even (H.264 in yuv420p, I420 frames).
        max_side: The largest side the renderer can allocate (None: no limit).

    Returns:
        ``(height, width)`` as Python ints.

    Raises:
        FrameSizeError: not two positive integers, a side above ``max_side``, or (with
            ``even``) an odd side, with the nearest even sizes suggested.
    """
    ok = isinstance(size, (tuple, list)) and len(size) == 2 and all(is_int(s) for s in size)
    if not ok or not all(s > 0 for s in size):
        raise FrameSizeError(f"size must be (height, width), two positive integers; got {size!r}.")
    height, width = int(size[0]), int(size[1])
    if max_side is not None and max(height, width) > max_side:
        raise FrameSizeError(
            f"size {(height, width)!r} has a side above what the renderer can allocate; "
            f"pass sides in 1..{max_side}."
        )
    if even and (height % 2 or width % 2):
        nearest = (height + height % 2, width + width % 2)
        lower = (max(2, height - height % 2), max(2, width - width % 2))
        if max_side is not None and max(nearest) > max_side:
            nearest = lower  # one above the limit would be refused too
        shown = f"{nearest!r}" if nearest == lower else f"{nearest!r} or {lower!r}"
        raise FrameSizeError(
            f"Video size (height, width)={(height, width)!r} has an odd side; H.264 in "
            f"yuv420p needs even sizes. Render at {shown} instead "
            "(frames are never resized silently)."
        )
    return height, width


def frame_shape(size: tuple[int, int], pixel_format: str = "rgb24") -> tuple[int, ...]:
    """The array shape of one frame of ``size = (H, W)`` in ``pixel_format``."""
    height, width = size
    return (height, width, 3) if pixel_format == "rgb24" else (height * 3 // 2, width)
