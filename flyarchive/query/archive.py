"""Open an archive as a lazy, validated, masked ``xarray.Dataset`` (:func:`open_archive`).
Its header alone, without xarray or dask, is the store's
(:func:`flyarchive.store.dataset.open_header`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flyarchive.schema import validate
from flyarchive.store import dataset
from flyarchive.store.location import absolute_url, as_url
from flyarchive.store.dataset import read_archive

if TYPE_CHECKING:
    import xarray as xr


def open_archive(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
                 ) -> xr.Dataset:
    """Open an archive: lazy (dask-backed), validated, masked beyond ``n_frames``.

    The time dimension ends at the last committed frame of any world; frames a
    world has not committed read as NaN. A selection reads only the stored chunks it
    touches (one world of 1024 reads about its own bytes), and a damaged chunk fails
    only the reads that touch it, naming its worlds, frames and file. The dataset keeps
    the indexes of the shards that can no longer change (all their frames below every
    world's ``n_frames``): a second query of the same shards on S3 makes one request per
    shard, and one more to check that the archive is still the one opened (its
    ``archive_id``). Opening reads the metadata (on S3 one request: the root
    ``zarr.json``, which holds every array's metadata, consolidated), then ``n_frames``,
    the coordinates and every array's own ``zarr.json`` in one concurrent round of
    requests; an archive whose two copies of an array's metadata disagree on how bytes
    decode, or whose pipelines of numbers lack their CRC-32C checksum, is refused
    (:mod:`flyarchive.store.replicas`). Plain
    ``xarray.open_zarr(url)`` opens the same data without flyarchive, unmasked (and
    without warnings: the consolidated metadata is there).

    Args:
        url: A local path (a string or a :class:`pathlib.Path`) or any fsspec URL
            (``s3://bucket/run.zarr``, ``memory://x``).
        storage_options: Passed to fsspec, e.g. ``{"key": ..., "secret": ...,
            "client_kwargs": {"endpoint_url": ...}}`` for S3.

    Returns:
        Dataset with ``qpos`` (world, time, dof), ``mocap_pos``/``mocap_quat`` when the
        model has mocap bodies, ``n_frames`` (world,) loaded in memory, and the archive's
        attributes (``timestep``, ``output_fps``, ``playback_speed``, ``layout``...).
        Dask chunks are whole shards of worlds by several stored chunks of frames.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        SchemaError, SchemaVersionError: not a readable flyarchive archive (also: metadata
            that switches a checksum off, or two copies of an array's metadata that decode
            otherwise; the error names the array and the file).
        StorageBackendMissingError: the URL's protocol needs a package (names the extra).
        CorruptArchiveError: when computing, for damaged stored bytes (names the chunk).
        ArchiveReplacedError (a StorageError): when computing, once the archive was
            replaced (written again with ``mode="w"``) or deleted after it was opened:
            the dataset never mixes two archives; open it again.
    """
    # absolute: the lazy dataset's reads may run in Dask workers started in other folders
    ds = read_archive(absolute_url(as_url(url)), storage_options, dataset.read_dataset)
    validate(ds)
    return ds
