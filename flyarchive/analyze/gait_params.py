"""The thresholds of the step events and gait measures (:class:`GaitParams`): plain numbers,
no NumPy, so that the command line's parser reads their defaults without importing the
analysis (:mod:`~flyarchive.analyze.steps` uses them)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from flyarchive.errors import OptionsError


def is_real(value: object) -> bool:
    """Whether ``value`` is a real number: Python's or numpy's (``np.float32(0.5)``), not a
    bool (``True`` is no threshold)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class GaitParams:
    """Thresholds of the step events and gait measures (positions' length unit, seconds).

    The defaults suit NeuroMechFly walking on flat ground at 60 to 1000 frames/s: its
    tarsus tips stand 0.005-0.05 mm high, slipping at up to ~10 mm/s, and in swing rise
    0.1-0.9 mm or (hind legs that drag) slide at 20-70 mm/s. For another body or a
    tracked fly, give them in that data's unit (``stance_height`` and ``swing_height``
    from the ground, z up: just above where its tips stand). See
    :mod:`~flyarchive.analyze.steps` for how they are used.

    Attributes:
        stance_height: A tip lower than this may be in stance (the band). mm.
        stance_speed: A tip slower than this may be in stance (the band). mm/s.
        swing_height: A run out of the band is a swing only if the tip rises above this...
            mm (>= stance_height).
        swing_speed: ...or moves faster than this. mm/s (>= stance_speed).
        min_stance: Shorter stances between two swings join them. s.
        min_swing: Shorter swings between two stances join them. s.
        smooth: Positions are averaged over the frames within this many seconds before
            speeds are taken (one frame, i.e. none, below ~330 frames/s). s.
        fall_height: The thorax below this height counts in ``time_below``. mm.

    Raises:
        OptionsError: a threshold that is not a finite number >= 0, or a swing threshold
            below its stance threshold.
    """

    stance_height: float = 0.1
    stance_speed: float = 10.0
    swing_height: float = 0.15
    swing_speed: float = 20.0
    min_stance: float = 0.01
    min_swing: float = 0.01
    smooth: float = 0.006
    fall_height: float = 0.6

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not is_real(value) or not math.isfinite(value) or value < 0:
                raise OptionsError(
                    f"GaitParams.{f.name} must be a finite number >= 0 (--{f.name.replace('_', '-')} "
                    f"on the command line), got {value!r}.")
            object.__setattr__(self, f.name, float(value))  # numpy's numbers too
        for swing, stance in (("swing_height", "stance_height"), ("swing_speed", "stance_speed")):
            if getattr(self, swing) < getattr(self, stance):
                raise OptionsError(
                    f"GaitParams.{swing}={getattr(self, swing)!r} is below {stance}="
                    f"{getattr(self, stance)!r}; a swing must reach at least the stance band's "
                    "edge. Raise it, or lower the stance threshold.")
