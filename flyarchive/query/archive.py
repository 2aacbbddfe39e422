"""Open an archive as a lazy, validated, masked ``xarray.Dataset``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from flyarchive.errors import FlyarchiveError
from flyarchive.schema import STATE_VARS, validate
from flyarchive.store import unavailable
from flyarchive.store.reader import damaged_metadata, open_checked, open_stored, unreadable

__all__ = ["open_archive"]


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
