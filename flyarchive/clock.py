"""When a video frame is due, without drift, and at what time it is stored.

Frame ``k`` is scheduled at ``k * interval`` simulated seconds, with
``interval = playback_speed / output_fps``, and recorded at the first step whose
time is at or after it. Working from the schedule (not from the last frame's
time, as flygym 2.1.1's clock does) keeps the frame count exact when the
interval is not a whole number of steps.

An archive stores, for each frame, its index ``k`` on this schedule (coordinate
``frame``), its scheduled time (coordinate ``time``: :meth:`Timing.frame_times`,
the float nearest to ``k * playback_speed / output_fps`` computed exactly, so
that ``ds.sel(time=0.2)`` finds the frame scheduled at 0.2 s) and the simulation
time at which it was recorded (coordinate ``sim_time``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from flyarchive.errors import TimingError

_EXACT_INT = 2**53  # integers up to this are exact in float64




@dataclass(frozen=True)
class Timing:
    """How a recording samples simulated time.

    Attributes:
        timestep: Simulation timestep, seconds.
        output_fps: Video frame rate, frames per second of video.
        playback_speed: Video seconds per simulated second (0.2: five times slower).
    """

    timestep: float
    output_fps: float
    playback_speed: float

    def __post_init__(self) -> None:
        for name in ("timestep", "output_fps", "playback_speed"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise TimingError(f"{name} must be a positive finite number, got {value!r}.")
        if self.interval < self.timestep * (1 - 1e-9):
            raise TimingError(
                f"A frame is due every {self.interval:.3g} s of simulated time "
                f"(playback_speed={self.playback_speed!r} / output_fps={self.output_fps!r}), "
                f"less than one timestep ({self.timestep!r} s). "
                "Lower output_fps or raise playback_speed."
            )

    @property
    def interval(self) -> float:
        """Simulated seconds between frames."""
        return self.playback_speed / self.output_fps

    def frame_times(self, frames: np.ndarray | int) -> np.ndarray:
        """Scheduled simulation time of frames ``k``: ``k * playback_speed / output_fps``, s.

        The two settings are read as the decimals they print as (``0.2`` is 1/5), and
        ``k * playback_speed / output_fps`` is rounded once, to the nearest float64: frame
        25 at 25 fps and playback 0.2 is exactly ``0.2``, frame 3 is ``0.024`` (not
        ``0.024000000000000004``).

        Args:
            frames: Frame indices on the schedule, any shape, integers >= 0.

        Returns:
            float64 array of the same shape, seconds.
        """
        k = np.asarray(frames, dtype=np.int64)
        exact = Fraction(repr(float(self.playback_speed))) / Fraction(repr(float(self.output_fps)))
        if k.size and int(k.max()) * exact.numerator >= _EXACT_INT:
            return k * (float(self.playback_speed) / float(self.output_fps))
        return (k * exact.numerator).astype(np.float64) / float(exact.denominator)

    def frame_step(self, k: int) -> int:
        """The step index at which frame ``k`` is recorded (first step at or after k x interval)."""
        return math.ceil(k * self.interval / self.timestep - 1e-6)

    def frames_before_step(self, step: int) -> int:
        """How many frames are due at steps ``0 .. step - 1``."""
        if step <= 0:
            return 0
        k = math.floor((step - 1) * self.timestep / self.interval + 1e-6) + 1
        while k > 0 and self.frame_step(k - 1) >= step:
            k -= 1
        while self.frame_step(k) < step:
            k += 1
        return k


class FrameClock:
    """Decides, step by step, whether the next frame is due, and which one it is.

    Args:
        timing: The frame schedule.
        next_frame: Index on the schedule of the next frame to record (non-zero when
            resuming).
    """

    def __init__(self, timing: Timing, next_frame: int = 0) -> None:
        self.timing = timing
        self.next_frame = next_frame
        self._due_step = timing.frame_step(next_frame)

    def step_of(self, time: float) -> int:
        """The step index of a simulation time (nearest whole step)."""
        return round(time / self.timing.timestep)

    def due_frame(self, step: int) -> int | None:
        """The schedule index of the frame to record at ``step``, or None; changes nothing.

        It is :attr:`next_frame` when that frame is due at ``step``. When the caller
        missed steps (several frames were due since the last call), it is the latest of
        them: the one whose scheduled time is nearest before ``step``.
        """
        if step < self._due_step:
            return None
        if self.timing.frame_step(self.next_frame + 1) > step:
            return self.next_frame
        return self.timing.frames_before_step(step + 1) - 1

    def advance(self, frame: int) -> None:
        """Mark frame ``frame`` recorded: the next one due is ``frame + 1``."""
        self.next_frame = frame + 1
        self._due_step = self.timing.frame_step(self.next_frame)

    def is_due(self, step: int) -> bool:
        """True if a frame is due at ``step``; advances the clock past it if so."""
        frame = self.due_frame(step)
        if frame is None:
            return False
        self.advance(frame)
        return True

    def is_due_at(self, time: float) -> bool:
        """Like :meth:`is_due`, from a simulation time in seconds."""
        return self.is_due(self.step_of(time))


def frame_rate(step: float) -> float:
    """Frames per second of frames ``step`` seconds apart, to 12 significant digits:
    scheduled times are exact decimals, their differences are not (1 / 0.02 read from
    them is 49.99999999999996 for 50)."""
    return float(f"{1.0 / step:.12g}")
