"""Mosaics: many worlds tiled into one video per camera, each tile labelled with its world id.

A ``rows x cols`` mosaic takes the selected worlds in order (the order of ``worlds=`` as
given; all worlds: their order in the archive), ``rows * cols`` per video: more worlds
make several mosaic videos, fewer leave blank (black) tiles, which the manifest lists.
Tile ``t`` of a mosaic is at row ``t // cols``, column ``t % cols``; every tile shows the
same archive frame index, so the tiles are in step in simulated time; a world whose
recording ends earlier shows black after its last frame.

A mosaic larger than the selected worlds is fitted to them (:func:`fit_mosaic`: ``4x4`` of
3 worlds is ``1x3``), and a mosaic frame must be one H.264 can hold (:func:`mosaic_size`).
The manifest gives each mosaic's real frame size, its tile size and, when fitted, the
layout asked for.

Videos are ``{out}/mosaic{index:03d}/{camera}.mp4`` (:func:`flyarchive.video.output_files.safe_mosaic_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from flyarchive.errors import FrameSizeError, RenderOptionsError
from flyarchive.query.selection import VideoJob
from flyarchive.replay.sizes import MAX_GL_SIDE, is_int

#: Most 16 x 16 macroblocks in an H.264 frame (level 6.2, the highest; e.g. 8192 x 4352).
H264_MAX_MACROBLOCKS = 139264


@dataclass(frozen=True)
class MosaicJob:
    """One mosaic video: its tiles (one :class:`~flyarchive.query.selection.VideoJob` each, None
    for a blank tile) over archive frames ``[start, stop)``."""

    index: int
    rows: int
    cols: int
    tiles: tuple[VideoJob | None, ...]
    start: int
    stop: int
    #: The ``(rows, cols)`` asked for, when the mosaic was fitted to fewer worlds.
    asked: tuple[int, int] | None = None

    @property
    def n_frames(self) -> int:
        return self.stop - self.start

    @property
    def world_ids(self) -> list[int | None]:
        """The world id of each tile, None for a blank one."""
        return [None if t is None else t.world_id for t in self.tiles]

    @property
    def world_id(self) -> int:
        """The first tile's world id (for messages that name a job by one world)."""
        return next(w for w in self.world_ids if w is not None)

    @property
    def world_index(self) -> int:
        return next(t.world_index for t in self.tiles if t is not None)

    def describe(self) -> dict[str, Any]:
        """The manifest's ``mosaic`` entry: layout, worlds per tile and blank tiles."""
        blank = [i for i, t in enumerate(self.tiles) if t is None]
        fitted = {} if self.asked is None else {"asked": list(self.asked)}
        return {"index": self.index, "rows": self.rows, "cols": self.cols, **fitted,
                "worlds": self.world_ids, "blank_tiles": blank,
                "tile_frames": [None if t is None else [t.start, t.stop] for t in self.tiles],
                "blank": "black tiles: no world, or after a world's last frame"}


#: One video to make (per camera): a world's frames, or a mosaic of worlds.
Job: TypeAlias = VideoJob | MosaicJob


def is_mosaic(job: object) -> bool:
    """Whether ``job`` is a :class:`MosaicJob` (else a world's :class:`VideoJob`, or a world id)."""
    return isinstance(job, MosaicJob)


def parse_mosaic(mosaic: Any) -> tuple[int, int] | None:
    """``(rows, cols)`` from a pair of positive integers or ``"ROWSxCOLS"``; None stays None.

    Raises:
        RenderOptionsError: anything else.
    """
    if mosaic is None:
        return None
    value = mosaic
    if isinstance(mosaic, str):
        try:
            value = tuple(int(v) for v in mosaic.lower().split("x"))
        except ValueError:
            value = None
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(is_int(v) and v >= 1 for v in value)):
        raise RenderOptionsError(
            f"mosaic must be (rows, cols), two positive integers (CLI: --mosaic 2x3), got "
            f"{mosaic!r}.")
    return int(value[0]), int(value[1])


def mosaic_size(tile: tuple[int, int], mosaic: tuple[int, int]) -> tuple[int, int]:
    """``(height, width)`` of a mosaic frame of ``tile``-sized tiles.

    Raises:
        RenderOptionsError: a side above 16384 pixels, or more pixels than an H.264 frame
            holds (:func:`check_h264_size`).
    """
    size = (tile[0] * mosaic[0], tile[1] * mosaic[1])
    what = (f"A {mosaic[0]}x{mosaic[1]} mosaic of {tile[0]}x{tile[1]} tiles is "
            f"{size[0]}x{size[1]} pixels")
    if max(size) > MAX_GL_SIDE:
        raise RenderOptionsError(
            f"{what}; a side may be at most {MAX_GL_SIDE}. Use smaller tiles or fewer of them.")
    check_h264_size(size, what, error=RenderOptionsError)
    return size


def check_h264_size(size: tuple[int, int], what: str, *,
                    error: type[Exception] = FrameSizeError) -> None:
    """Refuse a video frame larger than H.264 holds (:data:`H264_MAX_MACROBLOCKS`).

    Args:
        size: ``(height, width)`` in pixels.
        what: The frame, for the message (``"Frames of 240x320"``).
        error: The exception class to raise.
    """
    blocks = -(-size[0] // 16) * -(-size[1] // 16)
    if blocks > H264_MAX_MACROBLOCKS:
        raise error(
            f"{what}: {blocks} macroblocks of 16x16 pixels, more than the "
            f"{H264_MAX_MACROBLOCKS} an H.264 frame holds (level 6.2, e.g. 8192x4352); "
            "players and decoders refuse it. Use smaller frames (tiles), or fewer tiles.")


def fit_mosaic(mosaic: tuple[int, int], n_worlds: int) -> tuple[int, int]:
    """The ``(rows, cols)`` layout for ``n_worlds`` worlds: ``mosaic`` when they fill it,
    else no more columns than worlds and no more rows than they need (``4x4`` of 3 worlds:
    ``1x3``; ``2x2`` of 3: ``2x2``, one blank tile)."""
    rows, cols = mosaic
    if n_worlds >= rows * cols or n_worlds < 1:
        return mosaic
    cols = min(cols, n_worlds)
    return min(rows, -(-n_worlds // cols)), cols


def mosaic_jobs(jobs: Sequence[VideoJob], mosaic: tuple[int, int], *,
                asked: tuple[int, int] | None = None) -> list[MosaicJob]:
    """Group per-world jobs, in order, into mosaics of ``rows * cols`` tiles (the last one
    padded with blank tiles); ``asked``: the layout asked for, when ``mosaic`` was fitted."""
    rows, cols = mosaic
    per = rows * cols
    groups = []
    for index, first in enumerate(range(0, len(jobs), per)):
        tiles = tuple(jobs[first:first + per]) + (None,) * max(0, first + per - len(jobs))
        present = [t for t in tiles if t is not None]
        groups.append(MosaicJob(index, rows, cols, tiles, min(t.start for t in present),
                                max(t.stop for t in present),
                                None if asked == mosaic else asked))
    return groups
