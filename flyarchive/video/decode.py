"""Decode videos back to frames (for checks and tests, not for long videos)."""

from __future__ import annotations

import os

import imageio_ffmpeg
import numpy as np

__all__ = ["read_video"]


def read_video(path: str | os.PathLike[str]) -> np.ndarray:
    """Decode a local video file into memory (for tests and checks, not for long videos).

    Returns:
        ``(n_frames, H, W, 3)`` uint8 RGB.
    """
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(raw, np.uint8).reshape(height, width, 3) for raw in reader]
    if not frames:
        return np.empty((0, height, width, 3), np.uint8)
    return np.stack(frames)
