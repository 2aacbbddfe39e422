"""Keypoints: what :func:`flyarchive.positions` gives positions of, named and resolved
against a model.

A keypoint is one of

- a body's origin (``"nmf/lf_tarsus5"``): MuJoCo's ``xpos``;
- a site (``"nmf"``): MuJoCo's ``site_xpos``;
- a point fixed in a body's frame: ``points={"nmf/lf_tip": ("nmf/lf_tarsus5", (x, y, z))}``,
  ``(x, y, z)`` in the body's frame, in the model's length unit; or
  ``("nmf/lf_tarsus5", "tip")``: the point of the body's geoms farthest from its origin
  (the farthest mesh vertex; for other geoms the farthest corner of their bounding box),
  e.g. the claw end of a tarsus.

Names follow flygym 2.1's bodies, ``{fly}/{leg}_{segment}`` (``nmf/lf_tarsus5``,
``nmf/c_thorax``), and are picked by ``leg``, ``segment`` and ``fly`` as
:func:`flyarchive.select_dofs` picks dofs: :func:`keypoint_labels` (and
:func:`select_keypoints` on a positions array). :func:`tarsus_tips` names the six tarsus
tips of a fly as points (``nmf/lf_tip``...), which parse as leg ``lf``, segment ``tip``.

:func:`resolve` turns a request into a :class:`KeypointSet`: ids in a model, every
point's offset as numbers, and the definitions kept as provenance of stored positions.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import mujoco
import numpy as np

from flyarchive.errors import SelectionError
from flyarchive.query.dofs import as_names

if TYPE_CHECKING:
    import xarray as xr

#: flygym's legs: left/right x front/middle/hind.
LEGS = ("lf", "lm", "lh", "rf", "rm", "rh")
_KINDS = ("body", "site", "point")
_Data = TypeVar("_Data", "xr.Dataset", "xr.DataArray")
PointSpec = tuple[str, "Sequence[float] | str"]


@dataclass(frozen=True)
class KeypointName:
    """A keypoint label read as flygym's ``[fly/]{leg}_{segment}``.

    Attributes:
        label: The full label, e.g. ``"nmf/lf_tarsus5"``.
        fly: ``"nmf"``, or ``""`` without a prefix.
        leg: ``"lf"`` ... ``"rh"``, ``"c"`` (centre), ``"l"``/``"r"`` (eyes, antennae...).
        segment: ``"tarsus5"``, ``"thorax"``, ``"tip"``...
    """

    label: str
    fly: str
    leg: str
    segment: str

    @classmethod
    def parse(cls, label: str) -> "KeypointName | None":
        """Read a label; None if it does not follow the pattern."""
        fly, _, name = label.rpartition("/")
        leg, sep, segment = name.partition("_")
        if not sep or not leg or not segment:
            return None
        return cls(label, fly, leg.lower(), segment.lower())


@dataclass(frozen=True)
class KeypointRequest:
    """What a caller asked for, before it is checked against a model.

    Attributes:
        bodies: Body names (``"*"``: every body but the world); None: every body when
            nothing else is asked, else none.
        sites: Site names.
        points: ``{label: (body, (x, y, z) | "tip")}``.
        leg, segment, fly: Keep only keypoints whose label matches (None: any); see
            :func:`keypoint_labels`.
    """

    bodies: tuple[str, ...] | None = None
    sites: tuple[str, ...] = ()
    points: tuple[tuple[str, str, tuple[float, float, float] | str], ...] = ()
    leg: str | tuple[str, ...] | None = None
    segment: str | tuple[str, ...] | None = None
    fly: str | tuple[str, ...] | None = None

    @classmethod
    def of(cls, bodies: str | Iterable[str] | None = None, sites: str | Iterable[str] | None = None,
           points: Mapping[str, PointSpec] | None = None, *, leg: Any = None, segment: Any = None,
           fly: Any = None) -> "KeypointRequest":
        """A request from the arguments of :func:`flyarchive.positions` (checked for form).

        Raises:
            SelectionError: a point that is not ``(body, (x, y, z))`` or ``(body, "tip")``.
        """
        if points is not None and not isinstance(points, Mapping):
            raise SelectionError(
                f"points must be a mapping {{label: (body, (x, y, z))}} or {{label: (body, "
                f"'tip')}}, got {type(points).__name__} {points!r}.")
        return cls(as_names(bodies, "bodies") if bodies is not None else None,
                   as_names(sites, "sites") if sites is not None else (),
                   tuple(_point(label, spec) for label, spec in (points or {}).items()),
                   _selector(leg, "leg"), _selector(segment, "segment"), _selector(fly, "fly"))


def _selector(value: Any, what: str) -> str | tuple[str, ...] | None:
    """A selector as given (one text, or several as a tuple: hashable)."""
    return value if value is None or isinstance(value, str) else as_names(value, what)


def _point(label: Any, spec: Any) -> tuple[str, str, tuple[float, float, float] | str]:
    how = ("A point is {label: (body, (x, y, z))} with the offset in the body's frame, in the "
           "model's length unit, or {label: (body, 'tip')}")
    try:
        body, offset = spec
    except (TypeError, ValueError):
        raise SelectionError(f"Point {label!r} is {spec!r}. {how}.") from None
    if not isinstance(label, str) or not label or not isinstance(body, str):
        raise SelectionError(f"Point {label!r} = {spec!r} needs a text label and body. {how}.")
    if isinstance(offset, str):
        if offset != "tip":
            raise SelectionError(f"Point {label!r} has offset {offset!r}. {how}.")
        return label, body, offset
    try:
        xyz = tuple(float(v) for v in offset)
    except (TypeError, ValueError):
        xyz = ()
    if len(xyz) != 3 or not np.isfinite(xyz).all():
        raise SelectionError(f"Point {label!r} has offset {offset!r}, not 3 finite numbers. {how}.")
    return label, body, (xyz[0], xyz[1], xyz[2])


def tarsus_tips(fly: str = "nmf", legs: Sequence[str] = LEGS) -> dict[str, PointSpec]:
    """The tarsus tips of a flygym fly, as points: ``{"nmf/lf_tip": ("nmf/lf_tarsus5",
    "tip"), ...}`` (the end of each tarsus5 segment farthest from its joint)."""
    return {f"{fly}/{leg}_tip": (f"{fly}/{leg}_tarsus5", "tip") for leg in legs}


# ----------------------------------------------------------------------------- the model
def body_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """Names of the model's bodies but the world, in id order (unnamed ones ``body{i}``)."""
    return tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, i) or f"body{i}"
                 for i in range(1, model.nbody))


