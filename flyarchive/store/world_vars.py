"""Per-world variables added to an archive after recording: :func:`add_world_vars`.

A world variable is a ``(world,)`` array of bools, numbers or text (a seed, a parameter,
a success flag, a reward, a genotype) stored beside the recorded state as its own zarr
array with dimension ``world``, so that ``open_archive`` (and plain ``xarray.open_zarr``)
shows it as a ``(world,)`` variable. Text is stored as zarr's variable-length UTF-8
``string`` data type (read back as numpy strings).

Non-finite floats are stored as given, as xarray stores them: NaN marks a missing value
(a world whose reward was never computed), and infinities are values. A condition on them
follows numpy and xarray: ``ds.reward > 0.5`` and ``ds.reward == x`` are False where the
reward is NaN, ``ds.reward != x`` is True there (``--where-world-var`` does the same, and
refuses ``nan`` as the value compared with, which equals nothing: select missing values
in Python with ``ds.reward.isnull()``).

Committed atomically: a reader sees a variable whole or not at all. Each variable is one
chunk; its chunk is written first, its ``zarr.json`` (which makes it exist) last, then
the consolidated copy of the metadata, if the archive has one. Replacing a variable
(``overwrite=True``) keeps its metadata and rewrites only its chunk, one object (a put
on object stores, a rename on local disk): a reader, even one that read the metadata
before, gets the old values or the new ones. So a replacement keeps the stored dtype:
values it cannot hold exactly (1.5 into an int64 variable) are refused.

Stored whole: the chunk is written even when every value equals the fill value (zarr
skips such chunks unless asked), and the metadata says so
(:data:`~flyarchive.schema.WHOLE_ATTR`), so a chunk found missing is damage (a file
deleted or lost), which readers refuse and ``verify`` names
(:mod:`flyarchive.store.chunk_holes`), never values. A variable added before flyarchive
marked them (an older archive) is read as it always was (a missing chunk gives the fill
value: its writer skipped a chunk of fill values) and is marked when it is replaced.

Writers take turns: :func:`add_world_vars` holds the archive's writer claim
(:mod:`flyarchive.store.claims`) while it writes, so it refuses, with
:class:`~flyarchive.errors.ArchiveInUseError` and before writing anything, an archive
that a recorder (or another ``add_world_vars``) is writing; add variables once the
recording is closed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.storage

from flyarchive.errors import OutputExistsError, SchemaError
from flyarchive.schema import STATE_VARS, TIME_COORDS, WHOLE_ATTR
from flyarchive.store.claims import WRITER_KEY, claim_archive, release
from flyarchive.store.location import as_url, sync, write_faults
from flyarchive.store.opener import open_for_writing
from flyarchive.zarr_internals import default_buffer_prototype
from flyarchive.archive_spec import RESERVED_NAMES, is_text, world_var_array, world_var_dtype

#: Names a world variable may not take: the archive's own arrays, groups and coordinates.
RESERVED_WORLD_VAR_NAMES = frozenset(RESERVED_NAMES | set(STATE_VARS) | set(TIME_COORDS))


def add_world_vars(
    url: str,
    variables: Mapping[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    takeover: bool = False,
) -> list[str]:
    """Add per-world variables to a recorded archive, each committed atomically.

    Example: ``add_world_vars("run.zarr", {"success": np.array([1, 0, 1, 1])})``; then
    ``open_archive("run.zarr").success`` is a ``(world,)`` variable, and
    ``render_videos(..., where=ds.success == 1)`` renders the successful worlds.

    Args:
        url: The archive (a local path or any fsspec URL).
        variables: ``{name: values}``, one value per world in the archive's world order
            (a sequence or array of shape ``(n_worlds,)``), or an ``xarray.DataArray``
            over ``world`` whose ``world`` coordinate holds exactly the archive's world
            ids (in any order: it is aligned). Bools, numbers (NaN and infinities kept as
            given) or text (``str``: e.g. ``["wt", "mutA", "wt"]``). A DataArray's
            ``units`` and ``description`` attributes (text) are stored with it, and read
            back as its attributes (a replacement without them keeps the stored ones).
        storage_options: Passed to fsspec.
        overwrite: Replace variables of these names added before (never the archive's
            own arrays).
        takeover: Take over the writer claim of a writer that crashed on another host.

    Returns:
        The names written, in the order given.

    Raises:
        SchemaError: a name that is not allowed (empty, with ``/``, or one of the
            archive's own: ``qpos``, ``time``, ``world``, ``models``...), values of
            another length than the worlds, of a dtype that is not bool, integer, float or
            text (objects, bytes, complex), or a DataArray whose world ids differ from
            the archive's; nothing is written.
        OutputExistsError: a variable of that name exists and ``overwrite`` is False.
        ArchiveNotFoundError: no archive at ``url``.
        ArchiveInUseError: a writer (a recorder, another ``add_world_vars``) holds the
            archive; nothing is written.
        StorageError: the storage failed; each variable is there whole or not at all.
    """
    url = as_url(url)
    with write_faults(url, storage_options, "Adding world variables to",
                      "Each variable is there whole or not at all; run the call again."):
        return _add(url, variables, storage_options, overwrite, takeover)


def _add(url: str, variables: Mapping[str, Any], storage_options: Mapping[str, Any] | None,
         overwrite: bool, takeover: bool) -> list[str]:
    group = open_for_writing(url, storage_options)
    if "n_frames" not in group or "world" not in group:
        raise SchemaError(
            f"The archive at {url!r} has no 'n_frames' or 'world' array: its creation did not "
            "finish. World variables are added to recorded archives."
        )
    world_ids = np.asarray(group["world"][:])
    if not isinstance(variables, Mapping) or not variables:
        raise SchemaError(
            f"variables must be a non-empty dict {{name: (n_worlds,) values}}, got {variables!r}.")
    prepared = {name: check_world_var(name, values, world_ids, url)
                for name, values in variables.items()}
    described = {name: _described(name, values) for name, values in variables.items()}
    store = group.store
    writer = claim_archive(store, url, takeover=takeover)
    try:  # every variable is encoded (and every refusal made) before anything is written
        objects = {name: _objects(group, name, values, url, overwrite, described[name])
                   for name, values in prepared.items()}
        created: dict[str, Any] = {}
        for name, encoded in objects.items():
            meta = encoded.pop("zarr.json", None)  # None: a replacement keeps its metadata
            for key, data in encoded.items():  # the chunk first...
                _put(store, f"{_key(group, name)}/{key}", data)
            if meta is not None:  # ...then the metadata, which makes the variable exist
                _put(store, f"{_key(group, name)}/zarr.json", meta)
                created[name] = json.loads(meta)
        if created:
            _update_consolidated(store, _key(group, "zarr.json"), created)
    finally:
        release(store, [WRITER_KEY], writer)
    return list(prepared)


def check_world_var(name: Any, values: Any, world_ids: np.ndarray, url: str = "") -> np.ndarray:
    """A world variable's values as a ``(n_worlds,)`` array in the archive's world order.

    Raises:
        SchemaError: see :func:`add_world_vars`.
    """
    n = len(world_ids)
    if not isinstance(name, str) or not name or "/" in name or name.startswith(".") \
            or name in RESERVED_WORLD_VAR_NAMES:
        raise SchemaError(
            f"World variable name {name!r} cannot be used: a name is a non-empty string "
            "without '/' or a leading '.', other than the archive's own names "
            f"{sorted(RESERVED_WORLD_VAR_NAMES)}. Rename it."
        )
    if isinstance(values, (str, bytes)):
        raise SchemaError(
            f"World variable {name!r} is the single value {values!r}; it must be {n} values, "
            f"one per world, e.g. [{values!r}] * {n}.")
    values = _aligned(name, values, world_ids, url)
    try:
        array = world_var_array(values)
    except (ValueError, TypeError) as err:
        raise SchemaError(
            f"World variable {name!r} cannot be stored: {err}. World variables hold bools, "
            "numbers or text (str), one per world; convert it, e.g. np.asarray(values, "
            "dtype=float) or [str(v) for v in values]."
        ) from None
    if array.shape != (n,):
        raise SchemaError(
            f"World variable {name!r} has shape {array.shape}; the archive at {url!r} has {n} "
            f"worlds (ids {_shown(world_ids)}), so it needs shape ({n},): one value per world, "
            "in the archive's world order."
        )
    return array


def _shown(ids: np.ndarray) -> str:
    listed = [int(w) for w in ids[:10]]
    return f"{listed}{'...' if len(ids) > 10 else ''}"


def _aligned(name: str, values: Any, world_ids: np.ndarray, url: str) -> Any:
    """An ``xarray.DataArray`` over ``world`` reordered to the archive's world ids."""
    import xarray as xr

    if not isinstance(values, xr.DataArray):
        return values
    if values.dims != ("world",):
        raise SchemaError(
            f"World variable {name!r} is a DataArray over {values.dims}; it must be over "
            "('world',).")
    if "world" not in values.coords:
        return values.values
    given = [int(w) for w in values["world"].values]
    if sorted(given) != sorted(int(w) for w in world_ids):
        raise SchemaError(
            f"World variable {name!r} is over world ids {_shown(np.asarray(given))} "
            f"({len(given)}); the archive at {url!r} has world ids {_shown(world_ids)} "
            f"({len(world_ids)}). Give one value for each of the archive's worlds."
        )
    return values.sel(world=world_ids).values


def _key(group: zarr.Group, name: str) -> str:
    root = group.path.strip("/")
    return f"{root}/{name}" if root else name


#: The attributes of a DataArray that a world variable keeps.
KEPT_ATTRS = ("units", "description")


def _described(name: str, values: Any) -> dict[str, str]:
    """The :data:`KEPT_ATTRS` of a DataArray's ``attrs`` (none for other values).

    Raises:
        SchemaError: one that is not text.
    """
    import xarray as xr

    if not isinstance(values, xr.DataArray):
        return {}
    kept = {key: values.attrs[key] for key in KEPT_ATTRS if key in values.attrs}
    for key, value in kept.items():
        if not isinstance(value, str):
            raise SchemaError(
                f"World variable {name!r} has the attribute {key}={value!r}; a world "
                f"variable keeps {' and '.join(KEPT_ATTRS)} as text. Pass "
                f"attrs={{{key!r}: str(...)}} or drop it. Nothing was written.")
    return kept


def _objects(group: zarr.Group, name: str, values: np.ndarray, url: str,
             overwrite: bool, described: Mapping[str, str]) -> dict[str, bytes]:
    """The objects to write for one variable: its chunk and (for a new one) ``zarr.json``.

    Raises:
        OutputExistsError: it exists and ``overwrite`` is False.
        SchemaError: something that is not a world variable has that name, or a
            replacement's values do not fit the stored dtype exactly.
    """
    key = _key(group, name)
    meta = sync(group.store.get(f"{key}/zarr.json", prototype=default_buffer_prototype()))
    if meta is None:
        if sync(_any(group.store, f"{key}/")):
            raise SchemaError(
                f"The archive at {url!r} holds objects under {name!r} that are not a world "
                "variable; choose another name.")
        return _encoded(values, None, described=described)
    try:
        parsed = json.loads(meta.to_bytes())
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict) or parsed.get("node_type") != "array" \
            or parsed.get("dimension_names") != ["world"]:
        raise SchemaError(
            f"The archive at {url!r} has a node {name!r} that is not a (world,) variable; "
            "choose another name.")
    if not overwrite:
        raise OutputExistsError(
            f"The archive at {url!r} already has the world variable {name!r}. Pass "
            "overwrite=True (--overwrite) to replace it, or choose another name.")
    return _encoded(values, meta.to_bytes(), name=name, described=described)


