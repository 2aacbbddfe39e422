"""NeuroMechFly (flygym 2.1) walking on flat ground, for demos, benchmarks and tests.

The world is composed the way flygym 2.1's own GPU benchmark composes it: the
NeuroMechFly body with leg joints only, position actuators on the 42 active leg
degrees of freedom, adhesion on the six tarsi, flygym's tracking camera, and a
flat ground with the fly on a free joint (``nq = 7 + 66 = 73``, timestep 0.1 ms).

The fly walks by replaying recorded fly kinematics that ship with flygym (the
Spotlight clip in ``flygym_demo.spotlight_data``: 2 s of leg joint angles at
330 Hz). The clip is smoothed, and after its end a stretch of it that starts and
ends in nearly the same pose is looped, with a short cross-fade, so that walks of
any length stay realistic. The clip is read without unpickling anything.

Requires ``pip install 'flyarchive[flygym]'``; ``import flyarchive`` never imports this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import mujoco
import numpy as np

from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import OptionsError, missing_dependency

__all__ = ["CAMERAS", "NmfWorld", "WalkPattern", "build_world", "check_walk", "simulate_walk", "walk_qpos"]

#: Camera presets accepted by :func:`build_world`, mapped to the camera's name in the model.
CAMERAS = {"tracking": "nmf/trackcam"}

_FLY_NAME = "nmf"
_CLIP_RESOURCE = ("flygym_demo", "spotlight_data/assets/spotlight_behavior_clip.npz")
_SMOOTH_WINDOW_S = 0.03  # Savitzky-Golay window, as flygym's MotionSnippet uses
_CROSSFADE_FRAMES = 10  # clip frames (30 ms at 330 Hz) blended at the loop seam
_RAMP_S = 0.05  # targets move from the neutral pose to the clip over this time
_POSITION_GAIN = 50.0  # kp of the position actuators, as in flygym's benchmark
_SPAWN_POSITION = (0.0, 0.0, 0.8)  # mm


@dataclass(frozen=True, eq=False)
class WalkPattern:
    """Recorded leg joint angles that loop seamlessly after the first pass.

    Attributes:
        angles: Target joint angles, shape ``(loop_end + 1, n_actuated)``, float64,
            radians, one row per clip frame, columns in actuator order. Row
            ``loop_end`` equals row ``loop_start``.
        fps: Clip frames per simulated second.
        loop_start: First clip frame of the looped stretch.
        loop_end: Clip frame at which playback jumps back to ``loop_start``.
    """

    angles: np.ndarray
    fps: float
    loop_start: int
    loop_end: int

    def at(self, time: float) -> np.ndarray:
        """Target joint angles at ``time`` simulated seconds, shape ``(n_actuated,)``, radians."""
        f = max(time, 0.0) * self.fps
        if f >= self.loop_end:
            period = self.loop_end - self.loop_start
            f = self.loop_start + math.fmod(f - self.loop_start, period)
        i = min(int(f), self.loop_end - 1)
        w = f - i
        return (1.0 - w) * self.angles[i] + w * self.angles[i + 1]


@dataclass(frozen=True, eq=False)
class NmfWorld:
    """A compiled NeuroMechFly world and what is needed to drive it.

    Attributes:
        model: The compiled model (``nq = 73``, ``nmocap = 0``, timestep 1e-4 s).
        cameras: Names of the cameras that film the fly, e.g. ``("nmf/trackcam",)``.
        actuator_ids: Position actuator index of each actuated leg DoF, shape ``(42,)``, int.
        adhesion_ids: Adhesion actuator index of each leg (lf, lm, lh, rf, rm, rh), shape ``(6,)``.
        neutral_key: Index of the ``neutral`` keyframe every world starts from.
        pattern: The walking pattern, columns in ``actuator_ids`` order.
        spec: The ``mujoco.MjSpec`` the model was compiled from (flygym's
            ``world.mjcf_root``): a recorder's ``model_source``, kept beside an archive as the
            model's portable form. None when the world was made without one.
    """

    model: mujoco.MjModel
    cameras: tuple[str, ...]
    actuator_ids: np.ndarray
    adhesion_ids: np.ndarray
    neutral_key: int
    pattern: WalkPattern
    spec: mujoco.MjSpec | None = field(default=None, repr=False)

    @property
    def neutral_targets(self) -> np.ndarray:
        """Position targets of the neutral pose, shape ``(42,)``, radians."""
        return np.asarray(self.model.key_ctrl[self.neutral_key][self.actuator_ids])


def build_world(*, camera: str = "tracking") -> NmfWorld:
    """Compose NeuroMechFly on flat ground with a camera that follows it.

    Args:
        camera: Camera preset; ``"tracking"`` is flygym's tracking camera (it moves
            with the thorax but keeps its orientation), named ``"nmf/trackcam"``.

    Returns:
        The compiled world, walking pattern and spec included (record it with
        ``TrajectoryRecorder(url, world.model, model_source=world.spec)`` to keep its
        portable form).

    Raises:
        OptionsError: for an unknown camera preset.
        MissingDependencyError: if flygym (with its bundled ``flygym_demo`` data) is
            not installed.
    """
    if camera not in CAMERAS:
        raise OptionsError(
            f"Unknown camera preset {camera!r}. Presets: {', '.join(map(repr, CAMERAS))}."
        )
    try:
        from flygym.anatomy import ActuatedDOFPreset, AxisOrder, JointPreset, Skeleton
        from flygym.compose import (
            ActuatorType,
            FlatGroundWorld,
            KinematicPosePreset,
            NeuroMechFly,
        )
        from flygym.utils.math import Rotation3D
    except ImportError:
        raise missing_dependency("flygym", "flygym", "The NeuroMechFly world") from None

    fly = NeuroMechFly(name=_FLY_NAME)
    neutral = KinematicPosePreset.NEUTRAL
    fly.add_joints(
        Skeleton(axis_order=AxisOrder.YAW_PITCH_ROLL, joint_preset=JointPreset.LEGS_ONLY),
        neutral_pose=neutral,
    )
    dofs = fly.skeleton.get_actuated_dofs_from_preset(ActuatedDOFPreset.LEGS_ACTIVE_ONLY)
    fly.add_actuators(
        dofs, actuator_type=ActuatorType.POSITION, kp=_POSITION_GAIN, neutral_input=neutral
    )
    fly.add_leg_adhesion()
    fly.colorize()
    fly.add_tracking_camera()
    arena = FlatGroundWorld()
    arena.add_fly(fly, _SPAWN_POSITION, Rotation3D("quat", (1, 0, 0, 0)))
    model, _ = arena.compile()

    order = fly.get_actuated_jointdofs_order(ActuatorType.POSITION)
    actuators = fly.jointdof_to_mjcfactuator_by_type[ActuatorType.POSITION]
    adhesion = [fly.leg_to_adhesionactuator[leg] for leg in fly.get_legs_order()]
    return NmfWorld(
        model=model,
        cameras=(CAMERAS[camera],),
        actuator_ids=_actuator_ids(model, [actuators[dof].name for dof in order]),
        adhesion_ids=_actuator_ids(model, [a.name for a in adhesion]),
        neutral_key=mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, "neutral"),
        pattern=_load_pattern(order),
        spec=arena.mjcf_root,
    )


def _actuator_ids(model: mujoco.MjModel, names: list[str]) -> np.ndarray:
    ids = np.array([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, n) for n in names])
    if (ids < 0).any():
        missing = [n for n, i in zip(names, ids) if i < 0]
        raise RuntimeError(f"Actuators {missing!r} are missing from the compiled model.")
    ids.setflags(write=False)
    return ids


def _load_pattern(order: list[Any]) -> WalkPattern:
    """Load flygym's Spotlight walking clip for the actuated DoFs in ``order`` (no pickle)."""
    from scipy.signal import savgol_filter

    try:
        path = resources.files(_CLIP_RESOURCE[0]) / _CLIP_RESOURCE[1]
        with resources.as_file(path) as local, np.load(local, allow_pickle=False) as clip:
            raw = np.asarray(clip["joint_angles"], dtype=np.float64)  # (frames, 6 legs, 7 dofs)
            legs = [str(leg) for leg in clip["legs"]]
            dofs_per_leg = [tuple(str(x) for x in row) for row in clip["dofs_per_leg"]]
            fps = float(clip["data_fps"])
    except (ImportError, FileNotFoundError, KeyError) as err:
        raise missing_dependency(
            "flygym_demo", "flygym", f"The walking pattern (flygym's Spotlight clip; {err})"
        ) from None
    # The clip uses SeqIKPy's global convention; NeuroMechFly mirrors right-leg roll and yaw.
    for leg_i, leg in enumerate(legs):
        for dof_i, (_, _, axis) in enumerate(dofs_per_leg):
            if leg.startswith("r") and axis in ("roll", "yaw"):
                raw[:, leg_i, dof_i] *= -1.0
    columns = [
        (legs.index(d.child.pos), dofs_per_leg.index((d.parent.link, d.child.link, d.axis.value)))
        for d in order
    ]
    angles = raw[:, [c[0] for c in columns], [c[1] for c in columns]]
    window = int(_SMOOTH_WINDOW_S * fps) | 1  # odd
    smooth = savgol_filter(angles, window_length=window, polyorder=3, axis=0)
    return _looping_pattern(smooth, fps)


