"""Positions of keypoints on the CPU: ``mj_kinematics`` frame by frame, bit-exact with a
live ``MjData`` at the same state.

:class:`CpuKinematics` runs the model's kinematic skeleton (:mod:`~flyarchive.analyze.skeleton`:
bodies and joints, no geoms, a site per site or point keypoint) over a block of frames:
per frame it sets ``qpos`` (and mocap poses), calls ``mj_kinematics`` and copies the
body positions (and site positions, body orientations) it needs; the keypoints are
picked from those copies once per block. Frames whose state is not finite (past a
world's ``n_frames``: NaN) are skipped and give NaN.

:func:`kinematics_block` is what a task of the lazy array runs, on any backend: it finds
(or builds, once per thread and model) the engine and runs it on a block of the archive.
The model travels to workers as its MJB bytes, one object per worker; state is read on
the worker from the archive, never shipped.
"""

from __future__ import annotations

import threading
from typing import Any

import mujoco
import numpy as np

from flyarchive.analyze.keypoints import KeypointSet
from flyarchive.analyze.skeleton import kinematic_model
from flyarchive.models import load_mjb

__all__ = ["CpuKinematics", "kinematics_block", "model_of", "quat_mul", "BACKENDS"]

#: Backends of :func:`flyarchive.positions`: CPU MuJoCo (bit-exact), mujoco-warp on
#: Warp's CPU device, mujoco-warp on CUDA.
BACKENDS = ("cpu", "warp-cpu", "gpu")

_MODELS: dict[str, mujoco.MjModel] = {}
_MODELS_LOCK = threading.Lock()
_LOCAL = threading.local()


def model_of(sha256: str, blob: bytes) -> mujoco.MjModel:
    """The model of MJB bytes whose SHA-256 is ``sha256`` (computed by the caller), loaded
    once per process (a model is only read by kinematics: threads share it)."""
    with _MODELS_LOCK:
        model = _MODELS.get(sha256)
        if model is None:
            model = _MODELS[sha256] = load_mjb(blob, f"the model (sha256 {sha256[:12]}...)")
            while len(_MODELS) > 4:
                _MODELS.pop(next(iter(_MODELS)))
        return model


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


def _engine(sha256: str, blob: bytes, keypoints: KeypointSet, orientations: bool,
            backend: str) -> Any:
    """This thread's engine for a model, keypoints and backend (built on first use)."""
    engines = getattr(_LOCAL, "engines", None)
    if engines is None:
        engines = _LOCAL.engines = {}
    key = (sha256, keypoints.digest, orientations, backend)
    engine = engines.get(key)
    if engine is None:
        model = model_of(sha256, blob)
        if backend == "cpu":
            engine = CpuKinematics(model, keypoints, orientations)
        else:
            from flyarchive.analyze.warp_positions import warp_engine

            engine = warp_engine(model, sha256, keypoints, orientations, backend)
        while len(engines) >= 4:
            engines.pop(next(iter(engines)))
        engines[key] = engine
    return engine


def kinematics_block(qpos: np.ndarray, *args: Any, sha256: str, keypoints: KeypointSet,
                     orientations: bool, backend: str, mocap: bool) -> np.ndarray:
    """One block of the lazy positions: ``(w, t, nq)`` qpos (and, with ``mocap``,
    ``(w, t, nmocap, 3)`` positions and ``(w, t, nmocap, 4)`` quaternions), then the
    model's MJB bytes -> ``(w, t, K, 3 or 7)`` (float64 on ``"cpu"``, float32 on Warp)."""
    blob = args[-1]
    mocap_pos, mocap_quat = (args[0], args[1]) if mocap else (None, None)
    engine = _engine(sha256, blob, keypoints, orientations, backend)
    w, t = qpos.shape[:2]
    flat = [None if a is None else np.asarray(a).reshape(w * t, *a.shape[2:])
            for a in (qpos, mocap_pos, mocap_quat)]
    out = engine.frames(*flat)
    return out.reshape(w, t, *out.shape[1:])
