"""Gait and locomotion of every world (and every window of time): step events of the leg
tips, the measures fly locomotion papers report, and the thorax's path.

Lengths are in the positions' unit (millimetres for NeuroMechFly; the table says mm; the
``units`` attributes say ``length_unit=``'s, "model unit" for another body's tips unless
named), times in seconds,
"horizontal" is the x-y plane and z is up. Only frames with finite positions count
(frames past a world's ``n_frames``, tracking dropouts); ``duration`` is the time from
the first to the last of them. Stance, swing, lift-offs and touchdowns come from
:mod:`~flyarchive.analyze.steps` (thresholds with hysteresis and minimum durations:
:class:`GaitParams`). A *cycle* of a leg runs from a touchdown to its next touchdown
(a stance, then a swing), with no unknown frame in it; a cycle belongs to the window its
first touchdown lies in.

Per world (:data:`MEASURES`, ``<leg>`` a leg name such as ``lf``):

=============================  =====  ==========================================================
``duration``                   s      last minus first frame time
``distance``                   mm     horizontal distance of the thorax from its first to its
                                      last position
``path_length``                mm     sum of the thorax's horizontal displacements between frames
``mean_speed``                 mm/s   ``path_length / duration``
``peak_speed``                 mm/s   largest horizontal displacement between consecutive frames
                                      over their time
``heading_change``             rad    net change of heading (the thorax's x axis in the
                                      horizontal plane, unwrapped), last minus first; positive
                                      turns left (counter-clockwise)
``mean_height``, ``min_height`` mm    mean and lowest thorax height (z)
``time_below``                 s      frames with the thorax below ``fall_height``, times the
                                      frame interval
``tcs``                        1      tripod coordination strength: for each swing of a front leg,
                                      with the nearest swing of each of its tripod partners
                                      (``lf``-``rm``-``lh``, ``rf``-``lm``-``rh``), the time all
                                      three swing together over the time from the first lift-off
                                      to the last touchdown; the mean (Wosnitza et al. 2013)
``support_tripod``             1      share of frames whose legs in stance are exactly one tripod
``support_tetrapod``           1      share of frames with four legs in stance, the two in swing
                                      on opposite sides and in different segments
``support_wave``               1      share of frames with five legs in stance
``support_other``              1      share of the other frames (six or fewer than three legs in
                                      stance, other sets of three or four): Mendes et al. 2013's
                                      non-canonical
``stance_fraction_<leg>``      1      share of frames in stance
``step_frequency_<leg>``       Hz     complete cycles per second of the time they span:
                                      cycles / sum of their durations
``duty_factor_<leg>``          1      stance time of the cycles over their duration
``stance_duration_<leg>``      s      mean stance duration of the cycles
``swing_duration_<leg>``       s      mean swing duration of the cycles
``step_length_<leg>``          mm     mean horizontal distance the tip moved in the cycles' swings
``phase_<leg>``                cycle  circular mean of the leg's lift-offs' phases in the
                                      reference leg's cycles (lift-off to lift-off), in [0, 1)
``phase_concentration_<leg>``  1      length of their mean resultant vector: 1 every lift-off at
                                      the same phase, 0 none preferred
=============================  =====  ==========================================================

The support shares and ``tcs`` need the six legs ``lf``, ``lm``, ``lh``, ``rf``, ``rm``,
``rh`` (flygym's names; map a tracked fly's keypoints to them with ``legs=``); NaN
otherwise. A measure with nothing to count (fewer than two frames, no complete cycle)
is NaN. Without orientations the heading is the direction of travel between consecutive
frames (undefined while the thorax stands still; those frames are skipped).

The same functions take an archive (positions computed, or read where kept), positions
from :func:`flyarchive.positions`, or a ``movement`` poses dataset (a fly tracked with
DeepLabCut, SLEAP, Anipose... and loaded by ``movement.io``; ``legs=`` names its tip
keypoints): :func:`gait_summary` (the measures), :func:`gait_steps` (one row per step)
and :func:`gait_epochs` (every stance and swing interval).

References:
    Wosnitza A, Bockemühl T, Dübbert M, Scholz H, Büschges A (2013). Inter-leg
    coordination in the control of walking speed in Drosophila. J Exp Biol 216:480-491.
    doi:10.1242/jeb.078139

    Mendes CS, Bartos I, Akay T, Márka S, Mann RS (2013). Quantification of gait
    parameters in freely walking wild type and sensory deprived Drosophila melanogaster.
    eLife 2:e00231. doi:10.7554/eLife.00231

    DeAngelis BD, Zavatone-Veth JA, Clark DA (2019). The manifold structure of limb
    coordination in walking Drosophila. eLife 8:e46409 (the canonical leg sets listed
    above for tripod, tetrapod and wave). doi:10.7554/eLife.46409
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze.keypoints import LEGS, KeypointName, PointSpec, tarsus_tips
from flyarchive.analyze.gait_params import GaitParams, is_real
from flyarchive.analyze.steps import (
    STANCE,
    UNKNOWN,
    PhaseEpochs,
    StepEvents,
    event_edges,
    phase_epochs,
    stance_runs,
    state_at_events,
    step_events,
    with_time_gaps,
)
from flyarchive.errors import OptionsError, SelectionError
from flyarchive.query.selection import parse_world_ids

if TYPE_CHECKING:
    import mujoco
    import pandas as pd
    import xarray as xr

#: Every measure: name -> (unit, definition); ``<leg>`` stands for each leg's name.
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
    "tcs": ("1", "tripod coordination strength (Wosnitza et al. 2013): per front-leg swing, "
                 "time its tripod swings together / time from first lift-off to last touchdown"),
    "support_tripod": ("1", "share of frames with exactly one tripod in stance"),
    "support_tetrapod": ("1", "share of frames with four legs in stance, the two in swing on "
                              "opposite sides and in different segments"),
    "support_wave": ("1", "share of frames with five legs in stance"),
    "support_other": ("1", "share of the other frames (Mendes et al. 2013's non-canonical)"),
    "stance_fraction_<leg>": ("1", "share of frames in stance"),
    "step_frequency_<leg>": ("Hz", "complete cycles (touchdown to touchdown) per second of "
                                   "their duration"),
    "duty_factor_<leg>": ("1", "stance time of the complete cycles over their duration"),
    "stance_duration_<leg>": ("s", "mean stance duration of the complete cycles"),
    "swing_duration_<leg>": ("s", "mean swing duration of the complete cycles"),
    "step_length_<leg>": ("mm", "mean horizontal distance the tip moved in a swing of the "
                                "complete cycles"),
    "phase_<leg>": ("cycle", "circular mean phase of the leg's lift-offs in the reference "
                             "leg's lift-off-to-lift-off cycles, in [0, 1)"),
    "phase_concentration_<leg>": ("1", "length of the mean resultant vector of those phases "
                                       "(1: always the same phase)"),
}
#: The columns of :func:`gait_steps`: name -> (unit, definition).
STEP_COLUMNS: dict[str, tuple[str, str]] = {
    "world": ("", "world id (a poses dataset: the individual's index)"),
    "individual": ("", "world<id>, or the poses dataset's individual name"),
    "leg": ("", "leg name (lf, lm, lh, rf, rm, rh for a fly)"),
    "step": ("", "the step's index among this leg's steps, from 0"),
    "liftoff_time": ("s", "lift-off: the swing's start"),
    "touchdown_time": ("s", "touchdown: the swing's end"),
    "swing_duration": ("s", "touchdown_time - liftoff_time"),
    "stance_start": ("s", "start of the stance before the lift-off (NaN: began at a gap or "
                          "the first frame)"),
    "stance_duration": ("s", "liftoff_time - stance_start"),
    "step_length": ("mm", "horizontal distance of the tip from its last stance frame before "
                          "lift-off to its first after touchdown"),
}
#: The columns of :func:`gait_epochs`: name -> (unit, definition).
EPOCH_COLUMNS: dict[str, tuple[str, str]] = {
    "world": STEP_COLUMNS["world"],
    "individual": STEP_COLUMNS["individual"],
    "leg": STEP_COLUMNS["leg"],
    "phase": ("", "stance or swing"),
    "start_time": ("s", "its start: an event, or its first frame's time at a gap or the start"),
    "stop_time": ("s", "its end: an event, or its last frame's time at a gap or the end"),
    "duration": ("s", "stop_time - start_time"),
    "complete": ("", "both ends are events"),
}
#: The leg sets of a tripod, the front leg first.
TRIPODS = (("lf", "rm", "lh"), ("rf", "lm", "rh"))
_WORLD = [n for n in MEASURES if "<leg>" not in n]
_PER_LEG = [n.removesuffix("_<leg>") for n in MEASURES if n.endswith("_<leg>")]
_THORAX_MEASURES = _WORLD[:9]
#: Labels of the thorax's points that the gait functions ask of an archive.
_THORAX, _AHEAD = "gait/thorax", "gait/ahead"
#: The length unit of another body's positions when none is given: the model's.
_MODEL_UNIT = "model unit"
#: The length unit of poses that say none (a tracker's: pixels, or what it was calibrated in).
_POSES_UNIT = "poses unit"
#: Names of the unit the default thresholds are in.
_MILLIMETRES = ("mm", "millimeter", "millimeters", "millimetre", "millimetres")
#: Tip-frames handled at once (bounds the memory of the temporaries: ~40 bytes each).
_BLOCK = 500_000


# ----------------------------------------------------------------------------- the thorax
def gait_measures(times: np.ndarray, thorax: np.ndarray, tips: np.ndarray,
                  forward: np.ndarray | None = None, params: GaitParams = GaitParams(), *,
                  legs: Sequence[str] | None = None, reference: str | None = None,
                  height: bool = True) -> dict[str, np.ndarray]:
    """The measures of worlds from their trajectories (host arrays), over the whole time.

    Args:
        times: ``(T,)`` frame times, s.
        thorax: ``(W, T, 3)`` thorax positions; NaN for frames that do not count.
        tips: ``(W, T, L, 3)`` leg tip positions.
        forward: ``(W, T, 2 or 3)`` the thorax's forward axis (its x axis) in the world
            frame, or None (heading from the direction of travel).
        params: Thresholds.
        legs: The legs' names (default ``lf``, ``lm``... in order, or ``leg0``...).
        reference: The leg phases are measured against (default ``lf``, else the first).
        height: False: z is not a height (2-D tracking; height measures are NaN).

    Returns:
        ``{name: (W,) array}`` for the world measures of :data:`MEASURES`, and ``(W, L)``
        for the per-leg ones (names without ``_<leg>``).
    """
    legs = _leg_names(legs, tips.shape[2])
    walk = _Walk.of(times, thorax, tips, forward, legs, height)
    measured = _measure(walk, params, reference or _default_reference(legs), None)
    return {name: values[..., 0] for name, values in measured.items()}


def _thorax_measures(times: np.ndarray, thorax: np.ndarray, forward: np.ndarray | None,
                     params: GaitParams, height: bool) -> dict[str, np.ndarray]:
    """The thorax's measures, ``{name: (W,)}`` (NaN for a world with fewer than 2 frames)."""
    worlds = len(thorax)
    if thorax.shape[1] < 2:
        return {name: np.full(worlds, np.nan) for name in _THORAX_MEASURES}
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
        z = np.where(valid, thorax[..., 2], np.nan) if height else np.full(valid.shape, np.nan)
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
            "time_below": below.sum(axis=1) * _interval(times) if height
            else np.full(worlds, np.nan),
        }
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
    # Unwrap each world's frames that count: the jumps between them, wrapped into (-pi, pi].
    angle = np.where(ok, angle, np.nan)
    jumps = np.diff(angle, axis=1)
    skipped = ~ok[:, 1:]
    if skipped.any():  # a jump over skipped frames: from the last frame that counted
        index = np.where(ok, np.arange(angle.shape[1]), -1)
        last = np.maximum.accumulate(index, axis=1)
        held = np.take_along_axis(angle, np.maximum(last, 0), axis=1)
        jumps = np.where(ok[:, 1:], angle[:, 1:] - held[:, :-1], np.nan)
    wrapped = (jumps + np.pi) % (2 * np.pi) - np.pi
    wrapped = np.where((wrapped == -np.pi) & (jumps > 0), np.pi, wrapped)  # as np.unwrap
    total = np.nansum(wrapped, axis=1)
    return np.where(ok.any(axis=1), total, np.nan)


