"""Depth and segmentation maps beside the videos: lossless 16-bit zarr v3 arrays.

One array per (world, camera, map), named after its video
(:func:`map_url`): ``{out}/world00003/front.mp4`` has ``front.depth.zarr`` and
``front.seg.zarr`` beside it. Each is ``(frames, H, W)`` uint16 with dimension names
``(time, y, x)``, chunks of :data:`CHUNK_FRAMES` frames, zstd level 1 then CRC-32C (so
a flipped bit is detected on read), and attributes that say what a count means
(:func:`depth_attrs`, :func:`segmentation_attrs`; the counts themselves are defined in
:mod:`flyarchive.replay.output_kinds`). Any zarr v3 reader opens them:
``zarr.open_array("front.depth.zarr")``; :func:`flyarchive.video.decode.read_depth`
returns model units.

Chosen by measurement (NeuroMechFly, 240x320, one core, ``scripts/bench_outputs.py``
and the issue 14 memo): 0.14 ms of CPU per depth frame and 0.10 per segmentation frame
against 0.8 and 0.7 for lossless FFV1 video, at 9.6 and 1.6 kB per frame for a moving
camera (FFV1: 5.3 and 1.7) and about 0.1 kB for a fixed one (zstd's window spans frames,
FFV1 is intra-only); reads need no ffmpeg and slice lazily.

Maps are written like videos: into a local folder first (:class:`MapWriter`), then
published (:func:`publish_map`), so that a final name never holds a partial array.
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.errors import (
    CorruptArchiveError,
    FrameSizeError,
    OutputExistsError,
    StorageError,
    UnsafeFileError,
    VideoEncodeError,
)
from flyarchive.video.mp4 import CloseOrAbort

#: Frames per chunk of a map array (about 7.7 MB of raw counts at 240x320).
CHUNK_FRAMES = 50
#: File name suffix of each map kind, replacing the video's ``.mp4``.
MAP_SUFFIXES = {"depth": ".depth.zarr", "segmentation": ".seg.zarr"}
_ZSTD_LEVEL = 1
_METADATA = "zarr.json"
#: Largest map read whole (:func:`flyarchive.video.decode.read_map`), decoded bytes.
MAX_MAP_BYTES = 8 << 30


def map_url(video_url: str, kind: str) -> str:
    """The URL of a video's map of ``kind`` (``"depth"`` or ``"segmentation"``)."""
    base = video_url[: -len(".mp4")] if video_url.endswith(".mp4") else video_url
    return base + MAP_SUFFIXES[kind]


def remove_stale_maps(video_url: str, kept: tuple[str, ...],
                      storage_options: Mapping[str, Any]) -> list[str]:
    """Remove the maps beside a video that a render of it just replaced did not write
    (kinds not in ``kept``): they belonged to the video it replaced (another size, window
    or frame count), and are found by name. A link there is removed, never followed.

    Returns:
        The URLs removed.
    """
    from flyarchive.video.workspace import filesystem, is_local_fs

    removed = []
    for kind in MAP_SUFFIXES:
        if kind in kept:
            continue
        url = map_url(video_url, kind)
        fs, path = filesystem(url, storage_options)
        if is_local_fs(fs):
            if os.path.islink(path) or os.path.isfile(path):
                os.unlink(path)
            elif os.path.isdir(path):
                shutil.rmtree(path)
            else:
                continue
        elif fs.exists(path):
            fs.rm(path, recursive=True)
        else:
            continue
        removed.append(url)
    return removed


def depth_attrs(scale: float, far: float) -> dict[str, Any]:
    """The attributes of a depth map: the unit and scale of its counts.

    Args:
        scale: Model length units per count.
        far: The model's far clipping plane, model length units.
    """
    return {
        "flyarchive_map": "depth",
        "meaning": "planar depth (distance along the camera's optical axis) = count * scale",
        "unit": "model length unit (metres for SI models; NeuroMechFly: millimetres)",
        "scale": scale, "no_hit": 0, "saturated": 65535, "far_plane": far,
    }


def segmentation_attrs() -> dict[str, Any]:
    """The attributes of a segmentation map: what its counts name."""
    return {
        "flyarchive_map": "segmentation",
        "meaning": "geom id + 1 (mjOBJ_GEOM ids of the compiled model)",
        "background": 0,
        "ids": "geom",
    }


