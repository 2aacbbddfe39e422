"""A synthetic six-legged walker whose gait is known: for tests of the gait measures,
examples and benchmarks.

Each tip cycles at ``frequency`` with a given duty factor and phase: in stance it stands
still on the ground; in swing (a share ``1 - duty`` of the cycle, from its lift-off at
phase 0) it lifts (height ``lift * sin(pi u)``, ``u`` the share of the swing done) and
moves forward by ``step_length``, its speed rising and falling over the first and last
``ramp`` of the swing and constant between (a brisk lift-off, as a fly's). The thorax
moves forward at the walking speed ``step_length * frequency``, 1.2 mm high; tips stand
0.02 mm above the ground in stance. Positions are in mm, times in s, labelled as
NeuroMechFly's (``nmf/c_thorax``, ``nmf/lf_tip``...), so the gait functions take them
with their defaults.

The walker also has a body (:func:`walker_model`: a thorax on a free joint and six tarsus
bodies on slide joints, named as NeuroMechFly's), so that its walk can be an archive
(:func:`walker_archive`) whose gait the archive's readers (positions, gait, the viewer)
find with their defaults.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

__all__ = ["WalkerGait", "TRIPOD", "TRACKED", "WALKER_XML", "walker_positions", "walker_poses",
           "write_walker_dlc", "walker_model", "walker_states", "walker_archive"]

_LEGS = ("lf", "lm", "lh", "rf", "rm", "rh")
_FOOT = {"lf": (0.9, 0.7), "lm": (0.0, 0.9), "lh": (-0.9, 0.7), "rf": (0.9, -0.7),
         "rm": (0.0, -0.9), "rh": (-0.9, -0.7)}  # tips' places around the thorax, mm
_STANCE_Z = 0.02  # mm


@dataclass(frozen=True)
class WalkerGait:
    """The walker's gait.

    Attributes:
        frequency: Step cycles per second, Hz.
        duty: Share of a cycle in stance.
        phases: Each leg's lift-off phase in cycles (``lf``, ``lm``, ``lh``, ``rf``,
            ``rm``, ``rh``), relative to a cycle starting at time 0.
        step_length: How far a tip moves in a swing, mm.
        lift: How high a tip rises in a swing, mm.
        ramp: Share of the swing over which the tip's speed rises (and falls at its end).
    """

    frequency: float = 9.3
    duty: float = 0.62
    phases: tuple[float, ...] = (0.0, 0.5, 0.02, 0.52, 0.04, 0.54)
    step_length: float = 1.0
    lift: float = 0.6
    ramp: float = 0.1


#: A tripod gait with a small front-to-back lag in each tripod (the default).
TRIPOD = WalkerGait()


def _tip(times: np.ndarray, gait: WalkerGait, phase: float) -> np.ndarray:
    """``(T, 3)``: one tip, its stance spot starting at x = 0."""
    cycles = times * gait.frequency - phase
    count = np.floor(cycles)
    u = np.clip((cycles - count) / (1.0 - gait.duty), 0.0, 1.0)  # share of the swing done
    swinging = (cycles - count) < 1.0 - gait.duty
    r = gait.ramp
    top = 1.0 / (1.0 - r)  # the constant speed's share of a step per share of the swing
    done = np.where(u < r, top * u * u / (2 * r),
                    np.where(u > 1 - r, 1 - top * (1 - u) ** 2 / (2 * r), top * (u - r / 2)))
    x = gait.step_length * (count + np.where(swinging, done, 1.0))
    z = _STANCE_Z + np.where(swinging, gait.lift * np.sin(np.pi * u), 0.0)
    return np.stack([x, np.zeros_like(x), z], axis=-1)


def walker_positions(fps: float, seconds: float, *, gait: WalkerGait = TRIPOD, worlds: int = 1,
                     noise: float = 0.0, seed: int = 0) -> xr.DataArray:
    """The walker's positions as :func:`flyarchive.positions` gives them.

    Args:
        fps: Frames per second (frame ``k`` at ``k / fps`` s).
        seconds: Length of the walk.
        gait: Its gait.
        worlds: Identical walkers (world ids 0...), each with its own noise.
        noise: Standard deviation of Gaussian noise added to every coordinate, mm.
        seed: Seed of the noise.

    Returns:
        ``(world, time, keypoint, xyz)`` float64: ``nmf/c_thorax`` then the six
        ``nmf/<leg>_tip``.
    """
    import xarray as xr

    times = np.arange(int(round(seconds * fps))) / fps
    speed = gait.step_length * gait.frequency
    thorax = np.stack([speed * times, np.zeros_like(times), np.full_like(times, 1.2)], axis=-1)
    tips = []
    for leg, phase in zip(_LEGS, gait.phases):
        tip = _tip(times, gait, phase)
        # the tip starts where it stands at time 0, so that it stays beside the thorax
        tip[:, 0] += _FOOT[leg][0] - gait.step_length * (1.0 - (phase % 1.0)) * 0.5
        tip[:, 1] += _FOOT[leg][1]
        tips.append(tip)
    one = np.stack([thorax, *tips], axis=1)  # (T, 7, 3)
    values = np.repeat(one[None], worlds, axis=0)
    if noise:
        values = values + np.random.default_rng(seed).normal(0.0, noise, values.shape)
    labels = ["nmf/c_thorax", *(f"nmf/{leg}_tip" for leg in _LEGS)]
    return xr.DataArray(values, dims=("world", "time", "keypoint", "xyz"),
                        coords={"world": np.arange(worlds), "time": times, "keypoint": labels,
                                "xyz": ["x", "y", "z"]}, attrs={"units": "mm"})


def walker_poses(fps: float, seconds: float, *, gait: WalkerGait = TRIPOD, individuals: int = 1,
                 noise: float = 0.0, seed: int = 0, dims: int = 2) -> xr.Dataset:
    """The walker as a ``movement`` poses dataset, named as a tracked fly's keypoints
    (``thorax``, ``L1_tip``, ``L2_tip``, ``L3_tip``, ``R1_tip``... for lf, lm, lh, rf...),
    individuals ``fly0``..., confidence 1; ``dims=2`` keeps x and y only (a camera from
    above), 3 keeps z (Anipose). Needs movement."""
    from movement.io import load_poses

    pos = walker_positions(fps, seconds, gait=gait, worlds=individuals, noise=noise, seed=seed)
    values = np.asarray(pos.transpose("time", "xyz", "keypoint", "world").values)[:, :dims]
    return load_poses.from_numpy(values, np.ones((values.shape[0], *values.shape[2:])),
                                 individual_names=[f"fly{i}" for i in range(individuals)],
                                 keypoint_names=list(TRACKED), fps=fps,
                                 source_software="flyarchive.testing")


#: The tracked keypoint of each walker keypoint, and the legs they are.
TRACKED = {"thorax": "nmf/c_thorax", "L1_tip": "lf", "L2_tip": "lm", "L3_tip": "lh",
           "R1_tip": "rf", "R2_tip": "rm", "R3_tip": "rh"}


def write_walker_dlc(path: str | Path, fps: float = 200.0, seconds: float = 2.0, *,
                     individuals: Sequence[str] = ("fly0",), noise: float = 0.005,
                     seed: int = 0) -> Path:
    """Write the walker as a DeepLabCut ``.csv`` (x, y in mm, likelihood 1), as a lab's
    tracking would give it; ``movement.io.load_poses.from_dlc_file(path, fps=fps)`` reads
    it back. Needs movement. Returns the path."""
    from movement.io import save_poses

    ds = walker_poses(fps, seconds, individuals=len(individuals), noise=noise, seed=seed)
    ds = ds.assign_coords(individual=list(individuals))
    path = Path(path)
    save_poses.to_dlc_file(ds, path, split_individuals=False)
    return path


#: The walker's body, in mm: the thorax ``nmf/c_thorax`` on a free joint, and per leg a
#: tarsus ``nmf/<leg>_tarsus5`` on three slide joints (x, y, z in the thorax's frame), its
#: tip (the point of its geom farthest from its origin) the walker's tip. Camera ``top``
#: looks down on the walk; ``side`` follows the thorax.
WALKER_XML = """
<mujoco model="walker">
  <option timestep="0.002"/>
  <visual><global offwidth="640" offheight="480"/><quality shadowsize="512"/></visual>
  <worldbody>
    <light pos="0 0 30" dir="0 0 -1" directional="true"/>
    <geom name="floor" type="plane" size="40 40 0.1" rgba="0.35 0.35 0.35 1"/>
    <camera name="top" pos="4 0 14" xyaxes="1 0 0 0 1 0"/>
    <body name="nmf/c_thorax" pos="0 0 1.2">
      <freejoint name="nmf/root"/>
      <camera name="side" pos="0 -6 1.5" xyaxes="1 0 0 0 0.2 1"/>
      <geom type="ellipsoid" size="0.9 0.45 0.3" rgba="0.75 0.45 0.2 1"/>
{legs}
    </body>
  </worldbody>
