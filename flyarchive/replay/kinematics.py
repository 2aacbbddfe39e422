"""Position-only kinematics for replay: from ``qpos`` and mocap poses to rendered geometry.

MuJoCo's scene update reads derived positions (``xpos``/``xmat``, ``geom_xpos``,
``cam_xpos``, light poses, tendon paths), never ``qpos``. Right after ``mj_step`` these
still describe the state at the start of the step, so a live renderer that draws the
stepped ``MjData`` shows the past. flygym 2.1.1 renders from a private ``MjData`` into
which it copies ``qpos`` and mocap poses and recomputes the geometry; replay does the
same, so replayed frames equal live ones bit for bit.
"""

from __future__ import annotations

import mujoco
import numpy as np
from numpy.typing import ArrayLike

from flyarchive.errors import LayoutMismatchError


def update_render_geometry(model: mujoco.MjModel, data: mujoco.MjData) -> None:
    """Recompute everything rendering reads from ``data.qpos`` and the mocap poses.

    Runs the position stages of ``mj_forward`` that rendered geometry depends on:
    body/geom/site frames (``mj_kinematics``), centres of mass (``mj_comPos``), camera and
    light poses (``mj_camlight``) and tendon paths (``mj_tendon``). Collisions and every
    velocity- or force-dependent stage are skipped; they do not change rendered pixels
    with default scene options. The same stages as ``flygym.rendering.update_render_geometry``
    (flygym 2.1.1), in the same order.

    Args:
        model: The compiled model.
        data: State to update in place (host memory); reads ``qpos``, ``mocap_pos``,
            ``mocap_quat``.
    """
    mujoco.mj_kinematics(model, data)
    mujoco.mj_comPos(model, data)
    mujoco.mj_camlight(model, data)
    mujoco.mj_tendon(model, data)


def set_state(
    model: mujoco.MjModel,
    data: mujoco.MjData,
    qpos: ArrayLike,
    mocap_pos: ArrayLike | None = None,
    mocap_quat: ArrayLike | None = None,
) -> None:
    """Copy one recorded frame into ``data`` and recompute its rendered geometry.

    Args:
        model: The compiled model the frame was recorded with (same layout).
        data: The ``MjData`` to overwrite, usually a private one kept for rendering.
        qpos: Generalized coordinates, shape ``(nq,)``, any float dtype (float32 from
            a GPU recording is widened to float64).
        mocap_pos: Mocap body positions, shape ``(nmocap, 3)``, in the model's length
            unit (NeuroMechFly: millimetres), or ``None`` to
            keep what ``data`` holds (the model's default pose for a fresh ``MjData``).
        mocap_quat: Mocap body orientations, shape ``(nmocap, 4)``, order w, x, y, z, or
            ``None`` to keep what ``data`` holds.

    Raises:
        LayoutMismatchError: if a shape does not fit the model.
    """
    data.qpos[:] = _parse(qpos, (model.nq,), "qpos")
    if mocap_pos is not None:
        data.mocap_pos[:] = _parse(mocap_pos, (model.nmocap, 3), "mocap_pos")
    if mocap_quat is not None:
        data.mocap_quat[:] = _parse(mocap_quat, (model.nmocap, 4), "mocap_quat")
    update_render_geometry(model, data)


def _parse(values: ArrayLike, shape: tuple[int, ...], name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != shape:
        raise LayoutMismatchError(
            f"{name} of one frame has shape {array.shape!r}; the model needs {shape!r}. "
            f"Pass the model the state was recorded with, and one frame at a time."
        )
    return array
