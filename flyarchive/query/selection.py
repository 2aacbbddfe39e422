"""Which frames to render: worlds and time windows of an archive as per-world frame ranges,
chosen by ids and a time span, or by a boolean mask computed from the archive (``where=``).

A ``where`` mask over ``(world, time)`` selects windows: runs of True frames of each world,
widened by ``pad`` simulated seconds on both sides, merged when they overlap or touch
(windows closer than ``2 * pad``), cut to the world's committed frames and to ``time``.
Each window is a video of its own (:attr:`VideoJob.window`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.errors import SelectionError

if TYPE_CHECKING:  # imported where a where mask is read: planning without one needs no xarray
    import xarray as xr

    from flyarchive.store.header import Archive

#: Slack when comparing simulated times, seconds.
_TIME_SLACK = 1e-9


@dataclass(frozen=True)
class VideoJob:
    """The frames of one world to render: archive indices ``[start, stop)`` along time.

    Attributes:
        world_id: The world's id (the ``world`` coordinate).
        world_index: Its index along the archive's ``world`` dimension.
        start: First frame (archive index along ``time``).
        stop: One past the last frame.
        window: For a window of a ``where`` mask: its index among the world's windows
            (0, 1, ...); its video's name then carries its frames (:attr:`suffix`). None:
            the whole selection of the world.
    """

    world_id: int
    world_index: int
    start: int
    stop: int
    window: int | None = None

    @property
    def n_frames(self) -> int:
        return self.stop - self.start

    @property
    def suffix(self) -> str:
        """What a window's video name carries before ``.mp4``: its archive frames ``[start,
        stop)``, e.g. ``".frames000120-000240"``; ``""`` without a window."""
        return "" if self.window is None else f".frames{self.start:06d}-{self.stop:06d}"


def select_frames(
    ds: Archive,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    *,
    where: xr.DataArray | None = None,
    pad: float = 0.0,
) -> list[VideoJob]:
    """Turn a world and time selection into per-world frame ranges of committed frames.

    Args:
        ds: From :func:`flyarchive.open_archive`, or its header without a ``where`` mask
            (:func:`flyarchive.store.dataset.open_header`).
        worlds: World ids (the ``world`` coordinate); None: every world with frames.
        time: ``(start, end)`` in simulated seconds, inclusive; None on a side: open.
        where: A boolean (or integer: nonzero is True) DataArray computed from the
            archive, over ``(world,)`` (worlds to render, e.g. ``ds.success == 1``) or
            ``(world, time)`` (frames to render, e.g. ``ds.qpos.sel(dof="x") > 0.1``),
            with the archive's ``world`` (and ``time``) coordinates or a subset of them;
            without coordinates, of the archive's sizes. Combined with ``worlds`` and
            ``time`` (all must hold). None: no mask.
        pad: Simulated seconds added before and after each window of a ``(world, time)``
            mask; windows that then overlap or touch merge into one.

    Returns:
        One job per world, or with a ``(world, time)`` mask one per window, in world
        order then time order (windows numbered 0, 1, ... per world).

    Raises:
        SelectionError: ``worlds`` that are not whole numbers each given once
            (:func:`parse_world_ids`), a ``time`` that is not ``(start, end)`` of numbers
            (:func:`parse_time_window`), unknown worlds, chosen worlds without committed
            frames, a window outside the recording, nothing selected, a ``where`` mask
            whose dims, dtype, world ids or times do not match the archive (naming both),
            or a ``pad`` that is not a number of at least 0.
    """
    worlds, time = parse_world_ids(worlds), parse_time_window(time)
    ids = [int(w) for w in ds.world.values]
    n_frames = ds.n_frames.values
    if worlds is None:
        chosen = [w for w, n in zip(ids, n_frames) if n > 0]
    else:
        chosen = worlds
        unknown = sorted(set(chosen) - set(ids))
        if unknown:
            shown = _shown(ids)
            raise SelectionError(f"World(s) {unknown[:10]} are not in the archive. It has {shown}.")
    if not chosen:
        raise SelectionError("The selection holds no world with recorded frames.")
    _refuse_empty_worlds(ids, n_frames, chosen)
    times = ds.time.values
    lo, hi = time if time is not None else (None, None)
    start = 0 if lo is None else int(np.searchsorted(times, lo - 1e-12, side="left"))
    stop = len(times) if hi is None else int(np.searchsorted(times, hi + 1e-12, side="right"))
    mask = None if where is None else where_mask(ds, where)
    pad = _parse_pad(pad, where)
    if mask is not None and mask.ndim == 1:  # worlds only
        picked = [w for w in chosen if mask[ids.index(w)]]
        if not picked:
            raise SelectionError(
                f"The where mask (--where-world-var) selects none of the chosen worlds "
                f"({_shown(chosen)}; it selects {_shown([w for w, m in zip(ids, mask) if m])} "
                "of the archive's). Check the condition and the worlds chosen.")
        chosen = picked
    jobs = []
    for w in chosen:
        index = ids.index(w)
        k1 = min(stop, int(n_frames[index]))
        if mask is not None and mask.ndim == 2:
            for k, (a, b) in enumerate(where_windows(mask[index], times, pad, start, k1)):
                jobs.append(VideoJob(w, index, a, b, window=k))
        elif k1 > start:
            jobs.append(VideoJob(w, index, start, k1))
    if not jobs and mask is not None and mask.ndim == 2:
        raise SelectionError(
            f"The where mask selects no committed frame of the chosen worlds "
            f"({len(chosen)} world{'' if len(chosen) == 1 else 's'}) "
            f"{'in their recording' if time is None else f'in the time window {lo}:{hi}'}. "
            "Check the condition, e.g. print(where.sum('time').values).")
    if not jobs:
        span = f"{times[0]:.6g}..{times[-1]:.6g} s" if len(times) else "nothing"
        raise SelectionError(
            f"No recorded frame of the chosen worlds lies in the time window {lo}:{hi}; "
            f"the recording spans {span}. Widen or move the window."
        )
    return jobs


def parse_world_ids(worlds: Sequence[int] | None, what: str = "worlds") -> list[int] | None:
    """World ids asked for, checked: whole numbers (Python or numpy ints; not bools, which
    are not world ids), each given once; None stays None (every world).

    Args:
        worlds: The ids, e.g. ``[0, 3]`` or ``np.array([0, 3])``.
        what: The argument's name, for messages.

    Raises:
        SelectionError: not a sequence (a string, a single number), an id that is not a
            whole number, or an id given twice.
    """
    import operator

    if worlds is None:
        return None
    try:
        if isinstance(worlds, (str, bytes)):
            raise TypeError
        items = list(worlds)
    except TypeError:
        raise SelectionError(
            f"{what} must be a sequence of world ids, e.g. [0, 3], got {worlds!r}.") from None
    ids = []
    for w in items:
        try:
            if isinstance(w, (bool, np.bool_)):
                raise TypeError
            ids.append(operator.index(w))
        except TypeError:
            kind = "a bool, which is not a world id" if isinstance(w, (bool, np.bool_)) \
                else f"a {type(w).__name__}"
            raise SelectionError(
                f"{what}={_listed(worlds)} holds {w!r}, {kind}. World ids are whole numbers "
                "(the world coordinate); to select worlds by a condition pass where=..., e.g. "
                "where=ds.success == 1.") from None
    if len(set(ids)) < len(ids):
        from collections import Counter

        repeated = sorted(w for w, n in Counter(ids).items() if n > 1)
        raise SelectionError(
            f"{what}={_listed(worlds)} names world(s) {repeated[:10]} more than once; name "
            "each world once.")
    return ids


def _listed(worlds: Any) -> str:
    items = list(worlds)
    return f"[{', '.join(map(repr, items[:10]))}{', ...' if len(items) > 10 else ''}]"


def parse_time_window(time: Any) -> tuple[float | None, float | None] | None:
    """A time window asked for, checked: None, or ``(start, end)`` simulated seconds, each
    a number or None (open); infinities are open sides too.

    Raises:
        SelectionError: not a pair, a side that is not a number (or is a bool), NaN, or a
            window that ends before it starts.
    """
    if time is None:
        return None
    if isinstance(time, (str, bytes)) or not isinstance(time, (tuple, list)) or len(time) != 2:
        raise SelectionError(
            f"time must be (start, end) in simulated seconds, either side None for open, e.g. "
            f"(0.5, 2.0) or (1.0, None); got {time!r}.")
    sides = []
    for side in time:
        if side is not None and (isinstance(side, (bool, np.bool_))
                                 or not isinstance(side, (int, float, np.integer, np.floating))):
            raise SelectionError(
                f"time={time!r} holds {side!r}; each side is a number of simulated seconds or "
                "None (open).")
        if side is not None and math.isnan(side):
            raise SelectionError(
                f"time={time!r} holds NaN, which is no time; give a number of simulated "
                "seconds, or None for an open side.")
        sides.append(None if side is None else float(side))
    lo, hi = sides
    if lo is not None and hi is not None and lo > hi:
        raise SelectionError(f"The time window {lo}:{hi} ends before it starts.")
    return lo, hi


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


def _shown(ids: Sequence[int]) -> str:
    count = f"{len(ids)} world{'' if len(ids) == 1 else 's'}"
    return f"{list(ids[:10])}{'...' if len(ids) > 10 else ''} ({count})"


def _parse_pad(pad: float, where: xr.DataArray | None) -> float:
    try:
        value = float(pad)
        ok = math.isfinite(value) and value >= 0 and not isinstance(pad, bool)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise SelectionError(
            f"pad must be a number of simulated seconds of at least 0, got {pad!r}.")
    if value and where is None:
        raise SelectionError(
            f"pad={pad!r} widens the windows of a where mask, and no where mask was given. "
            "Pass where=... (a boolean DataArray over world and time), or leave pad out.")
    return value


def where_mask(ds: xr.Dataset, where: xr.DataArray) -> np.ndarray:
    """A ``where`` mask aligned with the archive: ``(world,)`` or ``(world, time)`` bool
    over all of ``ds``'s worlds and times (False where the mask does not reach).

    Raises:
        SelectionError: not a DataArray; dims other than ``world`` and ``time``; a dtype
            that is not bool or integer; world ids or times that are not the archive's
            (both named); sizes that differ when the mask has no coordinates.
    """
    import xarray as xr

    if not isinstance(where, xr.DataArray):
        raise SelectionError(
            f"where must be an xarray DataArray computed from the archive (e.g. "
            f"ds.success == 1), got {type(where).__name__}.")
    dims = tuple(where.dims)
    if "world" not in dims or not set(dims) <= {"world", "time"}:
        raise SelectionError(
            f"The where mask has dims {dims}; it must be over ('world',) or ('world', "
            f"'time') (the archive's qpos is over {tuple(ds.qpos.dims)}). Reduce the other "
            "dims first, e.g. (ds.qpos.sel(dof='x') > 0.1) or (ds.qpos > 0.1).any('dof').")
    if where.dtype.kind not in "biu":
        raise SelectionError(
            f"The where mask has dtype {where.dtype}; it must be bool (or integer, nonzero "
            "meaning True). Compare to get one (ds.success == 1), or fill NaN first: "
            "where.fillna(0).astype(bool).")
    where = where.transpose("world", *(("time",) if "time" in dims else ()))
    rows = _positions(ds, where, "world")
    shape = (ds.sizes["world"],) + ((ds.sizes["time"],) if "time" in dims else ())
    out = np.zeros(shape, dtype=bool)
    values = np.asarray(where.values) != 0  # a dask-backed mask is computed here
    if "time" in dims:
        out[np.ix_(rows, _positions(ds, where, "time"))] = values
    else:
        out[rows] = values
    return out


def _positions(ds: xr.Dataset, where: xr.DataArray, dim: str) -> np.ndarray:
    """Indices along ``ds``'s ``dim`` of the mask's entries along ``dim``."""
    have = ds[dim].values
    if dim not in where.coords:
        if where.sizes[dim] != len(have):
            raise SelectionError(
                f"The where mask has {where.sizes[dim]} entries along {dim!r} and no {dim!r} "
                f"coordinate; the archive has {len(have)}. Compute the mask from the archive "
                "(open_archive), which gives it the archive's coordinates.")
        return np.arange(len(have))
    asked = where[dim].values
    if dim == "world":
        where_of = {int(w): i for i, w in enumerate(have)}
        unknown = [int(w) for w in asked if int(w) not in where_of]
        if unknown:
            raise SelectionError(
                f"The where mask is over world ids {_shown([int(w) for w in asked])}, and "
                f"{unknown[:10]} are not in the archive, which has world ids "
                f"{_shown([int(w) for w in have])}. Compute the mask from this archive.")
        return np.array([where_of[int(w)] for w in asked], dtype=np.int64)
    cols = np.searchsorted(have, asked - _TIME_SLACK)
    inside = cols < len(have)
    near = np.zeros(len(asked), dtype=bool)
    near[inside] = np.abs(have[cols[inside]] - asked[inside]) <= _TIME_SLACK
    if not near.all():
        bad = asked[~near]
        span = f"{have[0]:.6g}..{have[-1]:.6g} s ({len(have)} frames)" if len(have) else "none"
        raise SelectionError(
            f"The where mask is over times {asked.min():.6g}..{asked.max():.6g} s "
            f"({len(asked)} frames), and {len(bad)} of them (first {bad[0]:.6g} s) are not "
            f"times of the archive's frames, which span {span}. Compute the mask from this "
            "archive (open_archive).")
    return cols


def where_windows(row: np.ndarray, times: np.ndarray, pad: float, start: int,
                  stop: int) -> list[tuple[int, int]]:
    """The windows of one world's mask: ``[a, b)`` archive frame ranges.

    Args:
        row: ``(time,)`` bool, the world's mask over the archive's frames.
        times: ``(time,)`` simulated seconds of the archive's frames.
        pad: Seconds added on both sides of each run of True frames.
        start, stop: The frames that may be selected (the ``time`` selection, cut to the
            world's committed frames).

    Returns:
        Runs of True within ``[start, stop)``, widened by ``pad`` (to the frames whose
        times lie within ``pad`` of the run) and cut to ``[start, stop)``; windows that
        overlap or touch merged. Empty when nothing is selected.
    """
    if stop <= start:
        return []
    inside = np.zeros(len(row) + 2, dtype=np.int8)
    inside[start + 1:stop + 1] = row[start:stop]
    edges = np.diff(inside)
    runs = zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))
    windows: list[tuple[int, int]] = []
    for a, b in runs:  # [a, b): frames a..b-1 are True
        a = max(start, int(np.searchsorted(times, times[a] - pad - _TIME_SLACK, side="left")))
        b = min(stop, int(np.searchsorted(times, times[b - 1] + pad + _TIME_SLACK, side="right")))
        if windows and a <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(windows[-1][1], b))
        else:
            windows.append((a, b))
    return windows