async def _any(store: Any, prefix: str) -> bool:
    async for _ in store.list_prefix(prefix):
        return True
    return False


def _encoded(values: np.ndarray, stored_meta: bytes | None, *, name: str = "",
             described: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """The objects of a one-chunk world-variable array: ``{"zarr.json": ..., "c/0": ...}``,
    as flyarchive writes world variables at creation (bytes, crc32c; the chunk written even
    when every value is the fill value, the metadata marked
    :data:`~flyarchive.schema.WHOLE_ATTR`); with ``stored_meta`` (a replacement) the chunk
    alone, encoded by that metadata, and the metadata marked if it was not (a variable
    added before flyarchive marked them) or given other attributes (``described``)."""
    objects: dict[str, Any] = {}
    memory = zarr.storage.MemoryStore(objects)
    proto = default_buffer_prototype()
    whole = {"write_empty_chunks": True}
    if stored_meta is None:
        array = zarr.create_array(
            memory, shape=values.shape, dtype=world_var_dtype(values), chunks=values.shape,
            dimension_names=["world"], compressors=[zarr.codecs.Crc32cCodec()],
            attributes={"description": "per-world variable (add_world_vars)",
                        **(described or {}), WHOLE_ATTR: True},
            config=whole,
        )
    else:
        objects["zarr.json"] = proto.buffer.from_bytes(stored_meta)
        array = zarr.open_array(memory, mode="r+", config=whole)
        values = _fitted(name, values, array)
    array[:] = values
    out = {key: buf.to_bytes() for key, buf in objects.items()}
    if stored_meta is not None:
        meta = json.loads(stored_meta)
        attributes = meta.get("attributes") if isinstance(meta.get("attributes"), dict) else {}
        wanted = {**attributes, **(described or {}), WHOLE_ATTR: True}
        if wanted == attributes:
            del out["zarr.json"]
        else:  # written after the chunk: a reader of either metadata reads the new chunk
            meta["attributes"] = wanted
            out["zarr.json"] = json.dumps(meta, indent=2).encode()
    return out


def _fitted(name: str, values: np.ndarray, array: zarr.Array) -> np.ndarray:
    """``values`` in the stored variable's dtype, if it holds them exactly."""
    if array.shape != values.shape:
        raise SchemaError(
            f"The world variable {name!r} is stored with shape {array.shape}; the new values "
            f"have shape {values.shape}.")
    dtype = np.dtype(array.dtype)
    if is_text(dtype) != is_text(values.dtype):
        raise SchemaError(
            f"The world variable {name!r} is stored as {'text' if is_text(dtype) else dtype}; a "
            f"replacement keeps it (so that readers never see a half-replaced variable), and "
            f"the new values are {'text' if is_text(values.dtype) else values.dtype}. Pass "
            f"{'text' if is_text(dtype) else 'numbers'}, or add them under another name.")
    if is_text(dtype):
        return values
    with np.errstate(all="ignore"):
        cast = values.astype(dtype)
    same = np.array_equal(cast.astype(values.dtype), values, equal_nan=values.dtype.kind == "f")
    if not same:
        raise SchemaError(
            f"The world variable {name!r} is stored as {dtype}; a replacement keeps it (so that "
            f"readers never see a half-replaced variable), and the new {values.dtype} values "
            f"do not fit it exactly. Pass values of dtype {dtype}, or add them under another "
            "name."
        )
    return cast


def _put(store: Any, key: str, data: bytes) -> None:
    sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))


def _update_consolidated(store: Any, root_key: str, written: Mapping[str, Any]) -> None:
    """Add the variables' metadata to the consolidated copy in the root ``zarr.json``, if
    the archive keeps one (a reader that uses it sees the variables from then on)."""
    raw = sync(store.get(root_key, prototype=default_buffer_prototype()))
    if raw is None:
        return
    root = json.loads(raw.to_bytes())
    copy = root.get("consolidated_metadata")
    if not isinstance(copy, dict) or not isinstance(copy.get("metadata"), dict):
        return
    copy["metadata"].update(written)
    document = json.dumps(root, indent=2).encode()
    sync(store.set(root_key, default_buffer_prototype().buffer.from_bytes(document)))
