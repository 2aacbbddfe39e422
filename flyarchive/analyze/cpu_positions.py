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


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` for quaternions (w, x, y, z) on the last axis, broadcast (MuJoCo's order
    of operations, ``mju_mulQuat``)."""
    aw, ax, ay, az = (a[..., i] for i in range(4))
    bw, bx, by, bz = (b[..., i] for i in range(4))
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)


#: Frames per batch of copies (NeuroMechFly: 1.2 MB of body positions, in the cache).
_BATCH = 1024


def _bytes(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` as float64, C-contiguous (a copy only when it is not so)."""
    return memoryview(np.ascontiguousarray(array, dtype=np.float64)).cast("B")


def _span(indices: np.ndarray) -> slice | np.ndarray:
    """``indices`` as a slice when they are consecutive (a view, not a gather)."""
    if indices.size and np.array_equal(indices, np.arange(indices[0], indices[0] + indices.size)):
        return slice(int(indices[0]), int(indices[0]) + indices.size)
    return indices


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
        # Positions of consecutive bodies only (or of consecutive sites only: points, as
        # gait asks for): each frame's rows of xpos (site_xpos) are its result.
        self._direct = None if orientations else self._direct_rows()
        direct = self._direct is not None
        names = (["xpos"] if self._body_k.size else []) + \
            (["site_xpos"] if self._site_k.size else []) + (["xquat"] if orientations else [])
        self._copies = {name: np.empty((_BATCH, *getattr(self.data, name).shape))
                        for name in ([] if direct else names)}

    def _direct_rows(self) -> np.ndarray | None:
        """The rows of ``xpos`` or ``site_xpos`` that are the keypoints, in order, when
        they are consecutive rows of one of them; else None."""
        for ids, others, field in ((self._body_ids, self._site_k, "xpos"),
                                   (self._site_ids, self._body_k, "site_xpos")):
            span = _span(ids)
            if ids.size and not others.size and isinstance(span, slice):
                return getattr(self.data, field)[span]
        return None

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
        valid = np.isfinite(qpos).all(axis=1)
        states = [qpos]
        if mocap_pos is not None and mocap_quat is not None and self.model.nmocap:
            valid &= np.isfinite(mocap_pos).all(axis=(1, 2)) & np.isfinite(mocap_quat).all(axis=(1, 2))
            states += [mocap_pos, mocap_quat]
        rows = np.flatnonzero(valid)
        if rows.size < n:
            states = [state[rows] for state in states]
        # States move as bytes between memoryviews (1.5 us a frame less than numpy's slice
        # assignment for NeuroMechFly): float64, contiguous, one block at a time.
        ins = [(_bytes(state), _bytes(getattr(self.data, name)))
               for state, name in zip(states, ("qpos", "mocap_pos", "mocap_quat"))]
        values = np.empty((rows.size, k, self.channels))
        for r0 in range(0, rows.size, _BATCH):  # batches whose copies stay in the cache
            r1 = min(rows.size, r0 + _BATCH)
            if self._direct is not None:
                self._run(ins, [(_bytes(values[r0:r1]), _bytes(self._direct))], r0, r1)
            else:
                self._run(ins, [(_bytes(b), _bytes(getattr(self.data, name)))
                                for name, b in self._copies.items()], r0, r1)
                self._pick(values[r0:r1], r1 - r0)
        if rows.size == n:
            return values
        out = np.full((n, k, self.channels), np.nan)
        out[rows] = values
        return out

    def _pick(self, values: np.ndarray, n: int) -> None:
        """The keypoints of ``n`` frames from the batch's copies (one index array per
        assignment: two would make numpy broadcast them, 20 us a frame)."""
        if self._body_k.size:
            values[:, _span(self._body_k), :3] = self._copies["xpos"][:n, _span(self._body_ids)]
        if self._site_k.size:
            values[:, _span(self._site_k), :3] = self._copies["site_xpos"][:n, _span(self._site_ids)]
        if self._orientations:
            values[..., 3:] = self._orientation(self._copies["xquat"][:n])

    def _run(self, ins: list[tuple[memoryview, memoryview]],
             outs: list[tuple[memoryview, memoryview]], r0: int, r1: int) -> None:
        """The per-frame loop over rows ``r0 .. r1 - 1`` of the states ``ins`` (``(source
        bytes, MjData field)``): set the state, ``mj_kinematics``, copy each field of
        ``outs`` (``(destination bytes from row r0, MjData field)``); nothing else."""
        m, d, kin = self.model, self.data, mujoco.mj_kinematics
        if len(ins) == 1 and len(outs) == 1:  # the common case, kept lean
            (src, q), = ins
            (dst, x), = outs
            a, b = q.nbytes, x.nbytes
            for i, j in zip(range(r0 * a, r1 * a, a), range(0, (r1 - r0) * b, b)):
                q[:] = src[i:i + a]
                kin(m, d)
                dst[j:j + b] = x
            return
        for i in range(r0, r1):
            for src, state in ins:
                state[:] = src[i * state.nbytes:(i + 1) * state.nbytes]
            kin(m, d)
            for dst, out in outs:
                dst[(i - r0) * out.nbytes:(i - r0 + 1) * out.nbytes] = out

    def _orientation(self, xquat: np.ndarray) -> np.ndarray:
        """``(n, K, 4)``: each keypoint's body orientation, times its site's quaternion."""
        quats = xquat.take(self._keypoints.body_ids, axis=1)
        turned = np.flatnonzero((self._keypoints.quats != [1.0, 0.0, 0.0, 0.0]).any(axis=1))
        if turned.size:
            product = quat_mul(quats[:, turned], self._keypoints.quats[turned])
            quats[:, turned] = product / np.linalg.norm(product, axis=-1, keepdims=True)
        return quats
