"""Open an archive as a lazy, validated, masked ``xarray.Dataset``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xarray as xr

from flyarchive.errors import FlyarchiveError, UnsafeFileError
from flyarchive.schema import validate
from flyarchive.store import unavailable
from flyarchive.store.dataset import open_dataset
from flyarchive.store.reader import damaged_metadata, open_checked, unreadable

__all__ = ["open_archive"]


def open_archive(url: str, storage_options: Mapping[str, Any] | None = None) -> xr.Dataset:
    """Open an archive: lazy (dask-backed), validated, masked beyond ``n_frames``.

    The time dimension ends at the last committed frame of any world; frames a
    world has not committed read as NaN. A selection reads only the stored chunks it
    touches (one world of 1024 reads about its own bytes), and a damaged chunk fails
    only the reads that touch it, naming its worlds, frames and file. The dataset keeps
    the indexes of the shards that can no longer change (all their frames below every
    world's ``n_frames``): a second query of the same shards on S3 makes one request per
    shard, and one more to check that the archive is still the one opened (its
    ``archive_id``). Opening reads the metadata (on S3 one request: the root
    ``zarr.json``, which holds every array's metadata, consolidated), then ``n_frames``
    and the coordinates in one concurrent round of requests. Plain
    ``xarray.open_zarr(url)`` opens the same data without flyarchive, unmasked (and
    without warnings: the consolidated metadata is there).

    Args:
        url: A local path or any fsspec URL (``s3://bucket/run.zarr``, ``memory://x``).
        storage_options: Passed to fsspec, e.g. ``{"key": ..., "secret": ...,
            "client_kwargs": {"endpoint_url": ...}}`` for S3.

    Returns:
        Dataset with ``qpos`` (world, time, dof), ``mocap_pos``/``mocap_quat`` when the
        model has mocap bodies, ``n_frames`` (world,) loaded in memory, and the archive's
        attributes (``timestep``, ``output_fps``, ``playback_speed``, ``layout``...).
        Dask chunks are whole shards of worlds by several stored chunks of frames.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        SchemaError, SchemaVersionError: not a readable flyarchive archive.
        StorageBackendMissingError: the URL's protocol needs a package (names the extra).
        CorruptArchiveError: when computing, for damaged stored bytes (names the chunk).
        ArchiveReplacedError (a StorageError): when computing, once the archive was
            replaced (written again with ``mode="w"``) or deleted after it was opened:
            the dataset never mixes two archives; open it again.
    """
    try:
        group = open_checked(url, storage_options)
    except UnsafeFileError:  # a writer replaced a metadata file as it was read: look again
        group = open_checked(url, storage_options)
    for attempt in (1, 2):  # a second look, should a writer have changed it under the first
        try:
            ds = open_dataset(url, storage_options, group)
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
    return ds
