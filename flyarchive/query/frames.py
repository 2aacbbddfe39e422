"""Which frames to render: worlds and time windows of an archive as per-world frame ranges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from flyarchive.errors import SelectionError

__all__ = ["VideoJob", "select_frames"]


@dataclass(frozen=True)
class VideoJob:
    """The frames of one world to render: archive indices ``[start, stop)`` along time."""

    world_id: int
    world_index: int
    start: int
    stop: int

    @property
    def n_frames(self) -> int:
        return self.stop - self.start


def select_frames(
    ds: xr.Dataset,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
) -> list[VideoJob]:
    """Turn a world and time selection into per-world frame ranges of committed frames.

    Args:
        ds: From :func:`flyarchive.open_archive`.
        worlds: World ids (the ``world`` coordinate); None: every world with frames.
        time: ``(start, end)`` in simulated seconds, inclusive; None on a side: open.

    Raises:
        SelectionError: unknown worlds, chosen worlds without committed frames, a window
            outside the recording, or nothing selected.
    """
    ids = [int(w) for w in ds.world.values]
    n_frames = ds.n_frames.values
    if worlds is None:
        chosen = [w for w, n in zip(ids, n_frames) if n > 0]
    else:
        chosen = [int(w) for w in worlds]
        unknown = sorted(set(chosen) - set(ids))
        if unknown:
            shown = f"{ids[:10]}{'...' if len(ids) > 10 else ''} ({len(ids)} worlds)"
            raise SelectionError(f"World(s) {unknown[:10]} are not in the archive. It has {shown}.")
    if not chosen:
        raise SelectionError("The selection holds no world with recorded frames.")
    _refuse_empty_worlds(ids, n_frames, chosen)
    times = ds.time.values
    lo, hi = time if time is not None else (None, None)
    if lo is not None and hi is not None and lo > hi:
        raise SelectionError(f"The time window {lo}:{hi} ends before it starts.")
    start = 0 if lo is None else int(np.searchsorted(times, lo - 1e-12, side="left"))
    stop = len(times) if hi is None else int(np.searchsorted(times, hi + 1e-12, side="right"))
    jobs = []
    for w in chosen:
        index = ids.index(w)
        k1 = min(stop, int(n_frames[index]))
        if k1 > start:
            jobs.append(VideoJob(w, index, start, k1))
    if not jobs:
        span = f"{times[0]:.6g}..{times[-1]:.6g} s" if len(times) else "nothing"
        raise SelectionError(
            f"No recorded frame of the chosen worlds lies in the time window {lo}:{hi}; "
            f"the recording spans {span}. Widen or move the window."
        )
    return jobs


def _refuse_empty_worlds(ids: list[int], n_frames: np.ndarray, chosen: list[int]) -> None:
    """Refuse chosen worlds that have no committed frame, naming them."""
    counts = dict(zip(ids, (int(n) for n in n_frames)))
    empty = [w for w in chosen if counts[w] == 0]
    if not empty:
        return
    with_frames = [w for w in ids if counts[w] > 0]
    shown = f"{with_frames[:10]}{'...' if len(with_frames) > 10 else ''}"
    others = f"Worlds with frames: {shown}." if with_frames else "No world of it has any."
    raise SelectionError(
        f"World(s) {empty[:10]} have no committed frames in the archive (nothing was "
        f"recorded for them, or their recorder was never closed). {others} Choose worlds "
        "that have frames."
    )
