"""CPU MuJoCo worlds seen through Warp arrays: what ``WarpTrajectoryRecorder`` reads of a
``mujoco_warp.Data``, without importing mujoco-warp.

A process that imports ``mujoco_warp`` and loads its step kernels spends about 5 s of
CPU before its first step (far more on an empty kernel cache). Tests of what the Warp
recorder does with its buffers (a SIGKILL, an exit of Python without ``close()``) need
the recorder on Warp's device, not mujoco-warp's physics: :class:`HostWarpData` holds
the four arrays the recorder reads (``qpos``, ``mocap_pos``, ``mocap_quat``, ``time``:
the dtypes and shapes of ``mujoco_warp.Data``) on a Warp device, set from CPU worlds of
:func:`flyarchive.testing.simulate` at every step (:func:`host_warp_steps`), so the
expected frames are :func:`flyarchive.testing.reference_frames` (its ``time`` in
float32, as mujoco-warp keeps it).

Tests of the recorder inside a real mujoco-warp simulation use mujoco-warp
(tests/record/test_warp.py, tests/interop/test_flygym_sim.py).

Nothing here is needed to record or replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mujoco
import numpy as np

__all__ = ["HostWarpData", "host_warp_steps", "host_warp_reference"]


class HostWarpData:
    """The state arrays of ``n_worlds`` worlds of ``model`` that a ``mujoco_warp.Data`` has
    and the Warp recorder reads, on a Warp device.

    Attributes:
        qpos: ``(n_worlds, nq)`` float32.
        mocap_pos: ``(n_worlds, nmocap)`` ``wp.vec3``.
        mocap_quat: ``(n_worlds, nmocap)`` ``wp.quat`` (MuJoCo's w, x, y, z order, as
            mujoco-warp keeps it).
        time: ``(n_worlds,)`` float32, seconds.
    """

    def __init__(self, model: mujoco.MjModel, n_worlds: int, device: str = "cpu") -> None:
        from flyarchive.warp_log import import_warp

        wp = import_warp("flyarchive.testing.warp_states")
        self.qpos = wp.zeros((n_worlds, model.nq), dtype=wp.float32, device=device)
        self.mocap_pos = wp.zeros((n_worlds, model.nmocap), dtype=wp.vec3, device=device)
        self.mocap_quat = wp.zeros((n_worlds, model.nmocap), dtype=wp.quat, device=device)
        self.time = wp.zeros(n_worlds, dtype=wp.float32, device=device)

    def set(self, datas: list[mujoco.MjData]) -> None:
        """Copy the state of each CPU world (one ``MjData`` per world) onto the device."""
        self.qpos.assign(np.stack([d.qpos for d in datas]).astype(np.float32))
        if self.mocap_pos.shape[1]:
            self.mocap_pos.assign(np.stack([d.mocap_pos for d in datas]).astype(np.float32))
            self.mocap_quat.assign(np.stack([d.mocap_quat for d in datas]).astype(np.float32))
        self.time.assign(np.array([d.time for d in datas], dtype=np.float32))


def host_warp_steps(model: mujoco.MjModel, n_worlds: int, n_steps: int,
                    on_step: Callable[[int, HostWarpData], object], *, seed: int = 0,
                    device: str = "cpu") -> HostWarpData:
    """Step :func:`flyarchive.testing.simulate`'s worlds ``n_steps`` times; after each
    step (and once before the first) set a :class:`HostWarpData` from them and call
    ``on_step(step, data)`` (step 0..n_steps). Returns the data."""
    from flyarchive.testing import simulate

    data = HostWarpData(model, n_worlds, device)
    step = 0

    def each(datas: list[mujoco.MjData]) -> None:
        nonlocal step
        data.set(datas)
        on_step(step, data)
        step += 1

    simulate(model, n_worlds, n_steps, each, seed=seed)
    return data


def host_warp_reference(model: mujoco.MjModel, n_worlds: int, n_steps: int, *,
                        seed: int = 0) -> dict[str, np.ndarray]:
    """The frames a Warp recorder of :func:`host_warp_steps` stores (at the recorders'
    default 25 fps, 0.2x): :func:`~flyarchive.testing.reference_frames` with ``time`` as
    float32 seconds (the dtype of ``data.time``) and the states in float32."""
    from flyarchive.testing import reference_frames

    ref = reference_frames(model, n_worlds, n_steps, seed=seed)
    return {k: v.astype(np.float32) for k, v in ref.items()}
