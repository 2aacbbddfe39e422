"""Step events of leg tips: when each tip is in stance or in swing, its lift-offs and
touchdowns, from its height and horizontal speed, for many tips at once.

A tip's state, frame by frame (``(N, T)`` arrays, one row per tip: the worlds' legs):

1. **Band.** A frame is in the *stance band* when the tip is low and still: height ``z``
   below ``stance_height`` and horizontal speed below ``stance_speed``. The speed of a
   frame is the smaller of its backward and forward differences (so the last frame before
   a lift-off and the first after a touchdown, where the tip stands, read as still at any
   frame rate), of positions averaged over ``smooth`` seconds (a centred moving average
   over the frames within ``smooth / 2`` of each; below ~330 frames/s it is one frame:
   none).
2. **Hysteresis.** A run of frames out of the band is a swing only if the tip in it
   rises above ``swing_height`` or moves faster than ``swing_speed`` (the larger of its
   two differences); else the run is part of the stance around it (a slip, a wobble,
   noise). So a tip enters stance at the band (touchdown) and leaves it when it clearly
   swings, its lift-off traced back to where it left the band.
3. **Minimum durations.** A swing shorter than ``min_swing`` between two stances joins
   them; then a stance shorter than ``min_stance`` between two swings joins them.

Frames whose tip position is not finite (tracking dropouts, frames past a world's
``n_frames``) are *unknown*; a stance or swing next to them (or to the first or last
frame) has no event on that side, so no step is counted across a gap.

An event lies between the last frame of one state and the first of the next, at the
middle of the two frame times (unbiased for events that fall anywhere between frames).
Thresholds set where the events lie on a smooth lift-off: a tip is in stance until it
leaves the band, so stance reads longer than ground contact by the time a tip takes to
rise ``stance_height`` or reach ``stance_speed``.

Without heights (2-D tracking), the band and the swing evidence are the speeds alone.

:func:`stance_state` gives the state (thresholds:
:class:`~flyarchive.analyze.gait_params.GaitParams`); :func:`step_events` the complete
steps (a swing between two stances) with their lift-off, touchdown, the stance before and
the step length; :func:`phase_epochs` every stance and swing as a time interval (the
footfall diagram, NWB epochs). Vectorized over tips and frames: no Python loop per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flyarchive.analyze.gait_params import GaitParams

#: A frame's state: in stance, in swing, or unknown (no position).
STANCE, SWING, UNKNOWN = 1, 0, -1


def stance_state(times: np.ndarray, tips: np.ndarray, params: GaitParams, *,
                 height: bool = True) -> np.ndarray:
    """Stance or swing of every tip and frame (see the module's docstring).

    Args:
        times: ``(T,)`` frame times, s, increasing.
        tips: ``(N, T, 3)`` tip positions (x, y horizontal, z up), float; NaN where a
            position is unknown. Fastest when each coordinate is contiguous (a view of a
            ``(3, N, T)`` array).
        params: Thresholds (:class:`~flyarchive.analyze.gait_params.GaitParams`).
        height: False: ``z`` is not a height (2-D tracking); only speeds count.

    Returns:
        ``(N, T)`` int8: :data:`STANCE`, :data:`SWING` or :data:`UNKNOWN`.
    """
    n, t = tips.shape[:2]
    if t < 2:
        return np.full((n, t), UNKNOWN, np.int8)
    x, y, z = (_smoothed(tips[..., k], times, params.smooth) for k in range(3))
    dx, dy = np.diff(x, axis=1), np.diff(y, axis=1)
    moved = np.sqrt(dx * dx + dy * dy)
    moved /= np.diff(times)  # (N, T-1) horizontal speed between frames
    slow = np.empty((n, t))
    fast = np.empty((n, t))
    slow[:, 0] = fast[:, 0] = moved[:, 0]
    slow[:, -1] = fast[:, -1] = moved[:, -1]
    with np.errstate(invalid="ignore"):
        np.fmin(moved[:, :-1], moved[:, 1:], out=slow[:, 1:-1])
        np.fmax(moved[:, :-1], moved[:, 1:], out=fast[:, 1:-1])
        known = np.isfinite(slow)
        known &= np.isfinite(tips[..., 0]) & np.isfinite(tips[..., 1]) & np.isfinite(tips[..., 2])
        band = slow < params.stance_speed
        evidence = fast > params.swing_speed
        if height:
            band &= z < params.stance_height
            evidence |= z > params.swing_height
    code = np.where(known, band.astype(np.int8), np.int8(UNKNOWN)).astype(np.int8)
    # Hysteresis: out of the band without clear swing evidence is stance.
    runs = _Runs.of(code)
    swung = np.add.reduceat((evidence & known).ravel(), runs.first) > 0
    code = runs.painted(np.where((runs.value == SWING) & ~swung, STANCE, runs.value))
    # Short swings join the stances around them, then short stances the swings.
    bounds = _boundaries(times)
    for value, shortest in ((SWING, params.min_swing), (STANCE, params.min_stance)):
        if shortest <= 0:
            continue
        runs = _Runs.of(code)
        other = STANCE + SWING - value
        inner = (runs.value == value) & (runs.before == other) & (runs.after == other)
        short = inner & (bounds[runs.stop] - bounds[runs.start] < shortest)
        if short.any():
            code = runs.painted(np.where(short, other, runs.value))
    return code


def _smoothed(values: np.ndarray, times: np.ndarray, width: float) -> np.ndarray:
    """A centred moving average of ``(N, T)`` along time over the frames within
    ``width / 2`` of each (fewer at the ends; NaN where the window holds a NaN), or
    ``values`` itself when that is one frame."""
    n, t = values.shape
    half = int(width / (2 * float(np.median(np.diff(times)))) + 1e-9)
    if half < 1:
        return values
    sums = np.zeros((n, t + 1))
    np.cumsum(values, axis=1, out=sums[:, 1:])
    index = np.arange(t)
    low, high = np.maximum(index - half, 0), np.minimum(index + half + 1, t)
    return (sums[:, high] - sums[:, low]) / (high - low)


def _boundaries(times: np.ndarray) -> np.ndarray:
    """``(T + 1,)``: the time of the boundary before each frame (the middle between it and
    the frame before; the first and last frame times at the ends)."""
    return np.concatenate([times[:1], (times[1:] + times[:-1]) / 2, times[-1:]])


@dataclass(frozen=True)
class _Runs:
    """Runs of equal values of an ``(N, T)`` array, flattened in row order.

    Attributes:
        row, start, stop: The run's row and frames ``[start, stop)`` in it.
        value: Its value.
        before, after: The value of the run before and after it in its row; -2 at a
            row's first and last run.
        first: Its first element in the flattened array.
        shape: ``(N, T)``.
    """

    row: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    value: np.ndarray
    before: np.ndarray
    after: np.ndarray
    first: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def of(cls, code: np.ndarray) -> _Runs:
        n, t = code.shape
        change = np.ones((n, t), bool)
        np.not_equal(code[:, 1:], code[:, :-1], out=change[:, 1:])
        first = np.flatnonzero(change)
        row, start = np.divmod(first, t)
        stop = np.empty_like(start)
        stop[:-1] = np.where(row[1:] == row[:-1], start[1:], t)
        stop[-1:] = t
        value = code.ravel()[first]
        same = row[1:] == row[:-1]
        before = np.full(len(first), -2, np.int8)
        after = np.full(len(first), -2, np.int8)
        before[1:] = np.where(same, value[:-1], -2)
        after[:-1] = np.where(same, value[1:], -2)
        return cls(row, start, stop, value, before, after, first, (n, t))

    def painted(self, values: np.ndarray) -> np.ndarray:
        """The ``(N, T)`` array with each run set to its entry of ``values``."""
        return np.repeat(values.astype(np.int8), self.stop - self.start).reshape(self.shape)


@dataclass(frozen=True)
class StepEvents:
    """The complete steps of many tips: each a swing between two stances.

    Attributes (``(S,)`` arrays, ordered by tip, then time):
        tip: The tip's row in the arrays it was found in.
        liftoff: Lift-off time (the swing's start), s.
        touchdown: Touchdown time (its end), s.
        stance_start: Start of the stance before the lift-off (the touchdown before),
            s; NaN when that stance began at a gap or at the first frame.
        step_length: Horizontal distance of the tip from its last stance frame before
            the lift-off to its first after the touchdown, in the positions' unit.
    """

    tip: np.ndarray
    liftoff: np.ndarray
    touchdown: np.ndarray
    stance_start: np.ndarray
    step_length: np.ndarray

    @property
    def swing_duration(self) -> np.ndarray:
        return self.touchdown - self.liftoff

    @property
    def stance_duration(self) -> np.ndarray:
        return self.liftoff - self.stance_start

    def __len__(self) -> int:
        return len(self.tip)


def step_events(times: np.ndarray, state: np.ndarray, tips: np.ndarray) -> StepEvents:
    """The complete steps in a state (see :class:`StepEvents`).

    Args:
        times: ``(T,)`` frame times, s.
        state: ``(N, T)`` from :func:`stance_state`.
        tips: ``(N, T, 2 or 3)`` the positions it came from (x, y used).
    """
    if state.shape[1] < 2:
        empty = np.zeros(0)
        return StepEvents(np.zeros(0, np.int64), empty, empty, empty, empty)
    runs = _Runs.of(state)
    swing = (runs.value == SWING) & (runs.before == STANCE) & (runs.after == STANCE)
    where = np.flatnonzero(swing)
    bounds = _boundaries(times)
    start, stop, row = runs.start[where], runs.stop[where], runs.row[where]
    stance = where - 1  # the stance run before each swing
    stance_start = np.where(runs.before[stance] == SWING, bounds[runs.start[stance]], np.nan)
    left, right = tips[row, start - 1, :2], tips[row, stop, :2]
    length = np.hypot(*(right - left).T) if len(where) else np.zeros(0)
    return StepEvents(row.astype(np.int64), bounds[start], bounds[stop], stance_start, length)


@dataclass(frozen=True)
class PhaseEpochs:
    """Every stance and every swing of many tips as time intervals.

    Attributes (``(E,)`` arrays, ordered by tip, then time):
        tip: The tip's row.
        stance: True for a stance, False for a swing.
        start, stop: Its start and end, s: the events at its ends, or, where it begins
            or ends at a gap or at the first or last frame, that frame's time.
        complete: Both ends are events (touchdown and lift-off, or lift-off and
            touchdown).
    """

    tip: np.ndarray
    stance: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    complete: np.ndarray

    def __len__(self) -> int:
        return len(self.tip)


def phase_epochs(times: np.ndarray, state: np.ndarray) -> PhaseEpochs:
    """The stance and swing intervals of a state (see :class:`PhaseEpochs`)."""
    if state.shape[1] == 0:
        empty = np.zeros(0)
        return PhaseEpochs(np.zeros(0, np.int64), np.zeros(0, bool), empty, empty,
                           np.zeros(0, bool))
    runs = _Runs.of(state)
    keep = runs.value != UNKNOWN
    bounds = _boundaries(times)
    opens = runs.before[keep] >= 0
    closes = runs.after[keep] >= 0
    start = np.where(opens, bounds[runs.start[keep]], times[runs.start[keep]])
    stop = np.where(closes, bounds[runs.stop[keep]], times[runs.stop[keep] - 1])
    return PhaseEpochs(runs.row[keep].astype(np.int64), runs.value[keep] == STANCE, start, stop,
                       opens & closes)
