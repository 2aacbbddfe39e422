"""Helpers shared by the test suite: where a test writes, tiny recordings, and snapshots
of what is committed (to assert that a refused call changed nothing).

Plain functions, no pytest: ``tests/conftest.py`` wraps some of them in fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco

__all__ = ["Location", "record"]


@dataclass(frozen=True)
class Location:
    """Where a test writes an archive: a URL and its fsspec options (None: none)."""

    url: str
    storage_options: dict[str, Any] | None = None


def record(model: mujoco.MjModel, url: str, *, n_worlds: int = 2, n_steps: int = 76,
           chunk_frames: int = 5, **kwargs: Any) -> str:
    """Record ``n_worlds`` worlds of :func:`flyarchive.testing.simulate` into ``url``.

    With the tiny model's 2 ms timestep and the recorder's default 25 fps at 0.2x, a
    frame is due every 4 steps: the default 76 steps give 20 frames per world, the same
    states as ``reference_frames(model, n_worlds, n_steps)``.

    Args:
        model: The model to simulate.
        url: Where to record (created; ``mode="a"`` in ``kwargs`` appends).
        n_worlds: Worlds, each from :func:`flyarchive.testing.perturb` with its seed.
        n_steps: Simulation steps.
        chunk_frames: Frames per chunk (a commit every ``chunk_frames`` frames).
        **kwargs: Passed to :class:`flyarchive.TrajectoryRecorder`.

    Returns:
        ``url``.
    """
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate

    with TrajectoryRecorder(url, model, chunk_frames=chunk_frames, **kwargs) as recorder:
        simulate(model, n_worlds, n_steps, recorder.record_as_needed)
    return url
