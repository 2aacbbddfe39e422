"""Gait and locomotion measures per world (and per window of time), from keypoint positions.

Definitions (lengths in the model's unit, millimetres for NeuroMechFly; times in
simulated seconds; "horizontal" is the x-y plane, z is up). Only frames with finite
positions count (frames past a world's ``n_frames`` are NaN); ``duration`` is the time
from the first to the last of them.

==================  =====  ===============================================================
``duration``        s      last minus first frame time
``distance``        mm     horizontal distance of the thorax from its first to its last position
``path_length``     mm     sum of the thorax's horizontal displacements between frames
``mean_speed``      mm/s   ``path_length / duration``
``peak_speed``      mm/s   largest horizontal displacement between consecutive frames over their time
``heading_change``  rad    net change of heading (the thorax's x axis in the horizontal plane,
                           unwrapped), last minus first; positive turns left (counter-clockwise)
``mean_height``     mm     mean thorax height (z)
``min_height``      mm     lowest thorax height
``time_below``      s      frames with thorax height below ``fall_height``, times the frame interval
``stance_fraction_<leg>`` 1  share of frames in stance: tip height below ``stance_height`` and
                           horizontal tip speed (central differences, one-sided at the ends)
                           below ``stance_speed``
``step_frequency_<leg>``  Hz  touchdowns (a stance frame after a swing frame) per second of ``duration``
==================  =====  ===============================================================

Without orientations the heading is the direction of travel between consecutive frames
(undefined while the thorax stands still; those frames are skipped).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze.keypoints import KeypointName, PointSpec, tarsus_tips
from flyarchive.errors import SelectionError

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

#: Every per-world measure: name -> (unit, description).
MEASURES: dict[str, tuple[str, str]] = {
    "duration": ("s", "time from the first to the last frame with positions"),
    "distance": ("mm", "horizontal distance of the thorax, first to last position"),
    "path_length": ("mm", "sum of the thorax's horizontal displacements between frames"),
    "mean_speed": ("mm/s", "path_length / duration"),
    "peak_speed": ("mm/s", "largest horizontal speed of the thorax between consecutive frames"),
    "heading_change": ("rad", "net change of the thorax's heading (unwrapped), last - first"),
    "mean_height": ("mm", "mean height (z) of the thorax"),
    "min_height": ("mm", "lowest height (z) of the thorax"),
    "time_below": ("s", "time with the thorax below fall_height"),
}
#: Labels of the thorax's points that gait_summary asks of an archive.
_THORAX, _AHEAD = "gait/thorax", "gait/ahead"
_PER_LEG = {
    "stance_fraction": ("1", "share of frames in stance (tip low and slow)"),
    "step_frequency": ("Hz", "touchdowns (stance after swing) per second"),
}


@dataclass(frozen=True)
class GaitParams:
    """Thresholds of the gait measures (model length unit, simulated seconds).

    The defaults suit NeuroMechFly walking on flat ground (its thorax 1.1-1.4 mm high,
    tarsus tips below 0.05 mm half of the time and moving at 20-40 mm/s in swing).

    Attributes:
        stance_height: A tip lower than this (z) may be in stance. mm.
        stance_speed: A tip slower than this (horizontal) may be in stance. mm/s.
        fall_height: The thorax below this height (z) counts in ``time_below``. mm.
    """

    stance_height: float = 0.1
    stance_speed: float = 5.0
    fall_height: float = 0.6


def gait_measures(times: np.ndarray, thorax: np.ndarray, tips: np.ndarray,
                  forward: np.ndarray | None = None, params: GaitParams = GaitParams()
                  ) -> dict[str, np.ndarray]:
    """The measures of worlds from their trajectories (host arrays).

    Args:
        times: ``(T,)`` frame times, s.
        thorax: ``(W, T, 3)`` thorax positions; NaN for frames that do not count.
        tips: ``(W, T, L, 3)`` leg tip positions.
        forward: ``(W, T, 2 or 3)`` the thorax's forward axis (its x axis) in the world
            frame, or None (heading from the direction of travel).
        params: Thresholds.

    Returns:
        ``{name: (W,) array}`` for :data:`MEASURES`, and ``stance_fraction``,
        ``step_frequency`` as ``(W, L)``; NaN for a world with fewer than 2 frames.
    """
    if thorax.shape[1] < 2:  # no step between frames: nothing to measure
        worlds, legs = len(thorax), tips.shape[2]
        return {**{name: np.full(worlds, np.nan) for name in MEASURES},
                **{name: np.full((worlds, legs), np.nan) for name in _PER_LEG}}
    valid = np.isfinite(thorax.sum(axis=-1))  # (W, T); positions are whole or NaN
    t = np.where(valid, times[None, :], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN worlds give NaN
        first, last = np.nanmin(t, axis=1), np.nanmax(t, axis=1)
        duration = last - first
        xy = thorax[..., :2]
        start, end = _at(xy, t, first), _at(xy, t, last)
        steps, dts = _steps(xy, times, valid)
        path = np.nansum(steps, axis=1)
        speed = steps / dts
        z = np.where(valid, thorax[..., 2], np.nan)
        below = (z < params.fall_height) & valid
        out = {
            "duration": duration,
            "distance": np.hypot(*(end - start).T),
            "path_length": np.where(valid.sum(1) > 1, path, np.nan),
            "mean_speed": path / duration,
            "peak_speed": np.nanmax(np.where(np.isfinite(speed), speed, -np.inf), axis=1),
            "heading_change": _heading_change(thorax, forward, valid),
            "mean_height": np.nanmean(z, axis=1),
            "min_height": np.nanmin(z, axis=1),
            "time_below": below.sum(axis=1) * _interval(times),
        }
        stance, swing = _phases(times, tips, valid, params)
        n = valid.sum(axis=1)[:, None]
        out["stance_fraction"] = stance.sum(axis=1) / n
        touchdowns = (stance[:, 1:] & swing[:, :-1]).sum(axis=1)
        out["step_frequency"] = touchdowns / duration[:, None]
    few = valid.sum(axis=1) < 2
    for name, values in out.items():
        values = np.asarray(values, dtype=float)
        values[few] = np.nan
        if name == "peak_speed":
            values[~np.isfinite(values)] = np.nan
        out[name] = values
    return out


def _at(xy: np.ndarray, t: np.ndarray, when: np.ndarray) -> np.ndarray:
    """``(W, 2)``: each world's ``xy`` at its frame of time ``when`` (NaN: none)."""
    hit = t == when[:, None]
    index = np.where(hit.any(axis=1), hit.argmax(axis=1), 0)
    return np.where(hit.any(axis=1)[:, None], xy[np.arange(len(xy)), index], np.nan)


