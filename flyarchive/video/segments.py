"""Join mp4 segments encoded with the same settings into one, without re-encoding.

Long videos are encoded as segments in parallel (one per block of frames) and joined
with ffmpeg's concat demuxer and ``-c copy``: the frames of the output are exactly the
frames of the segments.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import imageio_ffmpeg

from flyarchive.errors import OutputExistsError, VideoEncodeError

__all__ = ["concat_segments"]


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