def _looping_pattern(angles: np.ndarray, fps: float) -> WalkPattern:
    """Find the stretch whose ends match best in pose and velocity; cross-fade its seam."""
    n = len(angles)
    velocity = np.gradient(angles, axis=0)
    k = _CROSSFADE_FRAMES
    starts = np.arange(k, n // 2)
    ends = np.arange(n // 4 + k, n)
    d_pose = np.linalg.norm(angles[starts, None] - angles[None, ends], axis=-1)
    d_vel = np.linalg.norm(velocity[starts, None] - velocity[None, ends], axis=-1)
    cost = d_pose + 5.0 * d_vel
    cost[ends[None, :] - starts[:, None] < n // 4] = np.inf
    i, j = np.unravel_index(np.argmin(cost), cost.shape)
    start, end = int(starts[i]), int(ends[j])
    table = angles[: end + 1].copy()
    for f in range(end - k, end + 1):
        w = (f - (end - k)) / k
        table[f] = (1.0 - w) * angles[f] + w * angles[start - (end - f)]
    table.setflags(write=False)
    return WalkPattern(angles=table, fps=fps, loop_start=start, loop_end=end)


@dataclass(frozen=True)
class _Perturbation:
    time_offset: float  # seconds into the clip
    bias: np.ndarray  # (42,) radians added to every target


def _perturbation(world: NmfWorld, seed: int) -> _Perturbation:
    rng = np.random.default_rng(seed)
    n = len(world.actuator_ids)
    return _Perturbation(float(rng.uniform(0.0, 0.05)), rng.normal(0.0, 0.02, n))


def _apply_controls(world: NmfWorld, data: mujoco.MjData, p: _Perturbation) -> None:
    neutral = world.neutral_targets
    ramp = min(1.0, data.time / _RAMP_S)
    targets = world.pattern.at(data.time + p.time_offset) + p.bias
    data.ctrl[world.actuator_ids] = neutral + ramp * (targets - neutral)
    data.ctrl[world.adhesion_ids] = 1.0


def check_walk(n_worlds: Any, seconds: Any) -> None:
    """Raise OptionsError unless ``n_worlds`` is a whole number >= 1 and ``seconds`` a
    finite number >= 0 (what :func:`simulate_walk` takes)."""
    if not (isinstance(n_worlds, int) and not isinstance(n_worlds, bool) and n_worlds >= 1):
        raise OptionsError(f"n_worlds must be a positive integer, got {n_worlds!r}.")
    if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            and math.isfinite(seconds) and seconds >= 0):
        raise OptionsError(f"seconds must be a finite number >= 0, got {seconds!r}.")


def simulate_walk(
    world: NmfWorld,
    n_worlds: int,
    seconds: float,
    on_step: Callable[[list[mujoco.MjData]], object],
    *,
    seed: int = 0,
) -> list[mujoco.MjData]:
    """Step ``n_worlds`` walking flies on the CPU in lockstep, calling ``on_step`` each step.

    Every world starts from the neutral keyframe. World ``w`` replays the walking
    pattern shifted by its own offset (0-50 ms) with its own small per-joint bias
    (0.02 rad s.d.), both drawn from seed ``seed + w``, so worlds differ and every run
    with the same arguments gives bit-identical states. ``on_step(datas)`` is called
    once before the first step and after every step.

    Args:
        world: From :func:`build_world`.
        n_worlds: Number of worlds (>= 1).
        seconds: Simulated duration; ``round(seconds / timestep)`` steps are taken.
        on_step: Called with the list of ``MjData`` (host memory), one per world.
        seed: Base seed of the per-world perturbations.

    Returns:
        The ``MjData`` of every world after the last step.

    Raises:
        OptionsError: if ``n_worlds < 1`` or ``seconds`` is negative or not finite.
    """
    check_walk(n_worlds, seconds)
    model = world.model
    n_steps = round(seconds / model.opt.timestep)
    datas = [mujoco.MjData(model) for _ in range(n_worlds)]
    perturbations = [_perturbation(world, seed + w) for w in range(n_worlds)]
    for data in datas:
        mujoco.mj_resetDataKeyframe(model, data, world.neutral_key)
        mujoco.mj_forward(model, data)
    on_step(datas)
    for _ in range(n_steps):
        for data, p in zip(datas, perturbations):
            _apply_controls(world, data, p)
            mujoco.mj_step(model, data)
        on_step(datas)
    return datas


def walk_qpos(
    n_frames: int = 250,
    output_fps: float = 25.0,
    playback_speed: float = 0.2,
    dtype: np.typing.DTypeLike = np.float64,
    *,
    seed: int = 0,
    world: NmfWorld | None = None,
) -> np.ndarray:
    """A realistic NeuroMechFly walk sampled at the video cadence, for benchmarks.

    Frames are sampled as :class:`flyarchive.clock.FrameClock` schedules them (frame
    ``k`` at ``k * playback_speed / output_fps`` simulated seconds); the defaults give
    250 frames over 2 s of walking. Nothing is cached, on disk or in memory.

    Args:
        n_frames: Number of frames (>= 1).
        output_fps: Video frames per second.
        playback_speed: Video seconds per simulated second.
        dtype: Output dtype (float64 as the CPU records, float32 as the GPU does).
        seed: Seed of the world's perturbation (see :func:`simulate_walk`).
        world: A world from :func:`build_world`; built if None.

    Returns:
        qpos per frame, shape ``(n_frames, nq)`` (``nq = 73``), ``dtype``; free joint
        position in mm, quaternion w,x,y,z, hinge angles in radians.
    """
    if not (isinstance(n_frames, int) and n_frames >= 1):
        raise OptionsError(f"n_frames must be a positive integer, got {n_frames!r}.")
    world = build_world() if world is None else world
    model = world.model
    timing = Timing(model.opt.timestep, output_fps, playback_speed)
    clock = FrameClock(timing)
    out = np.empty((n_frames, model.nq), dtype=dtype)
    counter = {"step": 0, "frame": 0}

    def record(datas: list[mujoco.MjData]) -> None:
        if clock.is_due(counter["step"]) and counter["frame"] < n_frames:
            out[counter["frame"]] = datas[0].qpos
            counter["frame"] += 1
        counter["step"] += 1

    last_step = timing.frame_step(n_frames - 1)
    simulate_walk(world, 1, last_step * model.opt.timestep, record, seed=seed)
    return out