def _steps(xy: np.ndarray, times: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Horizontal displacement between consecutive frames and their time step, ``(W, T-1)``
    (NaN where either frame does not count)."""
    both = valid[:, 1:] & valid[:, :-1]
    step = np.diff(xy, axis=1)
    steps = np.hypot(step[..., 0], step[..., 1])
    return np.where(both, steps, np.nan), np.broadcast_to(np.diff(times), steps.shape)


def _interval(times: np.ndarray) -> float:
    return float(np.median(np.diff(times))) if len(times) > 1 else 0.0


def forward_axis(quat: np.ndarray) -> np.ndarray:
    """``(..., 2)``: the x-y part of the x axis of orientations ``(..., 4)`` (w, x, y, z)."""
    w, x, y, z = (quat[..., i] for i in range(4))
    return np.stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z)], axis=-1)


def _heading_change(thorax: np.ndarray, forward: np.ndarray | None, valid: np.ndarray
                    ) -> np.ndarray:
    if forward is not None:
        forward = forward[..., :2]
        ok = valid & np.isfinite(forward.sum(axis=-1))
    else:
        forward = np.diff(thorax[..., :2], axis=1)
        ok = valid[:, 1:] & valid[:, :-1] & (np.hypot(forward[..., 0], forward[..., 1]) > 0)
    angle = np.arctan2(forward[..., 1], forward[..., 0])
    out = np.full(len(angle), np.nan)
    for w in range(len(angle)):  # unwrap each world's frames that count
        a = np.unwrap(angle[w][ok[w]])
        if a.size:
            out[w] = a[-1] - a[0]
    return out


def _phases(times: np.ndarray, tips: np.ndarray, valid: np.ndarray, params: GaitParams
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(W, T, L)`` stance and swing masks of the tips (both False where a frame does not
    count or the tip's speed is unknown)."""
    ok = valid[..., None] & np.isfinite(tips.sum(axis=-1))
    speed = np.hypot(_central(tips[..., 0], times), _central(tips[..., 1], times))
    ok &= np.isfinite(speed)
    stance = ok & (tips[..., 2] < params.stance_height) & (speed < params.stance_speed)
    return stance, ok & ~stance


def _central(x: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``d x / d t`` along axis 1 of ``(W, T, ...)``: central differences, one-sided at
    the ends (``np.gradient``'s first order, without its cost for uneven steps)."""
    dt = times.reshape(-1, *([1] * (x.ndim - 2)))
    out = np.empty_like(x)
    out[:, 1:-1] = (x[:, 2:] - x[:, :-2]) / (dt[2:] - dt[:-2])
    out[:, 0] = (x[:, 1] - x[:, 0]) / (dt[1] - dt[0])
    out[:, -1] = (x[:, -1] - x[:, -2]) / (dt[-1] - dt[-2])
    return out


# ----------------------------------------------------------------------------- the summary
def gait_summary(
    source: str | xr.Dataset | xr.DataArray,
    *,
    thorax: str = "nmf/c_thorax",
    tips: Mapping[str, PointSpec] | Sequence[str] | None = None,
    params: GaitParams = GaitParams(),
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    window: float | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "cpu",
    save: bool = False,
    processes: int | None = None,
) -> xr.Dataset:
    """Gait and locomotion measures of every world (see the module's table for definitions).

    Args:
        source: An archive (URL or dataset): the thorax and leg tips are computed
            (:func:`flyarchive.positions`, kept positions when they match); or positions
            already computed (a DataArray, or a Dataset with ``orientation``) holding
            ``thorax`` and the tips as keypoints.
        thorax: The body (keypoint) whose path is the fly's.
        tips: Leg tips: points ``{label: (body, offset)}`` for an archive, or labels of
            keypoints for positions; default :func:`flyarchive.tarsus_tips` of the
            thorax's fly (NeuroMechFly's six tarsus tips, legs ``lf`` ... ``rh``).
        params: Thresholds (:class:`GaitParams`).
        worlds, time: Worlds and a time window (seconds, inclusive), as for positions.
        window: Seconds: measures per window ``[start, start + window)``, windows one after
            another from the first frame (a ``window`` dimension, its start time as
            coordinate; a window of fewer than 2 frames gives NaN). None: the whole selection.
        model, storage_options, backend: As for :func:`flyarchive.positions`.
        save: Also store the measures in the archive as world variables
            (:func:`flyarchive.add_world_vars`, replacing earlier ones), so that
            ``where=ds.distance > 5`` and ``--where-world-var 'distance>5'`` pick worlds.
        processes: From an archive on the CPU: worker processes computing the positions
            beside this one (bit-exact with one process; threads would not run faster:
            the GIL); 0: dask's scheduler in this process; None: one per other usable
            core when the selection holds at least 200,000 frames.

    Returns:
        Dataset over ``world`` (and ``window``): the measures of :data:`MEASURES`, and
        per leg ``stance_fraction_<leg>``, ``step_frequency_<leg>``; each with ``units``
        and ``description`` attributes; ``attrs`` hold the thresholds.

    Raises:
        SelectionError: unknown thorax or tips, a window that is not a positive number,
            ``save`` with windows or without an archive URL.
        And as :func:`flyarchive.positions`.
    """
    import xarray as xr

    if window is not None and not (isinstance(window, (int, float)) and window > 0):
        raise SelectionError(f"window must be a positive number of seconds, got {window!r}.")
    if save and (window is not None or not isinstance(source, str)):
        raise SelectionError(
            "save=True stores one value per world in the archive: pass the archive's URL and "
            "no window.")
    pos, heading = _trajectories(source, thorax, tips, worlds, time, model, storage_options,
                                 backend, processes)
    ahead = isinstance(heading, str)
    legs = [_leg(str(k)) for k in pos.keypoint.values[1 + ahead:]]
    times = pos.time.values
    values = np.asarray(pos.values)
    forward = None
    if ahead:  # a point ahead of the thorax on its x axis
        forward, values = values[:, :, 1] - values[:, :, 0], np.delete(values, 1, axis=2)
    elif heading is not None:
        forward = forward_axis(np.asarray(heading.values))
    starts = [None] if window is None else list(np.arange(times[0], times[-1], window)) or [times[0]]
    parts = []
    for t0 in starts:
        cut = slice(None) if t0 is None else (times >= t0 - 1e-12) & (times < t0 + window - 1e-12)
        measured = gait_measures(times[cut], values[:, cut, 0], values[:, cut, 1:],
                                 None if forward is None else forward[:, cut], params)
        parts.append(_dataset(measured, pos.world.values, legs))
    summary = parts[0] if window is None else xr.concat(parts, dim="window").assign_coords(
        window=("window", np.asarray(starts, dtype=float), {"units": "s",
                                                            "description": "window start"}))
    summary.attrs.update({k: float(v) for k, v in vars(params).items()})
    summary.attrs["thorax"] = thorax
    if save:
        from flyarchive.store.world_vars import add_world_vars

        add_world_vars(source, {k: v for k, v in summary.data_vars.items()},  # type: ignore[arg-type]
                       storage_options=storage_options, overwrite=True)
    return summary


def _leg(label: str) -> str:
    name = KeypointName.parse(label)
    return name.leg if name is not None else label.replace("/", "_")


def _trajectories(source: Any, thorax: str, tips: Any, worlds: Any, time: Any, model: Any,
                  storage_options: Any, backend: str, processes: int | None
                  ) -> tuple[xr.DataArray, Any]:
    """``(world, time, keypoint, xyz)`` positions, the thorax first, and how to find its
    heading: ``"ahead"`` (the second keypoint is a point 1 unit ahead on its x axis), its
    orientation (a DataArray of quaternions), or None (the direction of travel)."""
    import xarray as xr

    if isinstance(source, (xr.DataArray, xr.Dataset)) and "keypoint" in source.dims:
        pos = source["position"] if isinstance(source, xr.Dataset) else source
        quat = source["orientation"] if isinstance(source, xr.Dataset) and \
            "orientation" in source else None
        labels = list(tips) if tips is not None else \
            list(tarsus_tips(thorax.rpartition("/")[0] or "nmf"))
        missing = [k for k in [thorax, *labels] if k not in pos.keypoint.values]
        if missing:
            raise SelectionError(
                f"The positions have no keypoint {missing[0]!r}. Keypoints: "
                f"{[str(k) for k in pos.keypoint.values][:12]}. Pass thorax= and tips= labels "
                "that exist.")
        if list(pos.keypoint.values) != [thorax, *labels]:  # (a selection copies)
            pos = pos.sel(keypoint=[thorax, *labels])
        if worlds is not None or time is not None:
            pos = pos.sel(world=list(worlds) if worlds is not None else slice(None),
                          time=slice(*(time or (None, None))))
        return pos, None if quat is None else quat.sel(keypoint=thorax, world=pos.world,
                                                       time=pos.time)
    from flyarchive.analyze.lazy import computed_positions

    if tips is None or isinstance(tips, Mapping):
        bodies, tip_points = [], tips if tips is not None else \
            tarsus_tips(thorax.rpartition("/")[0] or "nmf")
    else:
        bodies, tip_points = list(tips), {}
    # The thorax as points (its origin and one unit ahead), so that a frame copies only
    # site positions: no orientations, and the per-frame loop stays lean.
    points = {_THORAX: (thorax, (0.0, 0.0, 0.0)), _AHEAD: (thorax, (1.0, 0.0, 0.0)), **tip_points}
    got = computed_positions(source, bodies, points, worlds=worlds, time=time, model=model,
                             storage_options=storage_options, backend=backend,
                             processes=processes)
    order = [_THORAX, _AHEAD, *tip_points, *bodies]
    if [str(k) for k in got.keypoint.values] != order:  # (a selection copies every frame)
        got = got.sel(keypoint=order)
    return got, "ahead"


def _dataset(measured: Mapping[str, np.ndarray], worlds: np.ndarray, legs: list[str]) -> xr.Dataset:
    import xarray as xr

    data = {name: xr.DataArray(measured[name], dims="world",
                               attrs={"units": unit, "description": text})
            for name, (unit, text) in MEASURES.items()}
    for name, (unit, text) in _PER_LEG.items():
        for i, leg in enumerate(legs):
            data[f"{name}_{leg}"] = xr.DataArray(measured[name][:, i], dims="world",
                                                 attrs={"units": unit, "description": text})
    return xr.Dataset(data, coords={"world": worlds})
