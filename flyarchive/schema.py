"""Schema v1 of a flyarchive archive: names, dims, dtypes, attributes, validation, and
which frames of recorded state are usable (finite).

The schema is described for users in README.md, section "The archive". This module
knows the contract; it touches no storage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.codecs import CodecSpecError, parse_codec
from flyarchive.errors import SchemaError, SchemaVersionError
from flyarchive.layout import ModelLayout

if TYPE_CHECKING:
    import xarray as xr

#: Largest decoded chunk of a string array (labels, text world variables), bytes, and most
#: strings in one: what readers accept, and so what writers may write.
MAX_STRING_CHUNK_BYTES = 16 << 20
MAX_STRINGS = 1 << 20

#: Deepest nesting of lists and objects in metadata and attributes.
MAX_JSON_DEPTH = 64

SCHEMA_NAME = "flyarchive.trajectory"
SCHEMA_VERSION = 1

#: Variables that hold recorded state, with their dimensions.
STATE_VARS: dict[str, tuple[str, ...]] = {
    "qpos": ("world", "time", "dof"),
    "mocap_pos": ("world", "time", "mocap", "xyz"),
    "mocap_quat": ("world", "time", "mocap", "wxyz"),
}
#: Coordinates along ``time`` besides ``time`` (the scheduled time), with their dtypes:
#: the simulation time at which each frame was recorded and its index on the frame
#: schedule (-1: unknown). Archives written before flyarchive stored them lack them.
TIME_COORDS: dict[str, np.dtype] = {"sim_time": np.dtype("float64"), "frame": np.dtype("int64")}
#: Archive attribute that marks an import: its state, files, frames and the files' digest.
IMPORT_ATTR = "npz_import"
#: Attributes that replay needs, besides the schema name/version and the layout.
TIMING_ATTRS = ("timestep", "output_fps", "playback_speed")
#: Attributes written by flyarchive; user metadata may not reuse these names.
RESERVED_ATTRS = frozenset(
    {"flyarchive_schema", "flyarchive_schema_version", "layout", "source", "versions", "codec",
     "model", "portable_model", "appended_with"}
    | set(TIMING_ATTRS)
)
STATE_DTYPES = (np.dtype("float64"), np.dtype("float32"))

#: The group under an archive's root that holds its derived groups (``derived/<name>/``).
DERIVED_GROUP = "derived"
#: The attribute that makes a group a derived group, and holds its provenance: ``kind``
#: (e.g. ``"positions"``), ``source_archive_id``, ``model_sha256`` (the model's identity),
#: and what the kind defines.
DERIVED_ATTR = "derived"
#: Provenance entries that define, in order, the labels of a derived group's coordinate:
#: coordinate -> entry, a list of objects each with its ``label``.
LABELLED_PROVENANCE = {"keypoint": "keypoints"}


#: Attribute (``true``) of an array stored with every chunk written, even one that holds
#: only the fill value (zarr skips those unless asked): a world variable. A chunk missing
#: from it is damage, never its fill value. World variables written before flyarchive
#: marked them lack it (their reads of a missing chunk give the fill value: an old writer
#: skipped the chunk of values that all equal it).
WHOLE_ATTR = "stored_whole"


def is_world_var(name: str, dims: tuple[str, ...] | list[str]) -> bool:
    """Whether an array of an archive is a world variable: dims ``(world,)``, other than
    the ``world`` coordinate and ``n_frames``."""
    return tuple(dims) == ("world",) and name not in ("world", "n_frames")


def is_state(dims: tuple[str, ...] | list[str]) -> bool:
    """Whether a variable of these dimensions holds frames of worlds (``qpos``, mocap
    poses, a derived group's ``position``...): dims ``(world, time, ...)``. Every such
    array is read, masked and checked the same way, whatever it is named."""
    return tuple(dims[:2]) == ("world", "time")


def validate_attrs(attrs: Mapping[str, Any]) -> ModelLayout:
    """Check the archive-level attributes and return the recorded layout.

    Raises:
        SchemaError: if a required attribute is missing or malformed.
        SchemaVersionError: if the schema version is not one this flyarchive reads.
    """
    name = attrs.get("flyarchive_schema")
    if name != SCHEMA_NAME:
        raise SchemaError(
            f"This is not a flyarchive archive: attribute 'flyarchive_schema' is {name!r}, "
            f"expected {SCHEMA_NAME!r}. Open it with xarray.open_zarr instead, or record "
            "it with flyarchive."
        )
    depth = json_depth_of(dict(attrs))
    if depth > MAX_JSON_DEPTH:
        raise SchemaError(
            f"The archive's attributes are nested {depth} deep; flyarchive reads at most "
            f"{MAX_JSON_DEPTH} levels. The metadata was edited or corrupted; restore zarr.json."
        )
    version = attrs.get("flyarchive_schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"The archive has schema version {version!r}; this flyarchive reads version "
            f"{SCHEMA_VERSION}. Install the flyarchive release that wrote it, or convert it."
        )
    for key in TIMING_ATTRS:
        value = attrs.get(key)
        if not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
            raise SchemaError(
                f"Attribute {key!r} is {value!r}; it must be a positive number. "
                "The archive's metadata was edited or corrupted."
            )
    if "layout" not in attrs:
        raise SchemaError("The archive has no 'layout' attribute; replay cannot check models.")
    _check_types(attrs)
    return ModelLayout.from_attrs(attrs["layout"])


def _check_types(attrs: Mapping[str, Any]) -> None:
    """Refuse reserved attributes of the wrong type (a ``codec`` that is a string...)."""
    wrong = []
    if not isinstance(attrs["layout"], Mapping):
        wrong.append(("layout", "an object with nq, nmocap, joint_names, joint_types, "
                      "mocap_names and hash"))
    if "codec" in attrs:  # archives from before the codec option have none: lossless
        codec = attrs["codec"]
        spec = codec.get("spec") if isinstance(codec, Mapping) else None
        try:
            parse_codec(spec)
        except CodecSpecError:
            wrong.append(("codec", "an object whose 'spec' is 'lossless' or 'abs:<bound>'"))
    versions = attrs.get("versions", {})
    if not isinstance(versions, Mapping) or not all(
            isinstance(v, str) for v in versions.values()):
        wrong.append(("versions", "an object of package names to version strings"))
    if not isinstance(attrs.get("source", ""), str):
        wrong.append(("source", "a string such as 'mujoco'"))
    if wrong:
        name, expected = wrong[0]
        raise SchemaError(
            f"Attribute {name!r} is {str(attrs[name])[:80]!r} ({type(attrs[name]).__name__}); "
            f"it must be {expected}. The archive's metadata was edited or corrupted; restore "
            "zarr.json from a backup."
        )


def validate(ds: xr.Dataset) -> ModelLayout:
    """Check a dataset against schema v1 and return its layout.

    Args:
        ds: A dataset as stored (before masking), e.g. from ``xarray.open_zarr``, or an
            archive's header (:class:`flyarchive.store.header.ArchiveHeader`: the same
            interface, without state values).

    Returns:
        The model layout recorded in the attributes.

    Raises:
        SchemaError: naming the first thing that is off.
        SchemaVersionError: for a schema version this flyarchive cannot read.
    """
    layout = validate_attrs(ds.attrs)
    if "qpos" not in ds and isinstance(ds.attrs.get(DERIVED_ATTR), Mapping):
        raise SchemaError(
            "This holds values derived from an archive (e.g. positions kept with "
            "`flyarchive positions ... --to`), not the archive itself. Read positions with "
            "flyarchive.open_positions(url) (`flyarchive export-poses` and `verify` take it "
            "too), and the archive they came from with open_archive.")
    _check_var(ds, "qpos", STATE_VARS["qpos"], STATE_DTYPES)
    _check_var(ds, "n_frames", ("world",), (np.dtype("int64"),))
    _check_coord(ds, "world", np.dtype("int64"))
    _check_coord(ds, "time", np.dtype("float64"))
    for name, dtype in TIME_COORDS.items():
        if name in ds.variables:
            _check_time_coord(ds, name, dtype)
    labels = tuple(str(v) for v in ds["dof"].values) if "dof" in ds.coords else ()
    repeated = sorted(label for label, n in Counter(labels).items() if n > 1)
    if repeated:
        raise SchemaError(
            f"Coordinate 'dof' repeats the label(s) {repeated}; each dof must have its own "
            "label to be selected. The archive's metadata was edited or corrupted."
        )
    if labels != layout.dof_labels:
        raise SchemaError(
            f"Coordinate 'dof' has {len(labels)} labels that do not match the recorded layout "
            f"(nq={layout.nq}). The archive's metadata was edited or corrupted."
        )
    if layout.nmocap:
        for name in ("mocap_pos", "mocap_quat"):
            _check_var(ds, name, STATE_VARS[name], (ds["qpos"].dtype,))
        names = tuple(str(v) for v in ds["mocap"].values)
        if names != layout.mocap_names:
            raise SchemaError(
                f"Coordinate 'mocap' is {names!r}; the layout says {layout.mocap_names!r}."
            )
    elif "mocap_pos" in ds or "mocap_quat" in ds:
        raise SchemaError("The layout has no mocap bodies but the archive has mocap variables.")
    if len(np.unique(ds["world"].values)) != ds.sizes["world"]:
        raise SchemaError("Coordinate 'world' repeats a world id; each world must appear once.")
    return layout


def validate_derived(ds: xr.Dataset) -> dict[str, Any]:
    """Check a derived group against what flyarchive writes and return its provenance.

    A derived group is laid out as an archive: the source's schema attributes, ``n_frames``,
    ``world``, ``time`` (and ``sim_time``, ``frame``), and its own state variables of dims
    ``(world, time, ...)`` (:func:`is_state`), each other dimension labelled by a
    coordinate of distinct strings.

    Args:
        ds: The group as stored, or as opened (coordinates read).

    Returns:
        The ``derived`` attribute (its provenance).

    Raises:
        SchemaError: naming the first thing that is off.
        SchemaVersionError: for a schema version this flyarchive cannot read.
    """
    validate_attrs(ds.attrs)
    derived = ds.attrs.get(DERIVED_ATTR)
    if not isinstance(derived, Mapping) or not isinstance(derived.get("kind"), str) \
            or not isinstance(derived.get("source_archive_id", ""), (str, type(None))):
        raise SchemaError(
            f"Attribute {DERIVED_ATTR!r} is {str(derived)[:80]!r}; a derived group's provenance "
            "is an object with 'kind' and 'source_archive_id'. Its metadata was edited or "
            "corrupted.")
    _check_var(ds, "n_frames", ("world",), (np.dtype("int64"),))
    _check_coord(ds, "world", np.dtype("int64"))
    _check_coord(ds, "time", np.dtype("float64"))
    for name, dtype in TIME_COORDS.items():
        if name in ds.variables:
            _check_time_coord(ds, name, dtype)
    if len(np.unique(ds["world"].values)) != ds.sizes["world"]:
        raise SchemaError("Coordinate 'world' repeats a world id; each world must appear once.")
    states = [name for name, var in ds.data_vars.items() if is_state(var.dims)]
    other = sorted(name for name in ds.data_vars
                   if name not in states and name != "n_frames" and name not in TIME_COORDS)
    if other:
        raise SchemaError(
            f"Variable {other[0]!r} has dims {ds[other[0]].dims}; a derived group's values have "
            "dims (world, time, ...). Its metadata was edited or corrupted.")
    if not states:
        raise SchemaError(f"The derived group has no variable of dims (world, time, ...). "
                          f"Variables: {sorted(ds.data_vars)}.")
    for name in states:
        var = ds[name]
        if var.dtype not in STATE_DTYPES:
            raise SchemaError(f"Variable {name!r} has dtype {var.dtype}; derived values are "
                              "float64 or float32.")
        for dim in var.dims[2:]:
            _check_labels(ds, name, dim)
    for dim, entry in LABELLED_PROVENANCE.items():
        defined = derived.get(entry)
        if dim not in ds.coords or defined is None:
            continue
        named = [d.get("label") if isinstance(d, Mapping) else None
                 for d in (defined if isinstance(defined, list) else [defined])]
        labels = [str(v) for v in ds[dim].values]
        if named != labels:
            raise SchemaError(
                f"Coordinate {dim!r} is {labels[:8]!r}{'...' if len(labels) > 8 else ''}, but "
                f"the provenance defines {str(named[:8])[:200]}: the labels do not name the "
                "values they label. Its metadata was edited or corrupted.")
    return dict(derived)


def _check_labels(ds: xr.Dataset, name: str, dim: str) -> None:
    """A dimension of a derived state variable is labelled by distinct strings."""
    if dim not in ds.coords or ds[dim].dims != (dim,):
        raise SchemaError(f"Variable {name!r} has the dimension {dim!r} but the group has no "
                          f"coordinate {dim!r} that labels it.")
    values = ds[dim].values
    if values.dtype.kind not in "UOT" or not all(isinstance(v, str) for v in values.tolist()):
        raise SchemaError(f"Coordinate {dim!r} has dtype {values.dtype}; labels are strings.")
    repeated = sorted(label for label, n in Counter(values.tolist()).items() if n > 1)
    if repeated:
        raise SchemaError(f"Coordinate {dim!r} repeats the label(s) {repeated[:8]}; each must "
                          "be distinct to be selected. Its metadata was edited or corrupted.")


def _check_var(ds: xr.Dataset, name: str, dims: tuple[str, ...], dtypes: tuple[np.dtype, ...]) -> None:
    if name not in ds:
        raise SchemaError(f"The archive has no variable {name!r}. Variables: {sorted(ds.data_vars)}.")
    var = ds[name]
    if var.dims != dims:
        raise SchemaError(f"Variable {name!r} has dims {var.dims}; schema v1 wants {dims}.")
    if var.dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise SchemaError(f"Variable {name!r} has dtype {var.dtype}; schema v1 wants {wanted}.")


def _check_coord(ds: xr.Dataset, name: str, dtype: np.dtype) -> None:
    if name not in ds.coords:
        raise SchemaError(f"The archive has no coordinate {name!r}.")
    if ds[name].dtype != dtype:
        raise SchemaError(f"Coordinate {name!r} has dtype {ds[name].dtype}; schema v1 wants {dtype}.")


def _check_time_coord(ds: xr.Dataset, name: str, dtype: np.dtype) -> None:
    var = ds.variables[name]
    if var.dims != ("time",) or var.dtype != dtype:
        raise SchemaError(
            f"{name!r} has dims {var.dims} and dtype {var.dtype}; schema v1 wants ('time',) and "
            f"{dtype}. The archive's metadata was edited or corrupted."
        )


def import_status(attrs: Mapping[str, Any]) -> str | None:
    """How an archive's ``.npz`` import stands: None (not imported), ``"complete"``, or a
    sentence saying the import is partial and how to finish it."""
    marker = attrs.get(IMPORT_ATTR)
    if not isinstance(marker, Mapping):
        return None
    if marker.get("state") == "complete":
        return "complete"
    return (
        f"PARTIAL: an import of {marker.get('files')!s} .npz file(s) ({marker.get('frames')!s} "
        "frames) into this archive is in progress or was interrupted, so frames are missing. "
        "Finish it with the same files and model: flyarchive import-npz FILES --to URL --model "
        "MODEL --resume (API: import_npz(..., resume=True))."
    )


def json_depth_of(value: Any) -> int:
    """Deepest nesting of lists and mappings in a parsed value (iterative: no recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def finite_frames(*states: np.ndarray | None, frame_dims: int = 1) -> np.ndarray:
    """Which frames of recorded state hold only finite numbers (no NaN, no infinity).

    A frame is usable (recorded, replayed) only when every value of its ``qpos`` and
    mocap pose is finite; the recorders, replay, ``verify`` and the ``.npz`` import all
    ask this one question.

    Args:
        states: Arrays that share their leading ``frame_dims`` dimensions (e.g.
            ``qpos (n, nq)``, ``mocap_pos (n, nmocap, 3)``, ``mocap_quat (n, nmocap, 4)``;
            or ``(worlds, n, ...)`` with ``frame_dims=2``); None (no mocap) is skipped.
        frame_dims: How many leading dimensions index frames.

    Returns:
        Bool array of the leading shape: True where the frame is finite in every array.
    """
    present = [np.asarray(s) for s in states if s is not None]
    if not present:
        raise ValueError("finite_frames needs at least one array.")
    finite = np.ones(present[0].shape[:frame_dims], dtype=bool)
    for values in present:
        finite &= np.isfinite(values).all(axis=tuple(range(frame_dims, values.ndim)))
    return finite


# ----------------------------------------------------------------------------- consistency
# One sentence per problem, shared by the readers (which refuse: flyarchive.store.dataset)
# and verify (which lists it), so that both say the same of the same archive.

def sizes_problem(shapes: Mapping[str, tuple[tuple[str, ...], tuple[int, ...]]]) -> str | None:
    """The first variable whose length along a dimension other than ``time`` differs from
    that dimension's coordinate (or, without one, from the first variable along it).

    Args:
        shapes: ``{name: (dims, shape)}`` of every stored array, as its metadata says.

    Returns:
        One sentence, or None when every dimension has one length.
    """
    lengths: dict[str, tuple[str, int]] = {}
    for name, (dims, shape) in shapes.items():  # coordinates first: they set the length
        if tuple(dims) == (name,) and name != "time":
            lengths[name] = (f"coordinate {name!r}", int(shape[0]))
    for name in sorted(shapes):
        dims, shape = shapes[name]
        for dim, n in zip(dims, shape):
            if dim == "time":  # extents may differ while a commit grows them: n_frames says
                continue
            seen = lengths.setdefault(dim, (f"variable {name!r}", int(n)))
            if int(n) != seen[1]:
                return (f"Variable {name!r} has length {int(n)} along {dim!r}, but {seen[0]} "
                        f"has length {seen[1]}. The archive's metadata was edited or corrupted.")
    return None


def n_frames_problem(n_frames: np.ndarray, extent: int) -> str | None:
    """The commit markers outside ``0..extent`` (the shortest ``time`` extent of the
    stored arrays), as one sentence; None when they are inside."""
    n_frames = np.asarray(n_frames)
    if not ((n_frames < 0).any() or (n_frames > extent).any()):
        return None
    shown = [int(n) for n in n_frames[:16]]
    more = f" (first 16 of {len(n_frames)} worlds)" if len(n_frames) > 16 else ""
    return (f"n_frames {shown}{more} is outside 0..{extent} (the time extent): the commit "
            "markers are inconsistent with the stored frames.")


def times_problem(time: np.ndarray, sim_time: np.ndarray | None = None) -> str | None:
    """What is wrong with the times of the committed frames, as one sentence: ``time``
    (the schedule) must be finite and strictly increasing, ``sim_time`` (when stored)
    finite; None when they are sound.

    Args:
        time: ``(n,)`` ``time`` of the committed frames (``n`` = the largest ``n_frames``).
        sim_time: ``(n,)`` ``sim_time`` of the same frames, or None.
    """
    for name, values in (("time", time), ("sim_time", sim_time)):
        if values is not None and not np.isfinite(values).all():
            return (f"{name} has {int((~np.isfinite(values)).sum())} missing or non-finite "
                    f"values among the {len(values)} committed frames (a chunk is missing or "
                    "was never written).")
    if (np.diff(time) <= 0).any():
        return "time is not strictly increasing over the committed frames."
    return None


def derived_source_url(url: str) -> str | None:
    """The archive a derived group kept beside it belongs to (``.../run.zarr`` for
    ``.../run.zarr/derived/positions-1a2b``); None for any other URL (an archive of
    positions of its own, ``flyarchive positions --to``)."""
    head, _, name = str(url).rstrip("/").rpartition("/")
    archive, _, parent = head.rpartition("/")
    if parent != DERIVED_GROUP or not name or not archive or archive.endswith(":/"):
        return None
    return archive


def damage_advice(url: str, attrs: Mapping[str, Any]) -> str:
    """What to do about damage found at ``url``, an archive or a derived group (by its
    attributes): an archive's recorded states are restored from a backup; derived values
    are recomputed from their archive, which repairs what is damaged.

    Args:
        url: The archive or derived group, as the user gave it.
        attrs: Its root attributes (untrusted: only compared, never printed).
    """
    derived = attrs.get(DERIVED_ATTR) if isinstance(attrs, Mapping) else None
    if not isinstance(derived, Mapping):
        return (f"Run `flyarchive verify {url}` to list every problem; restore the archive "
                "from a backup.")
    positions = derived.get("kind") == "positions"
    archive = derived_source_url(url)
    if archive is None:
        again = (f"`flyarchive positions ARCHIVE --to {url}` again with the same keypoints"
                 if positions else "the command that made them again")
        return (f"These values were computed from an archive, whose recorded states are not "
                f"affected: run {again}, which recomputes what is damaged. `flyarchive verify "
                f"{url}` lists every problem.")
    again = (f"`flyarchive positions {archive}` again with the same keypoints" if positions
             else "the command that made it again")
    return (f"This derived group holds values computed from the archive at {archive!r}, "
            f"whose recorded states are not affected: run {again}, which recomputes what is "
            f"damaged. `flyarchive verify {archive}` lists every problem.")
