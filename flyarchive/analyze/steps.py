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
frame) has no event on that side, so no step is counted across a gap. A gap in time
(frames not recorded: more than 1.5 frame intervals between two frames) is one unknown
frame (:func:`with_time_gaps`).

**Event times.** The states say which frames stand and which swing; a lift-off or a
touchdown is then placed where the tip leaves or reaches the ground, not where it leaves
the band (which would lengthen every stance by the time a tip takes to rise
``stance_height``: 0.65 ms a side for a tip rising 46 mm/s through a 0.03 mm band, +2 %
of the duty factor). Per event:

- *The stance's height*: the median height of the stance's frames within 20 ms of the
  event (at least its 3 nearest, none past the stance) that are in the band (a frame of a
  tip already on its way up or down does not move it). The *margin*: 2.5 times the noise
  of the tip's stance heights (the root mean square of those frames' distances below
  their median, pooled over the tip's events; noise alone lifts a standing frame over it
  once in 160), at least 1 % of ``stance_height``.
- *The first frame off it*: the first of the swing's frames (of its first ``smooth / 2``
  seconds, the frames by which smoothing moves the band's edge) above the stance's height
  plus the margin, traced back into the stance while frames stay above it (into the
  stance's second half at most). A swing whose first frames stay at the stance's height
  began by speed alone (a tip that drags): its event stays at the band's edge.
- *Where between frames*: frames more than 3 ms apart (below ~330 frames/s, where a tip
  rises a large part of its swing between two frames): the middle of the two frame times
  (unbiased wherever the tip crossed the margin between them), less the time the tip takes
  to rise the margin at its speed off the stance (the tip's mean over its events of the
  height over the margin at the first frame off, over half a frame interval), never past
  the two frames. Closer: where
  the straight line through the tip's heights over the first 3 ms off the stance (their
  mean time and height, the tip's mean slope) meets the stance's height.

Touchdowns are the mirror image. On the synthetic walker (:mod:`flyarchive.testing.walker`,
noise 0.005 mm) events are on average within 0.3 ms of the truth at 60-1000 frames/s,
each within about half a frame but for the few that noise lifts over the margin.

**Without heights** (2-D tracking, x and y only), the band and the swing evidence are the
speeds alone, and the tip's noise matters more: a tracked tip's (often 0.01-0.05 mm) makes
its frame-to-frame speed noisy at high frame rates. So each tip's speed is the slope of the
straight line through as many frames as its noise needs (at least those of ``smooth``): a
standing tip's speed noise at most a fifth of ``swing_speed``, or its frame differences
alone where their noise is at most a quarter of it. The noise is read first roughly (from
the lowest quarter of the tip's displacements between frames), then from the stances found
(the median absolute difference of their consecutive frames), and the state found again
with it.

A tip's speed rises from rest, so an event placed where the tip passes a speed or a
distance lengthens every stance by the time the tip takes to get there (on the walker,
+5 % of the duty factor at 1000 frames/s, +25 % at 60 with the band's edge). Per event,
on the frames around it (the stance's nearest, as for heights, and the swing's first half;
its last half for a touchdown):

- *Progress*: the tip's distance from the stance's spot (the median of those stance
  frames) along the direction to the swing's middle frame. *Swing speed*: the tip's median
  over its swings of its speed over their middle third.
- *The event*: the median, over the swing's frames more than 3 times the tip's noise off
  the spot, of the time at which a tip setting off from rest, its speed rising evenly over
  ``ramp`` seconds to the swing speed, would have come that far.
- ``ramp``: one for all lift-offs, one for all touchdowns: the one (from 0 to half the
  median swing) whose tip fits the frames around up to 1000 events best (least squares
  over the noise; the stance's frames count, their progress expected 0).

An event whose swing takes its tip less than 5 times its noise off the spot stays at the
band's edge. On the walker (noise 0.005 mm) the events are on average within 0.4 ms of the
truth at 60-1000 frames/s; its swing (a ramp, then a constant speed) is this model's own
shape, which flatters it: a tip that drags or slips with its height unknown sets off and
stops where it moves, which may not be where it lifts (NeuroMechFly's dragged hind legs:
2-5 ms apart).

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
#: A tip is off its stance height when higher by this many times the scatter of its
#: stance heights (pooled over its events)...
_NOISE_MARGIN = 2.5
#: ...and by at least this share of ``stance_height``.
_HEIGHT_FLOOR = 0.01
#: Frames at most this far apart (s) place an event by a straight line through the
#: tip's heights over this long off the stance; farther apart, midway between frames.
_RISE = 0.003
#: A stance's height near an event: the median of its frames within this many seconds of
#: the event (at least its :data:`_BASE_FRAMES` nearest).
_BASE_TIME = 0.02
_BASE_FRAMES = 3
#: 2-D: a tip's noise is first read from this share (the lowest) of its displacements
#: between consecutive frames.
_QUIET = 0.25
#: 2-D: speeds are taken over enough frames that a standing tip's speed noise (per
#: coordinate) is at most ``swing_speed`` over this.
_SPEED_NOISE = 5.0
#: 2-D: ...or, its differences alone (a frame's two are independent), over this.
_DIFF_NOISE = 4.0


#: Two frames further apart than this many times the median interval have frames
#: missing between them (a recording that skipped them): a gap.
_GAP = 1.5


def with_time_gaps(times: np.ndarray, *arrays: np.ndarray | None
                   ) -> tuple[np.ndarray, ...]:
    """``times`` and ``arrays`` (each ``(W, T, ...)``; None stays None) with one unknown
    frame (NaN, at the middle time) in each gap in time (see :data:`_GAP`), so that no
    stance or swing runs across frames that were not recorded; as given without a gap."""
    times = np.asarray(times, dtype=float)
    if len(times) < 3:
        return (times, *arrays)
    dt = np.diff(times)
    gaps = np.flatnonzero(dt > _GAP * np.median(dt))
    if not gaps.size:
        return (times, *arrays)
    at = gaps + 1
    filled = np.insert(times, at, (times[gaps] + times[at]) / 2)
    return (filled, *(None if a is None else np.insert(np.asarray(a, dtype=float), at, np.nan,
                                                        axis=1) for a in arrays))


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
    runs = stance_runs(times, tips, params, height=height)
    return runs.painted(runs.value)


def stance_runs(times: np.ndarray, tips: np.ndarray, params: GaitParams, *,
                height: bool = True) -> _Runs:
    """:func:`stance_state` as runs of frames (``state = runs.painted(runs.value)``), which
    :func:`step_events` and :func:`phase_epochs` take in place of the state."""
    n, t = tips.shape[:2]
    if t < 2:
        return _Runs.of(np.full((n, t), UNKNOWN, np.int8))
    if height:
        x, y, z = (_smoothed(tips[..., k], times, params.smooth) for k in range(3))
        return _classified(times, tips, params, *_frame_speeds(x, y, times), z)
    # Without heights: speeds over as many frames as the noise needs: first as a rough
    # estimate of it says, then as the noise of the stances found says.
    frame = _frame_speeds(tips[..., 0], tips[..., 1], times)
    half = _planar_halves(times, _rough_noise(tips), params)
    runs = _classified(times, tips, params, *_widened(frame, tips, half, times), None)
    better = _planar_halves(times, _stance_noise(runs, tips), params)
    if not np.array_equal(better, half):
        runs = _classified(times, tips, params, *_widened(frame, tips, better, times), None)
    return runs


def _classified(times: np.ndarray, tips: np.ndarray, params: GaitParams, slow: np.ndarray,
                fast: np.ndarray, z: np.ndarray | None) -> _Runs:
    """The runs of stance and swing from the squared speeds ``slow`` and ``fast`` and the
    heights ``z`` (None: none) of every tip and frame: band, hysteresis, minimum
    durations."""
    with np.errstate(invalid="ignore"):
        known = np.isfinite(slow)
        known &= np.isfinite(tips[..., 0] + tips[..., 1] + tips[..., 2])
        band = slow < params.stance_speed ** 2
        evidence = fast > params.swing_speed ** 2
        if z is not None:
            band &= z < params.stance_height
            evidence |= z > params.swing_height
    code = band.view(np.int8)
    code[~known] = UNKNOWN
    # Hysteresis: out of the band without clear swing evidence is stance.
    runs = _Runs.of(code)
    evidence &= known
    swung = np.add.reduceat(evidence.ravel(), runs.first) > 0
    runs = runs.merged(np.where((runs.value == SWING) & ~swung, STANCE, runs.value))
    # Short swings join the stances around them, then short stances the swings.
    bounds = _boundaries(times)
    for value, shortest in ((SWING, params.min_swing), (STANCE, params.min_stance)):
        if shortest <= 0:
            continue
        other = STANCE + SWING - value
        inner = (runs.value == value) & (runs.before == other) & (runs.after == other)
        short = inner & (bounds[runs.stop] - bounds[runs.start] < shortest)
        if short.any():
            runs = runs.merged(np.where(short, other, runs.value))
    return runs


def _frame_speeds(x: np.ndarray, y: np.ndarray, times: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(N, T)`` squared horizontal speeds of each frame: the smaller (``slow``) and the
    larger (``fast``) of its backward and forward differences (the first and last frame:
    their one), NaN where a position is not finite."""
    n, t = x.shape
    dt = np.diff(times)
    moved = np.diff(x, axis=1)
    moved *= moved
    dy = np.diff(y, axis=1)
    dy *= dy
    moved += dy  # (N, T-1) squared horizontal displacement between frames
    slow = np.empty((n, t))
    fast = np.empty((n, t))
    with np.errstate(invalid="ignore"):
        slow[:, 0] = fast[:, 0] = moved[:, 0] / (dt[0] * dt[0])
        slow[:, -1] = fast[:, -1] = moved[:, -1] / (dt[-1] * dt[-1])
        moved /= dt * dt  # squared speed
        np.fmin(moved[:, :-1], moved[:, 1:], out=slow[:, 1:-1])
        np.fmax(moved[:, :-1], moved[:, 1:], out=fast[:, 1:-1])
    return slow, fast


def _widened(frame: tuple[np.ndarray, np.ndarray], tips: np.ndarray, half: np.ndarray,
             times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The squared speeds ``frame`` (:func:`_frame_speeds` of tips without heights), with
    those of each tip whose ``half`` is more than 0 both the slope of the straight line
    through the frames within ``half`` of each frame."""
    slow, fast = frame[0].copy(), frame[1].copy()
    wide = np.flatnonzero(half > 0)
    if len(wide):
        dt = float(np.median(np.diff(times)))
        vx, vy = (_slopes(tips[wide, :, k], half[wide], dt) for k in range(2))
        slow[wide] = fast[wide] = vx * vx + vy * vy
    return slow, fast


def _rough_noise(tips: np.ndarray) -> np.ndarray:
    """``(N,)`` each tip's position noise (sd per coordinate), roughly and rather too high:
    from the lowest quarter of its displacements between consecutive frames, taken as a
    standing tip's (whose displacements are noise alone; a tip that also walks overstates
    it)."""
    moved = np.hypot(np.diff(tips[..., 0], axis=1), np.diff(tips[..., 1], axis=1))
    # a standing tip's displacement: Rayleigh, sd sqrt(2) times the noise per coordinate
    return _row_quantile(moved, _QUIET) / np.sqrt(-4.0 * np.log(1.0 - _QUIET))


def _stance_noise(runs: _Runs, tips: np.ndarray) -> np.ndarray:
    """``(N,)`` each tip's position noise (sd per coordinate): from the median absolute
    difference of its coordinates between consecutive frames of a stance (NaN for a tip
    without)."""
    state = runs.painted(runs.value)
    both = (state[:, 1:] == STANCE) & (state[:, :-1] == STANCE)
    moved = np.concatenate([np.where(both, np.abs(np.diff(tips[..., k], axis=1)), np.nan)
                            for k in range(2)], axis=1)
    return _row_quantile(moved, 0.5) / (0.6745 * np.sqrt(2.0))


def _row_quantile(values: np.ndarray, q: float) -> np.ndarray:
    """``(N,)``: the ``q`` quantile of each row's finite values of ``(N, M)`` (linear
    between the two nearest, as NumPy's), NaN for a row without any."""
    ranked = np.sort(values, axis=1)  # NaN last
    count = np.isfinite(values).sum(axis=1)
    at = q * np.maximum(count - 1, 0)
    low = np.floor(at).astype(np.int64)
    high = np.minimum(low + 1, np.maximum(count - 1, 0))
    rows = np.arange(len(values))
    if not values.shape[1]:
        return np.full(len(values), np.nan)
    below, above = ranked[rows, low], ranked[rows, high]
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, below + (at - low) * (above - below), np.nan)


def _planar_halves(times: np.ndarray, noise: np.ndarray, params: GaitParams) -> np.ndarray:
    """``(N,)`` the frames on each side of a frame that 2-D speeds are taken over, per tip of
    position ``noise``: those of ``params.smooth``, or more where the noise needs them (0:
    the frame's differences alone): a standing tip's speed noise (per coordinate) at most
    ``swing_speed`` / :data:`_SPEED_NOISE`, so that noise alone almost never passes for a
    swing."""
    dt = float(np.median(np.diff(times)))
    allowed = params.swing_speed / _SPEED_NOISE * dt  # speed noise times dt
    with np.errstate(invalid="ignore"):
        # differences: speed noise noise * sqrt(2) / dt (each frame's two: independent)
        need = np.isfinite(noise) & (noise * np.sqrt(2.0) > allowed * _SPEED_NOISE / _DIFF_NOISE)
        # a straight line through m = 2h + 1 frames: noise * sqrt(12 / (m (m^2 - 1))) / dt
        ratio = np.where(need, 12.0 * (noise / max(allowed, 1e-300)) ** 2, 0.0)
    m = np.where(need, np.ceil(np.cbrt(ratio)), 0).astype(np.int64)
    m = np.maximum(m + (m % 2 == 0), np.where(need, 3, 0))  # odd, at least 3
    m = np.where(need & (m * (m * m - 1) < ratio), m + 2, m)
    half = np.minimum((np.maximum(m, 1) - 1) // 2, max(len(times) // 2, 0))
    return np.maximum(half, _half_window(times, params.smooth)).astype(np.int64)


def _slopes(values: np.ndarray, half: np.ndarray, dt: float) -> np.ndarray:
    """``(N, T)``: the slope (per second) of the straight line through the frames of each
    row of ``values`` within ``half[row]`` of each frame (fewer at the ends; NaN where one
    of them is NaN); frames ``dt`` apart."""
    n, t = values.shape
    out = np.empty((n, t))
    index = np.arange(t, dtype=np.float64)
    for h in np.unique(half):  # a few widths: each a slice of rows
        rows = np.flatnonzero(half == h)
        part = values[rows]
        sx, low, high = _window_sums(part, int(h))
        six, _, _ = _window_sums(part * index, int(h))
        count = high - low
        mean = (low + high - 1) / 2.0
        spread = count * (count * count - 1) / 12.0  # sum of (i - mean)^2
        with np.errstate(invalid="ignore", divide="ignore"):
            out[rows] = (six - mean * sx) / spread / dt
    return out


def _window_sums(values: np.ndarray, half: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(N, T)`` the sums of ``values`` over the frames within ``half`` of each (fewer at
    the ends; NaN where one of them is NaN), and ``(T,)`` each window's first frame and
    the frame past its last."""
    n, t = values.shape
    index = np.arange(t)
    low, high = np.maximum(index - half, 0), np.minimum(index + half + 1, t)
    gap = ~np.isfinite(values)
    sums = np.zeros((n, t + 1))
    np.cumsum(np.where(gap, 0.0, values) if gap.any() else values, axis=1, out=sums[:, 1:])
    out = _differenced(sums, low, high, half)
    if gap.any():
        gaps = np.zeros((n, t + 1), np.int32)
        np.cumsum(gap, axis=1, out=gaps[:, 1:])
        out[_differenced(gaps, low, high, half) > 0] = np.nan
    return out, low, high


def _differenced(sums: np.ndarray, low: np.ndarray, high: np.ndarray, half: int
                 ) -> np.ndarray:
    """``sums[:, high] - sums[:, low]`` for windows of ``2 * half + 1`` frames (``low`` and
    ``high`` of :func:`_window_sums`), by slices where the window is whole."""
    t = len(low)
    out = np.empty((len(sums), t), dtype=sums.dtype)
    inner = slice(half, max(t - half, half))
    np.subtract(sums[:, 2 * half + 1:t + 1], sums[:, :max(t - 2 * half, 0)], out=out[:, inner])
    ends = np.r_[np.arange(min(half, t)), np.arange(max(t - half, half), t)]
    out[:, ends] = sums[:, high[ends]] - sums[:, low[ends]]
    return out


def _smoothed(values: np.ndarray, times: np.ndarray, width: float) -> np.ndarray:
    """A centred moving average of ``(N, T)`` along time over the frames within
    ``width / 2`` of each (fewer at the ends; NaN where the window holds a NaN), or
    ``values`` itself when that is one frame."""
    half = _half_window(times, width)
    if half < 1:
        return values
    sums, low, high = _window_sums(values, half)
    return sums / (high - low)


def _half_window(times: np.ndarray, width: float) -> int:
    """Frames on each side of a centred moving average over ``width`` seconds."""
    return int(width / (2 * float(np.median(np.diff(times)))) + 1e-9)


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

    def merged(self, values: np.ndarray) -> _Runs:
        """The runs of ``self.painted(values)``: runs given equal values next to each other
        in a row join (found from the runs, without painting)."""
        values = values.astype(np.int8)
        keep = np.ones(len(values), bool)
        keep[1:] = (values[1:] != values[:-1]) | (self.row[1:] != self.row[:-1])
        row, start, first, value = self.row[keep], self.start[keep], self.first[keep], values[keep]
        n, t = self.shape
        same = row[1:] == row[:-1]
        stop = np.empty_like(start)
        stop[:-1] = np.where(same, start[1:], t)
        stop[-1:] = t
        before = np.full(len(first), -2, np.int8)
        after = np.full(len(first), -2, np.int8)
        before[1:] = np.where(same, value[:-1], -2)
        after[:-1] = np.where(same, value[1:], -2)
        return _Runs(row, start, stop, value, before, after, first, self.shape)


def event_edges(times: np.ndarray, runs: _Runs, tips: np.ndarray, params: GaitParams, *,
                height: bool = True) -> np.ndarray:
    """``(R,)``: the time each run of :func:`stance_runs` begins, lift-offs and touchdowns
    placed as :func:`step_events` places them (see the module's docstring)."""
    return _event_times(runs, times, tips, params, height)


def state_at_events(times: np.ndarray, runs: _Runs, edges: np.ndarray) -> np.ndarray:
    """``(N, T)`` int8: each frame's state by the events (:func:`event_edges`) rather than by
    the band it is in: a frame is in the run whose time span holds its time, so a frame
    after a lift-off placed before it swings, one before a touchdown placed after it still
    swings. Frames without positions stay :data:`UNKNOWN`. What shares of time in stance
    are counted from, as the durations are (the band alone lengthens stances)."""
    n, t = runs.shape
    if not len(edges):
        return np.zeros((n, t), np.int8)
    span = float(times[-1] - times[0]) + 1.0
    begins = runs.row * span + (edges - times[0])
    order = np.argsort(begins, kind="stable")  # (an event is never placed past the next one)
    frames = (np.arange(n)[:, None] * span + (times - times[0])[None, :]).ravel()
    # (a row's first run begins at its first frame: no frame falls before its row's runs)
    at = order[np.clip(np.searchsorted(begins[order], frames, side="right") - 1, 0, None)]
    return runs.value[at].astype(np.int8).reshape(n, t)


def _event_times(runs: _Runs, times: np.ndarray, tips: np.ndarray, params: GaitParams,
                 height: bool) -> np.ndarray:
    """``(R,)``: the time of the boundary before each run's first frame: for a lift-off or a
    touchdown, where the tip leaves or reaches its stance height (see the module's
    docstring); for any other boundary (and without heights), the middle of the two frame
    times."""
    bounds = _boundaries(times)
    edge = bounds[runs.start]
    n, t = runs.shape
    if t < 3:
        return edge
    if not height:
        return _planar_times(runs, times, tips, params, edge)
    z = tips[..., 2]
    dt = float(np.median(np.diff(times)))
    late = _half_window(times, params.smooth)
    value, before = runs.value, runs.before
    lift = np.flatnonzero((value == SWING) & (before == STANCE))  # swing runs after a stance
    land = np.flatnonzero((value == STANCE) & (before == SWING))  # stance runs after a swing
    for events, way, stance, swing in ((lift, +1, lift - 1, lift), (land, -1, land, land - 1)):
        if not len(events):
            continue
        edge[events] = _Event.of(runs, events, way, stance, swing, z).time(
            params, times, bounds, dt, late, bound=edge[events])
    return edge


@dataclass(frozen=True)
class _Event:
    """Lift-offs (``way`` +1) or touchdowns (-1) of many tips, and the heights of their
    tips around them: a stance side (the stance's frames from the event on, away from the
    swing) and a swing side.

    Attributes:
        row: ``(E,)`` the tip's row.
        first: ``(E,)`` the column of the boundary's frame after it (the swing's first for
            a lift-off, the stance's first for a touchdown).
        way: +1 or -1: the direction of time from the stance into the swing.
        stance_frames, swing_frames: ``(E,)`` frames of the stance and of the swing.
        z: ``(n, t)`` heights.
        flat: ``z`` as one C-contiguous row, indexed by ``offset + column``.
        offset: ``(E,)`` the index in ``flat`` of each event's row.
    """

    row: np.ndarray
    first: np.ndarray
    way: int
    stance_frames: np.ndarray
    swing_frames: np.ndarray
    z: np.ndarray
    flat: np.ndarray
    offset: np.ndarray

    @classmethod
    def of(cls, runs: _Runs, events: np.ndarray, way: int, stance: np.ndarray,
           swing: np.ndarray, z: np.ndarray) -> _Event:
        length = runs.stop - runs.start
        row = runs.row[events]
        return cls(row, runs.start[events], way, length[stance], length[swing], z,
                   np.ascontiguousarray(z, dtype=np.float64).reshape(-1), row * z.shape[1])

    def height(self, column: np.ndarray) -> np.ndarray:
        """``(E,)`` each event's tip's height at ``column``."""
        return self.flat[self.offset + column]

    def at(self, step: np.ndarray | int) -> np.ndarray:
        """Columns ``step`` frames from each boundary in the direction stance -> swing (0:
        the swing's frame next to it, -1: the stance's), clipped to the row: ``step`` a
        number or ``(E,)``."""
        next_to = self.first - (1 if self.way < 0 else 0)
        return np.clip(next_to + self.way * step, 0, self.z.shape[1] - 1)

    def heights(self, side: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The heights ``(count, E)`` of the first ``count`` frames of the stance (``side``
        -1, from the boundary back) or the swing (+1), and whether each belongs to it."""
        frames = self.stance_frames if side < 0 else self.swing_frames
        z = np.empty((count, len(self.row)))
        for j in range(count):
            z[j] = self.height(self.at(-1 - j if side < 0 else j))
        return z, np.arange(count)[:, None] < frames[None, :]

    def time(self, params: GaitParams, times: np.ndarray, bounds: np.ndarray, dt: float,
             late: int, bound: np.ndarray) -> np.ndarray:
        """When each tip leaves (reaches) its stance height; ``bound``, the band's edge, where
        the tip does not leave it within ``late`` frames of the swing (a tip that drags, or
        a stance without a frame low enough to give its height)."""
        n = self.z.shape[0]
        reach = max(_BASE_FRAMES, int(_BASE_TIME / dt + 1e-9))
        zs, inside = self.heights(-1, reach)
        with np.errstate(invalid="ignore"):
            use = inside & (zs < params.stance_height)
        floor = _HEIGHT_FLOOR * params.stance_height
        base, margin = _stance_height(zs, use, self.row, n, floor)
        level = base + margin[self.row]  # (E,) the height a tip is off the stance above
        # The first frame of the swing's first `late + 1` above it...
        zw, in_swing = self.heights(+1, late + 1)
        with np.errstate(invalid="ignore"):
            up = in_swing & (zw > level)
        found = up.any(axis=0) & np.isfinite(level)
        into_swing = np.argmax(up, axis=0)
        # ...traced back into the stance while the tip is above it (its second half at most).
        extend = np.minimum((self.stance_frames - 1) // 2, reach)
        with np.errstate(invalid="ignore"):
            risen = (zs > level) & (np.arange(reach)[:, None] < extend)
        back = np.where(into_swing == 0,
                        np.argmin(np.r_[risen, np.zeros((1, risen.shape[1]), bool)], axis=0), 0)
        # `off`: the first frame off the stance height; `on`: the one before, at it (as
        # columns in the direction stance -> swing: positive into the swing).
        off_step = np.where(back > 0, -back, into_swing)
        off, on = self.at(off_step), self.at(off_step - 1)
        got = _crossed(self, off, on, base, margin, params, times, bounds, dt)
        return np.where(found, got, bound)


def _stance_height(zs: np.ndarray, use: np.ndarray, row: np.ndarray, n: int,
                   floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Each event's stance height ``(E,)`` (NaN: no frame to give it) and each row's margin
    over it ``(n,)``, from the stance heights ``zs`` ``(k, E)`` where ``use``.

    The height is their median; the noise, the root mean square of their distances below
    it, pooled over the row (frames on their way up or down at a stance's end are above
    it: they would count as noise); the margin, :data:`_NOISE_MARGIN` times the noise, at
    least ``floor``.
    """
    e = zs.shape[1]
    count = use.sum(axis=0)
    ranked = np.sort(np.where(use, zs, np.inf), axis=0)
    columns = np.arange(e)
    low, high = ranked[np.maximum(count - 1, 0) // 2, columns], ranked[count // 2, columns]
    with np.errstate(invalid="ignore", divide="ignore"):
        base = np.where(count > 0, (low + high) / 2, np.nan)
        below = use & (zs < base)
        deep = np.where(below, zs - base, 0.0)
        noise = np.sqrt(np.bincount(row, (deep * deep).sum(axis=0), minlength=n)
                        / np.bincount(row, below.sum(axis=0), minlength=n))
    margin = np.maximum(np.nan_to_num(_NOISE_MARGIN * noise, nan=0.0), floor)
    return base, margin


def _crossed(event: _Event, off: np.ndarray, on: np.ndarray, base: np.ndarray,
             margin: np.ndarray, params: GaitParams, times: np.ndarray, bounds: np.ndarray,
             dt: float) -> np.ndarray:
    """The times at which tips leave or reach their stance height ``base``, between the
    frames (columns) ``on`` (at it) and ``off`` (the first or last frame off it).

    Frames more than :data:`_RISE` apart: the middle of the two frame times (where the
    tip crossed ``base + margin``, anywhere between them), less (lift-off) or plus
    (touchdown) the time the tip takes to rise the row's ``margin`` at its speed off the
    stance: the row's mean of ``(height at off - margin) / (half the frame interval)``.
    Closer: where the straight line through the frames within :data:`_RISE` from ``off``
    (their mean time and height; the row's mean slope) meets the stance height, no earlier
    than the frame before ``on``.
    """
    row, way, z = event.row, event.way, event.z
    n, t = z.shape
    middle = bounds[np.maximum(on, off)]
    count = np.bincount(row, minlength=n)
    k = int(_RISE / dt + 1e-9)
    with np.errstate(invalid="ignore", divide="ignore"):
        if k < 1:
            interval = np.abs(times[off] - times[on])
            rise = np.maximum(event.height(off) - base - margin[row], 0.0) / (interval / 2)
            speed = np.bincount(row, np.nan_to_num(rise), minlength=n) / count
            lag = margin[row] / speed[row]
            at = middle - way * np.where(np.isfinite(lag), lag, 0.0)
            # a tip that barely rises (a dragging leg) rises slowly: its lag, unbounded,
            # would put the event past the frames around it (a stance ending before it
            # began); the event lies between them
            lo, hi = np.minimum(times[on], times[off]), np.maximum(times[on], times[off])
            return np.clip(at, lo, hi)
        # the frames off .. off + k away from the stance, cut at the swing's far end
        last = event.first - (way < 0) + way * (event.swing_frames - 1)  # its far frame
        reach = np.where(way > 0, np.minimum(off + k, last), np.maximum(off - k, last))
        frames = np.abs(reach - off)
        t_sum, z_sum = np.zeros(len(off)), np.zeros(len(off))
        for j in range(k + 1):
            at = off + way * np.minimum(j, frames)
            t_sum += times[at]
            z_sum += event.height(at)
        slope = (event.height(reach) - event.height(off)) / np.abs(times[reach] - times[off])
        ok = np.isfinite(slope) & (frames > 0)
        speed = np.bincount(row[ok], slope[ok], minlength=n) / np.bincount(row[ok], minlength=n)
        at = t_sum / (k + 1) - way * (z_sum / (k + 1) - base) / speed[row]
    earliest = times[np.clip(on - way, 0, t - 1)]
    lo, hi = np.minimum(earliest, times[off]), np.maximum(earliest, times[off])
    return np.where(np.isfinite(at) & (speed[row] > 0), np.clip(at, lo, hi), middle)


def _planar_times(runs: _Runs, times: np.ndarray, tips: np.ndarray, params: GaitParams,
                  edge: np.ndarray) -> np.ndarray:
    """``edge`` with the lift-offs and touchdowns of tips without heights (2-D tracking)
    placed where each tip sets off from or comes to rest on its stance spot (see the
    module's docstring); an event whose tip's noise or swing speed is unknown, or whose
    swing does not take the tip clearly off the spot, stays at the band's edge."""
    value, before = runs.value, runs.before
    kinds = [(events, way) for events, way in
             ((np.flatnonzero((value == SWING) & (before == STANCE)), +1),
              (np.flatnonzero((value == STANCE) & (before == SWING)), -1)) if len(events)]
    if not kinds:
        return edge
    dt = float(np.median(np.diff(times)))
    noise = _stance_noise(runs, tips)
    # the frames by which the speeds' smoothing may move the band's edge, beyond 20 ms
    reach = max(_BASE_FRAMES, int(_BASE_TIME / dt + 1e-9)
                + int(_planar_halves(times, noise, params).max(initial=0)))
    xy = tips[..., :2]
    speed = _swing_speed(runs, times, xy)
    swing = runs.stop[value == SWING] - runs.start[value == SWING]
    longest = _RAMP_SHARE * dt * float(np.median(swing))
    for events, way in kinds:
        departure = _Departure.of(runs, events, way, times, xy, reach)
        v = speed[departure.row]
        sigma = np.maximum(noise[departure.row], 1e-6 * v * dt)
        ramp = departure.ramp(v, sigma, longest)
        when = departure.started(v, sigma, ramp)
        ok = np.isfinite(when)
        edge[events[ok]] = when[ok]
    return edge


#: 2-D: the longest ramp tried, as a share of the median swing (the frames out of the band).
_RAMP_SHARE = 0.5
#: 2-D: ramp times tried: this many from 0 to the longest, then :data:`_FINER` between the
#: best's neighbours.
_RAMPS = 11
_FINER = 5
#: 2-D: a swing must take its tip this many times its noise off the stance spot (by its
#: middle frame) for its events to be placed by it...
_CLEAR = 5.0
#: ...and a frame this many times off it to count as set off.
_OFF = 3.0
#: 2-D: events (of each kind) the ramp is fitted on, at most (evenly spread over them).
_FIT_EVENTS = 1000


def _row_median(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``(n,)``: the median of the finite ``values`` of each row (NaN for a row without)."""
    keep = np.isfinite(values)
    values, rows = values[keep], rows[keep]
    order = np.lexsort((values, rows))
    values, rows = values[order], rows[order]
    count = np.bincount(rows, minlength=n)
    first = np.cumsum(count) - count
    has = count > 0
    low = first + np.maximum(count - 1, 0) // 2
    high = first + count // 2
    out = np.full(n, np.nan)
    out[has] = (values[low[has]] + values[high[has]]) / 2
    return out


def _swing_speed(runs: _Runs, times: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """``(n,)``: each tip's swing speed: the median over its swings (of two frames or more)
    of its speed along the swing over the swing's middle third (its two frames, for a swing
    of two)."""
    n = runs.shape[0]
    swing = np.flatnonzero(runs.value == SWING)
    start, stop, row = runs.start[swing], runs.stop[swing], runs.row[swing]
    length = stop - start
    keep = length >= 2
    start, stop, row, length = start[keep], stop[keep], row[keep], length[keep]
    a = np.where(length >= 3, start + length // 3, start)
    b = np.where(length >= 3, start + (2 * length) // 3, start + 1)
    along = xy[row, stop - 1] - xy[row, start]
    with np.errstate(invalid="ignore", divide="ignore"):
        along /= np.hypot(along[:, 0], along[:, 1])[:, None]
        moved = ((xy[row, b] - xy[row, a]) * along).sum(axis=1) / (times[b] - times[a])
    return _row_median(moved, row, n)


def _ramped(tau: np.ndarray, ramp: float) -> np.ndarray:
    """How far a tip has come, over its swing speed, ``tau`` seconds after it set off
    (negative before): its speed rising evenly from 0 over ``ramp`` seconds, then constant
    (``tau - ramp / 2`` once past it)."""
    tau = np.maximum(tau, 0.0)
    if ramp <= 0:
        return tau
    early = np.minimum(tau, ramp)
    return tau - early + early * early * (0.5 / ramp)


def _unramped(come: np.ndarray, ramp: float) -> np.ndarray:
    """The inverse of :func:`_ramped`: how long after it set off a tip has come ``come``
    (its distance over its swing speed, s, at least 0)."""
    if ramp <= 0:
        return come
    return np.where(come < ramp / 2, np.sqrt(2.0 * ramp * np.maximum(come, 0.0)),
                    come + ramp / 2)


@dataclass(frozen=True)
class _Departure:
    """Lift-offs (``way`` +1) or touchdowns (-1) of tips tracked in 2-D, and their tips'
    progress away from the stance spot on frames around them: the stance's frames nearest
    the event (at most ``reach``) and the swing's first half (its last half, for a
    touchdown; at most ``reach`` frames).

    Attributes:
        row: ``(E,)`` the tip's row.
        way: +1 or -1: the direction of time from the stance into the swing.
        time: ``(E, K)`` frame times, s, less ``centre``.
        progress: ``(E, K)`` the tip's distance from the stance spot (the median position
            of the stance's frames) along the direction to the last frame (the swing's
            middle); 0 where not ``valid``.
        valid: ``(E, K)`` frames that belong to the event.
        stance: ``(E, K)`` frames of the stance.
        clear: ``(E,)`` how far the swing's middle frame is from the spot.
        low, high: ``(E,)`` the earliest and latest time the event may be placed at (the
            stance's middle, the swing's middle), less ``centre``.
        centre: ``(E,)`` the boundary's time (the band's edge).
    """

    row: np.ndarray
    way: int
    time: np.ndarray
    progress: np.ndarray
    valid: np.ndarray
    stance: np.ndarray
    clear: np.ndarray
    low: np.ndarray
    high: np.ndarray
    centre: np.ndarray

    @classmethod
    def of(cls, runs: _Runs, events: np.ndarray, way: int, times: np.ndarray, xy: np.ndarray,
           reach: int) -> _Departure:
        t = runs.shape[1]
        length = runs.stop - runs.start
        stance, swing = (events - 1, events) if way > 0 else (events, events - 1)
        row = runs.row[events]
        near = runs.start[events] - (way < 0)  # the swing's frame next to the boundary
        ahead = np.minimum((length[swing] + 1) // 2, reach)  # swing frames in the window
        back = np.minimum(length[stance], reach)  # stance frames in the window
        step = np.arange(-reach, reach)  # from the stance into the swing
        column = np.clip(near[:, None] + way * step[None, :], 0, t - 1)
        valid = (step[None, :] >= -back[:, None]) & (step[None, :] < ahead[:, None])
        positions = np.where(valid[..., None], xy[row[:, None], column], np.nan)
        in_stance = valid & (step[None, :] < 0)
        spot = _nan_median(positions[:, :reach])  # (the stance's frames: NaN elsewhere)
        middle = positions[np.arange(len(events)), reach + ahead - 1]  # the swing's middle
        toward = middle - spot
        clear = np.hypot(toward[:, 0], toward[:, 1])
        with np.errstate(invalid="ignore", divide="ignore"):
            toward /= clear[:, None]
            progress = np.nan_to_num(((positions - spot[:, None]) * toward[:, None]).sum(-1))
        valid &= np.isfinite(positions).all(axis=-1)
        centre = (times[near] + times[near - way]) / 2
        # no earlier (lift-off) than the stance's middle frame; no later than the swing's
        halfway = np.where(way > 0, runs.stop[stance] - 1 - (length[stance] - 1) // 2,
                           runs.start[stance] + (length[stance] - 1) // 2)
        bound = np.sort(np.stack([times[halfway], times[near + way * (ahead - 1)]]), axis=0)
        return cls(row, way, times[column] - centre[:, None], np.where(valid, progress, 0.0),
                   valid, in_stance, clear, bound[0] - centre, bound[1] - centre, centre)

    def _set_off(self, speed: np.ndarray, sigma: np.ndarray, ramp: float,
                 part: slice | np.ndarray = slice(None)) -> np.ndarray:
        """``(P,)`` when each event's tip set off (s, less ``centre``; NaN where unknown):
        the median over its swing frames clearly off the spot (:data:`_OFF` times the
        noise) of the frame's time less the time a tip ramping up over ``ramp`` takes to
        come that far."""
        v = speed[part][:, None]
        swing = slice(self.time.shape[1] // 2, None)  # the swing's frames, and invalid ones
        progress = self.progress[part, swing]
        with np.errstate(invalid="ignore", divide="ignore"):
            off = self.valid[part, swing] & (progress > _OFF * sigma[part][:, None])
            took = _unramped(progress / v, ramp)
            at = np.where(off, self.time[part, swing] - self.way * took, np.nan)
        return _nan_median(at[..., None])[:, 0]

    def _placeable(self, speed: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """``(E,)`` events whose tip's speed and noise are known and whose swing takes it
        clearly off the spot."""
        with np.errstate(invalid="ignore"):
            return np.isfinite(speed) & (speed > 0) & np.isfinite(sigma) \
                & (self.clear > _CLEAR * sigma)

    def misfit(self, speed: np.ndarray, sigma: np.ndarray, ramp: float,
               part: np.ndarray) -> float:
        """The sum over the events ``part`` and their frames of the squared distance, over
        the noise, between each frame's progress and that of a tip setting off when
        :meth:`_set_off` says and ramping up over ``ramp`` (s): smaller for a ramp that
        fits them better."""
        at = self._set_off(speed, sigma, ramp, part)
        part, at = part[np.isfinite(at)], at[np.isfinite(at)]
        come = _ramped(self.way * (self.time[part] - at[:, None]), ramp) * speed[part][:, None]
        miss = np.where(self.valid[part], (self.progress[part] - come) / sigma[part][:, None],
                        0.0)
        return float(np.einsum("ek,ek->", miss, miss))

    def ramp(self, speed: np.ndarray, sigma: np.ndarray, longest: float) -> float:
        """The ramp (s, 0 to ``longest``) whose :meth:`misfit` is least on up to
        :data:`_FIT_EVENTS` events (evenly spread): the best of :data:`_RAMPS` evenly
        spaced, then of :data:`_FINER` between its neighbours, refined by a parabola through the
        best and its two neighbours."""
        fit = np.flatnonzero(self._placeable(speed, sigma))
        fit = fit[::max(1, -(-len(fit) // _FIT_EVENTS))]
        if not len(fit) or longest <= 0:
            return 0.0
        tried = np.linspace(0.0, longest, _RAMPS)
        for rounds in range(2):
            scores = np.array([self.misfit(speed, sigma, float(r), fit) for r in tried])
            best = int(np.argmin(scores))
            if rounds == 0:
                tried = np.linspace(tried[max(best - 1, 0)], tried[min(best + 1, _RAMPS - 1)],
                                    _FINER)
        if 0 < best < _FINER - 1:
            a, b, c = scores[best - 1:best + 2]
            bend = a - 2 * b + c
            if bend > 0:
                return float(tried[best] + 0.5 * (a - c) / bend * (tried[1] - tried[0]))
        return float(tried[best])

    def started(self, speed: np.ndarray, sigma: np.ndarray, ramp: float) -> np.ndarray:
        """``(E,)`` each event's time, s (NaN where it is not placed): :meth:`_set_off`
        with ``ramp``, between the stance's and the swing's middle frames."""
        at = self._set_off(speed, sigma, ramp)
        ok = self._placeable(speed, sigma) & np.isfinite(at)
        return np.where(ok, np.clip(at, self.low, self.high) + self.centre, np.nan)


def _nan_median(values: np.ndarray) -> np.ndarray:
    """``(E, C)``: the median over axis 1 of ``(E, K, C)`` ignoring NaN (NaN where all are)."""
    count = np.isfinite(values).sum(axis=1)
    ranked = np.sort(np.where(np.isfinite(values), values, np.inf), axis=1)
    e, c = np.indices(count.shape)
    low = ranked[e, np.maximum(count - 1, 0) // 2, c]
    high = ranked[e, np.minimum(count // 2, values.shape[1] - 1), c]
    return np.where(count > 0, (low + high) / 2, np.nan)


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
            the lift-off to its first after the touchdown (without heights: its last
            frame before the lift-off's time, its first after the touchdown's), in the
            positions' unit.
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


def step_events(times: np.ndarray, state: np.ndarray | _Runs, tips: np.ndarray,
                params: GaitParams, *, height: bool = True,
                edges: np.ndarray | None = None) -> StepEvents:
    """The complete steps in a state (see :class:`StepEvents`).

    Args:
        times: ``(T,)`` frame times, s.
        state: ``(N, T)`` from :func:`stance_state`, or its runs (:func:`stance_runs`).
        tips: ``(N, T, 3)`` the positions it came from.
        params, height: As given to :func:`stance_state`.
        edges: The runs' :func:`event_edges`, when computed already.
    """
    runs = state if isinstance(state, _Runs) else _Runs.of(state)
    if runs.shape[1] < 2:
        empty = np.zeros(0)
        return StepEvents(np.zeros(0, np.int64), empty, empty, empty, empty)
    edge = _event_times(runs, times, tips, params, height) if edges is None else edges
    swing = (runs.value == SWING) & (runs.before == STANCE) & (runs.after == STANCE)
    where = np.flatnonzero(swing)
    start, stop, row = runs.start[where], runs.stop[where], runs.row[where]
    stance = where - 1  # the stance run before each swing
    stance_start = np.where(runs.before[stance] == SWING, edge[stance], np.nan)
    before, after = start - 1, stop
    if not height:  # the band's edges may lie inside the swing: the frames off the events
        before = np.clip(np.searchsorted(times, edge[where], "right") - 1,
                         runs.start[stance], before)
        after = np.clip(np.searchsorted(times, edge[where + 1], "left"), after,
                        runs.stop[where + 1] - 1)
    left, right = tips[row, before, :2], tips[row, after, :2]
    length = np.hypot(*(right - left).T) if len(where) else np.zeros(0)
    return StepEvents(row.astype(np.int64), edge[where], edge[where + 1], stance_start, length)


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


def phase_epochs(times: np.ndarray, state: np.ndarray | _Runs, tips: np.ndarray,
                 params: GaitParams, *, height: bool = True) -> PhaseEpochs:
    """The stance and swing intervals of a state (see :class:`PhaseEpochs`); arguments as
    for :func:`step_events`."""
    if (state.shape[1] if not isinstance(state, _Runs) else state.shape[1]) == 0:
        empty = np.zeros(0)
        return PhaseEpochs(np.zeros(0, np.int64), np.zeros(0, bool), empty, empty,
                           np.zeros(0, bool))
    runs = state if isinstance(state, _Runs) else _Runs.of(state)
    edge = _event_times(runs, times, tips, params, height)
    after = np.r_[edge[1:], np.nan]  # the boundary after each run (the next run's, in a row)
    keep = np.flatnonzero(runs.value != UNKNOWN)
    opens = runs.before[keep] >= 0
    closes = runs.after[keep] >= 0
    start = np.where(opens, edge[keep], times[runs.start[keep]])
    stop = np.where(closes, after[keep], times[runs.stop[keep] - 1])
    return PhaseEpochs(runs.row[keep].astype(np.int64), runs.value[keep] == STANCE, start, stop,
                       opens & closes)
