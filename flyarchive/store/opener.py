"""An archive opened for reading: its checked group, read by a reader function and looked at
twice should a writer change it under the first look (:func:`read_archive`, what
:func:`flyarchive.query.archive.open_archive` reads its dataset through), and its header
(:func:`open_header`): what a render plans with, read without xarray or dask.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flyarchive.errors import FlyarchiveError, SchemaError, UnsafeFileError
from flyarchive.schema import validate
from flyarchive.store import dataset
from flyarchive.store.header import ArchiveHeader
from flyarchive.store.location import as_url, unavailable
from flyarchive.store.reader import damaged_metadata, open_checked, unreadable

_Read = TypeVar("_Read")


def open_header(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None,
                *, group: Any = None) -> ArchiveHeader:
    """Open an archive's header: its attributes, ``n_frames``, coordinates and per-world
    variables, checked and validated as :func:`flyarchive.open_archive` does, without
    importing xarray or dask (:mod:`flyarchive.store.header`). What a render plans with;
    states are read by :class:`~flyarchive.store.reader.StateReader` (renders) or
    :func:`~flyarchive.open_archive`.

    Args:
        url, storage_options: As :func:`flyarchive.open_archive`.
        group: The archive's group, opened and checked already (``header.group`` of an
            earlier header, ``StateReader.group``); None: opened here.

    Raises:
        As :func:`flyarchive.open_archive` when opening.
    """
    header = read_archive(as_url(url), storage_options, dataset.read_header, group)
    validate(header)
    return header


def read_archive(url: str, storage_options: Mapping[str, Any] | None,
                 read: Callable[..., _Read], group: Any = None) -> _Read:
    """``read(url, storage_options, group)`` of the checked group (opened here unless
    given), looked at twice should a writer have changed the archive under the first
    look; errors named."""
    if group is None:
        try:  # the arrays' own metadata is checked in read's first round (store.replicas)
            group = open_checked(url, storage_options, own_later=True)
        except UnsafeFileError:  # a writer replaced a metadata file as it was read: look again
            group = open_checked(url, storage_options, own_later=True)
    for attempt in (1, 2):
        try:
            return read(url, storage_options, group)
        except (OSError, TimeoutError) as err:
            if isinstance(err, FlyarchiveError):
                raise
            if not isinstance(err, FileNotFoundError):
                raise unavailable(url, err) from None
            if attempt == 2:
                raise damaged_metadata(url, group, err) from None
        except SchemaError:  # names its file: looking again would not change it
            raise
        except Exception as err:  # zarr/xarray report damaged metadata in many ways
            if attempt == 2:
                raise unreadable(url, group, err) from None
    raise AssertionError("unreachable")
