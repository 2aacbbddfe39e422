"""``where`` masks from written conditions (the command line's ``--where-world-var
success=1`` and ``--where-dof 'joint>0.5'``): a world variable or a dof's ``qpos``
compared with a number.

In Python, compute the mask from the dataset itself (``ds.success == 1``,
``ds.qpos.sel(dof="x") > 0.1``) and pass it as ``where=``
(:func:`flyarchive.query.frames.select_frames`).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import xarray as xr

from flyarchive.errors import SelectionError

__all__ = ["parse_condition", "parse_number", "world_var_mask", "dof_mask",
           "where_from_conditions", "OPERATORS", "world_var_names"]

#: Comparison operators a condition may use (``=`` means ``==``).
OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
    ">": operator.gt, "<": operator.lt,
}
_CONDITION = re.compile(r"\s*(.+?)\s*(==|!=|>=|<=|=|>|<)\s*(\S+)\s*")


def parse_number(text: str) -> float | None:
    """A number, or ``true`` / ``false`` (1.0 / 0.0), from text; None if it is neither."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return float(lowered == "true")
    try:
        return float(text)
    except ValueError:
        return None


def parse_condition(text: str, option: str = "--where-world-var") -> tuple[str, str, float]:
    """``"success=1"`` -> ``("success", "==", 1.0)``.

    Operators: ``= == != > >= < <=``; the value a number or ``true`` / ``false``.

    Raises:
        SelectionError: no operator, an empty name, or a value that is not a number
            (the message quotes ``option`` and the text).
    """
    found = _CONDITION.fullmatch(text)
    value = parse_number(found.group(3)) if found else None
    if found is None or value is None:
        raise SelectionError(
            f"Cannot read the condition {option} {text!r}; write NAME OPERATOR NUMBER with one "
            f"of = == != > >= < <=, e.g. {option} success=1 or {option} 'reward>0.5'."
        )
    op = "==" if found.group(2) == "=" else found.group(2)
    return found.group(1), op, value


def world_var_names(ds: xr.Dataset) -> list[str]:
    """The archive's per-world variables: ``(world,)`` data variables but ``n_frames``."""
    return sorted(str(n) for n, v in ds.data_vars.items() if v.dims == ("world",)
                  and n != "n_frames")


def world_var_mask(ds: xr.Dataset, name: str, op: str, value: float) -> xr.DataArray:
    """``ds[name] <op> value`` over ``(world,)``.

    Raises:
        SelectionError: no world variable ``name`` (the message lists them).
    """
    names = world_var_names(ds)
    if name not in names:
        raise SelectionError(
            f"--where-world-var {name}{op}{value:g}: the archive has no world variable {name!r}. "
            f"World variables: {', '.join(map(repr, names)) or 'none'}. Add one with "
            "`flyarchive set-world-var URL NAME=V1,V2,...` (or flyarchive.add_world_vars)."
        )
    return OPERATORS[op](ds[name], value)


def dof_mask(ds: xr.Dataset, label: str, op: str, value: float) -> xr.DataArray:
    """``ds.qpos.sel(dof=label) <op> value`` over ``(world, time)``; frames past a world's
    ``n_frames`` (NaN) are False.

    Raises:
        SelectionError: no dof ``label`` (the message lists some).
    """
    labels = [str(d) for d in ds.dof.values]
    if label not in labels:
        shown = ", ".join(map(repr, labels[:8])) + (" ..." if len(labels) > 8 else "")
        raise SelectionError(
            f"--where-dof {label}{op}{value:g}: the archive has no dof {label!r}. Dofs: {shown} "
            "(flyarchive.dof_labels lists them)."
        )
    return OPERATORS[op](ds.qpos.sel(dof=label), value)


def where_from_conditions(ds: xr.Dataset, world_vars: Sequence[str],
                          dofs: Sequence[str] = ()) -> xr.DataArray:
    """The mask of written conditions, all of which must hold.

    Args:
        ds: The archive (:func:`flyarchive.open_archive`).
        world_vars: Conditions on world variables, e.g. ``["success=1"]``.
        dofs: Conditions on dofs' ``qpos``, e.g. ``["slide>0.1"]``.

    Returns:
        Over ``(world,)`` with only world-variable conditions, else ``(world, time)``.

    Raises:
        SelectionError: an unreadable condition, an unknown name, or no condition.
    """
    masks = [world_var_mask(ds, *parse_condition(t, "--where-world-var")) for t in world_vars]
    masks += [dof_mask(ds, *parse_condition(t, "--where-dof")) for t in dofs]
    if not masks:
        raise SelectionError("No condition was given.")
    mask = masks[0]
    for other in masks[1:]:
        mask = mask & other
    return mask