# ----------------------------------------------------------------------------- the legs
@dataclass(frozen=True)
class _Walk:
    """Trajectories of worlds in host memory.

    Attributes:
        times: ``(T,)`` s.
        thorax: ``(W, T, 3)``.
        tips: ``(W * L, T, 3)``, one row per world and leg (world-major): a view of a
            ``(3, W * L, T)`` array, so that each coordinate is contiguous.
        forward: ``(W, T, 2 or 3)`` or None.
        legs: L names.
        height: z is a height.
    """

    times: np.ndarray
    thorax: np.ndarray
    tips: np.ndarray
    forward: np.ndarray | None
    legs: list[str]
    height: bool

    @classmethod
    def of(cls, times: np.ndarray, thorax: np.ndarray, tips: np.ndarray,
           forward: np.ndarray | None, legs: list[str], height: bool) -> _Walk:
        """From tips ``(W, T, L, 3)`` (any layout); a gap in ``times`` (frames not
        recorded) holds an unknown frame (:func:`~flyarchive.analyze.steps.with_time_gaps`)."""
        times, thorax, tips, forward = with_time_gaps(times, thorax, tips, forward)
        w, t, n = tips.shape[:3]
        rows = np.empty((3, w * n, t))
        rows.reshape(3, w, n, t)[...] = tips.transpose(3, 0, 2, 1)
        return cls(times, thorax, rows.transpose(1, 2, 0), forward, legs, height)

    @property
    def worlds(self) -> int:
        return len(self.thorax)


def _leg_names(legs: Sequence[str] | None, count: int) -> list[str]:
    if legs is not None:
        return [str(leg) for leg in legs]
    return list(LEGS) if count == len(LEGS) else [f"leg{i}" for i in range(count)]


