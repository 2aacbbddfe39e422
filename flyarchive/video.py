"""Frames to H.264 mp4 with imageio-ffmpeg: streaming, segment by segment, to any fsspec URL.

Frames are piped to an ``ffmpeg`` process as they come, so memory holds what the caller
passes, never the video. Sizes are passed through as they are: imageio-ffmpeg's default
resizing to multiples of 16 is switched off (``macro_block_size=1``), and odd sizes,
which yuv420p cannot hold, are refused rather than resized.

Long videos can be encoded as segments in parallel (:func:`encode_segment`, one per
block of frames) and joined without re-encoding (:func:`concat_segments`). ffmpeg
writes local files only; :func:`write_output` uploads a finished file to a URL.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import imageio_ffmpeg
import numpy as np

from flyarchive.errors import (
    FlyarchiveError,
    FrameSizeError,
    OutputExistsError,
    SelectionError,
    StorageBackendMissingError,
    StorageError,
)

__all__ = [
    "FrameFormatError",
    "VideoEncodeError",
    "VideoOptions",
    "VideoWriter",
    "encode_segment",
    "concat_segments",
    "write_output",
    "safe_video_path",
    "read_video",
    "parse_video_size",
    "PIXEL_FORMATS",
    "PRESETS",
    "frame_shape",
]

#: x264 presets, fastest first.
PRESETS = (
    "ultrafast", "superfast", "veryfast", "faster", "fast",
    "medium", "slow", "slower", "veryslow", "placebo",
)  # fmt: skip
_SAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]")
#: Pixel formats a :class:`VideoWriter` takes: ``"rgb24"`` frames ``(H, W, 3)``, or
#: ``"yuv420p"`` frames ``(H * 3 // 2, W)``: planar I420, H rows of luma then the
#: ``(H/2, W/2)`` U and V planes (BT.601, limited range), passed to x264 unconverted.
PIXEL_FORMATS = ("rgb24", "yuv420p")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class FrameFormatError(FlyarchiveError, TypeError):
    """Frames are not uint8 arrays."""


class VideoEncodeError(FlyarchiveError, RuntimeError):
    """ffmpeg failed, or a video would be empty or mixes incompatible segments."""


@dataclass(frozen=True)
class VideoOptions:
    """How frames are encoded: H.264 (libx264), yuv420p, constant quality.

    The same frames and options give the same bytes (x264 is deterministic).

    Attributes:
        crf: Constant rate factor, 0 (lossless) to 51 (worst); 18 is visually lossless.
        preset: x264 speed/size trade-off, ``"ultrafast"`` to ``"placebo"``.
        threads: Encoder threads; ``None`` lets ffmpeg choose (all cores). Pass 1 when
            many encoders run at once, e.g. one per Dask worker core.
        keyframe_interval: Frames between keyframes (``-g``); ``None``: x264's default
            (250). Shorter makes seeking faster and files larger.
    """

    crf: int = 18
    preset: str = "veryfast"
    threads: int | None = None
    keyframe_interval: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.crf) or not 0 <= self.crf <= 51:
            raise ValueError(f"crf must be an integer in 0..51, got {self.crf!r}.")
        if self.preset not in PRESETS:
            presets = ", ".join(PRESETS)
            raise ValueError(f"preset {self.preset!r} is not an x264 preset: {presets}.")
        for name in ("threads", "keyframe_interval"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"{name} must be None or a positive integer, got {value!r}.")

    def ffmpeg_args(self) -> list[str]:
        """The ffmpeg output options these settings stand for."""
        args = ["-crf", str(self.crf), "-preset", self.preset]
        if self.threads is not None:
            args += ["-threads", str(self.threads)]
        if self.keyframe_interval is not None:
            args += ["-g", str(self.keyframe_interval)]
        return args


class VideoWriter:
    """Streams RGB frames into an H.264 mp4 file on the local disk.

    Use it as a context manager. On leaving the block the file is finished; when the
    block raises, the partial file is removed.

    Args:
        path: Local output file (``.mp4``); missing parent folders are created.
        fps: Frames per second of video (ffmpeg keeps two decimals).
        size: ``(height, width)`` of every frame in pixels; both even (yuv420p).
        options: Encoder settings.
        overwrite: Replace an existing file (False: raise :class:`OutputExistsError`).
        pixel_format: What :meth:`write` takes, one of :data:`PIXEL_FORMATS`:
            ``"rgb24"`` (ffmpeg converts to yuv420p) or ``"yuv420p"`` (converted
            already, e.g. on the GPU; encoded as it is).

    Raises:
        FrameSizeError: if a side is odd or not positive (the message suggests the
            nearest even size).
        OutputExistsError: if ``path`` exists and ``overwrite`` is False, or is a folder.
        ValueError: if ``pixel_format`` is not one of :data:`PIXEL_FORMATS`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fps: float,
        size: tuple[int, int],
        *,
        options: VideoOptions = VideoOptions(),
        overwrite: bool = False,
        pixel_format: str = "rgb24",
    ) -> None:
        self.path = Path(path)
        self.size = parse_video_size(size)
        if pixel_format not in PIXEL_FORMATS:
            raise ValueError(f"pixel_format must be one of {PIXEL_FORMATS}, got {pixel_format!r}.")
        self.pixel_format = pixel_format
        if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not fps >= 0.01:
            raise ValueError(f"fps must be a number >= 0.01, got {fps!r}.")
        if self.path.is_dir():
            raise OutputExistsError(
                f"{str(self.path)!r} is a folder; a video needs a file path. Pass a path "
                "ending in .mp4 that is not a folder."
            )
        if self.path.exists() and not overwrite:
            raise OutputExistsError(
                f"The video {str(self.path)!r} exists. Remove it, choose another path, "
                "or pass overwrite=True."
            )
        self.fps = float(fps)
        self.options = options
        self.n_frames = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    def __enter__(self) -> VideoWriter:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def open(self) -> None:
        """Start ffmpeg. Called by ``with``; calling it twice does nothing.

        ffmpeg is started with ``subprocess.Popen`` in its own process group (a Ctrl-C
        in the terminal reaches Python, which aborts, not ffmpeg mid-file), not with
        imageio-ffmpeg's ``write_frames``: that one sets a ``preexec_fn``, which makes
        Python fork the whole process, page tables and all, while holding the GIL
        (measured: 7 ms per video for a 2 GB process here, far more for one holding
        CUDA mappings), where ``process_group`` lets it use ``vfork``.
        """
        if self._process is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        height, width = self.size
        command = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-v", "error",
            "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}",
            "-pix_fmt", self.pixel_format, "-r", f"{self.fps:.02f}", "-i", "-", "-an",
            "-vcodec", "libx264", "-pix_fmt", "yuv420p", *self.options.ffmpeg_args(),
            str(self.path),
        ]
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._stderr,
            process_group=0,
        )
        assert self._process.stdin is not None
        _widen_pipe(self._process.stdin.fileno())

    def write(self, frames: np.ndarray) -> None:
        """Encode one frame or a block of ``n`` frames, uint8, host memory.

        A frame is :func:`frame_shape` ``(size, pixel_format)``: ``(H, W, 3)`` RGB, or
        ``(H * 3 // 2, W)`` planar I420 for ``"yuv420p"``.

        Raises:
            FrameFormatError: if the frames are not a uint8 array.
            FrameSizeError: if their shape is not a frame or a block of frames of the
                writer's size and pixel format.
            VideoEncodeError: if ffmpeg stopped (the message has its exit status and
                error output).
        """
        block = _parse_frames(frames, frame_shape(self.size, self.pixel_format))
        self.open()
        assert self._process is not None and self._process.stdin is not None
        try:
            # One pipe write for the whole block: ffmpeg's rawvideo input reads frames
            # back to back, and the write releases the GIL while ffmpeg consumes it.
            self._process.stdin.write(np.ascontiguousarray(block))
            self.n_frames += len(block)
        except OSError as err:  # ffmpeg stopped reading: wait for it, for its message
            log = self._stop(kill=False) or "ffmpeg exited cleanly without reading all frames."
            self.path.unlink(missing_ok=True)
            raise VideoEncodeError(
                f"ffmpeg stopped while encoding {str(self.path)!r} ({err}). {log}"
            ) from None

    def close_input(self) -> None:
        """Tell ffmpeg that no frame follows, without waiting for it to finish the file.

        ffmpeg encodes what it still holds and writes the file meanwhile; :meth:`close`
        then waits for it (:attr:`finished` tells whether it has exited). Calling it
        twice, or before any frame, does nothing.
        """
        if self._process is not None and self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:  # ffmpeg stopped reading: close() reports its exit status
                pass

    @property
    def finished(self) -> bool:
        """True when no ffmpeg is running for this writer (never started, or exited)."""
        return self._process is None or self._process.poll() is not None

    def close(self) -> None:
        """Finish the file.

        Raises:
            VideoEncodeError: if no frame was written (the empty file is removed),
                ffmpeg failed (its exit status and error output are in the message)
                or left no file.
        """
        failed = ""
        if self._process is not None:
            failed = self._stop(kill=self.n_frames == 0)
        if failed:
            self.path.unlink(missing_ok=True)
            raise VideoEncodeError(f"ffmpeg could not finish {str(self.path)!r}. {failed}")
        if self.n_frames == 0:
            self.path.unlink(missing_ok=True)
            raise VideoEncodeError(
                f"No frames were written to {str(self.path)!r}; an mp4 needs at least one. "
                "Check the selection of frames passed to the writer."
            )
        if not self.path.is_file() or self.path.stat().st_size == 0:
            raise VideoEncodeError(
                f"ffmpeg exited cleanly but left no video at {str(self.path)!r} after "
                f"{self.n_frames} frames. Check that the folder is writable."
            )

    def abort(self) -> None:
        """Stop ffmpeg and remove the partial file."""
        if self._process is not None:
            self._stop(kill=True)
        self.path.unlink(missing_ok=True)

    def _stop(self, *, kill: bool) -> str:
        """End ffmpeg: close its input and wait for it, or kill it.

        Returns:
            ``""`` when it exited cleanly or was killed, else its exit status and the
            end of its error output.
        """
        process = self._process
        assert process is not None
        if kill:
            process.kill()
        self.close_input()
        self._process = None
        code = process.wait()
        self._stderr.seek(0)
        log = self._stderr.read().decode(errors="replace").strip()[-2000:]
        self._stderr.close()
        if kill or code == 0:
            return ""
        return f"ffmpeg exited with status {code}: {log or '(no message)'}"


