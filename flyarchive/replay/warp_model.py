"""Make an ``MjModel`` acceptable to mujoco-warp's batch renderer, on a copy.

Replay only needs position kinematics and rasterization, so options that
mujoco-warp's ``put_model`` refuses but that only matter for dynamics (the noslip
solver, dense Jacobians of large models, unsupported integrators, contacts) are
switched off. Nothing here changes the qpos or mocap layout, so an archive
recorded with the original model replays with the prepared one.

The supported option values are read from mujoco-warp's enums, imported lazily
inside the function (``import flyarchive`` never imports warp).
"""

from __future__ import annotations

import copy
from typing import Any

import mujoco
import numpy as np

# Largest nv for which mujoco-warp 3.16 accepts a dense Jacobian.
_DENSE_NV_MAX = 60

# Contact sensor data-spec bits for linear and angular velocity (unsupported).
_CONTACT_SENSOR_VELOCITY_BITS = (1 << 7) | (1 << 8)


def prepare_for_batch_rendering(
    model: mujoco.MjModel, *, strip_mesh_textures: bool = True
) -> mujoco.MjModel:
    """Return a copy of ``model`` that mujoco-warp's ``put_model`` accepts for replay.

    The caller's model is never modified. Changes made on the copy:

    - ``opt.noslip_iterations = 0`` (mujoco-warp 3.16: "noslip solver not implemented").
    - An integrator, solver or cone mujoco-warp lacks becomes Euler / Newton /
      pyramidal; disable and enable flags it lacks are cleared; a dense Jacobian
      with ``nv > 60`` becomes sparse; sleeping is switched off.
    - Collisions are switched off: contact disabled, ``geom_contype`` and
      ``geom_conaffinity`` zeroed, geom and pair margins zeroed, multi-CCD off.
      Replay never collides, and this avoids collision-pair checks and warnings.
    - Velocity outputs of contact sensors are switched off.
    - With ``strip_mesh_textures``, materials on mesh geoms lose their RGB texture
      and take its mean colour (times the material colour) instead, as flygym's
      ``modify_world_for_batch_rendering`` does: textured complex meshes have
      corrupted memory in mujoco-warp's renderer. Planes, boxes etc. keep theirs.

    Kinematic fields (bodies, joints, ``qpos0``, geoms' sizes and poses, cameras,
    lights) are untouched, so ``nq``, ``nmocap`` and joint order stay identical.

    Args:
        model: The compiled model, on the host. Not modified.
        strip_mesh_textures: Replace RGB textures on mesh geoms' materials by a flat
            colour. ``False`` keeps every texture.

    Returns:
        A new ``MjModel``.

    Raises:
        MissingDependencyError: ``mujoco_warp`` is not installed.
    """
    prepared = copy.deepcopy(model)
    _switch_off_dynamics_options(prepared)
    _switch_off_collisions(prepared)
    if strip_mesh_textures:
        _flatten_mesh_textures(prepared)
    return prepared


def _switch_off_dynamics_options(m: mujoco.MjModel) -> None:
    mjw = _import_mujoco_warp()
    opt = m.opt
    opt.noslip_iterations = 0
    if int(opt.integrator) not in {int(v) for v in mjw.IntegratorType}:
        opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    if int(opt.solver) not in {int(v) for v in mjw.SolverType}:
        opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    if int(opt.cone) not in {int(v) for v in mjw.ConeType}:
        opt.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    if m.nv > _DENSE_NV_MAX and opt.jacobian == mujoco.mjtJacobian.mjJAC_DENSE:
        opt.jacobian = mujoco.mjtJacobian.mjJAC_SPARSE
    opt.disableflags &= _flag_mask(mjw.DisableBit)
    opt.enableflags &= _flag_mask(mjw.EnableBit) & ~int(mujoco.mjtEnableBit.mjENBL_SLEEP)
    contact_sensors = m.sensor_type == mujoco.mjtSensor.mjSENS_CONTACT
    if contact_sensors.any():
        m.sensor_intprm[contact_sensors, 0] &= ~_CONTACT_SENSOR_VELOCITY_BITS


def _flag_mask(supported: object) -> int:
    """Bitwise OR of the members of a mujoco-warp flag enum."""
    mask = 0
    for bit in supported:  # type: ignore[attr-defined]
        mask |= int(bit)
    return mask


def _import_mujoco_warp() -> Any:
    from flyarchive.warp_log import import_mujoco_warp

    return import_mujoco_warp("Preparing a model for mujoco-warp's batch renderer")


def _switch_off_collisions(m: mujoco.MjModel) -> None:
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(
        mujoco.mjtDisableBit.mjDSBL_MULTICCD
    )
    m.geom_contype[:] = 0
    m.geom_conaffinity[:] = 0
    m.geom_margin[:] = 0.0
    if m.npair:
        m.pair_margin[:] = 0.0


def _flatten_mesh_textures(m: mujoco.MjModel) -> None:
    rgb_role = int(mujoco.mjtTextureRole.mjTEXROLE_RGB)
    mesh_geoms = m.geom_type == mujoco.mjtGeom.mjGEOM_MESH
    for mat_id in np.unique(m.geom_matid[mesh_geoms]):
        if mat_id < 0:
            continue
        tex_id = int(m.mat_texid[mat_id, rgb_role])
        if tex_id < 0:
            continue
        m.mat_rgba[mat_id, :3] *= _mean_texture_rgb(m, tex_id)
        m.mat_texid[mat_id, rgb_role] = -1


def _mean_texture_rgb(m: mujoco.MjModel, tex_id: int) -> np.ndarray:
    """Mean colour of a texture, float32 (3,) in [0, 1]; grey textures repeat their channel."""
    nchannel = int(m.tex_nchannel[tex_id])
    size = int(m.tex_width[tex_id] * m.tex_height[tex_id]) * nchannel
    adr = int(m.tex_adr[tex_id])
    texels = m.tex_data[adr : adr + size].reshape(-1, nchannel).astype(np.float32) / 255.0
    mean = texels.mean(axis=0)
    if nchannel >= 3:
        return mean[:3]
    return np.repeat(mean[:1], 3)