</mujoco>
""".replace("{legs}", "\n".join(
    f"""      <body name="nmf/{leg}_tarsus5" pos="{x} {y} 0">
        <joint name="nmf/{leg}_x" type="slide" axis="1 0 0"/>
        <joint name="nmf/{leg}_y" type="slide" axis="0 1 0"/>
        <joint name="nmf/{leg}_z" type="slide" axis="0 0 1"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.6" size="0.05" rgba="0.2 0.2 0.25 1"
              contype="0" conaffinity="0"/>
      </body>""" for leg, (x, y) in _FOOT.items()))


def walker_model() -> mujoco.MjModel:
    """The walker's body (:data:`WALKER_XML`, nq = 7 + 18)."""
    import mujoco

    return mujoco.MjModel.from_xml_string(WALKER_XML)


def walker_states(model: mujoco.MjModel, positions: xr.DataArray) -> np.ndarray:
    """The states of :func:`walker_model` that put its thorax and tarsus tips where
    ``positions`` has them (the thorax upright, facing +x).

    Args:
        model: :func:`walker_model`.
        positions: ``(world, time, keypoint, xyz)`` as :func:`walker_positions` gives them.

    Returns:
        ``(world, time, nq)`` qpos.
    """
    import mujoco

    from flyarchive.analyze.keypoints import tip_offset

    values = np.asarray(positions.values, dtype=np.float64)
    labels = [str(k) for k in positions.keypoint.values]
    thorax = values[:, :, labels.index("nmf/c_thorax")]
    qpos = np.zeros(values.shape[:2] + (model.nq,))
    qpos[..., 0:3] = thorax
    qpos[..., 3] = 1.0  # upright, facing +x
    for leg in _LEGS:
        body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f"nmf/{leg}_tarsus5")
        joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, f"nmf/{leg}_x")
        at = int(model.jnt_qposadr[joint])
        tip = values[:, :, labels.index(f"nmf/{leg}_tip")]
        qpos[..., at:at + 3] = tip - thorax - model.body_pos[body] - tip_offset(model, body)
    return qpos


def walker_archive(url: str, gaits: Sequence[WalkerGait] = (TRIPOD,), *, frames: int = 100,
                   noise: float = 0.0, spread: float = 0.0) -> str:
    """An archive of :func:`walker_model` walking: world ``w`` with ``gaits[w]``, ``frames``
    frames at 125 frames/s (frame ``k`` at ``k * 0.008`` s), starting ``w * spread`` mm to
    the left (+y) of the origin, the model kept beside it. Returns ``url``."""
    from flyarchive.testing.fixtures import write_states

    model = walker_model()
    walks = []
    for w, gait in enumerate(gaits):
        positions = walker_positions(125.0, frames / 125.0, gait=gait, noise=noise, seed=w)
        positions.loc[{"xyz": "y"}] = positions.sel(xyz="y") + w * spread
        walks.append(walker_states(model, positions))
    qpos = np.concatenate(walks)
    return write_states(url, model, qpos, chunk_frames=25)
