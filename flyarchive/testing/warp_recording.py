"""Seeded Warp worlds recorded with ``WarpTrajectoryRecorder``, and their reference frames.

:func:`record_warp` steps the tiny model's seeded worlds on Warp's CPU device (with
mujoco-warp, or CPU MuJoCo's worlds in Warp arrays: :mod:`flyarchive.testing.warp_states`)
and records them; :class:`WarpFrames` reads the same worlds' state back on the host at
each frame of the recorders' schedule; :func:`warp_reference` is those frames alone.
The kill harness (:mod:`flyarchive.testing.kills`) records, kills and resumes with them.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flyarchive.testing.trials import STATE

__all__ = ["record_warp", "WarpFrames", "warp_reference"]


def _warp_sim(n_worlds: int) -> tuple[Any, Any, Any]:
    """The tiny model on the host, on Warp's CPU device, and ``n_worlds`` seeded worlds."""
    import warnings

    import warp as wp

    wp.config.log_level = wp.LOG_WARNING  # no start-up and module-load messages on stdout
    import mujoco_warp as mjw

    from flyarchive.testing import tiny_model

    model = tiny_model()
    rng = np.random.default_rng(0)
    with wp.ScopedDevice("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # mujoco-warp's notices about the model
        mjw_model = mjw.put_model(model)
        data = mjw.make_data(model, nworld=n_worlds)
        data.qvel.assign(rng.normal(0.0, 1.0, (n_worlds, model.nv)).astype(np.float32))
        data.ctrl.assign(rng.normal(0.0, 0.3, (n_worlds, model.nu)).astype(np.float32))
    return model, mjw_model, data


def _warp_steps(n_worlds: int, n_steps: int, on_step: Callable[[int, Any], None],
                host_states: bool = False) -> Any:
    """Step the seeded Warp worlds ``n_steps`` times; ``on_step(step, data)`` at 0..n_steps.

    ``host_states``: the worlds of :func:`flyarchive.testing.warp_states.host_warp_steps`
    (CPU MuJoCo's, in Warp arrays) instead of mujoco-warp's."""
    if host_states:
        from flyarchive.testing import tiny_model
        from flyarchive.testing.warp_states import host_warp_steps

        model = tiny_model()
        host_warp_steps(model, n_worlds, n_steps, on_step)
        return model
    import mujoco_warp as mjw
    import warp as wp

    model, mjw_model, data = _warp_sim(n_worlds)
    with wp.ScopedDevice("cpu"):
        on_step(0, data)
        for step in range(1, n_steps + 1):
            mjw.step(mjw_model, data)
            on_step(step, data)
    return model


def record_warp(url: str, n_worlds: int, chunk_frames: int, n_steps: int,
                on_frame: Callable[[int, int], None] | None = None, *,
                observe: Callable[[int, Any], None] | None = None,
                host_states: bool = False) -> None:
    """Record ``n_steps`` steps of the seeded Warp worlds with ``WarpTrajectoryRecorder``.

    Uses ``mode="a"``: a rerun from step 0 into an archive skips its committed frames.
    ``on_frame(recorded, committed)`` is called after each recorded frame;
    ``observe(step, data)`` at every step, before the recorder (e.g. a :class:`WarpFrames`).
    ``host_states``: see :func:`_warp_steps`.
    """
    from flyarchive.recorders import WarpTrajectoryRecorder
    from flyarchive.testing import tiny_model

    recorder = WarpTrajectoryRecorder(url, tiny_model(), n_worlds, chunk_frames=chunk_frames,
                                      mode="a")

    def on_step(step: int, data: Any) -> None:
        if observe is not None:
            observe(step, data)
        if recorder.record_as_needed(data) and on_frame is not None:
            on_frame(recorder.n_frames, recorder.committed_frames)

    with recorder:
        _warp_steps(n_worlds, n_steps, on_step, host_states)


class WarpFrames:
    """``observe(step, data)`` of the seeded Warp worlds: their state at each frame of the
    recorders' schedule (25 fps at 0.2x), read back on the host beside any recorder."""

    def __init__(self) -> None:
        from flyarchive.clock import FrameClock, Timing
        from flyarchive.testing import tiny_model

        self._clock = FrameClock(Timing(float(tiny_model().opt.timestep), 25, 0.2))
        self._frames: dict[str, list[np.ndarray]] = {k: [] for k in ("time", *STATE)}

    def __call__(self, step: int, data: Any) -> None:
        if self._clock.is_due(step):
            self._frames["time"].append(np.float64(data.time.numpy()[0]))
            for key in STATE:
                self._frames[key].append(getattr(data, key).numpy().copy())

    def arrays(self) -> dict[str, np.ndarray]:
        """``time`` (frames,) and each state (worlds, frames, ...)."""
        return {k: np.array(v) if k == "time" else np.stack(v, axis=1)
                for k, v in self._frames.items()}


def warp_reference(n_worlds: int, n_frames: int, host_states: bool = False
                   ) -> dict[str, np.ndarray]:
    """The first ``n_frames`` frames of the seeded Warp worlds, read back on the host."""
    frames = WarpFrames()
    _warp_steps(n_worlds, 4 * max(n_frames - 1, 0), frames, host_states)
    return frames.arrays()