def _widen_pipe(fd: int) -> None:
    """Let a pipe hold several frames (Linux: 1 MiB, the unprivileged maximum, instead
    of 64 KiB), so a writer hands over frames with fewer context switches."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return
    size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if size is not None:
        try:
            fcntl.fcntl(fd, size, 1 << 20)
        except OSError:  # a lower system limit: keep the default
            pass


def encode_segment(
    frames: Iterable[np.ndarray],
    path: str | os.PathLike[str],
    fps: float,
    size: tuple[int, int],
    options: VideoOptions = VideoOptions(),
    *,
    overwrite: bool = False,
) -> int:
    """Encode frames into a self-contained mp4 that starts on a keyframe.

    Segments encoded with the same ``fps``, ``size`` and ``options`` join without
    re-encoding with :func:`concat_segments`, so blocks of one video can be encoded in
    parallel.

    Args:
        frames: Iterable of ``(H, W, 3)`` frames or ``(n, H, W, 3)`` blocks, uint8 RGB;
            consumed lazily.
        path: Local output file.
        fps: Frames per second of video.
        size: ``(height, width)``, both even.
        options: Encoder settings.
        overwrite: Replace an existing file.

    Returns:
        The number of frames encoded.
    """
    with VideoWriter(path, fps, size, options=options, overwrite=overwrite) as writer:
        for item in frames:
            writer.write(item)
    return writer.n_frames


def concat_segments(
    paths: Sequence[str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> None:
    """Join mp4 segments, in the given order, into one mp4 without re-encoding.

    Uses ffmpeg's concat demuxer with ``-c copy``: the frames of the output are exactly
    the frames of the segments.

    Args:
        paths: Local segment files, in playing order; all encoded with the same size,
            fps and codec (e.g. by :func:`encode_segment` with the same arguments).
        out_path: Local output file.
        overwrite: Replace an existing output file.

    Raises:
        FileNotFoundError: if a segment is missing.
        VideoEncodeError: if there is no segment, the segments differ in codec, size or
            fps, or ffmpeg fails.
        OutputExistsError: if ``out_path`` exists and ``overwrite`` is False.
    """
    segments = [Path(p).resolve() for p in paths]
    out = Path(out_path)
    if not segments:
        raise VideoEncodeError(f"No segments to join into {str(out)!r}; pass at least one.")
    missing = [str(p) for p in segments if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"Segments not found: {', '.join(repr(m) for m in missing)}.")
    if out.exists() and not overwrite:
        raise OutputExistsError(
            f"The video {str(out)!r} exists. Remove it, choose another path, "
            "or pass overwrite=True."
        )
    _check_same_stream(segments)
    out.parent.mkdir(parents=True, exist_ok=True)
    from flyarchive.workspace import scratch_dir

    with tempfile.TemporaryDirectory(prefix="flyarchive-concat-", dir=scratch_dir()) as tmp:
        listing = Path(tmp) / "segments.txt"
        listing.write_text("".join(f"file {_concat_quote(str(p))}\n" for p in segments))
        command = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-v", "error", "-y",
            "-f", "concat", "-safe", "0", "-i", str(listing),
            "-map", "0:v", "-c", "copy", str(out),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        out.unlink(missing_ok=True)
        raise VideoEncodeError(
            f"ffmpeg could not join {len(segments)} segments into {str(out)!r} "
            f"(exit {result.returncode}): {result.stderr.strip()[-2000:]}"
        )


def write_output(
    local_path: str | os.PathLike[str],
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    staging_dir: str | os.PathLike[str] | None = None,
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

    Returns:
        The destination URL as given.

    Raises:
        OutputExistsError: if the destination exists and ``overwrite`` is False
            (nothing is written).
        StorageBackendMissingError: if the URL's protocol needs a missing package.
        StorageError: if the copy fails.
    """
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    source = Path(local_path)
    if not source.is_file():
        raise FileNotFoundError(f"No file to copy at {str(source)!r}.")
    try:
        fs, target = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as err:
        raise StorageBackendMissingError(
            f"Writing to {url!r} needs a package that is not installed: {err}. "
            "For s3:// install it with: pip install 'flyarchive[s3]'"
        ) from err
    exists_error = OutputExistsError(
        f"An output already exists at {url!r}. Pass overwrite=True to replace it, "
        "or choose another output location."
    )
    try:
        if isinstance(fs, LocalFileSystem):
            staging = None if staging_dir is None else Path(staging_dir)
            _copy_local(source, Path(target), overwrite, exists_error, staging)
        else:
            if not overwrite and fs.exists(target):
                raise exists_error
            fs.put_file(str(source), target)
    except (OutputExistsError, StorageBackendMissingError):
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
    if not _is_int(world_id) or world_id < 0:
        raise SelectionError(f"world_id must be a non-negative integer, got {world_id!r}.")
    name = _SAFE_CHARS.sub("_", str(camera))[:100]
    name = re.sub(r"^\.", "_", name) or "_"
    if name != camera:
        name += "-" + hashlib.sha256(str(camera).encode()).hexdigest()[:8]
    base = os.fspath(out_dir).rstrip("/")
    return f"{base}/world{int(world_id):05d}/{name}.mp4"


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