class MapWriter(CloseOrAbort):
    """Streams ``(n, H, W)`` uint16 maps into a new zarr v3 array in a local folder.

    Frames are buffered to whole chunks; each chunk is encoded as zarr would (little-endian
    bytes, zstd, CRC-32C; a chunk of zeros only is not stored, as zarr leaves it) and
    written to its file by the calling thread. zarr's own write path would send every
    chunk through its one event-loop thread: with an encoder thread per core that loop was
    the bound (on an H200 host, 16 encoder threads spent 1.9 ms of CPU per frame of maps
    against 0.1 ms for the compression itself). The array's metadata (``zarr.json``,
    attributes included) is written by :meth:`close`, after every chunk: an array without
    it is not finished. Use it as a context manager: leaving the block by an error
    removes the folder.

    Args:
        path: Local folder of the array (created; must not exist).
        size: ``(H, W)`` of each map.
        n_frames: Frames the array will hold.
        attrs: Attributes written at :meth:`close` (:func:`depth_attrs`...).
        chunk_frames: Frames per chunk.

    Raises:
        OutputExistsError: ``path`` exists.
    """

    def __init__(self, path: str | os.PathLike[str], size: tuple[int, int], n_frames: int,
                 attrs: Mapping[str, Any], *, chunk_frames: int = CHUNK_FRAMES) -> None:
        self.path = Path(path)
        self.size, self.n_frames, self._attrs = tuple(size), int(n_frames), dict(attrs)
        self._chunk = max(1, min(int(chunk_frames), self.n_frames))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir()
        except FileExistsError:
            raise OutputExistsError(f"A map already exists at {str(self.path)!r}.") from None
        self._buffer = np.zeros((self._chunk, *self.size), np.uint16)
        self._held = 0  # frames in the buffer
        self.written = 0  # frames in the array

    def write(self, counts: np.ndarray) -> None:
        """Append one map ``(H, W)`` or a block ``(n, H, W)`` of uint16 counts.

        Raises:
            FrameSizeError: a shape that is not ``(H, W)`` or ``(n, H, W)``, or more
                frames than ``n_frames``.
        """
        block = counts[None] if counts.ndim == 2 else counts
        if block.shape[1:] != self.size or block.ndim != 3:
            raise FrameSizeError(f"Maps of shape {counts.shape!r} given; this array holds "
                                 f"{self.size!r} maps or blocks of them.")
        if self.written + self._held + len(block) > self.n_frames:
            raise FrameSizeError(f"More than the {self.n_frames} frames of {str(self.path)!r}.")
        while len(block):
            take = min(self._chunk - self._held, len(block))
            self._buffer[self._held:self._held + take] = block[:take]
            self._held += take
            block = block[take:]
            if self._held == self._chunk:
                self._flush()

    def close(self) -> None:
        """Write what is buffered, then the metadata with the attributes.

        Raises:
            VideoEncodeError: fewer frames than ``n_frames`` were written (the folder is
                removed).
        """
        self._flush()
        if self.written != self.n_frames:
            self.abort()
            raise VideoEncodeError(
                f"Only {self.written} of the {self.n_frames} frames of {str(self.path)!r} "
                "were written; the map is removed.")
        import zarr
        from zarr.codecs import Crc32cCodec, ZstdCodec

        # zarr writes the metadata (zarr.json) only: the chunks already hold what its
        # codecs below would store (encode_chunk)
        zarr.create_array(
            store=str(self.path), shape=(self.n_frames, *self.size),
            chunks=(self._chunk, *self.size), dtype="uint16", fill_value=0,
            compressors=[ZstdCodec(level=_ZSTD_LEVEL), Crc32cCodec()],
            dimension_names=("time", "y", "x"), zarr_format=3, attributes=self._attrs,
        )

    def abort(self) -> None:
        """Remove the folder and everything written."""
        shutil.rmtree(self.path, ignore_errors=True)

    def _flush(self) -> None:
        if not self._held:
            return
        if self._held < self._chunk:  # the last chunk: zarr stores edge chunks whole
            self._buffer[self._held:] = 0
        if self._buffer.any():
            index = self.written // self._chunk
            folder = self.path / "c" / str(index) / "0"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "0").write_bytes(encode_chunk(self._buffer))
        self.written += self._held
        self._held = 0


