"""Positions of keypoints on the CPU: ``mj_kinematics`` frame by frame, bit-exact with a
live ``MjData`` at the same state.

:class:`CpuKinematics` runs the model's kinematic skeleton (:mod:`~flyarchive.analyze.skeleton`:
bodies and joints, no geoms, a site per site or point keypoint) over a block of frames:
per frame it sets ``qpos`` (and mocap poses), calls ``mj_kinematics`` and copies the
body positions (and site positions, body orientations) it needs; the keypoints are
picked from those copies once per block. Frames whose state is not finite (past a
world's ``n_frames``: NaN) are skipped and give NaN.
"""

from __future__ import annotations

import mujoco
import numpy as np

from flyarchive.analyze.keypoints import KeypointSet
from flyarchive.analyze.skeleton import kinematic_model

__all__ = ["CpuKinematics", "quat_mul"]


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` for quaternions (w, x, y, z) on the last axis, broadcast (MuJoCo's order
    of operations, ``mju_mulQuat``)."""
    aw, ax, ay, az = (a[..., i] for i in range(4))
    bw, bx, by, bz = (b[..., i] for i in range(4))
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)


class CpuKinematics:
    """Keypoint positions (and orientations) of frames, by ``mj_kinematics``.

    Args:
        model: The compiled model the archive was recorded with (read only).
        keypoints: Resolved in ``model``.
        orientations: Also give each keypoint's orientation (its body's ``xquat``, times
            a site's ``site_quat``).

    Not thread-safe (one ``MjData``): one engine per thread.
    """

    def __init__(self, model: mujoco.MjModel, keypoints: KeypointSet, orientations: bool) -> None:
        built = kinematic_model(model, keypoints)
        self.model, self.data = built.model, mujoco.MjData(built.model)
        kinds = np.asarray(keypoints.kinds)
        self._body_k = np.flatnonzero(kinds == "body")
        self._site_k = np.flatnonzero(kinds != "body")
        self._body_ids = keypoints.body_ids[self._body_k]
        self._site_ids = built.site_ids[self._site_k]
        self._keypoints = keypoints
        self._orientations = orientations
        self.channels = 7 if orientations else 3

    def frames(self, qpos: np.ndarray, mocap_pos: np.ndarray | None = None,
               mocap_quat: np.ndarray | None = None) -> np.ndarray:
        """Keypoints of ``n`` frames.

        Args:
            qpos: ``(n, nq)`` any float dtype (host).
            mocap_pos, mocap_quat: ``(n, nmocap, 3)`` and ``(n, nmocap, 4)``, or None.

        Returns:
            ``(n, K, 3)`` float64 positions, or ``(n, K, 7)`` with orientations (w, x, y,
            z) after them; NaN for frames whose state is not finite.
        """
        n, k = len(qpos), len(self._keypoints)
        out = np.full((n, k, self.channels), np.nan)
        valid = np.isfinite(qpos).all(axis=1)
        if mocap_pos is not None and mocap_quat is not None and self.model.nmocap:
            valid &= np.isfinite(mocap_pos).all(axis=(1, 2)) & np.isfinite(mocap_quat).all(axis=(1, 2))
        else:
            mocap_pos = mocap_quat = None
        rows = np.flatnonzero(valid)
        if rows.size == 0:
            return out
        copies = self._copies(rows.size)
        self._run(qpos, mocap_pos, mocap_quat, rows, copies)
        if self._body_k.size:
            out[rows[:, None], self._body_k, :3] = copies["xpos"][:, self._body_ids]
        if self._site_k.size:
            out[rows[:, None], self._site_k, :3] = copies["site_xpos"][:, self._site_ids]
        if self._orientations:
            out[rows, :, 3:] = self._orientation(copies["xquat"])
        return out

    def _copies(self, n: int) -> dict[str, np.ndarray]:
        """What to copy out of the data after each frame: ``{field: (n, ...) buffer}``."""
        names = (["xpos"] if self._body_k.size else []) + \
            (["site_xpos"] if self._site_k.size else []) + (["xquat"] if self._orientations else [])
        return {name: np.empty((n, *getattr(self.data, name).shape)) for name in names}

    def _run(self, qpos: np.ndarray, mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None,
             rows: np.ndarray, copies: dict[str, np.ndarray]) -> None:
        """The per-frame loop: set the state, ``mj_kinematics``, copy; nothing else."""
        m, d, kin = self.model, self.data, mujoco.mj_kinematics
        q = d.qpos
        pairs = [(copies[name], getattr(d, name)) for name in copies]
        if mocap_pos is None and len(pairs) == 1:  # the common case, kept lean
            (dst, src), = pairs
            for j, i in enumerate(rows.tolist()):
                q[:] = qpos[i]
                kin(m, d)
                dst[j] = src
            return
        mp, mq = d.mocap_pos, d.mocap_quat
        for j, i in enumerate(rows.tolist()):
            q[:] = qpos[i]
            if mocap_pos is not None:
                mp[:] = mocap_pos[i]
                mq[:] = mocap_quat[i]  # type: ignore[index]
            kin(m, d)
            for dst, src in pairs:
                dst[j] = src

    def _orientation(self, xquat: np.ndarray) -> np.ndarray:
        """``(n, K, 4)``: each keypoint's body orientation, times its site's quaternion."""
        quats = xquat[:, self._keypoints.body_ids]
        turned = np.flatnonzero((self._keypoints.quats != [1.0, 0.0, 0.0, 0.0]).any(axis=1))
        if turned.size:
            product = quat_mul(quats[:, turned], self._keypoints.quats[turned])
            quats[:, turned] = product / np.linalg.norm(product, axis=-1, keepdims=True)
        return quats