def parse_video_size(size: tuple[int, int]) -> tuple[int, int]:
    """Check a video size before rendering anything: ``(height, width)``, positive and even.

    Returns:
        ``(height, width)`` as Python ints.

    Raises:
        FrameSizeError: if a side is odd (the message suggests the nearest even sizes)
            or not a positive integer.
    """
    ok = isinstance(size, (tuple, list)) and len(size) == 2 and all(_is_int(s) for s in size)
    if not ok or not all(s > 0 for s in size):
        raise FrameSizeError(f"size must be (height, width), two positive integers; got {size!r}.")
    height, width = int(size[0]), int(size[1])
    if height % 2 or width % 2:
        nearest = (height + height % 2, width + width % 2)
        lower = (max(2, height - height % 2), max(2, width - width % 2))
        raise FrameSizeError(
            f"Video size (height, width)={(height, width)!r} has an odd side; H.264 in "
            f"yuv420p needs even sizes. Render at {nearest!r} or {lower!r} instead "
            "(frames are never resized silently)."
        )
    return height, width


_parse_even_size = parse_video_size  # older private name, kept for callers


def frame_shape(size: tuple[int, int], pixel_format: str = "rgb24") -> tuple[int, ...]:
    """The array shape of one frame of ``size = (H, W)`` in ``pixel_format``."""
    height, width = size
    return (height, width, 3) if pixel_format == "rgb24" else (height * 3 // 2, width)


def _parse_frames(frames: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8:
        kind = frames.dtype if isinstance(frames, np.ndarray) else type(frames).__name__
        raise FrameFormatError(
            f"Frames must be a uint8 numpy array of pixel values, got {kind}. "
            "Convert with np.clip(frames, 0, 255).astype(np.uint8) if they are 0..255."
        )
    block = frames[None] if frames.ndim == len(shape) else frames
    if block.ndim != len(shape) + 1 or block.shape[1:] != shape:
        raise FrameSizeError(
            f"Frames have shape {frames.shape!r}; this writer takes {shape!r} or "
            f"(n, *{shape!r}) frames."
        )
    return block


def _probe(path: Path) -> tuple[str, tuple[int, int], float]:
    reader = imageio_ffmpeg.read_frames(str(path))
    try:
        meta = next(reader)
    finally:
        reader.close()
    return str(meta["codec"]), tuple(meta["size"]), float(meta["fps"])


def _check_same_stream(segments: list[Path]) -> None:
    streams = [_probe(p) for p in segments]
    for path, stream in zip(segments, streams):
        if stream != streams[0]:
            raise VideoEncodeError(
                f"Segment {str(path)!r} has (codec, (width, height), fps)={stream!r}, but "
                f"{str(segments[0])!r} has {streams[0]!r}. Encode every segment of a video "
                "with the same size, fps and options."
            )


def _concat_quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def _copy_local(source: Path, target: Path, overwrite: bool, exists: OutputExistsError,
                staging_dir: Path | None = None) -> None:
    if not overwrite and target.exists():
        raise exists
    target.parent.mkdir(parents=True, exist_ok=True)
    name = f".{target.name}.{uuid.uuid4().hex}.part"
    staging = target.with_name(name) if staging_dir is None else staging_dir / name
    shutil.copyfile(source, staging)
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