def encode_chunk(counts: np.ndarray) -> bytes:
    """One chunk of uint16 counts as the map array's codecs store it: the
    little-endian bytes compressed with zstd, then their CRC-32C (little-endian uint32)."""
    import google_crc32c
    from numcodecs import Zstd

    compressed = Zstd(level=_ZSTD_LEVEL).encode(np.ascontiguousarray(counts, dtype="<u2"))
    return bytes(compressed) + struct.pack("<I", google_crc32c.value(bytes(compressed)))


def check_map_metadata(meta: Any, where: str) -> tuple[int, int]:
    """Check a map array's parsed ``zarr.json`` against what :class:`MapWriter` writes:
    uint16 ``(frames, H, W)`` in chunks of whole frames, little-endian bytes, zstd, CRC-32C,
    fill 0, default chunk keys; small enough chunks, few enough of them, at most
    :data:`MAX_MAP_BYTES` in all.

    Args:
        meta: The parsed metadata.
        where: Its path or URL, for messages.

    Returns:
        ``(most bytes a chunk file may hold, bytes it decodes to)``.

    Raises:
        CorruptArchiveError: naming the file and what in it a map never holds.
    """
    from flyarchive.store.allowlist import MAX_CHUNK_BYTES, MAX_OBJECTS

    def bad(problem: str) -> CorruptArchiveError:
        return CorruptArchiveError(
            f"{where}: {problem}. flyarchive reads only the maps it writes (uint16 counts, "
            "zstd then CRC-32C), so nothing was decoded; render the map again.")

    if not isinstance(meta, dict) or (meta.get("zarr_format"), meta.get("node_type")) != (3, "array"):
        raise bad("it is not the metadata of a zarr v3 array")
    shape = meta.get("shape")
    grid = meta.get("chunk_grid") or {}
    chunks = (grid.get("configuration") or {}).get("chunk_shape") if isinstance(grid, dict) else None
    for name, value in (("shape", shape), ("chunk_shape", chunks)):
        if not (isinstance(value, list) and len(value) == 3
                and all(type(v) is int and v >= 0 for v in value)):
            raise bad(f"its {name} is {str(value)[:60]}, not three whole numbers")
    if grid.get("name") != "regular" or chunks[0] < 1 or chunks[1:] != shape[1:]:
        raise bad(f"its chunk grid {str(grid)[:80]} is not whole frames of {shape[1:]}")
    codecs = meta.get("codecs")
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs] \
        if isinstance(codecs, list) else codecs
    if meta.get("data_type") != "uint16" or names != ["bytes", "zstd", "crc32c"] or \
            (codecs[0].get("configuration") or {}).get("endian", "little") != "little":
        raise bad(f"it holds {meta.get('data_type')!r} through {str(names)[:80]}, not uint16 "
                  "through bytes (little-endian), zstd, crc32c")
    if meta.get("fill_value") != 0 or meta.get("storage_transformers") or \
            meta.get("chunk_key_encoding") != {"name": "default", "configuration": {"separator": "/"}}:
        raise bad("its fill value, storage transformers or chunk keys are not a map's")
    raw = 2 * chunks[0] * shape[1] * shape[2]
    count = -(-shape[0] // chunks[0])
    if raw > MAX_CHUNK_BYTES or count > MAX_OBJECTS or 2 * shape[0] * shape[1] * shape[2] > MAX_MAP_BYTES:
        raise bad(f"shape {shape} in chunks of {chunks[0]} frames is more than flyarchive reads "
                  f"(chunks of at most {MAX_CHUNK_BYTES} bytes, {MAX_OBJECTS} of them, "
                  f"{MAX_MAP_BYTES} bytes in all); open it with zarr and read slices")
    # zstd's bound on compressed size (ZSTD_COMPRESSBOUND), then the 4-byte checksum
    return raw + (raw >> 8) + (128 << 10) + 4, raw


def join_maps(parts: list[Path], out: str | os.PathLike[str], **attrs: Any) -> None:
    """Join finished local map arrays, in order, into a new one at ``out``.

    The parts are read a chunk at a time; the result has their attributes (the first
    part's), updated with ``attrs`` (e.g. ``first_frame``).

    Raises:
        VideoEncodeError: the parts differ in frame size.
    """
    import zarr

    arrays = [zarr.open_array(str(p), mode="r") for p in parts]
    sizes = {tuple(a.shape[1:]) for a in arrays}
    if len(sizes) != 1:
        raise VideoEncodeError(f"Map segments of different sizes {sorted(sizes)} cannot be joined.")
    meta = {**dict(arrays[0].attrs), **attrs}
    total = sum(a.shape[0] for a in arrays)
    with MapWriter(out, sizes.pop(), total, meta) as writer:  # type: ignore[arg-type]
        for array in arrays:
            for k in range(0, array.shape[0], CHUNK_FRAMES):
                writer.write(np.asarray(array[k:k + CHUNK_FRAMES]))


def publish_map(local: str | os.PathLike[str], url: str, storage_options: Mapping[str, Any],
                *, overwrite: bool = False, staging_dir: str | os.PathLike[str] | None = None,
                move: bool = False, root: str | os.PathLike[str] | None = None) -> str:
    """Copy a finished map folder to its final URL, so that the URL never holds part of it.

    Local disk: the folder is copied beside the target (or into ``staging_dir``, on the
    same file system) and renamed into place; with ``overwrite`` an existing array is
    renamed away first and removed after. Object stores: an existing array is removed
    first (``overwrite``), the chunks are uploaded, and the array's metadata
    (``zarr.json``) last: a reader sees no array until it is complete.

    Args:
        local: The finished local array folder (:class:`MapWriter`).
        url: Destination path or fsspec URL.
        storage_options: fsspec options of ``url``.
        overwrite: Replace an existing array.
        staging_dir: Local destinations: a folder on their file system to stage in.
        move: The caller is done with ``local``: on the destination's file system the
            folder is renamed into place instead of copied.
        root: Local destinations: the output folder the array must stay inside.

    Returns:
        ``url``.

    Raises:
        OutputExistsError: the destination exists and ``overwrite`` is False.
        UnsafeFileError: the destination leads out of ``root``.
        StorageError: the copy failed.
    """
    from flyarchive.video.workspace import filesystem, is_local_fs

    source = Path(local)
    fs, target = filesystem(url, storage_options)
    exists = OutputExistsError(
        f"A map already exists at {url!r}. Pass overwrite=True (--overwrite) to replace it, or choose "
        "another output location.")
    try:
        if is_local_fs(fs):
            _publish_local(source, Path(target), overwrite, exists, staging_dir, move, root)
        else:
            _publish_remote(fs, source, target, overwrite, exists)
    except (OutputExistsError, UnsafeFileError):
        raise
    except Exception as err:
        raise StorageError(f"Copying the map {str(source)!r} to {url!r} failed: {err!r}") from err
    return url


def _publish_local(source: Path, target: Path, overwrite: bool, exists: OutputExistsError,
                   staging_dir: str | os.PathLike[str] | None, move: bool,
                   root: str | os.PathLike[str] | None = None) -> None:
    from flyarchive.video.guard import make_parent
    from flyarchive.video.workspace import stage

    make_parent(target, root)
    if os.path.lexists(target) and not overwrite:  # a dangling link too
        raise exists
    folder = target.parent if staging_dir is None else Path(staging_dir)
    staging = folder / f".{target.name}.{uuid.uuid4().hex}.part"
    stage(source, staging, move)
    trash = None
    try:
        if overwrite and os.path.lexists(target):
            trash = staging.with_name(staging.name + ".old")
            os.rename(target, trash)
        try:
            os.rename(staging, target)  # refuses a non-empty folder that appeared meanwhile
        except OSError:
            if os.path.lexists(target):
                raise exists from None
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if trash is not None and trash.is_symlink():  # a link was replaced: not what it names
            trash.unlink()
        elif trash is not None:
            shutil.rmtree(trash, ignore_errors=True)


def _publish_remote(fs: Any, source: Path, target: str, overwrite: bool,
                    exists: OutputExistsError) -> None:
    if fs.exists(target):
        if not overwrite:
            raise exists
        fs.rm(target, recursive=True)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    metadata = [p for p in files if p.name == _METADATA]
    for path in [p for p in files if p.name != _METADATA] + metadata:  # metadata last
        fs.put_file(str(path), f"{target}/{path.relative_to(source).as_posix()}")
