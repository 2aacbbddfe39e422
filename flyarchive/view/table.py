"""The world table on the server: filter by an expression, sort, and cut one page of rows;
two of its columns as the points of a scatter plot (:func:`scatter_points`), and the units
of the columns that are gait measures (:func:`column_units`).

The page never holds more than a page of rows; thousands of worlds stay smooth because
filtering and sorting are numpy operations over whole columns (4096 worlds: well under
a millisecond each).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from flyarchive.errors import SelectionError, did_you_mean
from flyarchive.view.expressions import evaluate
from flyarchive.view.logs import visible

#: Most rows one page may hold.
MAX_PAGE = 500


def query_table(columns: Mapping[str, np.ndarray], *, where: str = "", sort: str = "world",
                descending: bool = False, page: int = 0, page_size: int = 50) -> dict[str, Any]:
    """One page of the world table.

    Args:
        columns: Column name -> ``(n_worlds,)`` values (``world`` first).
        where: A filter expression (:mod:`flyarchive.view.expressions`); empty: every world.
        sort: The column to sort by (ties keep world order).
        descending: Largest first (NaN stays last either way).
        page: Page number from 0 (past the end: the last page).
        page_size: Rows per page, 1 to :data:`MAX_PAGE`.

    Returns:
        JSON-ready: ``columns`` (names), ``kinds`` (``"number"``, ``"bool"`` or
        ``"text"`` per column), ``rows`` (lists of values; NaN as None), ``total``
        (worlds), ``matched`` (worlds the filter keeps), ``page``, ``pages``,
        ``matched_worlds`` (every matching world id in sorted order, at most 100,000).

    Raises:
        SelectionError: a bad filter (see :func:`~flyarchive.view.expressions.evaluate`),
            an unknown sort column, or a page size out of range.
    """
    names = list(columns)
    if sort not in columns:
        raise SelectionError(f"No column {sort!r} to sort by. Columns: {', '.join(map(repr, names))}.")
    if not 1 <= page_size <= MAX_PAGE:
        raise SelectionError(f"A page holds 1 to {MAX_PAGE} rows, not {page_size!r}.")
    total = len(columns["world"])
    keep = evaluate(where, columns) if where.strip() else np.ones(total, dtype=bool)
    rows = np.flatnonzero(keep)
    order = _order(np.asarray(columns[sort])[rows], descending)
    rows = rows[order]
    pages = max(1, math.ceil(len(rows) / page_size))
    page = min(max(int(page), 0), pages - 1)
    shown = rows[page * page_size:(page + 1) * page_size]
    return {
        "columns": names,
        "kinds": [_kind(np.asarray(columns[n])) for n in names],
        "rows": [[_cell(columns[n][i]) for n in names] for i in shown],
        "total": total, "matched": int(len(rows)), "page": page, "pages": pages,
        "matched_worlds": [int(w) for w in np.asarray(columns["world"])[rows[:100_000]]],
    }


def _order(values: np.ndarray, descending: bool) -> np.ndarray:
    """A stable order of ``values``; NaN last, also when descending."""
    if values.dtype.kind == "f":
        nan = np.isnan(values)
        key = np.where(nan, 0.0, -values if descending else values)
        return np.lexsort((key, nan))
    if values.dtype.kind in "biu":
        key = values.astype(np.int64)
    else:  # text: by rank
        text = np.array([str(v) for v in values.ravel()], dtype=str)  # from any text dtype
        key = np.unique(text, return_inverse=True)[1].astype(np.int64)
    return np.argsort(-key if descending else key, kind="stable")


def _kind(values: np.ndarray) -> str:
    if values.dtype == bool:
        return "bool"
    return "number" if values.dtype.kind in "iuf" else "text"


def _cell(value: Any) -> Any:
    """A JSON value: numbers as numbers (NaN and infinities as None), text as text."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return str(value)


def scatter_points(columns: Mapping[str, np.ndarray], *, x: str, y: str,
                   where: str = "") -> dict[str, Any]:
    """Two numeric columns of the worlds a filter keeps, as points of a scatter plot.

    Args:
        columns: Column name -> ``(n_worlds,)`` values (``world`` first).
        x, y: The columns (numbers or true/false, as 1 and 0).
        where: A filter expression; empty: every world.

    Returns:
        JSON-ready: ``x``, ``y`` (the names), ``worlds`` (ids), ``xs``, ``ys`` (float64
        values) of the kept worlds whose two values are finite, in world order;
        ``matched`` (worlds the filter keeps) and ``missing`` (those of them left out: a
        NaN or infinite value).

    Raises:
        SelectionError: a column that does not exist (with the closest names) or holds
            text, or a bad filter (as :func:`query_table`).
    """
    for axis, name in (("x", x), ("y", y)):
        if name not in columns:
            numeric = [n for n in columns if _kind(np.asarray(columns[n])) != "text"]
            raise SelectionError(
                f"No world variable {visible(name, 60)!r} to plot on {axis}."
                f"{did_you_mean(name[:100], numeric)} Numeric ones: "
                f"{', '.join(map(repr, numeric))}.")
        if _kind(np.asarray(columns[name])) == "text":
            raise SelectionError(f"{name!r} holds text; a scatter plots numbers. Choose a numeric "
                                 "world variable.")
    total = len(columns["world"])
    keep = evaluate(where, columns) if where.strip() else np.ones(total, dtype=bool)
    xs = np.asarray(columns[x], dtype=np.float64)[keep]
    ys = np.asarray(columns[y], dtype=np.float64)[keep]
    finite = np.isfinite(xs) & np.isfinite(ys)
    ids = np.asarray(columns["world"])[keep][finite]
    return {"x": x, "y": y, "worlds": [int(w) for w in ids], "xs": xs[finite].tolist(),
            "ys": ys[finite].tolist(), "matched": int(keep.sum()),
            "missing": int((~finite).sum())}


def column_units(attrs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The unit of each column that has one: its stored ``units`` attribute (a world
    variable added as a DataArray with ``attrs={"units": ...}``; ``flyarchive gait --save``
    stores its measures so). Measures an earlier gait save stored without units (every
    measure of :data:`flyarchive.analyze.gait.MEASURES` there: ``distance`` mm,
    ``step_frequency_lf`` Hz...) get those of NeuroMechFly; a variable of yours that shares
    a measure's name gets none.

    Args:
        attrs: ``{column: its attributes}``.
    """
    from flyarchive.analyze.gait import MEASURES

    world = [name for name in MEASURES if "<leg>" not in name]
    saved = all(name in attrs for name in world)  # a gait save holds every measure
    found = {}
    for name, held in attrs.items():
        unit = held.get("units")
        if not isinstance(unit, str) and saved:
            per_leg = f"{name.rpartition('_')[0]}_<leg>"
            unit = (MEASURES.get(name) or MEASURES.get(per_leg) or ("",))[0]
        if isinstance(unit, str) and unit:
            found[name] = unit
    return found
