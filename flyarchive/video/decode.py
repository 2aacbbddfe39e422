"""Decode what a render wrote back to arrays: videos to frames (for checks and tests, not
for long videos), depth and segmentation maps to model units and geom ids.

What is read is untrusted (:mod:`flyarchive.video.guard`): only regular files (never a
FIFO, a device or a link leading out of ``root``), maps only as :class:`MapWriter` writes
them (:func:`~flyarchive.video.maps.check_map_metadata`), every file of bounded size.
Files on object stores (``s3://...``, as a manifest names them) are copied to a local
scratch folder first, then read as local files are.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import imageio_ffmpeg
import numpy as np

from flyarchive.errors import CorruptArchiveError, OptionsError, StorageError, UnsafeFileError
from flyarchive.schema import MAX_JSON_DEPTH, json_depth_of

#: Most decoded bytes :func:`read_video` holds unless told otherwise (4 GiB).
MAX_VIDEO_BYTES = 4 << 30
#: Largest video file read, bytes.
MAX_VIDEO_FILE_BYTES = 16 << 30
_MAP_METADATA_BYTES = 1 << 20


def read_video(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None,
               *, root: str | os.PathLike[str] | None = None,
               max_bytes: int = MAX_VIDEO_BYTES) -> np.ndarray:
    """Decode a video into memory (for tests and checks, not for long videos).

    Args:
        path: A local path or any fsspec URL (``s3://...``, as a manifest lists it).
        storage_options: fsspec options of ``path``.
        root: Local files: the folder (e.g. the output folder) it must be inside, links
            included; None: any regular file (links to one are followed).
        max_bytes: Most decoded bytes to hold.

    Returns:
        ``(n_frames, H, W, 3)`` uint8 RGB.

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafeFileError: a FIFO, device, socket or folder, a link leading out of ``root``,
            or a file larger than :data:`MAX_VIDEO_FILE_BYTES` (not opened).
        CorruptArchiveError: the file does not decode as a video.
        OptionsError: it decodes to more than ``max_bytes``.
    """
    text = os.fspath(path)
    with _local_copy(text, storage_options, root, "video", MAX_VIDEO_FILE_BYTES) as local:
        return _decode(local, text, max_bytes)


def _decode(local: str, text: str, max_bytes: int) -> np.ndarray:
    # Every frame the file holds, once: the ffmpeg of imageio-ffmpeg 0.8 (9.0) converts to a
    # constant rate when it writes to a pipe, and repeats a frame whose stored duration
    # spans a joined segment's start (5 frames decoded as 7); imageio-ffmpeg 0.6's did not.
    reader = imageio_ffmpeg.read_frames(local, output_params=["-fps_mode", "passthrough"])
    try:
        meta = next(reader)
        width, height = meta["size"]
        frames = []
        for raw in reader:
            frames.append(np.frombuffer(raw, np.uint8).reshape(height, width, 3))
            if len(frames) * height * width * 3 > max_bytes:
                raise OptionsError(
                    f"The video {text!r} decodes to more than max_bytes={max_bytes} bytes; "
                    "read_video holds a whole video in memory. Pass a larger max_bytes, or "
                    "decode it in pieces (imageio, ffmpeg).")
    except OSError as err:  # ffmpeg could not read it: its last line says why
        lines = [line for line in str(err).splitlines() if line.strip()]
        raise CorruptArchiveError(
            f"The video {text!r} does not decode ({lines[-1] if lines else 'ffmpeg failed'}). "
            "It is not a finished video; render it again.") from None
    finally:
        reader.close()
    if not frames:
        return np.empty((0, height, width, 3), np.uint8)
    return np.stack(frames)


@contextmanager
def _local_copy(text: str, storage_options: Mapping[str, Any] | None,
                root: str | os.PathLike[str] | None, what: str, max_bytes: int
                ) -> Iterator[str]:
    """A checked local path of the file ``text`` (a copy in a scratch folder when remote)."""
    from flyarchive.store.location import is_local, local_path
    from flyarchive.video.guard import check_file, refuse
    from flyarchive.video.workspace import filesystem, scratch_dir

    if is_local(text):
        st = check_file(local_path(text), root)
        if st is None:
            raise FileNotFoundError(f"No {what} at {text!r}. Pass the path a render's "
                                    "manifest lists for it.")
        if st.st_size > max_bytes:
            raise refuse(text, f"is {st.st_size} bytes, more than the {max_bytes} bytes "
                         f"flyarchive reads as a {what}", "Move it away.")
        yield str(local_path(text))
        return
    fs, remote = filesystem(text, storage_options or {})
    try:
        size = fs.info(remote).get("size")
    except FileNotFoundError:
        raise FileNotFoundError(f"No {what} at {text!r}. Pass the path a render's manifest "
                                "lists for it, with the storage options of its bucket.") from None
    if not isinstance(size, int) or size > max_bytes:
        raise refuse(text, f"is {size} bytes, more than the {max_bytes} bytes flyarchive "
                     f"reads as a {what}", "Move it away.")
    with tempfile.TemporaryDirectory(prefix="flyarchive-read-", dir=scratch_dir()) as tmp:
        local = Path(tmp) / Path(remote).name
        fs.get_file(remote, str(local))
        yield str(local)


def read_map(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None,
             *, kind: str | None = None, root: str | os.PathLike[str] | None = None
             ) -> tuple[np.ndarray, dict[str, Any]]:
    """A depth or segmentation map as stored: ``(n_frames, H, W)`` uint16 counts and its
    attributes (:mod:`flyarchive.video.maps`).

    Args:
        url: The map's path or fsspec URL (``.../front.depth.zarr``).
        storage_options: fsspec options of ``url``.
        kind: ``"depth"`` or ``"segmentation"`` to insist on; None: either.
        root: Local maps: the folder (e.g. the output folder) the map must be inside;
            None: the map's own folder (every file of it inside it).

    Raises:
        FileNotFoundError: no array at ``url``.
        StorageError: the array is not a finished flyarchive map (of ``kind``).
        UnsafeFileError: a file of it is a FIFO, a device, a link leading out of the map
            (or ``root``), or larger than its metadata allows (not read).
        CorruptArchiveError: its metadata is not a map's, or a chunk fails its checksum.
    """
    from flyarchive.store.location import is_local, local_path

    text = os.fspath(url).rstrip("/")
    if not is_local(text):
        with _downloaded_map(text, storage_options) as local:
            return read_map(local, kind=kind)
    folder = str(local_path(text))
    if root is not None:
        from flyarchive.video.guard import confine

        confine(folder, root)
    limits = _map_limits(folder, text)
    array = _open_map(folder, limits)
    attrs = dict(array.attrs)
    found = attrs.get("flyarchive_map")
    if found is None or (kind is not None and found != kind):
        what = "an unfinished map or not a flyarchive map" if found is None else f"a {found} map"
        raise StorageError(
            f"{text!r} is {what}; {'a ' + kind if kind else 'a depth or segmentation'} map "
            "was asked for. Pass the path a render's manifest lists for it.")
    try:
        return np.asarray(array[:]), attrs
    except UnsafeFileError:  # a file refused unread
        raise
    except (ValueError, RuntimeError) as err:
        raise CorruptArchiveError(f"The map {text!r} does not decode ({err}); render it again.") from err


def _map_limits(folder: str, text: str) -> tuple[int, int]:
    """Read and check a local map's ``zarr.json``: ``(chunk file bytes, chunk bytes)``."""
    from flyarchive.video.guard import read_bytes
    from flyarchive.video.maps import check_map_metadata

    where = f"{text}/zarr.json"
    raw = read_bytes(os.path.join(folder, "zarr.json"), max_bytes=_MAP_METADATA_BYTES,
                     root=folder, what="the map")
    if raw is None:
        raise FileNotFoundError(f"No map array at {text!r} (no zarr.json: missing, or not "
                                "finished). Pass the path a render's manifest lists for it.")
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise CorruptArchiveError(f"{where}: it is not JSON, or nested too deep ({err}); "
                                  "render the map again.") from None
    if json_depth_of(meta) > MAX_JSON_DEPTH:
        raise CorruptArchiveError(f"{where}: its JSON is nested more than {MAX_JSON_DEPTH} "
                                  "deep; render the map again.")
    return check_map_metadata(meta, where)


def _open_map(folder: str, limits: tuple[int, int]) -> Any:
    """The map array at ``folder`` on a guarded local store that bounds its chunk files."""
    import zarr

    from flyarchive.store import allowlist
    from flyarchive.store.localstore import GuardedLocalStore
    from flyarchive.video.guard import refuse
    from flyarchive.video.maps import check_map_metadata

    chunk = allowlist.ChunkLimits(limits[0], limits[1])

    class MapStore(GuardedLocalStore):
        """A map's files: regular, inside the map, each chunk no larger than it can be."""

        _what = "map"

        def _refuse(self, key: str, problem: str, fix: str) -> Exception:
            return refuse(str(self.root / key), problem, fix)

        def _limit(self, key: str) -> allowlist.ChunkLimits:
            return chunk if key.startswith("c/") else allowlist.ChunkLimits(_MAP_METADATA_BYTES)

        def _check_metadata(self, key: str, data: bytes) -> None:
            check_map_metadata(json.loads(data), str(self.root / key))

    try:
        return zarr.open_array(store=MapStore(folder, read_only=True), mode="r", zarr_format=3)
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        raise FileNotFoundError(f"No map array at {folder!r}.") from None


@contextmanager
def _downloaded_map(text: str, storage_options: Mapping[str, Any] | None) -> Iterator[str]:
    """A remote map copied to a local scratch folder (each object of bounded size)."""
    from flyarchive.video.guard import read_bytes, refuse
    from flyarchive.video.maps import MAX_MAP_BYTES
    from flyarchive.video.workspace import filesystem, scratch_dir

    fs, remote = filesystem(text, storage_options or {})
    try:
        found = fs.find(remote, detail=True)
    except FileNotFoundError:
        found = {}
    if not found:
        raise FileNotFoundError(f"No map array at {text!r}.")
    if sum(int(info.get("size") or 0) for info in found.values()) > MAX_MAP_BYTES:
        raise refuse(text, f"holds more than {MAX_MAP_BYTES} bytes", "Read it with zarr, in slices.")
    with tempfile.TemporaryDirectory(prefix="flyarchive-map-", dir=scratch_dir()) as tmp:
        local = Path(tmp) / "map.zarr"
        for name in found:
            relative = name[len(remote.rstrip("/")) + 1:]
            if not relative or ".." in relative.split("/"):
                continue
            target = local / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            data = read_bytes(f"{text}/{relative}", storage_options,
                              max_bytes=MAX_MAP_BYTES)
            target.write_bytes(data or b"")
        yield str(local)


def read_depth(url: str | os.PathLike[str],
               storage_options: Mapping[str, Any] | None = None, *,
               root: str | os.PathLike[str] | None = None) -> np.ndarray:
    """A depth map in model length units: ``(n_frames, H, W)`` float32, NaN where nothing
    was hit. Planar depth (along the camera's optical axis); the unit is the model's
    (metres for SI models, millimetres for NeuroMechFly); values are multiples of the
    map's ``scale`` attribute (at most ``scale / 2`` from the rendered depth).

    Raises: as :func:`read_map`.
    """
    from flyarchive.replay.output_kinds import counts_to_depth

    counts, attrs = read_map(url, storage_options, kind="depth", root=root)
    return counts_to_depth(counts, float(attrs["scale"]))


def read_segmentation(url: str | os.PathLike[str],
                      storage_options: Mapping[str, Any] | None = None, *,
                      root: str | os.PathLike[str] | None = None) -> np.ndarray:
    """A segmentation map as geom ids: ``(n_frames, H, W)`` int32, the ``mjOBJ_GEOM`` id
    of the compiled model seen at each pixel, -1 where no geom is seen (background).

    Raises: as :func:`read_map`.
    """
    from flyarchive.replay.output_kinds import counts_to_ids

    counts, _ = read_map(url, storage_options, kind="segmentation", root=root)
    return counts_to_ids(counts)
