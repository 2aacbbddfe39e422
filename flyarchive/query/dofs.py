"""Pick NeuroMechFly dofs by leg, joint and axis instead of by their full labels.

flygym 2.1 names a joint degree of freedom ``{parent}-{child}-{axis}`` after the two
body segments it connects, each ``{position}_{link}``, and prefixes it with the fly's
name: the left front leg's tibia-tarsus joint is ``nmf/lf_tibia-lf_tarsus1-pitch``,
its thorax-coxa yaw ``nmf/c_thorax-lf_coxa-yaw``. Here a dof is found by

- ``leg``: the position of the segment it moves (``"lf"``, ``"lm"``, ``"lh"``, ``"rf"``,
  ``"rm"``, ``"rh"``; any case);
- ``joint``: the link it moves, i.e. the child segment (``"coxa"``, ``"trochanterfemur"``,
  ``"tibia"``, ``"tarsus1"`` ... ``"tarsus5"``): ``joint="tarsus1"`` is the
  tibia-tarsus1 joint;
- ``axis``: ``"yaw"``, ``"pitch"`` or ``"roll"``;
- ``fly``: the fly's name, for worlds with several flies.

Labels that do not follow flygym's pattern (the free joint ``nmf/x`` ... ``nmf/qz``,
other models' joints) are never selected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from flyarchive.errors import SelectionError, did_you_mean

if TYPE_CHECKING:
    import xarray as xr

_Data = TypeVar("_Data", "xr.Dataset", "xr.DataArray")


@dataclass(frozen=True)
class DofName:
    """A dof label read as flygym's ``[fly/]{parent}-{child}-{axis}``.

    Attributes:
        label: The full label, e.g. ``"nmf/lf_tibia-lf_tarsus1-pitch"``.
        fly: The fly's name (``"nmf"``), or ``""`` without a prefix.
        leg: Position of the moved segment (``"lf"``; ``"c"`` for the body's center).
        joint: Link of the moved segment (``"tarsus1"``).
        axis: ``"yaw"``, ``"pitch"`` or ``"roll"``.
    """

    label: str
    fly: str
    leg: str
    joint: str
    axis: str

    @classmethod
    def parse(cls, label: str) -> "DofName | None":
        """Read a label; None if it does not follow flygym's pattern."""
        fly, _, name = label.rpartition("/")
        parts = name.split("-")
        if len(parts) != 3:
            return None
        child = parts[1].split("_", 1)
        if len(child) != 2 or not all(child) or not parts[2]:
            return None
        return cls(label, fly, child[0].lower(), child[1].lower(), parts[2].lower())


def as_names(value: str | Iterable[str], what: str) -> tuple[str, ...]:
    """A name or names as given (``"lf"``, ``["lf", "rf"]``) as a tuple of texts.

    Raises:
        SelectionError: ``value`` is neither a text nor a collection of texts (a number,
            a mapping...), naming ``what`` it was given as.
    """
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Mapping) and isinstance(items, Iterable):
        items = list(items)
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise SelectionError(
            f"{what} must be a name or a list of names (text), got {type(value).__name__} "
            f"{value!r}; give one text or a list of texts.")
    return tuple(items)


def _as_set(value: str | Iterable[str] | None, what: str) -> set[str] | None:
    if value is None:
        return None
    return {v.lower() for v in as_names(value, what)}


def dof_labels(
    data: xr.Dataset | xr.DataArray | Sequence[str],
    *,
    leg: str | Iterable[str] | None = None,
    joint: str | Iterable[str] | None = None,
    axis: str | Iterable[str] | None = None,
    fly: str | Iterable[str] | None = None,
) -> list[str]:
    """The dof labels that match every criterion given, in the archive's order.

    Args:
        data: A dataset or data array with a ``dof`` coordinate (e.g. from
            :func:`flyarchive.open_archive`), or the labels themselves.
        leg: Leg(s): ``"lf"``, ``"lm"``, ``"lh"``, ``"rf"``, ``"rm"``, ``"rh"`` (any case).
        joint: Link(s) the joint moves: ``"coxa"``, ``"trochanterfemur"``, ``"tibia"``,
            ``"tarsus1"``...
        axis: ``"yaw"``, ``"pitch"``, ``"roll"``.
        fly: Fly name(s), e.g. ``"nmf"``.
        None for a criterion means any.

    Returns:
        The matching labels, e.g. ``["nmf/lf_tibia-lf_tarsus1-pitch"]``.

    Raises:
        SelectionError: if nothing matches; the message lists the legs, joints and axes
            that exist.
    """
    import xarray as xr

    labels = [str(v) for v in (data["dof"].values if isinstance(data, (xr.Dataset, xr.DataArray))
                                else data)]
    names = [n for n in map(DofName.parse, labels) if n is not None]
    return matching(labels, names, {"leg": leg, "joint": joint, "axis": axis, "fly": fly},
                    "dof", "as flygym names joints")


def matching(labels: Sequence[str], names: Sequence[Any], asked: dict[str, Any], noun: str,
             named: str) -> list[str]:
    """The labels of ``names`` (parsed labels with a ``label`` and a field per key of
    ``asked``) whose every asked field is one of the values asked (any case; None: any).

    Raises:
        SelectionError: nothing matches, naming the values of every field that exist.
    """
    wanted = {key: _as_set(value, key) for key, value in asked.items()}
    found = [n.label for n in names
             if all(want is None or getattr(n, key) in want for key, want in wanted.items())]
    if not found:
        text = ", ".join(f"{k}={v!r}" for k, v in asked.items() if v is not None)

        def values(key: str) -> str:
            return ", ".join(sorted({getattr(n, key) for n in names})) or "none"

        plural = {"axis": "axes", "leg": "legs", "fly": "flies"}
        have = "; ".join(f"{plural.get(key, key + 's')} {values(key)}" for key in asked)
        raise SelectionError(
            f"No {noun} matches {text or 'the selection'}.{_closest(names, wanted)} Of "
            f"{len(labels)} {noun}s, {len(names)} are named {named}; they have {have}."
        )
    return found


def _closest(names: list[DofName], wanted: dict[str, set[str] | None]) -> str:
    """A "did you mean" for the first value asked for that no dof has (``joint="tarsus"``:
    ``" Did you mean 'tarsus1' or ..."``), else ``""``."""
    for key, want in wanted.items():
        have = {getattr(n, key) for n in names}
        for value in sorted(want or ()):
            if value not in have:
                hint = did_you_mean(value, sorted(have))
                if hint:
                    return f" No dof has {key} {value!r}.{hint}"
    return ""


def select_dofs(
    data: _Data,
    *,
    leg: str | Iterable[str] | None = None,
    joint: str | Iterable[str] | None = None,
    axis: str | Iterable[str] | None = None,
    fly: str | Iterable[str] | None = None,
) -> _Data:
    """``data`` restricted to the dofs that match (see :func:`dof_labels`).

    Example: ``flyarchive.select_dofs(ds.qpos, leg="lf", joint="tarsus1")`` is
    ``ds.qpos.sel(dof=["nmf/lf_tibia-lf_tarsus1-pitch"])``.

    Args:
        data: A dataset or data array with a ``dof`` dimension.
        leg, joint, axis, fly: As in :func:`dof_labels`.

    Returns:
        The same type as ``data``, with the matching dofs (a ``dof`` dimension is kept,
        even for one dof).

    Raises:
        SelectionError: if nothing matches.
    """
    return data.sel(dof=dof_labels(data, leg=leg, joint=joint, axis=axis, fly=fly))