def _default_reference(legs: Sequence[str]) -> str:
    return "lf" if "lf" in legs else legs[0]


def _windows(times: np.ndarray, window: float | None) -> tuple[np.ndarray, float]:
    """The windows' start times and length (one window of the whole time when None)."""
    if window is None:
        return np.asarray(times[:1], dtype=float), math.inf
    starts = np.arange(times[0], times[-1], window)
    return (starts if starts.size else np.asarray(times[:1], dtype=float)), float(window)


def _window_of(when: np.ndarray, starts: np.ndarray, length: float) -> np.ndarray:
    """Each time's window index, -1 outside every window (or NaN)."""
    if not math.isfinite(length):
        return np.where(np.isfinite(when), 0, -1)
    with np.errstate(invalid="ignore"):
        index = np.floor((when - starts[0]) / length + 1e-12)
        # the last window holds its end (the last frame of a recording it ends with)
        end = starts[0] + len(starts) * length
        index = np.where((index == len(starts)) & (when <= end + 1e-9), index - 1, index)
    ok = np.isfinite(index) & (index >= 0) & (index < len(starts))
    return np.where(ok, index, -1).astype(np.int64)


def _measure(walk: _Walk, params: GaitParams, reference: str, window: float | None
             ) -> dict[str, np.ndarray]:
    """Every measure of every world and window: ``(W, n)`` world measures and ``(W, L, n)``
    per-leg ones (names without ``_<leg>``)."""
    times = walk.times
    worlds, n_legs = walk.worlds, len(walk.legs)
    starts, length = _windows(times, window)
    out: dict[str, np.ndarray] = {}
    thorax = walk.thorax
    frame_window = _window_of(times, starts, length)
    for k, t0 in enumerate(starts):
        cut = slice(None) if not math.isfinite(length) else frame_window == k
        part = _thorax_measures(times[cut], thorax[:, cut],
                                None if walk.forward is None else walk.forward[:, cut], params,
                                walk.height)
        for name, values in part.items():
            out.setdefault(name, np.full((worlds, len(starts)), np.nan))[:, k] = values
    runs = stance_runs(times, walk.tips, params, height=walk.height)
    edges = event_edges(times, runs, walk.tips, params, height=walk.height)
    state = state_at_events(times, runs, edges)  # shares of time agree with the durations
    events = step_events(times, runs, walk.tips, params, height=walk.height, edges=edges)
    legs_out = _leg_measures(times, state, events, worlds, n_legs, starts, length)
    legs_out.update(_phases(events, worlds, n_legs, walk.legs.index(reference), starts, length,
                            times))
    out.update(legs_out)
    out.update(_coordination(times, state, events, worlds, walk.legs, starts, length))
    return out


def _sums(index: np.ndarray, ok: np.ndarray, size: int, *weights: np.ndarray) -> list[np.ndarray]:
    """Counts (and weighted sums) of ``index`` where ``ok``, ``size`` bins."""
    index = index[ok]
    out = [np.bincount(index, minlength=size).astype(float)]
    out += [np.bincount(index, weights=w[ok], minlength=size) for w in weights]
    return out


def _leg_measures(times: np.ndarray, state: np.ndarray, events: StepEvents, worlds: int,
                  n_legs: int, starts: np.ndarray, length: float) -> dict[str, np.ndarray]:
    n = len(starts)
    size = worlds * n_legs * n
    shape = (worlds, n_legs, n)
    # Shares of frames in stance.
    if n == 1 and not math.isfinite(length):  # one window of every frame: sums per row
        known = np.count_nonzero(state != UNKNOWN, axis=1).astype(float)
        stance = np.count_nonzero(state == STANCE, axis=1).astype(float)
    else:
        frame_window = _window_of(times, starts, length)
        rows = np.arange(state.shape[0])[:, None]
        bins = rows * n + frame_window[None, :]
        ok = (frame_window[None, :] >= 0) & (state != UNKNOWN)
        known, stance = _sums(bins.ravel(), ok.ravel(), size,
                              (state == STANCE).ravel().astype(float))
    # Complete cycles: the stance before each complete swing, then the swing.
    cycle = events.touchdown - events.stance_start
    where = _window_of(events.stance_start, starts, length)
    ok = where >= 0
    bins = events.tip * n + np.maximum(where, 0)
    count, period, stance_time, swing_time, step_length = _sums(
        bins, ok, size, cycle, events.stance_duration, events.swing_duration, events.step_length)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            "stance_fraction": stance / known,
            "step_frequency": count / period,
            "duty_factor": stance_time / period,
            "stance_duration": stance_time / count,
            "swing_duration": swing_time / count,
            "step_length": step_length / count,
        }
    return {name: values.reshape(shape) for name, values in out.items()}


def _phases(events: StepEvents, worlds: int, n_legs: int, reference: int, starts: np.ndarray,
            length: float, times: np.ndarray) -> dict[str, np.ndarray]:
    """Each leg's lift-offs in the reference leg's lift-off-to-lift-off cycles."""
    n = len(starts)
    shape = (worlds, n_legs, n)
    world, leg = np.divmod(events.tip, n_legs)
    ref = np.flatnonzero(leg == reference)
    # A reference cycle: two consecutive lift-offs with a complete stance between them: the
    # second step's stance began at the first's touchdown (else steps were lost between)
    follows = np.zeros(len(ref), bool)
    follows[1:] = (world[ref[1:]] == world[ref[:-1]]) & \
        (events.stance_start[ref[1:]] == events.touchdown[ref[:-1]])
    begin, end = ref[:-1][follows[1:]], ref[1:][follows[1:]]
    starts_key = _keys(world[begin], events.liftoff[begin], times)
    at = np.searchsorted(starts_key, _keys(world, events.liftoff, times), side="right") - 1
    ok = at >= 0
    at = np.maximum(at, 0)
    if len(begin):
        c0, c1 = events.liftoff[begin][at], events.liftoff[end][at]
        ok &= (world[begin][at] == world) & (events.liftoff < c1)
        phase = np.where(ok, (events.liftoff - c0) / (c1 - c0), 0.0)
    else:
        ok &= False
        phase = np.zeros(len(events))
    where = _window_of(events.liftoff, starts, length)
    ok &= where >= 0
    bins = events.tip * n + np.maximum(where, 0)
    count, cos, sin = _sums(bins, ok, worlds * n_legs * n, np.cos(2 * np.pi * phase),
                            np.sin(2 * np.pi * phase))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, (np.arctan2(sin, cos) / (2 * np.pi)) % 1.0, np.nan)
        strength = np.where(count > 0, np.hypot(cos, sin) / count, np.nan)
    return {"phase": mean.reshape(shape), "phase_concentration": strength.reshape(shape)}


def _keys(world: np.ndarray, when: np.ndarray, times: np.ndarray) -> np.ndarray:
    """One sortable number per (world, time): world-major, then time (searches over the
    events of every world at once)."""
    return world * (float(times[-1] - times[0]) + 1.0) + (when - times[0])


