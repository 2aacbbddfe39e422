"""Every output of a video: where it goes (its name, :func:`safe_video_path`,
:func:`output_urls`), written together (:class:`OutputWriter`: RGB frames to an mp4,
depth and segmentation counts to zarr arrays, in a local folder), and how each finished
local file reaches a local folder or any fsspec URL (:func:`write_output`,
:meth:`OutputWriter.publish`), complete or not at all.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.errors import (
    OutputExistsError,
    SelectionError,
    StorageBackendMissingError,
    StorageError,
    UnsafeFileError,
    missing_storage_backend,
)
from flyarchive.replay.sizes import is_int
from flyarchive.video.guard import make_parent
from flyarchive.video.maps import MAP_SUFFIXES, MapWriter, map_url, publish_map
from flyarchive.video.mp4 import CloseOrAbort, VideoOptions, VideoWriter
from flyarchive.video.workspace import stage

if TYPE_CHECKING:
    from flyarchive.video.mosaic import Job


_SAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def write_output(
    local_path: str | os.PathLike[str],
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    staging_dir: str | os.PathLike[str] | None = None,
    move: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> str:
    """Copy a finished local file to a local path or any fsspec URL.

    On the local file system the file appears complete or not at all (it is copied to
    a staging file, then renamed or linked into place), and an existing file is never
    replaced unless asked, even by a concurrent writer. On object stores the existence
    check and the upload are two requests: writers racing for one key are not detected.

    Args:
        local_path: The file to copy (e.g. a finished mp4 in a temporary folder).
        url: Destination: a path, ``file://``, ``s3://bucket/key``, ``memory://``...
        storage_options: Passed to the fsspec file system (e.g. ``{"endpoint_url": ...}``
            for s3fs).
        overwrite: Replace an existing destination.
        staging_dir: Local destinations only: a folder on the destination's file system
            to stage the copy in (e.g. a render run's parts folder, removed with the run
            even if the process is killed mid-copy). ``None``: a hidden file beside the
            destination.
        move: The caller is done with ``local_path``: on the destination's file
            system it is renamed into the staging name instead of copied (it is gone
            afterwards, whatever happens).
        root: Local destinations only: the output folder the destination must stay inside
            (a folder on the way that is a link leading out of it is refused).

    Returns:
        The destination URL as given.

    Raises:
        OutputExistsError: if the destination exists and ``overwrite`` is False
            (nothing is written).
        UnsafeFileError: the destination leads out of ``root`` (nothing is written).
        StorageBackendMissingError: if the URL's protocol needs a missing package.
        StorageError: if the copy fails.
    """
    from fsspec.implementations.local import LocalFileSystem

    from flyarchive.store.storage_errors import filesystem

    source = Path(local_path)
    if not source.is_file():
        raise FileNotFoundError(f"No file to copy at {str(source)!r}.")
    try:
        fs, target = filesystem(url, storage_options)
    except ImportError as err:
        raise missing_storage_backend(url, err) from err
    exists_error = OutputExistsError(
        f"An output already exists at {url!r}. Pass overwrite=True (--overwrite) to replace it, "
        "or choose another output location."
    )
    try:
        if isinstance(fs, LocalFileSystem):
            staging = None if staging_dir is None else Path(staging_dir)
            _copy_local(source, Path(target), overwrite, exists_error, staging, move, root)
        else:
            if not overwrite and fs.exists(target):
                raise exists_error
            fs.put_file(str(source), target)
    except (OutputExistsError, StorageBackendMissingError, UnsafeFileError):
        raise
    except Exception as err:
        raise StorageError(f"Copying {str(source)!r} to {url!r} failed: {err!r}") from err
    return url


def safe_video_path(out_dir: str | os.PathLike[str], world_id: int, camera: str) -> str:
    """The output path of one (world, camera) video: ``{out_dir}/world{id:05d}/{camera}.mp4``.

    The camera name becomes a file name that stays inside its folder: characters other
    than letters, digits, ``.``, ``_`` and ``-`` become ``_``, a leading dot becomes
    ``_`` (no ``..``, no hidden files), and names longer than 100 characters are cut.
    A name that had to change gets a short hash of the original, so two cameras never
    share a file (``a/b`` and ``a_b`` differ).

    Args:
        out_dir: Output folder, a local path or an fsspec URL (joined with ``/``).
        world_id: World index, ``>= 0``.
        camera: Camera name as in the model.

    Returns:
        The path or URL of the video file.

    Raises:
        SelectionError: if ``world_id`` is not a non-negative integer.
    """
    if not is_int(world_id) or world_id < 0:
        raise SelectionError(f"world_id must be a non-negative integer, got {world_id!r}.")
    base = os.fspath(out_dir).rstrip("/")
    return f"{base}/world{int(world_id):05d}/{_file_name(camera)}.mp4"


def safe_mosaic_path(out_dir: str | os.PathLike[str], index: int, camera: str) -> str:
    """The output path of mosaic ``index`` of one camera: ``{out_dir}/mosaic{index:03d}/{camera}.mp4``,
    the camera's name made safe as in :func:`safe_video_path`."""
    base = os.fspath(out_dir).rstrip("/")
    return f"{base}/mosaic{int(index):03d}/{_file_name(camera)}.mp4"


