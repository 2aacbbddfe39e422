"""The 3D view's data: the model's visible geoms once (shapes, sizes, colours, mesh
vertices and faces), then, per world and frame, where each geom is, by forward
kinematics on the CPU (``mujoco.mj_kinematics``: NeuroMechFly about 0.1 ms a frame).
The browser draws them with three.js; no video is rendered.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

#: MuJoCo's geom groups drawn by default (``mjVIS`` shows groups 0, 1 and 2).
VISIBLE_GROUPS = (0, 1, 2)
_DEFAULT_RGBA = np.array([0.5, 0.5, 0.5, 1.0], dtype=np.float32)
_TYPES = {int(mujoco.mjtGeom.mjGEOM_PLANE): "plane", int(mujoco.mjtGeom.mjGEOM_SPHERE): "sphere",
          int(mujoco.mjtGeom.mjGEOM_CAPSULE): "capsule",
          int(mujoco.mjtGeom.mjGEOM_ELLIPSOID): "ellipsoid",
          int(mujoco.mjtGeom.mjGEOM_CYLINDER): "cylinder", int(mujoco.mjtGeom.mjGEOM_BOX): "box",
          int(mujoco.mjtGeom.mjGEOM_MESH): "mesh"}
#: Most frames one pose request may cover, per world.
MAX_FRAMES = 500
#: Most worlds shown side by side.
MAX_WORLDS = 16


class Poser:
    """Forward kinematics of one model, for any number of worlds and frames.

    Thread-safe: one ``MjData`` per thread.
    """

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self.geoms = visible_geoms(model)
        self.root_body = _root_body(model)
        self._local = threading.local()

    def _data(self) -> mujoco.MjData:
        data = getattr(self._local, "data", None)
        if data is None:
            data = self._local.data = mujoco.MjData(self.model)
        return data

    def poses(self, states: dict[str, np.ndarray], frames: Sequence[int]) -> np.ndarray:
        """Where the visible geoms are in each frame.

        Args:
            states: One world's ``qpos`` ``(n_times, nq)`` (and ``mocap_pos`` /
                ``mocap_quat``), as :meth:`ViewedArchive.states` gives them.
            frames: Frame indices.

        Returns:
            ``(len(frames), n_geoms + 1, 12)`` float32: per visible geom its position
            (x, y, z, model units) and rotation matrix (row-major 3x3, MuJoCo's
            ``geom_xmat``); the last row is the root body's position (the point the
            camera follows) and an identity matrix. NaN for frames past the world's
            ``n_frames``.
        """
        model, data = self.model, self._data()
        geoms = np.asarray(self.geoms, dtype=np.int64)
        out = np.full((len(frames), len(geoms) + 1, 12), np.nan, dtype=np.float32)
        mocap = "mocap_pos" in states and model.nmocap > 0
        for row, frame in enumerate(frames):
            qpos = states["qpos"][frame]
            if not np.isfinite(qpos).all():
                continue
            data.qpos[:] = qpos
            if mocap:
                data.mocap_pos[:] = states["mocap_pos"][frame]
                data.mocap_quat[:] = states["mocap_quat"][frame]
            mujoco.mj_kinematics(model, data)
            out[row, :-1, :3] = data.geom_xpos[geoms]
            out[row, :-1, 3:] = data.geom_xmat[geoms]
            out[row, -1, :3] = data.xpos[self.root_body]
            out[row, -1, 3:] = (1, 0, 0, 0, 1, 0, 0, 0, 1)
        return out


def visible_geoms(model: mujoco.MjModel) -> list[int]:
    """Ids of the geoms drawn: of a shape three.js draws, in a visible group, not clear."""
    return [g for g in range(model.ngeom)
            if int(model.geom_type[g]) in _TYPES and int(model.geom_group[g]) in VISIBLE_GROUPS
            and _rgba(model, g)[3] > 0]


def _root_body(model: mujoco.MjModel) -> int:
    """The body the camera follows: the first with a free joint, else the first body."""
    for joint in range(model.njnt):
        if model.jnt_type[joint] == mujoco.mjtJoint.mjJNT_FREE:
            return int(model.jnt_bodyid[joint])
    return min(1, model.nbody - 1)


def _rgba(model: mujoco.MjModel, geom: int) -> np.ndarray:
    """A geom's colour as MuJoCo draws it: its material's, unless the geom sets its own."""
    rgba = np.asarray(model.geom_rgba[geom], dtype=np.float32)
    material = int(model.geom_matid[geom])
    if material >= 0 and np.allclose(rgba, _DEFAULT_RGBA):
        return np.asarray(model.mat_rgba[material], dtype=np.float32)
    return rgba


def _radius(model: mujoco.MjModel, geoms: Sequence[int]) -> float:
    """How far the model's geoms (planes aside) reach from the root body in its first
    pose (``qpos0``), model units: what the camera keeps in view."""
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    root = data.xpos[_root_body(model)]
    solid = [g for g in geoms if int(model.geom_type[g]) != int(mujoco.mjtGeom.mjGEOM_PLANE)]
    if not solid:
        return float(model.stat.extent)
    reach = np.linalg.norm(data.geom_xpos[solid] - root, axis=1) + model.geom_rbound[solid]
    return float(reach.max())


def scene(model: mujoco.MjModel, geoms: Sequence[int]) -> tuple[dict[str, Any], bytes]:
    """The visible geoms' shapes, for the browser.

    Returns:
        ``(description, blob)``: the description lists each geom (``type``, ``size``
        (MuJoCo's three numbers), ``rgba``, and for a mesh ``mesh``: its index in
        ``meshes``) and each mesh (``vertices``, ``faces``: counts, and ``offset``: where
        its float32 vertices ``(n, 3)`` then uint32 faces ``(m, 3)`` start in ``blob``,
        bytes); ``extent`` (the model's size, length units), ``radius`` (how far its
        geoms reach from the root body, see :func:`_radius`) and ``center``.
    """
    meshes: dict[int, int] = {}
    parts: list[bytes] = []
    described_meshes: list[dict[str, int]] = []
    offset = 0
    described = []
    for g in geoms:
        kind = _TYPES[int(model.geom_type[g])]
        item: dict[str, Any] = {"type": kind, "name": mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) or "",
                                "size": [float(v) for v in model.geom_size[g]],
                                "rgba": [round(float(v), 4) for v in _rgba(model, g)]}
        if kind == "mesh":
            mesh = int(model.geom_dataid[g])
            if mesh not in meshes:
                start, count = int(model.mesh_vertadr[mesh]), int(model.mesh_vertnum[mesh])
                fstart, fcount = int(model.mesh_faceadr[mesh]), int(model.mesh_facenum[mesh])
                vertices = np.ascontiguousarray(model.mesh_vert[start:start + count], np.float32)
                faces = np.ascontiguousarray(model.mesh_face[fstart:fstart + fcount], np.uint32)
                meshes[mesh] = len(described_meshes)
                described_meshes.append({"vertices": count, "faces": fcount, "offset": offset})
                parts += [vertices.tobytes(), faces.tobytes()]
                offset += vertices.nbytes + faces.nbytes
            item["mesh"] = meshes[mesh]
        described.append(item)
    description = {"geoms": described, "meshes": described_meshes,
                   "extent": float(model.stat.extent), "radius": _radius(model, geoms),
                   "center": [float(v) for v in model.stat.center]}
    return description, b"".join(parts)