#: Support pattern of each set of legs in stance (bit i: leg LEGS[i] in stance):
#: 0 tripod, 1 tetrapod, 2 wave, 3 other.
def _support_classes() -> np.ndarray:
    classes = np.full(64, 3, np.int64)
    tripods = [sum(1 << LEGS.index(leg) for leg in tripod) for tripod in TRIPODS]
    for bits in range(64):
        down = [leg for i, leg in enumerate(LEGS) if bits >> i & 1]
        up = [leg for leg in LEGS if leg not in down]
        if bits in tripods:
            classes[bits] = 0
        elif len(up) == 2 and up[0][0] != up[1][0] and up[0][1] != up[1][1]:
            classes[bits] = 1
        elif len(up) == 1:
            classes[bits] = 2
    return classes


_SUPPORT = _support_classes()
_SUPPORT_NAMES = ("support_tripod", "support_tetrapod", "support_wave", "support_other")


def _coordination(times: np.ndarray, state: np.ndarray, events: StepEvents, worlds: int,
                  legs: list[str], starts: np.ndarray, length: float) -> dict[str, np.ndarray]:
    """``tcs`` and the support shares, ``(W, n)``; NaN without the six legs of a fly."""
    n = len(starts)
    names = ("tcs", *_SUPPORT_NAMES)
    if not set(LEGS) <= set(legs):
        return {name: np.full((worlds, n), np.nan) for name in names}
    per_world = state.reshape(worlds, len(legs), -1)
    known = np.ones((worlds, state.shape[1]), bool)
    bits = np.zeros((worlds, state.shape[1]), np.uint8)
    for i, leg in enumerate(LEGS):  # (six legs: a loop over legs, not steps)
        one = per_world[:, legs.index(leg)]
        known &= one != UNKNOWN
        bits |= (one == STANCE).view(np.uint8) << np.uint8(i)
    classes = _SUPPORT[bits]
    if n == 1 and not math.isfinite(length):
        bins = np.arange(worlds, dtype=np.int64)[:, None] * 4 + classes
        ok = known
    else:
        frame_window = _window_of(times, starts, length)
        ok = known & (frame_window[None, :] >= 0)
        bins = (np.arange(worlds)[:, None] * n + frame_window[None, :]) * 4 + classes
    counts = np.bincount(bins[ok], minlength=worlds * n * 4).reshape(worlds, n, 4)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = counts / counts.sum(axis=2, keepdims=True)
    out = {name: shares[..., i] for i, name in enumerate(_SUPPORT_NAMES)}
    out["tcs"] = _tcs(events, worlds, legs, starts, length, times, state == UNKNOWN)
    return out


def _tcs(events: StepEvents, worlds: int, legs: list[str], starts: np.ndarray, length: float,
         times: np.ndarray, unknown: np.ndarray) -> np.ndarray:
    """Wosnitza's tripod coordination strength per world and window: for each swing of a
    tripod's front leg, the time all three legs swing together over the time from the
    first lift-off to the last touchdown, the partners' nearest swings taken. A swing
    whose partner was not tracked around it (an unknown frame within a swing's length of
    it) is left out: the partner's nearest known swing may be a cycle away."""
    n_legs, n = len(legs), len(starts)
    world, leg = np.divmod(events.tip, n_legs)
    middle = (events.liftoff + events.touchdown) / 2
    lost = np.concatenate([np.zeros((len(unknown), 1), np.int64),
                           np.cumsum(unknown, axis=1)], axis=1)  # unknown frames before each
    total = np.zeros(worlds * n)
    count = np.zeros(worlds * n)
    for tripod in TRIPODS:
        front = np.flatnonzero(leg == legs.index(tripod[0]))
        first_lo, last_lo = events.liftoff[front].copy(), events.liftoff[front].copy()
        first_td, last_td = events.touchdown[front].copy(), events.touchdown[front].copy()
        ok = np.ones(len(front), bool)
        for partner in tripod[1:]:
            mine = np.flatnonzero(leg == legs.index(partner))  # ordered by world, then time
            if not len(mine):
                ok &= False
                continue
            keys = _keys(world[mine], middle[mine], times)
            want = _keys(world[front], middle[front], times)
            right = np.clip(np.searchsorted(keys, want), 0, len(mine) - 1)
            left = np.maximum(right - 1, 0)
            pick = np.where(np.abs(keys[left] - want) <= np.abs(keys[right] - want), left, right)
            match = mine[pick]
            ok &= world[match] == world[front]
            swing = events.touchdown[front] - events.liftoff[front]
            lo = np.searchsorted(times, events.liftoff[front] - swing, side="left")
            hi = np.searchsorted(times, events.touchdown[front] + swing, side="right")
            row = world[front] * n_legs + legs.index(partner)
            ok &= lost[row, hi] == lost[row, lo]  # the partner known all around the swing
            first_lo = np.minimum(first_lo, events.liftoff[match])
            last_lo = np.maximum(last_lo, events.liftoff[match])
            first_td = np.minimum(first_td, events.touchdown[match])
            last_td = np.maximum(last_td, events.touchdown[match])
        together = np.maximum(first_td - last_lo, 0.0)
        strength = together / (last_td - first_lo)
        where = _window_of(events.liftoff[front], starts, length)
        ok &= where >= 0
        bins = world[front] * n + np.maximum(where, 0)
        total += np.bincount(bins[ok], weights=strength[ok], minlength=worlds * n)
        count += np.bincount(bins[ok], minlength=worlds * n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).reshape(worlds, n)


# ----------------------------------------------------------------------------- sources
def _leg(label: str) -> str:
    name = KeypointName.parse(label)
    return name.leg if name is not None else label.replace("/", "_")


