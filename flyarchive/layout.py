"""The qpos/mocap layout of a MuJoCo model and its fingerprint.

An archive stores the layout of the model it was recorded with, never the model:
dof labels, joint names and types, mocap body names and a hash of them. Replay
checks a model against it with :func:`check_compatible`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from flyarchive.errors import LayoutMismatchError, SchemaError

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


def _labels(name: str, kind: str) -> list[str]:
    return [f"{name}/{s}" if s else name for s in _SUFFIXES[kind]]


def _candidates(base: str) -> Iterator[str]:
    yield base
    yield f"{base}_unnamed"
    for k in itertools.count(2):
        yield f"{base}_unnamed{k}"


def _unique_names(
    model: mujoco.MjModel, obj: mujoco.mjtObj, ids: list[int], kinds: list[str], prefix: str
) -> tuple[str, ...]:
    """Names of objects ``ids``; an unnamed one is ``{prefix}{id}``, or, when a named object
    (or its labels) already uses that, ``{prefix}{id}_unnamed``, ``..._unnamed2``...

    Models without such a collision keep the names (and layout hashes) they always had.
    """
    names = [mujoco.mj_id2name(model, obj, i) or None for i in ids]
    taken = {label for name, kind in zip(names, kinds) if name for label in _labels(name, kind)}
    out = []
    for i, name, kind in zip(ids, names, kinds):
        if name is None:
            name = next(c for c in _candidates(f"{prefix}{i}")
                        if taken.isdisjoint(_labels(c, kind)))
            taken.update(_labels(name, kind))
        out.append(name)
    return tuple(out)


def _check_unique(labels: tuple[str, ...], what: str, fix: str) -> None:
    repeated = sorted(label for label, n in Counter(labels).items() if n > 1)
    if repeated:
        raise SchemaError(f"The {what} are not unique: {repeated[:5]} appear more than once. {fix}")


@dataclass(frozen=True)
class ModelLayout:
    """The state layout of a model: what each qpos entry and mocap slot means.

    Attributes:
        joint_names: Joint names in qpos order (unnamed joints are ``joint{i}``, or
            ``joint{i}_unnamed`` when a named joint is called ``joint{i}``).
        joint_types: ``"free"``, ``"ball"``, ``"slide"`` or ``"hinge"`` per joint.
        mocap_names: Names of the mocap bodies in mocap index order.
    """

    joint_names: tuple[str, ...]
    joint_types: tuple[str, ...]
    mocap_names: tuple[str, ...]

    @classmethod
    def from_model(cls, model: mujoco.MjModel) -> "ModelLayout":
        """Read the layout of a compiled model.

        Raises:
            SchemaError: if two qpos labels would be equal (a joint named like another
                joint's label); unnamed joints and bodies get names no other one uses.
        """
        order = [int(j) for j in np.argsort(model.jnt_qposadr, kind="stable")]
        types = tuple(_JOINT_TYPES[int(model.jnt_type[j])] for j in order)
        names = _unique_names(model, mujoco.mjtObj.mjOBJ_JOINT, order, list(types), "joint")
        bodies = sorted((int(model.body_mocapid[b]), b) for b in range(model.nbody)
                        if model.body_mocapid[b] >= 0)
        mocap = _unique_names(model, mujoco.mjtObj.mjOBJ_BODY, [b for _, b in bodies],
                              ["hinge"] * len(bodies), "body")
        layout = cls(names, types, mocap)
        _check_unique(layout.dof_labels, "model's qpos labels",
                      "A joint's name equals another joint's label (e.g. a hinge named 'root/x' "
                      "beside a free joint 'root'); rename it in the model.")
        return layout

    @property
    def dof_labels(self) -> tuple[str, ...]:
        """One label per qpos entry: ``joint``, ``joint/x..qz`` (free), ``joint/qw..qz`` (ball)."""
        labels = []
        for name, kind in zip(self.joint_names, self.joint_types):
            labels += _labels(name, kind)
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
        fix = ("Such an archive cannot tell its dofs apart by label; open it with "
               "xarray.open_zarr(url, consolidated=False) and select dofs by position.")
        _check_unique(layout.dof_labels, "archive's dof labels", fix)
        _check_unique(layout.mocap_names, "archive's mocap body names", fix)
        return layout


def check_compatible(archive: ModelLayout, model: ModelLayout, *, what: str = "model") -> None:
    """Raise if ``model`` cannot replay (or extend) a recording made with ``archive``.

    Raises:
        LayoutMismatchError: naming nq/nmocap on both sides and the first differing label.
    """
    detail = layout_difference(archive, model, what=what)
    if detail is not None:
        raise LayoutMismatchError(
            f"The {what} does not fit the archive: {detail}. Pass the model the archive was "
            "recorded with (same joints in the same order)."
        )


def layout_difference(archive: ModelLayout, model: ModelLayout, *, what: str = "model"
                      ) -> str | None:
    """How ``model``'s layout differs from ``archive``'s, in words (``"archive has nq=13,
    nmocap=1; model has nq=2, nmocap=0; first differing qpos label at index 0: ..."``);
    None when they are the same."""
    if archive == model:
        return None
    a_labels, m_labels = archive.dof_labels, model.dof_labels
    detail = _first_difference(a_labels, m_labels, "qpos label")
    if detail is None:
        detail = _first_difference(archive.joint_types, model.joint_types, "joint type")
    if detail is None:
        detail = _first_difference(archive.mocap_names, model.mocap_names, "mocap body")
    return (f"archive has nq={archive.nq}, nmocap={archive.nmocap}; {what} has nq={model.nq}, "
            f"nmocap={model.nmocap}; {detail}")


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


#: Largest difference allowed between a recorded model's ``qpos0`` and that of the model
#: its portable form compiles to (on this or another MuJoCo release), relative to the
#: value's magnitude (at least 1): MuJoCo's XML of an ``MjSpec`` writes 6 significant
#: digits, so that form compiles to within about 5e-7 relative. An MJCF source compiles
#: to the same qpos0 (1e-15 measured across MuJoCo 3.16 and 4.0.1).
QPOS0_TOLERANCE = 1e-6


def model_details(model: mujoco.MjModel) -> dict[str, list[Any]]:
    """What an archive records of its model besides the layout, to check a model compiled
    on another MuJoCo release: ``bodies`` (every body's name in id order, ``""`` when
    unnamed) and ``qpos0`` (the reference configuration, ``(nq,)`` floats), JSON-friendly."""
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, i) or "" for i in range(model.nbody)]
    return {"bodies": names, "qpos0": [float(v) for v in model.qpos0]}


def details_difference(recorded: Any, model: mujoco.MjModel) -> str | None:
    """How ``model`` differs from the bodies and ``qpos0`` an archive recorded
    (:func:`model_details`), in words; None when it does not (``qpos0`` within
    :data:`QPOS0_TOLERANCE` of ``max(1, |value|)``). Details the archive did not record are
    not compared."""
    have = model_details(model)
    bodies = recorded.get("bodies") if isinstance(recorded, dict) else None
    if isinstance(bodies, list):
        detail = _first_difference(tuple(map(str, bodies)), tuple(have["bodies"]), "body")
        if detail is not None:
            return f"archive has {len(bodies)} bodies, model has {len(have['bodies'])}; {detail}"
    qpos0 = recorded.get("qpos0") if isinstance(recorded, dict) else None
    if isinstance(qpos0, list):
        try:
            want = np.asarray(qpos0, dtype=np.float64)
        except (TypeError, ValueError):
            return "the archive's recorded qpos0 is not a list of numbers"
        got = np.asarray(have["qpos0"])
        if want.shape != got.shape:
            return f"archive records {want.size} qpos0 values, model has {got.size}"
        gap = np.abs(want - got) / np.maximum(1.0, np.abs(want))
        gap[np.isnan(gap)] = np.inf
        if not (gap <= QPOS0_TOLERANCE).all():
            i = int(np.argmax(gap))
            return (f"qpos0 differs at index {i}: archive {float(want[i])!r}, model "
                    f"{float(got[i])!r} (at most {QPOS0_TOLERANCE:g} of max(1, |value|) allowed)")
    return None


# ----------------------------------------------------------------------------- units
#: NeuroMechFly's length unit, the millimetre.
NMF_LENGTH_UNIT = "mm"
#: Another model's: MuJoCo models carry no unit.
MODEL_UNIT = "model unit"
#: The unit of a dof by its joint's type and its label's suffix (:mod:`flyarchive.layout`):
#: hinge angles in radians, slides and free-joint positions in the length unit (None
#: here), quaternion components without one.
_UNITS = {("hinge", ""): "rad", ("slide", ""): None, **{("free", a): None for a in "xyz"},
          **{(kind, q): "1" for kind in ("free", "ball") for q in ("qw", "qx", "qy", "qz")}}


def length_unit(layout_attrs: Any) -> str:
    """The length unit of the archive's model: mm for NeuroMechFly (joints named
    ``nmf/...``), else "model unit"."""
    names = layout_attrs.get("joint_names") if isinstance(layout_attrs, dict) else None
    nmf = isinstance(names, list) and any(str(n).startswith("nmf/") for n in names)
    return NMF_LENGTH_UNIT if nmf else MODEL_UNIT


def dof_units(layout_attrs: Any) -> dict[str, str]:
    """Each dof label's unit (``rad``, the length unit of :func:`length_unit`, ``1``) from
    the archive's ``layout`` attribute; empty when it cannot be read (the traces then say
    no unit)."""
    try:
        layout = ModelLayout.from_attrs(layout_attrs)
    except SchemaError:
        return {}
    length = length_unit(layout_attrs)
    units = {}
    for name, kind in zip(layout.joint_names, layout.joint_types):
        for label in (ModelLayout((name,), (kind,), ()).dof_labels):
            suffix = label[len(name) + 1:] if label != name else ""
            unit = _UNITS.get((kind, suffix), "")
            units[label] = length if unit is None else unit
    return units
