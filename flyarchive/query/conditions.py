"""``where`` masks from written conditions (the command line's ``--where-world-var
success=1`` and ``--where-dof 'joint>0.5'``): a world variable or a dof's ``qpos``
compared with a number, or a text world variable with a text (``genotype=='wt'``).

Comparisons follow numpy and xarray: where a world variable is NaN (a missing value),
``=``, ``>``, ``>=``, ``<`` and ``<=`` are False and ``!=`` is True, as ``ds.reward > 0.5``
is in Python; ``nan`` as the value compared with is refused (it equals nothing; select
missing values in Python with ``ds.reward.isnull()``).

In Python, compute the mask from the dataset itself (``ds.success == 1``,
``ds.genotype == "wt"``, ``ds.qpos.sel(dof="x") > 0.1``) and pass it as ``where=``
(:func:`flyarchive.query.selection.select_frames`).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import xarray as xr

from flyarchive.errors import SelectionError, did_you_mean

#: Comparison operators a condition may use (``=`` means ``==``).
OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le,
    ">": operator.gt, "<": operator.lt,
}
_CONDITION = re.compile(r"""\s*(.+?)\s*(==|!=|>=|<=|=|>|<)\s*('[^']*'|"[^"]*"|\S+)\s*""")


def parse_number(text: str) -> float | None:
    """A number, or ``true`` / ``false`` (1.0 / 0.0), from text; None if it is neither."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return float(lowered == "true")
    try:
        return float(text)
    except ValueError:
        return None


def parse_condition(text: str, option: str = "--where-world-var") -> tuple[str, str, float | str]:
    """``"success=1"`` -> ``("success", "==", 1.0)``; ``"genotype=='wt'"`` (or
    ``genotype=wt``) -> ``("genotype", "==", "wt")``.

    Operators: ``= == != > >= < <=``; the value a number, ``true`` / ``false``, or text:
    quoted (``'wt'``, ``"wt"``) or a word that is not a number.

    Raises:
        SelectionError: no operator, an empty name, or ``nan`` as the value (the message
            quotes ``option`` and the text).
    """
    found = _CONDITION.fullmatch(text)
    if found is None:
        raise SelectionError(
            f"Cannot read the condition {option} {text!r}; write NAME OPERATOR VALUE with one "
            f"of = == != > >= < <=, e.g. {option} success=1, {option} 'reward>0.5' or "
            f"{option} \"genotype=='wt'\"."
        )
    op = "==" if found.group(2) == "=" else found.group(2)
    raw = found.group(3)
    if raw[:1] in ("'", '"'):
        return found.group(1), op, raw[1:-1]
    value = parse_number(raw)
    if value is not None and math.isnan(value):
        raise SelectionError(
            f"The condition {option} {text!r} compares with NaN, which equals nothing (every "
            "comparison with it is False, but !=). NaN marks a missing value: select worlds "
            "whose value is missing in Python, with where=ds.NAME.isnull()."
        )
    return found.group(1), op, raw if value is None else value


def world_var_names(ds: xr.Dataset) -> list[str]:
    """The archive's per-world variables: ``(world,)`` data variables but ``n_frames``."""
    return sorted(str(n) for n, v in ds.data_vars.items() if v.dims == ("world",)
                  and n != "n_frames")


def world_var_mask(ds: xr.Dataset, name: str, op: str, value: float | str) -> xr.DataArray:
    """``ds[name] <op> value`` over ``(world,)``: a number (or bool) for a variable of
    numbers or bools, a text for a text variable (``==`` or ``!=`` only). ``n_frames``
    (the frames each world recorded) is compared as a world variable is.

    Raises:
        SelectionError: no world variable ``name`` (the message lists them and the
            closest names), or a value of the wrong kind for the variable.
    """
    names = world_var_names(ds)
    shown = f"{name}{op}{value:g}" if isinstance(value, float) else f"{name}{op}{value!r}"
    known = names + ["n_frames"] * ("n_frames" in ds.data_vars)  # and each world's frames
    if name not in known:
        raise SelectionError(
            f"--where-world-var {shown}: the archive has no world variable {name!r}."
            f"{did_you_mean(name, known)} World variables: "
            f"{', '.join(map(repr, names)) or 'none'}. Add one with "
            "`flyarchive set-world-var URL NAME=V1,V2,...` (or flyarchive.add_world_vars)."
        )
    text = ds[name].dtype.kind in "UTO"
    if text and not isinstance(value, str):
        raise SelectionError(
            f"--where-world-var {shown}: {name!r} holds text; compare it with a text in quotes, "
            f"e.g. \"{name}=='{value:g}'\".")
    if not text and isinstance(value, str):
        raise SelectionError(
            f"--where-world-var {shown}: {value!r} is not a number, and {name!r} holds "
            f"{ds[name].dtype} values; compare it with a number (or true / false).")
    if text and op not in ("==", "!="):
        raise SelectionError(
            f"--where-world-var {shown}: {name!r} holds text, which is compared with = or != "
            "only.")
    return OPERATORS[op](ds[name], value)


def dof_mask(ds: xr.Dataset, label: str, op: str, value: float | str) -> xr.DataArray:
    """``ds.qpos.sel(dof=label) <op> value`` over ``(world, time)``; frames past a world's
    ``n_frames`` (NaN) are False.

    Raises:
        SelectionError: no dof ``label`` (the message lists some, and the closest labels),
            or a value that is not a number.
    """
    labels = [str(d) for d in ds.dof.values]
    if isinstance(value, str):
        raise SelectionError(
            f"--where-dof {label}{op}{value!r}: {value!r} is not a number; a dof's qpos is "
            "compared with a number, e.g. --where-dof 'joint>0.5'.")
    if label not in labels:
        shown = ", ".join(map(repr, labels[:8])) + (" ..." if len(labels) > 8 else "")
        raise SelectionError(
            f"--where-dof {label}{op}{value:g}: the archive has no dof {label!r}."
            f"{did_you_mean(label, labels)} Dofs: {shown} (flyarchive.dof_labels lists them)."
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