def site_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """Names of the model's sites, in id order (unnamed ones ``site{i}``)."""
    return tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SITE, i) or f"site{i}"
                 for i in range(model.nsite))


@dataclass(frozen=True)
class KeypointSet:
    """Keypoints resolved in a model: what a kinematics engine computes.

    Attributes:
        labels: One label per keypoint, the ``keypoint`` coordinate.
        kinds: ``"body"``, ``"site"`` or ``"point"`` per keypoint.
        bodies: Name of the body each keypoint is fixed in.
        body_ids: ``(K,)`` int: the body of each keypoint (its orientation is the body's).
        site_ids: ``(K,)`` int: the site of a site keypoint, -1 for the others.
        offsets: ``(K, 3)`` float64: a point's offset in its body's frame (a site's
            ``site_pos``; zeros for bodies), model length unit.
        quats: ``(K, 4)`` float64 (w, x, y, z): a site's ``site_quat``, identity otherwise.
    """

    labels: tuple[str, ...]
    kinds: tuple[str, ...]
    bodies: tuple[str, ...]
    body_ids: np.ndarray = field(repr=False)
    site_ids: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    quats: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.labels)

    def definitions(self) -> list[dict[str, Any]]:
        """JSON-friendly definitions (label, kind, body, offset), kept with stored positions."""
        return [{"label": label, "kind": kind, "body": body,
                 "offset": [float(v) for v in offset] if kind == "point" else None}
                for label, kind, body, offset in zip(self.labels, self.kinds, self.bodies,
                                                     self.offsets)]

    @property
    def digest(self) -> str:
        """SHA-256 of :meth:`definitions` (hex): equal definitions, equal digest."""
        return hashlib.sha256(json.dumps(self.definitions(), sort_keys=True).encode()).hexdigest()


