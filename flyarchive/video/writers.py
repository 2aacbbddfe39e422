"""Every output of one camera of one video, written together: RGB frames to an mp4
(:class:`~flyarchive.video.writer.VideoWriter`), depth and segmentation counts to zarr
arrays (:class:`~flyarchive.video.maps.MapWriter`), in a local folder; then published,
each to its final URL (:meth:`OutputWriter.publish`), complete or not at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.video.maps import MAP_SUFFIXES, MapWriter, publish_map
from flyarchive.video.writer import CloseOrAbort, VideoOptions, VideoWriter

__all__ = ["OutputWriter"]


class OutputWriter(CloseOrAbort):
    """The writers of one camera's outputs, fed frame blocks in order.

    Args:
        folder: Local folder for the files being written.
        name: File name stem (``front`` -> ``front.mp4``, ``front.depth.zarr``...).
        outputs: Names from :data:`flyarchive.replay.outputs.OUTPUTS`.
        fps: Frames per second of video.
        size: ``(H, W)`` of the RGB frames (of the mosaic, for a mosaic).
        n_frames: Frames the video will hold (maps are allocated for them).
        video: Encoder settings.
        pixel_format: Of the RGB frames (``"rgb24"`` or ``"yuv420p"``).
        map_attrs: Attributes of each map, by output name
            (:func:`~flyarchive.video.maps.depth_attrs`...).
        map_size: ``(H, W)`` of the maps; None: ``size``.
    """

    def __init__(self, folder: str | os.PathLike[str], name: str, outputs: Sequence[str], *,
                 fps: float, size: tuple[int, int], n_frames: int, video: VideoOptions,
                 pixel_format: str = "rgb24", map_attrs: Mapping[str, Mapping[str, Any]] | None = None,
                 map_size: tuple[int, int] | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.outputs = tuple(outputs)
        self.paths = {n: folder / (f"{name}.mp4" if n == "rgb" else name + MAP_SUFFIXES[n])
                      for n in self.outputs}
        self.n_frames = 0
        self._video = (VideoWriter(self.paths["rgb"], fps, size, options=video,
                                   pixel_format=pixel_format) if "rgb" in self.outputs else None)
        attrs = map_attrs or {}
        self._maps = {n: MapWriter(self.paths[n], map_size or size, n_frames, attrs.get(n, {}))
                      for n in self.outputs if n != "rgb"}
        self._maps_closed = False
        #: Seconds spent in :meth:`write`, by kind: ``"rgb"`` (piping to ffmpeg) and
        #: ``"maps"`` (packing and compressing map chunks).
        self.seconds = {"rgb": 0.0, "maps": 0.0}

    def write(self, frames: np.ndarray | None = None,
              maps: Mapping[str, np.ndarray] | None = None) -> None:
        """Append a block of ``n`` frames: RGB (or I420) frames and uint16 counts per map.

        Args:
            frames: ``(n, *frame)`` uint8, or None without RGB.
            maps: ``{name: (n, H, W) uint16}`` for each map output.
        """
        n = None
        start = time.perf_counter()
        if self._video is not None:
            assert frames is not None
            self._video.write(frames)
            n = len(frames)
        middle = time.perf_counter()
        for name, writer in self._maps.items():
            assert maps is not None
            writer.write(maps[name])
            n = len(maps[name])
        self.seconds["rgb"] += middle - start
        self.seconds["maps"] += time.perf_counter() - middle
        self.n_frames += n or 0

    def close_input(self) -> None:
        """Tell ffmpeg that no frame follows (it finishes the file meanwhile); write the
        maps' last chunks and attributes."""
        if self._video is not None:
            self._video.close_input()
        for writer in self._maps.values():
            writer.close()
        self._maps_closed = True

    @property
    def finished(self) -> bool:
        """True when no ffmpeg is still running for this video."""
        return self._video is None or self._video.finished

    def close(self) -> None:
        """Finish every file (see :meth:`VideoWriter.close`)."""
        if not self._maps_closed:
            for writer in self._maps.values():
                writer.close()
            self._maps_closed = True
        if self._video is not None:
            self._video.close()

    def abort(self) -> None:
        """Stop ffmpeg and remove every partial file."""
        if self._video is not None:
            self._video.abort()
        for writer in self._maps.values():
            writer.abort()

    def publish(self, urls: Mapping[str, str], storage_options: Mapping[str, Any], *,
                overwrite: bool, staging_dir: str | os.PathLike[str] | None = None,
                root: str | os.PathLike[str] | None = None) -> None:
        """Copy every finished file to its URL (``urls[name]``), then remove the local ones.

        ``root``: local outputs must stay inside this folder (the output folder).

        Raises:
            OutputExistsError: an output exists and ``overwrite`` is False.
            UnsafeFileError: an output would leave ``root``.
            StorageError: a copy failed.
        """
        import shutil

        from flyarchive.video.output import write_output

        for name, path in self.paths.items():
            if name == "rgb":
                write_output(path, urls[name], dict(storage_options), overwrite=overwrite,
                             staging_dir=staging_dir, move=True, root=root)
                path.unlink(missing_ok=True)
            else:
                publish_map(path, urls[name], storage_options, overwrite=overwrite,
                            staging_dir=staging_dir, move=True, root=root)
                shutil.rmtree(path, ignore_errors=True)