@dataclass(frozen=True)
class _Source:
    """What the gait functions read, before it is computed into host memory.

    Attributes:
        position: ``(world, time, keypoint, xyz)``: the thorax, (``ahead``), the tips.
        ahead: The second keypoint is a point one unit ahead on the thorax's x axis.
        orientation: The thorax's orientation ``(world, time, wxyz)``, or None.
        legs: The tips' leg names.
        individuals: A name per world.
        height: z is a height.
        length_unit: The positions' length unit: ``mm`` for NeuroMechFly's tarsus tips,
            a poses dataset's own; None: not known (another body's points).
        tracked: They are a poses dataset's (a tracker's), not positions of a model.
    """

    position: xr.DataArray
    ahead: bool
    orientation: xr.DataArray | None
    legs: list[str]
    individuals: list[str]
    height: bool
    length_unit: str | None = None
    tracked: bool = False

    def blocks(self) -> list[slice]:
        """Slices of worlds whose tip-frames fit one block of work; for positions read when
        asked for (kept positions), their chunks of worlds (one read each)."""
        worlds, frames = self.position.sizes["world"], self.position.sizes["time"]
        chunks = self.position.chunks
        if chunks is not None:
            edges = np.cumsum([0, *chunks[0]])
            return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
        per = max(1, _BLOCK // max(1, frames * len(self.legs)))
        return [slice(i, min(i + per, worlds)) for i in range(0, worlds, per)]

    def walk(self, worlds: slice) -> _Walk:
        values = np.asarray(self.position.isel(world=worlds).values)
        thorax = values[:, :, 0].astype(np.float64)
        forward = None
        if self.ahead:
            forward = values[:, :, 1] - thorax
        elif self.orientation is not None:
            forward = forward_axis(np.asarray(self.orientation.isel(world=worlds).values))
        times = np.asarray(self.position.time.values, dtype=np.float64)
        return _Walk.of(times, thorax, values[:, :, 1 + self.ahead:], forward, self.legs,
                        self.height)


def _source(source: Any, thorax: str, tips: Any, legs: Mapping[str, str] | None, worlds: Any,
            time: Any, model: Any, storage_options: Any, backend: str,
            processes: int | None) -> _Source:
    import xarray as xr

    poses = _as_poses(source)
    if poses is not None:
        return _poses_source(poses, thorax, legs, worlds, time)
    if isinstance(source, (xr.DataArray, xr.Dataset)) and "keypoint" in source.dims:
        return _positions_source(source, thorax, tips, legs, worlds, time)
    if legs is not None:
        raise SelectionError(
            "legs= maps leg names to keypoints of positions or a poses dataset; for an archive "
            "pass tips= (points {label: (body, offset)}).")
    from flyarchive.analyze.lazy import computed_positions

    _check_tips_once(tips)
    if tips is None or isinstance(tips, Mapping):
        bodies, tip_points = [], gait_points(thorax, tips)
    else:
        bodies, tip_points = list(tips), gait_points(thorax, {})
    points = tip_points
    try:
        got = computed_positions(source, bodies, points, worlds=worlds, time=time, model=model,
                                 storage_options=storage_options, backend=backend,
                                 processes=processes)
    except SelectionError as err:
        if tips is not None or "no such body" not in str(err):
            raise
        raise SelectionError(
            f"{err} Without tips, gait takes NeuroMechFly's six tarsus tips of the thorax's "
            "fly; for another body name its tips: tips={'lf': ('lf_foot', 'tip'), ...} "
            "(--tip lf=lf_foot@tip ... on the command line).") from None
    order = [*points, *bodies]
    if [str(k) for k in got.keypoint.values] != order:  # (a selection copies every frame)
        got = got.sel(keypoint=order)
    ids = [int(w) for w in got.world.values]
    return _Source(got, True, None, [_leg(str(k)) for k in order[2:]], [f"world{w}" for w in ids],
                   True, "mm" if tips is None else None)


def gait_points(thorax: str = "nmf/c_thorax", tips: Mapping[str, PointSpec] | None = None
                ) -> dict[str, PointSpec]:
    """The points the gait functions compute from an archive: ``gait/thorax`` (the
    thorax's origin), ``gait/ahead`` (one unit ahead of it on its x axis: its heading;
    points, so that a frame copies only site positions) and the tips (default
    :func:`flyarchive.tarsus_tips` of the thorax's fly).

    Keep them once (``flyarchive.keep_positions(url, points=gait_points())``) and every
    later gait call on that archive reads them instead of computing kinematics.
    """
    if tips is None:
        tips = tarsus_tips(thorax.rpartition("/")[0] or "nmf")
    return {_THORAX: (thorax, (0.0, 0.0, 0.0)), _AHEAD: (thorax, (1.0, 0.0, 0.0)), **tips}


def gait_positions(
    url: str | xr.Dataset,
    *,
    thorax: str = "nmf/c_thorax",
    tips: Mapping[str, PointSpec] | Sequence[str] | None = None,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "cpu",
    processes: int | None = None,
) -> xr.DataArray:
    """The positions the gait functions compute from an archive, computed once into host
    memory, for several calls: :func:`gait_summary`, :func:`gait_steps` and
    :func:`gait_epochs` take them as their source (with no ``thorax``, ``tips`` or ``legs``).

    Args:
        url, thorax, tips, worlds, time, model, storage_options, backend, processes: As for
            :func:`gait_summary`.

    Returns:
        ``(world, time, keypoint, xyz)``: keypoints ``gait/thorax`` (the thorax's origin),
        ``gait/ahead`` (one unit ahead of it on its x axis: its heading) and the tips.
    """
    position = _source(url, thorax, tips, None, worlds, time, model, storage_options, backend,
                       processes).position
    return position.compute() if position.chunks is not None else position  # (kept: read now)


def _positions_source(source: Any, thorax: str, tips: Any, legs: Mapping[str, str] | None,
                      worlds: Any, time: Any) -> _Source:
    import xarray as xr

    pos = source["position"] if isinstance(source, xr.Dataset) else source
    quat = source["orientation"] if isinstance(source, xr.Dataset) and \
        "orientation" in source else None
    labels_here = [str(k) for k in pos.keypoint.values]
    if labels_here[:2] == [_THORAX, _AHEAD] and legs is None and tips is None:
        got = pos  # from gait_positions
        if worlds is not None or time is not None:
            got = got.sel(world=list(worlds) if worlds is not None else slice(None),
                          time=slice(*(time or (None, None))))
        return _Source(got, True, None, [_leg(k) for k in labels_here[2:]],
                       [f"world{int(w)}" for w in got.world.values], True,
                       "mm" if _tarsus_tips(labels_here[2:]) else None)
    if legs is not None:
        _check_once({leg: repr(str(k)) for leg, k in legs.items()})
        names, labels = list(legs), [str(v) for v in legs.values()]
    else:
        _check_tips_once(tips)
        labels = list(tips) if tips is not None else \
            list(tarsus_tips(thorax.rpartition("/")[0] or "nmf"))
        names = [_leg(label) for label in labels]
    _check_keypoints([thorax, *labels], [str(k) for k in pos.keypoint.values], "positions")
    if list(pos.keypoint.values) != [thorax, *labels]:  # (a selection copies)
        pos = pos.sel(keypoint=[thorax, *labels])
    if worlds is not None or time is not None:
        pos = pos.sel(world=list(worlds) if worlds is not None else slice(None),
                      time=slice(*(time or (None, None))))
    orientation = None if quat is None else quat.sel(keypoint=thorax, world=pos.world,
                                                     time=pos.time)
    return _Source(pos, False, orientation, names, [f"world{int(w)}" for w in pos.world.values],
                   True, "mm" if _tarsus_tips(labels) else None)


def _tarsus_tips(labels: Sequence[str]) -> bool:
    """The labels are NeuroMechFly's tarsus tips (:func:`flyarchive.tarsus_tips`): in mm."""
    fly = labels[0].rpartition("/")[0] if labels else ""
    legs = [_leg(k) for k in labels]
    return bool(fly) and set(legs) <= set(LEGS) and list(labels) == list(tarsus_tips(fly, legs))


def _check_tips_once(tips: Any) -> None:
    """Each tip names its own point or keypoint (two legs of one tip are a slip)."""
    if tips is None:
        return
    if isinstance(tips, Mapping):
        _check_once({str(label): repr(spec) for label, spec in tips.items()}, "tips= (--tip)",
                    "point")
    elif not isinstance(tips, str):
        _check_once({f"tip {i}": repr(str(label)) for i, label in enumerate(tips)}, "tips=",
                    "keypoint")


def _check_once(legs: Mapping[str, str], what: str = "legs=", thing: str = "keypoint") -> None:
    """Each keypoint tips one leg (a keypoint named for two legs is a slip of the mapping)."""
    seen: dict[str, str] = {}
    for leg, keypoint in legs.items():
        if str(keypoint) in seen:
            raise SelectionError(
                f"{what} maps both {seen[str(keypoint)]!r} and {leg!r} to the {thing} "
                f"{keypoint}; each leg needs a tip of its own. Give {leg!r} its own "
                f"{thing}, or leave it out.")
        seen[str(keypoint)] = str(leg)


def _check_keypoints(wanted: Sequence[str], have: Sequence[str], what: str) -> None:
    missing = [k for k in wanted if k not in have]
    if missing:
        from flyarchive.errors import did_you_mean

        raise SelectionError(
            f"The {what} have no keypoint {missing[0]!r}.{did_you_mean(missing[0], have)} "
            f"Keypoints ({len(have)}): {', '.join(repr(k) for k in have[:20])}"
            f"{' ...' if len(have) > 20 else ''}. Name keypoints that exist (thorax=, legs=).")


def _as_poses(source: Any) -> Any:
    """``source`` as a ``movement`` poses dataset with an ``individual`` dimension, or None
    when it is not one: a dataset of one fly (``ds.sel(individual="fly0")``) or a
    position DataArray (``movement.filtering.savgol_filter(ds.position)``), whose time is
    in seconds when its coordinate holds fractions (movement's frame numbers are whole)."""
    import xarray as xr

    if isinstance(source, xr.DataArray) and "space" in source.dims:
        if source.name not in (None, "position"):
            source = source.rename("position")
        unit = "seconds" if "time" in source.coords and \
            np.issubdtype(source["time"].dtype, np.floating) else "frames"
        source = source.to_dataset(name="position").assign_attrs(time_unit=unit)
    if not isinstance(source, xr.Dataset) or "position" not in source or \
            "space" not in source["position"].dims:
        return None
    if "individual" not in source.dims:
        named = "individual" in source.coords
        source = source.expand_dims("individual") if named else \
            source.expand_dims(individual=["individual_0"])
    return source


def _poses_source(ds: Any, thorax: str, legs: Mapping[str, str] | None, worlds: Any,
                  time: Any) -> _Source:
    """A ``movement`` poses dataset: ``position`` ``(time, space, keypoint, individual)``."""
    import xarray as xr

    have = [str(k) for k in ds.keypoint.values]
    if legs is None:
        raise SelectionError(
            f"A poses dataset needs legs= mapping leg names to its keypoints, e.g. "
            f"legs={{'lf': 'L1_tip', 'lm': 'L2_tip', ...}} (flygym's leg names lf, lm, lh, "
            f"rf, rm, rh give tcs and the support shares). Keypoints: {', '.join(have[:20])}.")
    if not isinstance(legs, Mapping) or not legs:
        raise SelectionError(f"legs= must map leg names to keypoint names, got {legs!r}.")
    _check_once({leg: repr(str(k)) for leg, k in legs.items()})
    _check_keypoints([thorax, *legs.values()], have, "poses")
    unit = ds.attrs.get("time_unit")
    if unit != "seconds":
        raise SelectionError(
            f"The poses dataset's time is in {unit!r}, not seconds: gait needs times. Load it "
            "with its frame rate, e.g. movement.io.load_poses.from_dlc_file(path, fps=300).")
    space = [str(s) for s in ds.space.values]
    position = ds["position"].sel(keypoint=[thorax, *legs.values()])
    if space == ["x", "y"]:  # 2-D tracking: no heights
        position = xr.concat([position, xr.zeros_like(position.isel(space=0))
                              .expand_dims(space=["z"])], dim="space")
    elif space != ["x", "y", "z"]:
        raise SelectionError(f"The poses dataset's space is {space}; expected x, y (and z).")
    names = [str(i) for i in ds.individual.values]
    # coordinates beside the dims (a flyarchive export's world ids, world variables) go
    position = position.drop_vars([c for c in position.coords if c not in position.dims])
    position = position.transpose("individual", "time", "keypoint", "space").rename(
        individual="world", space="xyz").assign_coords(world=np.arange(len(names)),
                                                       xyz=["x", "y", "z"])
    asked = parse_world_ids(worlds)
    if asked is not None:
        outside = [w for w in asked if not 0 <= w < len(names)]
        if outside or not asked:
            raise SelectionError(
                f"World(s) {outside or asked} are not in the poses dataset: its worlds are its "
                f"individuals' indices 0..{len(names) - 1} ({', '.join(names[:8])}"
                f"{'...' if len(names) > 8 else ''}). Pass some of them, or none for all.")
        position = position.sel(world=asked)
        names = [names[w] for w in asked]
    if time is not None:
        position = position.sel(time=slice(*time))
    unit = ds["position"].attrs.get("units")
    return _Source(position, False, None, [str(leg) for leg in legs], names, space != ["x", "y"],
                   str(unit) if unit else _POSES_UNIT, tracked=True)


def _prepare(source: Any, thorax: str, tips: Any, legs: Any, params: GaitParams, worlds: Any,
             time: Any, model: Any, storage_options: Any, backend: str, processes: int | None,
             reference: str | None, length_unit: str | None) -> tuple[_Source, str]:
    if not isinstance(params, GaitParams):
        raise OptionsError(f"params must be a GaitParams, got {type(params).__name__}.")
    _check_length_unit(length_unit)
    got = _source(source, thorax, tips, legs, worlds, time, model, storage_options, backend,
                  processes)
    if length_unit is not None or got.length_unit is None:
        got = replace(got, length_unit=length_unit or _MODEL_UNIT)
    if params == GaitParams() and got.length_unit not in _MILLIMETRES and got.tracked:
        said = "not given" if got.length_unit == _POSES_UNIT else got.length_unit
        warnings.warn(
            f"The gait thresholds are GaitParams' defaults, in mm (a tip below 0.1 mm may "
            f"stand...), and these poses' length unit is {said}: in "
            "pixels, or with the ground not at z = 0, stances and steps are found wrong or "
            "not at all. If they are in mm, say so (length_unit='mm'); else pass thresholds "
            "in their unit (params=GaitParams(stance_height=..., ...)).", stacklevel=3)
    frames = got.position.sizes["time"]
    if frames < 2:
        raise SelectionError(
            f"Gait needs at least 2 frames; the selection holds {frames}. Record longer, or "
            "widen time= (--time).")
    reference = reference if reference is not None else _default_reference(got.legs)
    if reference not in got.legs:
        raise SelectionError(f"No leg {reference!r} to measure phases against; legs: "
                             f"{', '.join(got.legs)}. Pass reference_leg= one of them.")
    return got, reference


# ----------------------------------------------------------------------------- public
def gait_summary(
    source: str | xr.Dataset | xr.DataArray,
    *,
    thorax: str = "nmf/c_thorax",
    tips: Mapping[str, PointSpec] | Sequence[str] | None = None,
    legs: Mapping[str, str] | None = None,
    params: GaitParams = GaitParams(),
    reference_leg: str | None = None,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    window: float | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "cpu",
    save: bool = False,
    processes: int | None = None,
    length_unit: str | None = None,
    overwrite: bool = False,
) -> xr.Dataset:
    """Gait and locomotion measures of every world (see the module's table for definitions).

    Example: ``flyarchive.gait_summary("run.zarr").step_frequency_lf``; a fly tracked
    with DeepLabCut: ``gait_summary(movement.io.load_poses.from_dlc_file(path, fps=300),
    thorax="thorax", legs={"lf": "L1_tip", ...})``.

    Args:
        source: An archive (URL or dataset): the thorax and leg tips are computed
            (:func:`flyarchive.positions`, kept positions when they match); positions
            already computed (a DataArray, or a Dataset with ``orientation``); or a
            ``movement`` poses dataset (its individuals are the worlds; time in seconds).
        thorax: The body (keypoint) whose path is the fly's.
        tips: Leg tips: points ``{label: (body, offset)}`` for an archive, or labels of
            keypoints for positions; default :func:`flyarchive.tarsus_tips` of the
            thorax's fly (NeuroMechFly's six tarsus tips, legs ``lf`` ... ``rh``).
        legs: ``{leg name: keypoint}`` for positions or a poses dataset (needed for one):
            the tips and the names the measures carry.
        params: Thresholds (:class:`GaitParams`).
        reference_leg: The leg whose cycles phases are measured in (default ``lf``, else
            the first leg).
        worlds, time: Worlds and a time window (seconds, inclusive), as for positions.
        window: Seconds: measures per window ``[start, start + window)``, windows one after
            another from the first frame (a ``window`` dimension, its start time as
            coordinate; at most the selection's length). None: the whole selection.
        model, storage_options, backend: As for :func:`flyarchive.positions`.
        save: Also store the measures in the archive as world variables
            (:func:`flyarchive.add_world_vars`), so that ``where=ds.distance > 5`` and
            ``--where-world-var 'distance>5'`` pick worlds. Needs every world and no
            window. Measures an earlier save stored are replaced (the archive holds every
            one of these measures); a world variable of one of their names otherwise (one
            of yours) only with ``overwrite``.
        overwrite: With ``save``: replace world variables of the measures' names whoever
            added them.
        processes: From an archive on the CPU: worker processes computing the positions
            beside this one; 0: dask's scheduler in this process; None: one per other
            usable core when the selection holds at least 200,000 frames.
        length_unit: The positions' length unit, for the measures' ``units`` (``"m"``,
            ``"px"``...; the thresholds are in it too). None: ``mm`` for NeuroMechFly's
            tarsus tips, a poses dataset's ``position.attrs["units"]``, else
            ``"model unit"`` (another body's points: MuJoCo models carry no unit).

    Returns:
        Dataset over ``world`` (and ``window``): the measures of :data:`MEASURES` (per leg
        ``<name>_<leg>``), each with ``units`` and ``description`` attributes; the
        coordinate ``individual`` names each world; ``attrs`` hold the thresholds.

    Raises:
        SelectionError: unknown thorax, tips or legs; fewer than 2 frames; a window that
            is not a positive number or is longer than the selection; ``save`` with
            windows, a subset of worlds or without an archive URL.
        OutputExistsError: ``save`` would replace world variables an earlier save did not
            store, and ``overwrite`` is False (nothing is written).
        OptionsError: thresholds that cannot be used.
        And as :func:`flyarchive.positions`.
    """
    if window is not None and (not is_real(window) or not math.isfinite(window) or window <= 0):
        raise SelectionError(f"window must be a positive number of seconds, got {window!r}.")
    if save and (window is not None or not isinstance(source, str)):
        raise SelectionError(
            "save=True stores one value per world in the archive: pass the archive's URL and "
            "no window.")
    if save and time is not None:
        raise SelectionError(
            f"save=True (--save) stores measures of the whole recording, and time={time!r} "
            "(--time) measures a part of it: saved, nothing would say which. Drop time= to "
            "save, or leave save off to see that part's measures (add_world_vars stores "
            "them under names of your own).")
    got, reference = _prepare(source, thorax, tips, legs, params, worlds, time, model,
                              storage_options, backend, processes, reference_leg, length_unit)
    times = np.asarray(got.position.time.values, dtype=np.float64)
    if window is not None and window > times[-1] - times[0] + 1e-9:
        raise SelectionError(
            f"window={window!r} s is longer than the selection ({times[-1] - times[0]:.6g} s, "
            f"{len(times)} frames). Pass a shorter window, or none for one value per world.")
    if save:
        _check_every_world(source, got, storage_options)
    parts = [_measure(got.walk(block), params, reference, window) for block in got.blocks()]
    measured = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    summary = _dataset(measured, got, window)
    if window is not None:
        starts, _ = _windows(times, window)
        summary = summary.assign_coords(window=("window", starts, {
            "units": "s", "description": "window start"})).transpose("window", "world")
    else:
        summary = summary.isel(window=0, drop=True)
    summary.attrs.update({f.name: float(getattr(params, f.name)) for f in fields(params)})
    summary.attrs.update(thorax=thorax, reference_leg=reference)
    if save:
        from flyarchive.store.world_vars import add_world_vars

        _check_replaced(source, list(summary.data_vars), storage_options, overwrite)
        add_world_vars(source, {k: v.reset_coords(drop=True)  # type: ignore[arg-type]
                                for k, v in summary.data_vars.items()},
                       storage_options=storage_options, overwrite=True)
    return summary


def _check_replaced(source: str, names: list[str], storage_options: Any, overwrite: bool) -> None:
    """Refuse to replace world variables of these names that an earlier save did not store
    (unless ``overwrite``): a save stores every measure at once, so an archive holding
    only some of them holds variables of the user's."""
    from flyarchive.errors import OutputExistsError
    from flyarchive.query import open_archive

    held = set(open_archive(source, storage_options=storage_options).data_vars)
    clash = [name for name in names if name in held]
    if not clash or overwrite or set(names) <= held:
        return
    shown = ", ".join(clash[:6]) + (f" (and {len(clash) - 6} more)" if len(clash) > 6 else "")
    raise OutputExistsError(
        f"The archive at {source!r} has world variables {shown} that no earlier gait save "
        f"stored (it holds {len(clash)} of these {len(names)} measures): saving would replace "
        "your values. Pass overwrite=True (--overwrite) to replace them, or save the measures "
        "in a copy of the archive. Nothing was written.")


def _check_every_world(source: str, got: _Source, storage_options: Any) -> None:
    from flyarchive.query import open_archive

    every = [int(w) for w in open_archive(source, storage_options=storage_options).world.values]
    chosen = [int(w) for w in got.position.world.values]
    if sorted(chosen) != sorted(every):
        raise SelectionError(
            f"save=True (--save) stores one value per world and needs every world of the "
            f"archive; the selection holds {len(chosen)} of its {len(every)}. Drop worlds= "
            "(--worlds) to save, or leave save off to see these worlds' measures.")


def _check_length_unit(unit: Any) -> None:
    if unit is not None and (not isinstance(unit, str) or not unit.strip()
                             or len(unit) > 40 or not unit.isprintable()):
        raise OptionsError(
            f"length_unit must be the name of the positions' length unit (\"mm\", \"m\", "
            f"\"px\"...), at most 40 printable characters, or None for the default, got "
            f"{unit!r}.")


def _in_unit(unit: str, got: _Source) -> str:
    """A unit written in mm, in the positions' length unit (pixels, cm...)."""
    return unit if got.length_unit == "mm" else unit.replace("mm", got.length_unit)


def _dataset(measured: Mapping[str, np.ndarray], got: _Source, window: float | None
             ) -> xr.Dataset:
    import xarray as xr

    def unit_of(name: str) -> str:
        return _in_unit(MEASURES[name][0], got)

    data = {}
    for name in _WORLD:
        unit, text = unit_of(name), MEASURES[name][1]
        data[name] = xr.DataArray(measured[name], dims=("world", "window"),
                                  attrs={"units": unit, "description": text})
    for name in _PER_LEG:
        unit, text = unit_of(f"{name}_<leg>"), MEASURES[f"{name}_<leg>"][1]
        for i, leg in enumerate(got.legs):
            data[f"{name}_{leg}"] = xr.DataArray(measured[name][:, i], dims=("world", "window"),
                                                 attrs={"units": unit, "description": text})
    return xr.Dataset(data, coords={"world": got.position.world.values,
                                    "individual": ("world", got.individuals)})


def _tables(source: Any, thorax: str, tips: Any, legs: Any, params: GaitParams, worlds: Any,
            time: Any, model: Any, storage_options: Any, backend: str, processes: int | None,
            length_unit: str | None) -> tuple[_Source, Iterator[tuple[_Walk, Any, int]]]:
    """The source, and each block of worlds' trajectories with their stance runs
    (:func:`~flyarchive.analyze.steps.stance_runs`) and first world, one block at a time."""
    got, _ = _prepare(source, thorax, tips, legs, params, worlds, time, model, storage_options,
                      backend, processes, None, length_unit)

    def blocks() -> Iterator[tuple[_Walk, Any, int]]:
        for block in got.blocks():
            walk = got.walk(block)
            yield walk, stance_runs(walk.times, walk.tips, params, height=walk.height), \
                block.start

    return got, blocks()


def gait_steps(
    source: str | xr.Dataset | xr.DataArray,
    *,
    thorax: str = "nmf/c_thorax",
    tips: Mapping[str, PointSpec] | Sequence[str] | None = None,
    legs: Mapping[str, str] | None = None,
    params: GaitParams = GaitParams(),
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "cpu",
    processes: int | None = None,
    length_unit: str | None = None,
) -> pd.DataFrame:
    """Every complete step (a swing between two stances) of every world and leg, a row each.

    Example: ``flyarchive.gait_steps("run.zarr").groupby(["world", "leg"]).swing_duration
    .mean()``; real and simulated flies in one table: ``pandas.concat([gait_steps(url),
    gait_steps(poses, thorax="thorax", legs={...})])``.

    Args:
        source, thorax, tips, legs, params, worlds, time, model, storage_options, backend,
            processes, length_unit: As for :func:`gait_summary`.

    Returns:
        A pandas DataFrame with the columns of :data:`STEP_COLUMNS` (``world``,
        ``individual``, ``leg``, ``step``, ``liftoff_time``, ``touchdown_time``,
        ``swing_duration``, ``stance_start``, ``stance_duration``, ``step_length``),
        ordered by world, leg, then time; ``attrs["units"]`` gives each column's unit.
        A step across a gap (frames without positions) is not a step: none is made up.

    Raises:
        As :func:`gait_summary`.
    """
    import pandas as pd

    got, blocks = _tables(source, thorax, tips, legs, params, worlds, time, model,
                          storage_options, backend, processes, length_unit)
    world_ids = np.asarray(got.position.world.values)
    parts = []
    for walk, runs, first in blocks:
        events = step_events(walk.times, runs, walk.tips, params, height=walk.height)
        world, leg = np.divmod(events.tip, len(got.legs))
        world = world + first
        parts.append(pd.DataFrame({
            "world": world_ids[world],
            "individual": np.asarray(got.individuals, dtype=str)[world],
            "leg": np.asarray(got.legs, dtype=str)[leg],
            "step": _ordinal(events.tip),
            "liftoff_time": events.liftoff,
            "touchdown_time": events.touchdown,
            "swing_duration": events.swing_duration,
            "stance_start": events.stance_start,
            "stance_duration": events.stance_duration,
            "step_length": events.step_length,
        }))
    table = pd.concat(parts, ignore_index=True)
    table.attrs["units"] = {name: _in_unit(unit, got) for name, (unit, _) in STEP_COLUMNS.items()}
    return table


def gait_epochs(
    source: str | xr.Dataset | xr.DataArray,
    *,
    thorax: str = "nmf/c_thorax",
    tips: Mapping[str, PointSpec] | Sequence[str] | None = None,
    legs: Mapping[str, str] | None = None,
    params: GaitParams = GaitParams(),
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "cpu",
    processes: int | None = None,
    length_unit: str | None = None,
) -> pd.DataFrame:
    """Every stance and every swing of every world and leg as a time interval, a row each:
    what a footfall diagram draws (the stance rows as bars per leg over time) and NWB
    export stores as epochs.

    Args:
        source, thorax, tips, legs, params, worlds, time, model, storage_options, backend,
            processes, length_unit: As for :func:`gait_summary`.

    Returns:
        A pandas DataFrame with the columns of :data:`EPOCH_COLUMNS` (``world``,
        ``individual``, ``leg``, ``phase`` (``"stance"`` or ``"swing"``), ``start_time``,
        ``stop_time``, ``duration``, ``complete``), ordered by world, leg, then time;
        frames without positions belong to no interval.

    Raises:
        As :func:`gait_summary`.
    """
    import pandas as pd

    got, blocks = _tables(source, thorax, tips, legs, params, worlds, time, model,
                          storage_options, backend, processes, length_unit)
    world_ids = np.asarray(got.position.world.values)
    parts = []
    for walk, runs, first in blocks:
        epochs: PhaseEpochs = phase_epochs(walk.times, runs, walk.tips, params,
                                           height=walk.height)
        world, leg = np.divmod(epochs.tip, len(got.legs))
        world = world + first
        parts.append(pd.DataFrame({
            "world": world_ids[world],
            "individual": np.asarray(got.individuals, dtype=str)[world],
            "leg": np.asarray(got.legs, dtype=str)[leg],
            "phase": np.where(epochs.stance, "stance", "swing"),
            "start_time": epochs.start,
            "stop_time": epochs.stop,
            "duration": epochs.stop - epochs.start,
            "complete": epochs.complete,
        }))
    table = pd.concat(parts, ignore_index=True)
    table.attrs["units"] = {name: _in_unit(unit, got) for name, (unit, _) in EPOCH_COLUMNS.items()}
    return table


def _ordinal(groups: np.ndarray) -> np.ndarray:
    """Each element's index within its run of equal values (``groups`` sorted)."""
    if not len(groups):
        return np.zeros(0, np.int64)
    start = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    return np.arange(len(groups)) - np.repeat(start, np.diff(np.r_[start, len(groups)]))