def resolve(model: mujoco.MjModel, request: KeypointRequest) -> KeypointSet:
    """The keypoints of ``request`` in ``model``.

    Raises:
        SelectionError: an unknown body or site (naming close matches and how many
            exist), a point in a body that does not exist, two keypoints with one label,
            a selector (``leg``/``segment``/``fly``) that keeps nothing, or nothing asked.
    """
    bodies, sites = body_names(model), site_names(model)
    asked_bodies = request.bodies
    if asked_bodies is None:
        nothing_else = not request.sites and not request.points
        asked_bodies = bodies if nothing_else else ()
    rows: list[tuple[str, str, str, int, int, np.ndarray, np.ndarray]] = []
    identity = np.array([1.0, 0.0, 0.0, 0.0])
    if "*" in asked_bodies:  # every body, in id order, with the others asked after them
        asked_bodies = [*bodies, *(b for b in asked_bodies if b != "*" and b not in bodies)]
    for name in asked_bodies:
        b = _find(name, bodies, "body") + 1
        rows.append((name, "body", name, b, -1, np.zeros(3), identity))
    for name in request.sites:
        s = _find(name, sites, "site")
        body = int(model.site_bodyid[s])
        rows.append((name, "site", _body_name(bodies, body), body, s,
                     model.site_pos[s].copy(), model.site_quat[s].copy()))
    for label, body_name, offset in request.points:
        b = _find(body_name, bodies, "body", point=label) + 1
        xyz = tip_offset(model, b) if isinstance(offset, str) else np.asarray(offset, dtype=float)
        rows.append((label, "point", body_name, b, -1, xyz, identity))
    rows = _selected(rows, request)
    labels = [row[0] for row in rows]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise SelectionError(
            f"Keypoint labels {repeated} appear more than once (a body, site or point of one "
            "name, or one asked twice). Ask for each once, and give points labels of their own.")
    return KeypointSet(tuple(labels), tuple(r[1] for r in rows), tuple(r[2] for r in rows),
                       np.array([r[3] for r in rows], dtype=np.int64),
                       np.array([r[4] for r in rows], dtype=np.int64),
                       np.array([r[5] for r in rows], dtype=np.float64).reshape(-1, 3),
                       np.array([r[6] for r in rows], dtype=np.float64).reshape(-1, 4))


def _body_name(bodies: tuple[str, ...], body_id: int) -> str:
    return "world" if body_id == 0 else bodies[body_id - 1]


def _find(name: str, names: tuple[str, ...], kind: str, *, point: str | None = None) -> int:
    """Index of ``name`` in ``names``, or a SelectionError with close matches."""
    if name in names:
        return names.index(name)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    shown = ", ".join(map(repr, names[:12])) + (" ..." if len(names) > 12 else "")
    what = f"Point {point!r} is in body {name!r}, but there is no such body" if point \
        else f"No {kind} {name!r} in the model"
    raise SelectionError(
        f"{what}.{hint} The model has {len(names)} {_plural(kind, len(names))}"
        f"{': ' + shown if names else ''}. Pass one of them"
        f"{' (flyarchive.analyze.keypoints.body_names(model) lists them)' if kind == 'body' else ''}."
    )


def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else {"body": "bodies"}.get(kind, f"{kind}s")


def _selected(rows: list[Any], request: KeypointRequest) -> list[Any]:
    wanted = {"leg": request.leg, "segment": request.segment, "fly": request.fly}
    if all(v is None for v in wanted.values()):
        if not rows:
            raise SelectionError("No keypoint was asked for. Pass bodies=, sites= or points=.")
        return rows
    labels = [row[0] for row in rows]
    keep = set(keypoint_labels(labels, **{k: v for k, v in wanted.items()}))
    return [row for row in rows if row[0] in keep]


