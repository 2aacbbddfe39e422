"""The one way an archive is opened for reading (:func:`open_for_reading`): its group on
the hardened store (:func:`~flyarchive.store.location.open_store`: on local disk the
guarded store of :mod:`~flyarchive.store.localstore`), its attributes validated, every
array's metadata checked against what flyarchive writes
(:func:`~flyarchive.store.allowlist.check_arrays`) and against its other copy
(:mod:`~flyarchive.store.replicas`) before any chunk is read, and an archive replaced
since the caller last opened it (another ``archive_id``) refused. Every reader opens
through it: the lazy dataset (:func:`flyarchive.query.archive.open_archive`) and the header
(:func:`~flyarchive.store.dataset.open_header`, both read by
:func:`~flyarchive.store.dataset.read_archive`), the state readers of :mod:`~flyarchive.store.reader`, derived
groups (:mod:`~flyarchive.store.derived`), ``verify``, the viewer, the exports.
Writers open an existing archive with :func:`open_for_writing`. No other module opens a
zarr group of an archive (``tests/store/test_one_opener.py`` holds it).

Also here: what is at a URL where
an archive was expected and none is (:func:`not_an_archive`: a depth or segmentation map
that ``flyarchive render`` wrote beside a video, an array or a folder inside an archive,
a plain zarr array), named in the error with what to open instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import zarr

from flyarchive.errors import (
    ArchiveNotFoundError,
    ArchiveReplacedError,
    SchemaError,
    StorageError,
    UnsafeFileError,
)
from flyarchive.schema import SCHEMA_NAME, validate_attrs
from flyarchive.store import allowlist, storage_errors
from flyarchive.store.allowlist import MAX_METADATA_BYTES, check_arrays, check_json_bytes
from flyarchive.store.location import (
    access_denied,
    as_url,
    is_local,
    is_remote,
    local_path,
    open_store,
    sync,
    unavailable,
)
from flyarchive.store.replicas import check_copies, check_own, read_copy
from flyarchive.zarr_internals import RangeByteRequest, default_buffer_prototype


def open_for_reading(url: str, storage_options: Mapping[str, Any] | None = None, *,
                     archive_id: str | None = None, attributes_only: bool = False,
                     consolidated: bool = True, own_later: bool = False,
                     check_copy: bool = True) -> zarr.Group:
    """Open an existing archive's zarr group for reading: the one way flyarchive does.

    The group is opened on the hardened store, its attributes validated (the schema's
    name and version), then, unless ``attributes_only``, every array's metadata checked
    against what flyarchive writes and against its other copy, before any chunk is read.
    A local archive whose metadata file a writer replaces while it is read is looked at
    again once.

    Args:
        url: The archive (a URL or local path, as given by the user).
        storage_options: Passed to fsspec.
        archive_id: The ``archive_id`` the caller opened before (a worker process, a
            reader kept from an earlier open); None: any archive.
        attributes_only: Only the root attributes are validated (a look at
            ``archive_id`` or the status of an import; reads of ``n_frames`` or labels
            whose pipelines the store decodes with its bounded decoders); False: every
            array's metadata checked too.
        consolidated: On remote storage, take the arrays' metadata from the consolidated
            copy in the root ``zarr.json`` when there is one (one request for all of it);
            ``verify`` passes False (the arrays' own metadata, the ground truth).
        own_later: For a group opened with the consolidated copy: the caller awaits
            :func:`flyarchive.store.replicas.check_own` in its first round of reads (the
            arrays' own ``zarr.json`` fetched beside them). False: fetched here, one more
            round of requests.
        check_copy: False: the two copies are not compared (``verify`` reports every
            difference itself).

    Returns:
        The archive's root group, read-only.

    Raises:
        ArchiveNotFoundError: no archive at ``url`` (also naming what is there instead:
            a map, an array or folder inside an archive).
        SchemaError / SchemaVersionError: not a readable flyarchive archive (also zarr v2
            metadata, metadata nested too deep, a pipeline without its checksum, copies
            that disagree).
        ArchiveReplacedError: the archive at ``url`` is not the one ``archive_id`` names (or,
            with ``archive_id``, none is there any more).
        StorageError: the storage is unreachable or refuses access.
    """
    url = as_url(url)
    try:
        if attributes_only:
            group = _open_group(url, storage_options, consolidated=consolidated)
        else:
            try:
                group = _open_checked(url, storage_options, consolidated=consolidated,
                                      own_later=own_later, check_copy=check_copy)
            except UnsafeFileError:  # a writer replaced a metadata file as it was read: again
                group = _open_checked(url, storage_options, consolidated=consolidated,
                                      own_later=own_later, check_copy=check_copy)
    except ArchiveNotFoundError:
        if archive_id is None:
            raise
        raise ArchiveReplacedError(
            f"The archive at {url!r} was replaced after it was opened (it is gone, or being "
            f"written again now; it was archive_id {archive_id!r}). Call "
            f"open_archive({url!r}) again to read the archive that is there now.") from None
    if archive_id is not None and group.attrs.get("archive_id") != archive_id:
        raise ArchiveReplacedError(
            f"The archive at {url!r} was replaced after it was opened (its archive_id is now "
            f"{group.attrs.get('archive_id')!r}, it was {archive_id!r}). Call "
            f"open_archive({url!r}) again to read the archive that is there now.")
    return group


def open_for_writing(url: str, storage_options: Mapping[str, Any] | None = None) -> zarr.Group:
    """Open an existing archive's zarr group for a writer (``mode="r+"``: the arrays' own
    metadata, never the consolidated copy), its attributes validated.

    Raises:
        As :func:`open_for_reading` (but ArchiveReplacedError).
    """
    url = as_url(url)
    if is_local(url):  # a writable local store would make the folder: refuse first, as reads do
        path = local_path(url)
        if not path.exists():
            raise ArchiveNotFoundError(f"Nothing at {url!r}. Check the path.")
        if not path.is_dir():
            raise ArchiveNotFoundError(
                f"No archive at {url!r}: it is a file, not an archive's folder. Check the path.")
    return _open_group(url, storage_options, mode="r+")


def _open_group(url: str, storage_options: Mapping[str, Any] | None = None, *, mode: str = "r",
                consolidated: bool = True) -> zarr.Group:
    """Open an existing archive's zarr group and check its schema attributes.

    Args:
        url: The archive.
        storage_options: Passed to fsspec.
        mode: ``"r"`` (read) or ``"r+"`` (a writer).
        consolidated: For ``mode="r"`` on remote storage (S3...): take the arrays'
            metadata from the consolidated copy in the root ``zarr.json`` when there is
            one (one request for all of it). Local and in-memory archives, writers
            (``"r+"``) and ``verify`` (False) read each array's own metadata: the ground
            truth, and the files the local store checks (:mod:`~flyarchive.store.localstore`).

    Raises:
        ArchiveNotFoundError: if no archive is at ``url``.
        SchemaError / SchemaVersionError: if it is not a readable flyarchive archive (also
            for zarr v2 metadata: flyarchive archives are zarr v3).
    """
    store = open_store(url, storage_options, read_only=(mode == "r"))
    use = None if mode == "r" and consolidated and is_remote(url) else False
    try:
        group = _open_within(store, "r" if mode == "r" else "r+", use,
                             OPEN_TIMEOUT_S if is_remote(url) else None)
    except TimeoutError:
        raise StorageError(
            f"The storage of {url!r} did not answer within {OPEN_TIMEOUT_S:g} s while the "
            "archive was opened (a server that takes connections but never answers, or a "
            "network that drops them). Check that the endpoint in the storage options "
            "answers, and retry; nothing was changed.") from None
    except storage_errors.client_errors() as err:  # interop: unreachable, no credentials...
        raise storage_errors.translate(err, url, storage_options) or err from None
    except PermissionError as err:
        raise access_denied(url, err) from None
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError):
        _refuse_v2(store, url)
        raise not_an_archive(url, storage_options) or ArchiveNotFoundError(
            f"No archive at {url!r}: there is no zarr.json there. Check the URL, or record "
            "one with flyarchive.TrajectoryRecorder."
        ) from None
    except OSError as err:
        raise unavailable(url, err) from None
    except (ValueError, TypeError) as err:  # also an array (a map...) where the group should be
        raise not_an_archive(url, storage_options) or SchemaError(
            f"The zarr metadata at {url!r} is unreadable ({err}).") from None
    try:
        validate_attrs(group.attrs.asdict())
    except SchemaError as err:  # a folder inside an archive (claims, models) is not one
        raise not_an_archive(url, storage_options) or err from None
    return group


#: Seconds an archive on remote storage may take to open (its metadata: a few small
#: objects) before the open fails: s3fs and botocore retry a server that takes the
#: connection and never answers for many minutes (5 tries of up to 5 attempts of 60 s
#: each, per object).
OPEN_TIMEOUT_S = 60.0


def _open_within(store: zarr.abc.store.Store, mode: str, use: bool | None,
                 timeout: float | None) -> zarr.Group:
    """The archive's group in ``store`` (as ``zarr.open_group``); with ``timeout``,
    TimeoutError past it (what was under way cancelled)."""
    import asyncio

    from zarr.api.asynchronous import open_group

    opened = open_group(store=store, mode=mode, zarr_format=3, use_consolidated=use)
    return zarr.Group(sync(asyncio.wait_for(opened, timeout)))


def _refuse_v2(store: zarr.abc.store.Store, url: str) -> None:
    """Raise SchemaError if zarr v2 metadata is where the root ``zarr.json`` should be
    (the guarded local store refuses to read it with its own message)."""
    try:
        found = sync(store.get(".zgroup", prototype=default_buffer_prototype()))
    except SchemaError:  # the guarded local store refuses zarr v2 metadata by its name
        found = True
    except UnsafeFileError:
        raise
    except Exception:  # nothing to tell beyond "no archive"
        return
    if found is not None:
        raise SchemaError(
            f"{url!r} is a zarr v2 store, not a flyarchive archive (flyarchive archives are "
            "zarr v3, with a zarr.json, written by flyarchive). Open it with "
            "xarray.open_zarr instead; nothing of it was decoded.")


def _open_checked(url: str, storage_options: Mapping[str, Any] | None, *,
                  consolidated: bool, own_later: bool, check_copy: bool) -> zarr.Group:
    """:func:`_open_group`, then every array's metadata checked against what
    flyarchive writes (:func:`flyarchive.store.allowlist.check_arrays`) before any chunk is
    read, and against its other copy (:mod:`flyarchive.store.replicas`): the consolidated
    copy in the root ``zarr.json`` and the array's own ``zarr.json`` must agree.

    Args:
        consolidated: Use the consolidated copy of the arrays' metadata when there is one
            (``verify`` passes False: it checks each array's own).
        own_later: For a group opened with the consolidated copy: the caller awaits
            :func:`flyarchive.store.replicas.check_own` in its first round of reads (the
            arrays' own ``zarr.json`` fetched beside them). False: fetched here, one more
            round of requests.
        check_copy: False: the two copies are not compared (``verify`` reports every
            difference itself).

    Raises:
        ArchiveNotFoundError, SchemaError (also for metadata nested too deep to parse, a
        pipeline without its checksum, or copies that disagree).
    """
    try:
        group = _open_group(url, storage_options, consolidated=consolidated)
        with_copy = group.metadata.consolidated_metadata is not None
        listed = read_copy(group, str(url)) if check_copy and not with_copy else {}
    except RecursionError:
        raise SchemaError(
            f"The zarr metadata at {url!r} is nested too deeply to parse. Run "
            f"`flyarchive verify {url}`; restore the zarr.json files from a backup."
        ) from None
    checked = check_arrays(group, str(url))
    if listed:
        check_copies(listed, checked, str(url))
    elif check_copy and with_copy and not own_later:
        sync(check_own(group, str(url)))
    return group


#: Levels above a URL searched for the archive holding it.
_LEVELS = 4
_MAPS = {"depth": ("read_depth", "a (frames, H, W) float32 array in model length units"),
         "segmentation": ("read_segmentation", "a (frames, H, W) int32 array of geom ids")}


def _document(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``zarr.json`` at ``url``, parsed (None if there is none or it is not JSON).

    Read as a byte range of at most :data:`~flyarchive.store.allowlist.MAX_METADATA_BYTES`:
    the guarded local store checks whole metadata files against what archives hold, and
    a map's pipeline is not an archive's.
    """
    try:
        store = open_store(url, storage_options, read_only=True)
        raw = sync(store.get("zarr.json", prototype=default_buffer_prototype(),
                             byte_range=RangeByteRequest(0, MAX_METADATA_BYTES)))
        if raw is None:
            return None
        data = raw.to_bytes()
        check_json_bytes(data, f"{url}/zarr.json", url)
        document = json.loads(data)
    except Exception:  # nothing to tell beyond what the caller says
        return None
    return document if isinstance(document, dict) else None


def _parent(url: str) -> str | None:
    """The URL one level up (None at a bucket, a drive's root, or a bare name)."""
    head, sep, path = url.rstrip("/").rpartition("://")
    if "/" not in path.strip("/"):
        return None
    return f"{head}{sep}{path.rsplit('/', 1)[0] or '/'}"


def not_an_archive(url: str, storage_options: Mapping[str, Any] | None = None
                   ) -> ArchiveNotFoundError | None:
    """The error for ``url`` when it holds a flyarchive map, or lies inside an archive, or
    is a plain zarr array; None when it is none of them.

    Returns:
        An :class:`ArchiveNotFoundError` naming what is there and what to open instead.
    """
    here = _document(url, storage_options)
    attributes = (here or {}).get("attributes")
    kind = attributes.get("flyarchive_map") if isinstance(attributes, dict) else None
    if kind in _MAPS:
        reader, what = _MAPS[kind]
        return ArchiveNotFoundError(
            f"No archive at {url!r}: it is a {kind} map that `flyarchive render` wrote beside a "
            f"video, not an archive. Read it with flyarchive.{reader}({url!r}) ({what}), or "
            "with any zarr v3 reader (zarr.open_array).")
    if (here or {}).get("node_type") == "group" and isinstance(attributes, dict) \
            and attributes.get("flyarchive_schema") == SCHEMA_NAME:
        return None  # flyarchive's own group (an archive, a derived group): its error stands
    parent, inside = url if "://" in url else os.path.abspath(url), []
    for _ in range(_LEVELS):
        name, parent = parent.rstrip("/").rsplit("/", 1)[-1], _parent(parent)
        if parent is None:
            break
        inside.insert(0, name)
        found = _document(parent, storage_options)
        if (found or {}).get("node_type") == "group" and \
                (found.get("attributes") or {}).get("flyarchive_schema") == SCHEMA_NAME:
            what = (f"the array {inside[0]!r}" if len(inside) == 1 and
                    (here or {}).get("node_type") == "array" else f"{'/'.join(inside)!r}")
            if "://" not in url and not os.path.isabs(url):  # as the user wrote it
                parent = os.path.relpath(parent)
            return ArchiveNotFoundError(
                f"No archive at {url!r}: it is {what} inside the archive at {parent!r}. Pass "
                f"the archive's URL instead, e.g. `flyarchive verify {parent}` or "
                f"flyarchive.open_archive({parent!r}).")
    if (here or {}).get("node_type") == "array":
        return ArchiveNotFoundError(
            f"No archive at {url!r}: it is a zarr array, not a flyarchive archive (a zarr group "
            "that flyarchive wrote). Open it with zarr.open_array.")
    return None