def output_urls(out_dir: str | os.PathLike[str], job: Job | int, camera: str,
                outputs: tuple[str, ...] = ("rgb",)) -> dict[str, str]:
    """Where each output of one job's camera goes: ``{"rgb": ....mp4, "depth":
    ....depth.zarr, "segmentation": ....seg.zarr}``, the keys of ``outputs``.

    Args:
        out_dir: The output folder.
        job: A :class:`~flyarchive.query.selection.VideoJob` (its window, if any, named
            before ``.mp4``, as :func:`flyarchive.render.plan.job_video_path`), a world
            id, or a :class:`~flyarchive.video.mosaic.MosaicJob` (RGB only).
        camera: Its camera name.
        outputs: Names from :data:`flyarchive.replay.output_kinds.OUTPUTS`.
    """
    from flyarchive.video.mosaic import is_mosaic

    if is_mosaic(job):
        video = safe_mosaic_path(out_dir, job.index, camera)
    else:
        world_id = job if is_int(job) else job.world_id
        video = safe_video_path(out_dir, world_id, camera)
        suffix = getattr(job, "suffix", "")  # a window's frames: front.frames000120-000240.mp4
        video = f"{video[:-len('.mp4')]}{suffix}.mp4" if suffix else video
    return {name: video if name == "rgb" else map_url(video, name) for name in outputs}


def _file_name(camera: str) -> str:
    """A camera name as a file name that stays inside its folder (see :func:`safe_video_path`)."""
    name = _SAFE_CHARS.sub("_", str(camera))[:100]
    name = re.sub(r"^\.", "_", name) or "_"
    if name != camera:
        name += "-" + hashlib.sha256(str(camera).encode()).hexdigest()[:8]
    return name


def _copy_local(source: Path, target: Path, overwrite: bool, exists: OutputExistsError,
                staging_dir: Path | None = None, move: bool = False,
                root: str | os.PathLike[str] | None = None) -> None:
    make_parent(target, root)
    if not overwrite and target.exists():
        raise exists
    name = f".{target.name}.{uuid.uuid4().hex}.part"
    staging = target.with_name(name) if staging_dir is None else staging_dir / name
    stage(source, staging, move)
    try:
        if overwrite:
            os.replace(staging, target)
        else:
            try:
                os.link(staging, target)  # atomic, and refuses an existing file
            except FileExistsError:
                raise exists from None
            except OSError:  # no hard links here: exclusive create, then copy
                try:
                    with open(target, "xb") as out, open(staging, "rb") as src:
                        shutil.copyfileobj(src, out)
                except FileExistsError:
                    raise exists from None
    finally:
        staging.unlink(missing_ok=True)


class OutputWriter(CloseOrAbort):
    """The writers of one camera's outputs, fed frame blocks in order.

    Args:
        folder: Local folder for the files being written.
        name: File name stem (``front`` -> ``front.mp4``, ``front.depth.zarr``...).
        outputs: Names from :data:`flyarchive.replay.output_kinds.OUTPUTS`.
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
        for name, path in self.paths.items():
            if name == "rgb":
                write_output(path, urls[name], dict(storage_options), overwrite=overwrite,
                             staging_dir=staging_dir, move=True, root=root)
                path.unlink(missing_ok=True)
            else:
                publish_map(path, urls[name], storage_options, overwrite=overwrite,
                            staging_dir=staging_dir, move=True, root=root)
                shutil.rmtree(path, ignore_errors=True)
