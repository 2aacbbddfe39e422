"""The qpos/mocap layout of a MuJoCo model and its fingerprint.

An archive stores the layout of the model it was recorded with, never the model:
dof labels, joint names and types, mocap body names and a hash of them. Replay
checks a model against it with :func:`check_compatible`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from flyarchive.errors import LayoutMismatchError, SchemaError

__all__ = ["ModelLayout", "check_compatible"]

_JOINT_TYPES = {
    int(mujoco.mjtJoint.mjJNT_FREE): "free",
    int(mujoco.mjtJoint.mjJNT_BALL): "ball",
    int(mujoco.mjtJoint.mjJNT_SLIDE): "slide",
    int(mujoco.mjtJoint.mjJNT_HINGE): "hinge",
}
_SUFFIXES = {
    "free": ("x", "y", "z", "qw", "qx", "qy", "qz"),
    "ball": ("qw", "qx", "qy", "qz"),
    "slide": ("",),
    "hinge": ("",),
}


def _name(model: mujoco.MjModel, obj: mujoco.mjtObj, i: int, prefix: str) -> str:
    return mujoco.mj_id2name(model, obj, i) or f"{prefix}{i}"


@dataclass(frozen=True)
class ModelLayout:
    """The state layout of a model: what each qpos entry and mocap slot means.

    Attributes:
        joint_names: Joint names in qpos order (unnamed joints are ``joint{i}``).
        joint_types: ``"free"``, ``"ball"``, ``"slide"`` or ``"hinge"`` per joint.
        mocap_names: Names of the mocap bodies in mocap index order.
    """

    joint_names: tuple[str, ...]
    joint_types: tuple[str, ...]
    mocap_names: tuple[str, ...]

    @classmethod
    def from_model(cls, model: mujoco.MjModel) -> "ModelLayout":
        """Read the layout of a compiled model."""
        order = np.argsort(model.jnt_qposadr, kind="stable")
        names = tuple(_name(model, mujoco.mjtObj.mjOBJ_JOINT, int(j), "joint") for j in order)
        types = tuple(_JOINT_TYPES[int(model.jnt_type[j])] for j in order)
        mocap = [""] * model.nmocap
        for body in range(model.nbody):
            mocap_id = int(model.body_mocapid[body])
            if mocap_id >= 0:
                mocap[mocap_id] = _name(model, mujoco.mjtObj.mjOBJ_BODY, body, "body")
        return cls(names, types, tuple(mocap))

    @property
    def dof_labels(self) -> tuple[str, ...]:
        """One label per qpos entry: ``joint``, ``joint/x..qz`` (free), ``joint/qw..qz`` (ball)."""
        labels = []
        for name, kind in zip(self.joint_names, self.joint_types):
            labels += [f"{name}/{s}" if s else name for s in _SUFFIXES[kind]]
        return tuple(labels)

    @property
    def nq(self) -> int:
        """Number of generalized coordinates."""
        return sum(len(_SUFFIXES[kind]) for kind in self.joint_types)

    @property
    def nmocap(self) -> int:
        """Number of mocap bodies."""
        return len(self.mocap_names)

    @property
    def hash(self) -> str:
        """SHA-256 of the joint names and types and the mocap names (hex)."""
        payload = json.dumps([self.joint_names, self.joint_types, self.mocap_names])
        return hashlib.sha256(payload.encode()).hexdigest()

    def to_attrs(self) -> dict[str, Any]:
        """The JSON-friendly form stored in the archive's ``layout`` attribute."""
        return {
            "nq": self.nq,
            "nmocap": self.nmocap,
            "joint_names": list(self.joint_names),
            "joint_types": list(self.joint_types),
            "mocap_names": list(self.mocap_names),
            "hash": self.hash,
        }

    @classmethod
    def from_attrs(cls, attrs: Any) -> "ModelLayout":
        """Rebuild a layout from the archive's ``layout`` attribute.

        Raises:
            SchemaError: if the attribute is malformed or its hash does not match.
        """
        try:
            layout = cls(
                tuple(str(n) for n in attrs["joint_names"]),
                tuple(str(t) for t in attrs["joint_types"]),
                tuple(str(n) for n in attrs["mocap_names"]),
            )
            bad = [t for t in layout.joint_types if t not in _SUFFIXES]
            stored = (attrs["nq"], attrs["nmocap"], attrs["hash"])
        except (KeyError, TypeError) as err:
            raise SchemaError(
                f"The archive's 'layout' attribute is malformed ({err!r}). "
                "It needs nq, nmocap, joint_names, joint_types, mocap_names and hash."
            ) from None
        if bad or stored != (layout.nq, layout.nmocap, layout.hash):
            raise SchemaError(
                "The archive's 'layout' attribute is inconsistent: nq, nmocap or hash do not "
                "match its joint names and types. The attribute was edited or corrupted."
            )
        return layout


def check_compatible(archive: ModelLayout, model: ModelLayout, *, what: str = "model") -> None:
    """Raise if ``model`` cannot replay (or extend) a recording made with ``archive``.

    Raises:
        LayoutMismatchError: naming nq/nmocap on both sides and the first differing label.
    """
    if archive == model:
        return
    a_labels, m_labels = archive.dof_labels, model.dof_labels
    detail = _first_difference(a_labels, m_labels, "qpos label")
    if detail is None:
        detail = _first_difference(archive.joint_types, model.joint_types, "joint type")
    if detail is None:
        detail = _first_difference(archive.mocap_names, model.mocap_names, "mocap body")
    raise LayoutMismatchError(
        f"The {what} does not fit the archive: archive has nq={archive.nq}, "
        f"nmocap={archive.nmocap}; {what} has nq={model.nq}, nmocap={model.nmocap}; {detail}. "
        f"Pass the model the archive was recorded with (same joints in the same order)."
    )


def _first_difference(a: tuple[str, ...], b: tuple[str, ...], kind: str) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first differing {kind} at index {i}: archive {x!r}, model {y!r}"
    if len(a) != len(b):
        i = min(len(a), len(b))
        extra = a[i] if len(a) > len(b) else b[i]
        side = "archive" if len(a) > len(b) else "model"
        return f"first differing {kind} at index {i}: only the {side} has {extra!r}"
    return None
