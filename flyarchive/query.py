"""Open an archive as a lazy, validated, masked ``xarray.Dataset``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr
import zarr

from flyarchive.errors import CorruptArchiveError, FlyarchiveError, SchemaError
from flyarchive.hardening import check_arrays
from flyarchive.schema import STATE_VARS, validate
from flyarchive.store import open_group, unavailable

__all__ = [
    "open_archive", "open_stored", "open_checked", "time_extents", "damaged_metadata",
    "corrupt_read", "unreadable",
]


_EXPECTED = ("qpos", "mocap_pos", "mocap_quat", "n_frames", "time", "world", "dof", "mocap")


def damaged_metadata(url: str, group: zarr.Group, err: BaseException) -> SchemaError:
    """The error for an archive whose arrays' metadata cannot be read, naming them."""
    bad = []
    for name in _EXPECTED:
        try:
            group[name]
        except KeyError:
            if name in ("qpos", "n_frames", "time", "world", "dof"):
                bad.append(f"{name!r} (missing)")
        except Exception:
            bad.append(f"{name!r} (unreadable metadata)")
    if any("'qpos' (missing)" == b for b in bad):
        return SchemaError(
            f"The archive at {url!r} has no variable 'qpos' (its zarr.json is missing). "
            "It cannot be replayed; restore the file from a backup."
        )
    return SchemaError(
        f"The archive at {url!r} has damaged metadata in {', '.join(bad) or 'an array'} "
        f"({type(err).__name__}: {err}). Run `flyarchive verify {url}`; restore the damaged "
        "zarr.json files from a backup."
    )


def open_checked(url: str, storage_options: Mapping[str, Any] | None = None) -> zarr.Group:
    """:func:`~flyarchive.store.open_group`, then every array's metadata checked against what
    flyarchive writes (:func:`flyarchive.hardening.check_arrays`) before any chunk is read.

    Raises:
        ArchiveNotFoundError, SchemaError (also for metadata nested too deep to parse).
    """
    try:
        group = open_group(url, storage_options)
    except RecursionError:
        raise SchemaError(
            f"The zarr metadata at {url!r} is nested too deeply to parse. Run "
            f"`flyarchive verify {url}`; restore the zarr.json files from a backup."
        ) from None
    check_arrays(group, str(url))
    return group


def unreadable(url: str, group: zarr.Group, err: BaseException) -> FlyarchiveError:
    """The error for an archive that xarray cannot open: a damaged chunk of a coordinate
    when one is found (named, with its file), else damaged metadata."""
    from flyarchive.integrity import damaged_chunks
    from flyarchive.localstore import UnsafeFileError

    for name in ("time", "world", "n_frames", "dof", "mocap", "xyz", "wxyz"):
        try:
            arr = group[name]
        except Exception:
            continue
        found = damaged_chunks(arr, limit=1)
        if found:
            if isinstance(found[0].error, UnsafeFileError):  # names its file already
                return found[0].error
            return corrupt_read(url, found[0].describe(), found[0].error)
    return err if isinstance(err, FlyarchiveError) else damaged_metadata(url, group, err)


def corrupt_read(url: str, what: str, err: BaseException) -> CorruptArchiveError:
    """The error for stored bytes that fail their checksum or do not decode."""
    return CorruptArchiveError(
        f"Reading {what} from {url!r} failed: {getattr(err, 'reason', err)}. The stored "
        f"bytes are damaged; run `flyarchive verify {url}` to list every damaged chunk."
    )


def time_extents(group: zarr.Group) -> dict[str, int]:
    """Length along ``time`` of every stored array that has that dimension."""
    return _extents(dict(group.arrays()))


def _extents(arrays: Mapping[str, zarr.Array]) -> dict[str, int]:
    out = {}
    for name, arr in arrays.items():
        dims = tuple(arr.metadata.dimension_names or ())
        if "time" in dims:
            out[name] = int(arr.shape[dims.index("time")])
    return out


