"""H.264 mp4 through the ffmpeg that imageio-ffmpeg ships: :class:`VideoWriter` streams
frames into it, started by us in its own process group; :func:`concat_segments` joins
segments without re-encoding.

Frames are piped to ``ffmpeg`` as they come, so memory holds what the caller passes,
never the video. Sizes are passed through as they are, and odd sizes, which yuv420p
cannot hold, are refused rather than resized. Segments encoded with the same settings
(:func:`encode_segment`) join without re-encoding (:func:`concat_segments`, with
ffmpeg's concat demuxer and ``-c copy``: the frames of the output are exactly the frames
of the segments).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import imageio_ffmpeg
import numpy as np

from flyarchive.errors import (
    FrameFormatError,
    FrameSizeError,
    OptionsError,
    OutputExistsError,
    VideoEncodeError,
)
from flyarchive.replay.sizes import PIXEL_FORMATS, frame_shape, is_int, parse_frame_size

#: x264 presets, fastest first.
PRESETS = (
    "ultrafast", "superfast", "veryfast", "faster", "fast",
    "medium", "slow", "slower", "veryslow", "placebo",
)  # fmt: skip


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
        if not is_int(self.crf) or not 0 <= self.crf <= 51:
            raise OptionsError(f"crf must be an integer in 0..51, got {self.crf!r}.")
        if self.preset not in PRESETS:
            presets = ", ".join(PRESETS)
            raise OptionsError(f"preset {self.preset!r} is not an x264 preset: {presets}.")
        for name in ("threads", "keyframe_interval"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise OptionsError(f"{name} must be None or a positive integer, got {value!r}.")

    def ffmpeg_args(self) -> list[str]:
        """The ffmpeg output options these settings stand for."""
        args = ["-crf", str(self.crf), "-preset", self.preset]
        if self.threads is not None:
            args += ["-threads", str(self.threads)]
        if self.keyframe_interval is not None:
            args += ["-g", str(self.keyframe_interval)]
        return args


class CloseOrAbort:
    """The ``with``-block of a writer: :meth:`close` when the block ends normally,
    :meth:`abort` when it raises (so nothing partial is left under a final name)."""

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class VideoWriter(CloseOrAbort):
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
        OptionsError: if ``pixel_format`` is not one of :data:`PIXEL_FORMATS`.
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
        self.size = parse_frame_size(size, even=True)
        if pixel_format not in PIXEL_FORMATS:
            raise OptionsError(f"pixel_format must be one of {PIXEL_FORMATS}, got {pixel_format!r}.")
        self.pixel_format = pixel_format
        if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not fps >= 0.01:
            raise OptionsError(f"fps must be a number >= 0.01, got {fps!r}.")
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
    from flyarchive.video.workspace import scratch_dir

    with tempfile.TemporaryDirectory(prefix="flyarchive-concat-", dir=scratch_dir()) as tmp:
        segments = _same_delay(segments, Path(tmp))
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


def _first_packet(path: Path) -> tuple[int, int, int]:
    """``(dts, pts, duration)`` of a segment's first video packet, in its time base."""
    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-v", "error", "-i", str(path),
               "-map", "0:v", "-c", "copy", "-frames:v", "1", "-f", "framecrc", "-"]
    result = subprocess.run(command, capture_output=True, text=True)
    rows = [line.split(",") for line in result.stdout.splitlines()
            if line.strip() and not line.startswith("#")]
    if result.returncode != 0 or not rows or len(rows[0]) < 4:
        raise VideoEncodeError(f"ffmpeg could not read the first packet of {str(path)!r}: "
                               f"{result.stderr.strip()[-500:]}")
    return int(rows[0][1]), int(rows[0][2]), int(rows[0][3])


def _same_delay(segments: list[Path], tmp: Path) -> list[Path]:
    """The segments, each with the decode delay of the one that has the most (the frames
    its first packet's decoding starts ahead of its showing): x264 starts a segment of
    a frame or two without B-frame delay, and the concat demuxer then leaves a gap in
    the decode times (the mp4's frame rate read as 23.2 instead of 25). A segment with
    less delay is remuxed (stream copy) with its decode times moved earlier; its frames
    and their presentation times are unchanged."""
    if len(segments) < 2:
        return segments
    firsts = [_first_packet(p) for p in segments]
    delays = [(pts - dts) // max(duration, 1) for dts, pts, duration in firsts]
    most = max(delays)
    fixed = []
    for i, (path, delay) in enumerate(zip(segments, delays)):
        if delay == most:
            fixed.append(path)
            continue
        moved = tmp / f"delay-{i:06d}.mp4"
        command = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-v", "error", "-y",
                   "-i", str(path), "-map", "0:v", "-c", "copy", "-bsf:v",
                   f"setts=dts=DTS-{most - delay}*DURATION", str(moved)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise VideoEncodeError(f"ffmpeg could not align the decode times of {str(path)!r}: "
                                   f"{result.stderr.strip()[-500:]}")
        fixed.append(moved)
    return fixed


def _probe(path: Path) -> tuple[str, tuple[int, int], float]:
    # No frames asked: ffmpeg ends after the header, so the reader runs to its end. Closing
    # it early instead makes imageio-ffmpeg wait for ffmpeg, then kill it with a warning on
    # stderr when a loaded machine is slower than its 1.5 s (a second line after a stop).
    reader = imageio_ffmpeg.read_frames(str(path), output_params=["-frames:v", "0"])
    meta = next(reader)
    for _ in reader:
        pass
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