def tip_offset(model: mujoco.MjModel, body: int) -> np.ndarray:
    """``(3,)`` the point of body ``body``'s geoms farthest from its origin, in its frame:
    the farthest vertex of its mesh geoms, else the farthest corner of its geoms' bounding
    boxes.

    Raises:
        SelectionError: the body has no geom.
    """
    geoms = np.flatnonzero(model.geom_bodyid == body)
    if geoms.size == 0:
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, body)
        raise SelectionError(
            f"Body {name!r} has no geom, so it has no 'tip'. Give the point's offset as "
            "(x, y, z) in the body's frame instead.")
    corners = []
    for g in geoms:
        rot = np.empty(9)
        mujoco.mju_quat2Mat(rot, model.geom_quat[g])
        local = _geom_points(model, int(g))
        corners.append(local @ rot.reshape(3, 3).T + model.geom_pos[g])
    points = np.concatenate(corners)
    return points[np.argmax(np.einsum("ij,ij->i", points, points))].copy()


def _geom_points(model: mujoco.MjModel, g: int) -> np.ndarray:
    """A geom's mesh vertices, or its bounding box's corners, in the geom's frame."""
    if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and model.geom_dataid[g] >= 0:
        mesh = int(model.geom_dataid[g])
        start = int(model.mesh_vertadr[mesh])
        return np.asarray(model.mesh_vert[start:start + int(model.mesh_vertnum[mesh])], dtype=float)
    centre, half = model.geom_aabb[g, :3], model.geom_aabb[g, 3:]
    signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    return centre + signs * half


# ----------------------------------------------------------------------------- selectors
def keypoint_labels(
    data: xr.Dataset | xr.DataArray | Sequence[str],
    *,
    leg: str | Iterable[str] | None = None,
    segment: str | Iterable[str] | None = None,
    fly: str | Iterable[str] | None = None,
) -> list[str]:
    """The keypoint labels that match every criterion given, in their order.

    Args:
        data: Positions (with a ``keypoint`` coordinate), or the labels themselves (e.g.
            :func:`body_names` of a model).
        leg: ``"lf"``, ``"lm"``, ``"lh"``, ``"rf"``, ``"rm"``, ``"rh"``, ``"c"``... (any case).
        segment: ``"coxa"``, ``"trochanterfemur"``, ``"tibia"``, ``"tarsus1"`` ...
            ``"tarsus5"``, ``"thorax"``, ``"tip"``...
        fly: Fly name(s), e.g. ``"nmf"``.
        None for a criterion means any.

    Returns:
        The matching labels, e.g. ``["nmf/lf_tarsus5"]``.

    Raises:
        SelectionError: nothing matches; the message lists the legs, segments and flies
            that exist.
    """
    import xarray as xr

    from flyarchive.query.dofs import matching

    labels = [str(v) for v in (data["keypoint"].values
                               if isinstance(data, (xr.Dataset, xr.DataArray)) else data)]
    names = [n for n in map(KeypointName.parse, labels) if n is not None]
    return matching(labels, names, {"leg": leg, "segment": segment, "fly": fly}, "keypoint",
                    "as flygym names bodies ({fly}/{leg}_{segment})")


def select_keypoints(
    data: _Data,
    *,
    leg: str | Iterable[str] | None = None,
    segment: str | Iterable[str] | None = None,
    fly: str | Iterable[str] | None = None,
) -> _Data:
    """``data`` restricted to the keypoints that match (see :func:`keypoint_labels`).

    Example: ``select_keypoints(pos, leg="lf", segment="tip")`` is
    ``pos.sel(keypoint=["nmf/lf_tip"])``.

    Raises:
        SelectionError: if nothing matches.
    """
    return data.sel(keypoint=keypoint_labels(data, leg=leg, segment=segment, fly=fly))
