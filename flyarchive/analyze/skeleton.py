"""The kinematic skeleton of a model: its bodies and joints, no geoms, a site per keypoint.

``mj_kinematics`` computes the pose of every body, then of every inertial frame, geom
and site. Positions need the bodies, and the sites and points asked for: NeuroMechFly's
70 geoms are work for nothing. :func:`skeleton` compiles a model with the same body
tree (same ids, same joints in the same order, same mocap bodies) and no geom, with one
site for each site or point keypoint, then copies every number ``mj_kinematics`` reads
(body and joint poses, axes, ``qpos0``, the sites' poses) from the original, exactly: so
its bodies' and sites' poses equal, bit for bit, those of the original model at the same
``qpos`` and mocap poses (tested against a live ``MjData``), and a point's position is
what MuJoCo computes for a site placed there.

If the compiled tree differs from the original's in anything ``mj_kinematics`` reads
(a model feature this does not rebuild), :func:`skeleton` returns None and callers use
the original model.
"""

from __future__ import annotations

import mujoco
import numpy as np

from flyarchive.analyze.keypoints import KeypointSet

#: Arrays that must be equal for ``mj_kinematics`` to follow the same path.
_STRUCTURE = ("body_parentid", "body_jntadr", "body_jntnum", "body_mocapid", "jnt_type",
              "jnt_qposadr", "jnt_bodyid")
#: Numbers ``mj_kinematics`` reads for bodies and joints, copied from the original.
_BODY_NUMBERS = ("body_pos", "body_quat", "jnt_pos", "jnt_axis", "qpos0")


class Skeleton:
    """A model to compute keypoints with, and where each keypoint is found in its data.

    Attributes:
        model: The model to run ``mj_kinematics`` on (the skeleton, or a copy of the
            original when no skeleton could be made).
        site_ids: ``(K,)`` int: the site of each site or point keypoint in ``model``,
            -1 for body keypoints.
        reduced: True for a skeleton, False for the original model.
    """

    def __init__(self, model: mujoco.MjModel, site_ids: np.ndarray, reduced: bool) -> None:
        self.model, self.site_ids, self.reduced = model, site_ids, reduced


def kinematic_model(model: mujoco.MjModel, keypoints: KeypointSet) -> Skeleton:
    """The skeleton of ``model`` for ``keypoints``, else the original model (its own
    sites serve site keypoints).

    Raises:
        SelectionError: points asked of a model whose skeleton cannot be rebuilt (a point
            needs a site of its own, which a compiled model cannot get).
    """
    built = skeleton(model, keypoints)
    if built is not None:
        return built
    if "point" in keypoints.kinds:
        from flyarchive.errors import SelectionError

        raise SelectionError(
            "Points fixed in a body's frame need the model's kinematic skeleton, which could "
            "not be rebuilt for this model. Ask for bodies and sites only.")
    site_ids = np.where(np.asarray(keypoints.kinds) == "site", keypoints.site_ids, -1)
    return Skeleton(model, site_ids, reduced=False)


def skeleton(model: mujoco.MjModel, keypoints: KeypointSet) -> Skeleton | None:
    """The model's kinematic skeleton with a site per site or point keypoint; None when
    its tree cannot be rebuilt exactly."""
    try:
        built, site_ids = _compile(model, keypoints)
    except (ValueError, RuntimeError, TypeError, AttributeError):
        return None
    if any(not np.array_equal(getattr(built, name), getattr(model, name))
           for name in _STRUCTURE) or built.nq != model.nq or built.nmocap != model.nmocap:
        return None
    for name in _BODY_NUMBERS:
        getattr(built, name)[:] = getattr(model, name)
    for k in np.flatnonzero(site_ids >= 0):
        s = int(site_ids[k])
        built.site_pos[s] = keypoints.offsets[k]
        built.site_quat[s] = keypoints.quats[k]
        if keypoints.kinds[k] == "site":  # as the original computes it
            built.site_sameframe[s] = model.site_sameframe[keypoints.site_ids[k]]
    return Skeleton(built, site_ids, reduced=True)


def _compile(model: mujoco.MjModel, keypoints: KeypointSet) -> tuple[mujoco.MjModel, np.ndarray]:
    spec = mujoco.MjSpec()
    spec.modelname = "flyarchive-skeleton"
    bodies = [spec.worldbody]
    for i in range(1, model.nbody):
        body = bodies[int(model.body_parentid[i])].add_body(
            pos=model.body_pos[i], quat=model.body_quat[i], mocap=bool(model.body_mocapid[i] >= 0))
        body.mass, body.inertia, body.explicitinertial = 1.0, [1.0, 1.0, 1.0], True
        for j in range(int(model.body_jntadr[i]), int(model.body_jntadr[i] + model.body_jntnum[i])):
            kind = mujoco.mjtJoint(int(model.jnt_type[j]))
            if kind == mujoco.mjtJoint.mjJNT_FREE:
                body.add_freejoint()
            else:
                body.add_joint(type=kind, axis=model.jnt_axis[j], pos=model.jnt_pos[j])
        bodies.append(body)
    for k, kind in enumerate(keypoints.kinds):
        if kind != "body":
            bodies[int(keypoints.body_ids[k])].add_site(
                name=f"k{k}", pos=keypoints.offsets[k], quat=keypoints.quats[k])
    built = spec.compile()
    site_ids = np.array([-1 if kind == "body" else built.site(f"k{k}").id
                         for k, kind in enumerate(keypoints.kinds)], dtype=np.int64)
    return built, site_ids
