"""Decode what a render wrote back to arrays: videos to frames (for checks and tests, not
for long videos), depth and segmentation maps to model units and geom ids."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import imageio_ffmpeg
import numpy as np

from flyarchive.errors import CorruptArchiveError, StorageError

__all__ = ["read_video", "read_depth", "read_segmentation", "read_map"]


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


def read_map(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None,
             *, kind: str | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """A depth or segmentation map as stored: ``(n_frames, H, W)`` uint16 counts and its
    attributes (:mod:`flyarchive.video.maps`).

    Args:
        url: The map's path or fsspec URL (``.../front.depth.zarr``).
        storage_options: fsspec options of ``url``.
        kind: ``"depth"`` or ``"segmentation"`` to insist on; None: either.

    Raises:
        FileNotFoundError: no array at ``url``.
        StorageError: the array is not a finished flyarchive map (of ``kind``).
        CorruptArchiveError: a chunk fails its checksum.
    """
    import zarr

    from flyarchive.store.location import is_local, local_path

    text = os.fspath(url)
    try:
        store = (zarr.storage.LocalStore(local_path(text), read_only=True) if is_local(text) else
                 zarr.storage.FsspecStore.from_url(text, storage_options=dict(storage_options or {}),
                                                   read_only=True))
        array = zarr.open_array(store=store, mode="r")
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        raise FileNotFoundError(f"No map array at {text!r}.") from None
    attrs = dict(array.attrs)
    found = attrs.get("flyarchive_map")
    if found is None or (kind is not None and found != kind):
        what = "an unfinished map or not a flyarchive map" if found is None else f"a {found} map"
        raise StorageError(
            f"{text!r} is {what}; {'a ' + kind if kind else 'a depth or segmentation'} map "
            "was asked for. Pass the path a render's manifest lists for it.")
    try:
        return np.asarray(array[:]), attrs
    except ValueError as err:
        raise CorruptArchiveError(f"The map {text!r} does not decode ({err}); render it again.") from err


def read_depth(url: str | os.PathLike[str],
               storage_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """A depth map in model length units: ``(n_frames, H, W)`` float32, NaN where nothing
    was hit. Planar depth (along the camera's optical axis); the unit is the model's
    (metres for SI models, millimetres for NeuroMechFly); values are multiples of the
    map's ``scale`` attribute (at most ``scale / 2`` from the rendered depth).

    Raises: as :func:`read_map`.
    """
    from flyarchive.replay.outputs import counts_to_depth

    counts, attrs = read_map(url, storage_options, kind="depth")
    return counts_to_depth(counts, float(attrs["scale"]))


def read_segmentation(url: str | os.PathLike[str],
                      storage_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """A segmentation map as geom ids: ``(n_frames, H, W)`` int32, the ``mjOBJ_GEOM`` id
    of the compiled model seen at each pixel, -1 where no geom is seen (background).

    Raises: as :func:`read_map`.
    """
    from flyarchive.replay.outputs import counts_to_ids

    counts, _ = read_map(url, storage_options, kind="segmentation")
    return counts_to_ids(counts)