def open_stored(group: zarr.Group, chunks: Mapping[str, int] | None = None) -> xr.Dataset:
    """The dataset as stored (not masked), lazy, from one consistent look at the archive.

    ``n_frames`` is read first (in memory), then each array's metadata exactly once:
    a writer grows every array before it commits, and extents only grow, so the
    extents seen are never below the ``n_frames`` seen, whatever a writer does
    meanwhile. Arrays may have different time extents (a commit in progress grows
    them one by one; a crash can stop it halfway): every array is cut to the
    shortest (committed frames never go beyond it).

    Args:
        group: The archive's root group.
        chunks: Dask chunk length per dimension; other dimensions follow the stored
            shards (or chunks). None: the stored shards.
    """
    import dask.array as da

    n_frames = np.asarray(group["n_frames"][:]) if "n_frames" in group else None
    arrays = dict(group.arrays())
    extents = _extents(arrays)
    n = min(extents.values()) if extents else 0
    variables, coords = {}, {}
    for name, arr in arrays.items():
        dims = tuple(arr.metadata.dimension_names or ())
        cut = tuple(slice(0, n) if d == "time" else slice(None) for d in dims)
        if name in dims:  # a coordinate: small, read now
            coords[name] = xr.Variable(dims, np.asarray(arr[cut]), dict(arr.attrs))
        elif name == "n_frames" and n_frames is not None:
            variables[name] = xr.Variable(dims, n_frames, dict(arr.attrs))
        else:
            stored = arr.shards or arr.chunks
            sizes = tuple((chunks or {}).get(d, c) for d, c in zip(dims, stored))
            data = da.from_zarr(arr, chunks=sizes)[cut]
            variables[name] = xr.Variable(dims, data, dict(arr.attrs))
    return xr.Dataset(variables, coords=coords, attrs=group.attrs.asdict())


def open_archive(url: str, storage_options: Mapping[str, Any] | None = None) -> xr.Dataset:
    """Open an archive: lazy (dask-backed), validated, masked beyond ``n_frames``.

    The time dimension ends at the last committed frame of any world; frames a
    world has not committed read as NaN. Plain ``xarray.open_zarr(url,
    consolidated=False)`` opens the same data without flyarchive, unmasked.

    Args:
        url: A local path or any fsspec URL (``s3://bucket/run.zarr``, ``memory://x``).
        storage_options: Passed to fsspec, e.g. ``{"key": ..., "secret": ...,
            "client_kwargs": {"endpoint_url": ...}}`` for S3.

    Returns:
        Dataset with ``qpos`` (world, time, dof), ``mocap_pos``/``mocap_quat`` when the
        model has mocap bodies, ``n_frames`` (world,) loaded in memory, and the archive's
        attributes (``timestep``, ``output_fps``, ``playback_speed``, ``layout``...).

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        SchemaError, SchemaVersionError: not a readable flyarchive archive.
        StorageBackendMissingError: the URL's protocol needs a package (names the extra).
    """
    group = open_checked(url, storage_options)
    for attempt in (1, 2):  # a second look, should a writer have changed it under the first
        try:
            ds = open_stored(group)
            break
        except (OSError, TimeoutError) as err:
            if isinstance(err, FlyarchiveError):
                raise
            if not isinstance(err, FileNotFoundError):
                raise unavailable(url, err) from None
            if attempt == 2:
                raise damaged_metadata(url, group, err) from None
        except Exception as err:  # zarr/xarray report damaged metadata in many ways
            if attempt == 2:
                raise unreadable(url, group, err) from None
    validate(ds)
    try:
        n_frames = ds["n_frames"].values.clip(0, ds.sizes["time"])
    except Exception as err:  # a checksum mismatch or bytes that do not decode
        raise unreadable(url, group, err) from None
    ds = ds.isel(time=slice(0, int(n_frames.max(initial=0))))
    ds["n_frames"] = ("world", n_frames.astype(np.int64), ds["n_frames"].attrs)
    committed = xr.DataArray(np.arange(ds.sizes["time"]), dims="time") < ds["n_frames"]
    for name in STATE_VARS:
        if name in ds:
            ds[name] = ds[name].where(committed)
    return ds
