"""Where an archive lives: URLs, zarr stores on any fsspec file system, and their errors.

Local paths get a :class:`~flyarchive.store.localstore.GuardedLocalStore` (regular
files inside the archive only); every store decodes with bounded decoders
(:mod:`flyarchive.store.allowlist`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import weakref
from collections.abc import Awaitable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec
import zarr
import zarr.storage

from flyarchive.archive_spec import absolute_url, as_url, parse_mode  # noqa: F401  (the store checks them too)
from flyarchive.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    FlyarchiveError,
    OptionsError,
    StorageError,
    missing_storage_backend,
)
from flyarchive.store import allowlist, storage_errors
from flyarchive.store.localstore import GuardedLocalStore


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def is_remote(url: str) -> bool:
    """True for storage reached over a network (``s3://``...): not local, not ``memory://``."""
    return not is_local(url) and not url.startswith("memory://")


def protocol(url: str) -> str:
    """``"s3"`` for ``s3://...``; ``"file"`` for local paths (and ``file://``)."""
    found, sep, _ = url.partition("://")
    return found if sep and found != "local" else "file"


def local_path(url: str) -> Path:
    return Path(url[len("file://"):] if url.startswith("file://") else url).expanduser()


def _check_protocol(url: str) -> None:
    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as err:
        raise missing_storage_backend(url, err) from None
    except ValueError:
        known = ", ".join(sorted(p for p in fsspec.available_protocols() if len(p) < 8)[:20])
        raise StorageError(
            f"URL {url!r} uses protocol {protocol!r}, which fsspec does not know. "
            f"Use a local path, file://, memory://, s3://, or another fsspec protocol ({known}...)."
        ) from None


def open_store(
    url: str, storage_options: Mapping[str, Any] | None = None, *, read_only: bool = False
) -> zarr.abc.store.Store:
    """Open a zarr store at any fsspec URL (a local path, ``file://``, ``memory://``, ``s3://``...).

    Local paths get a :class:`~flyarchive.store.localstore.GuardedLocalStore` (regular files
    inside the archive only); every store reads pcodec with bounded decoding. A read-only
    S3 store fetches each object with one request (s3fs ``max_concurrency=1``) unless
    ``storage_options`` set ``max_concurrency``; an S3 store's client gets the timeouts
    and retries of :data:`~flyarchive.store.storage_errors.S3_CLIENT_DEFAULTS` that its
    ``config_kwargs`` leave out.

    Raises:
        StorageBackendMissingError: if the protocol's package is not installed.
        StorageError: for an unknown protocol, or storage options of the wrong type.
        OptionsError: ``url`` is empty or not a path (:func:`as_url`).
    """
    url = as_url(url)
    allowlist.install_bounded_decoders()
    if not is_local(url):  # interop: malformed options are refused before a client is built
        storage_errors.check_storage_options(url, storage_options)
    if is_local(url):
        if storage_options:
            raise StorageError(f"storage_options were given for the local path {url!r}; drop them.")
        path = local_path(url)
        if read_only and not path.exists():
            raise ArchiveNotFoundError(f"Nothing at {url!r}. Check the path.")
        return GuardedLocalStore(path, read_only=read_only)
    _check_protocol(url)
    options = storage_errors.client_options(url, storage_options)
    if read_only and url.split("://", 1)[0] in ("s3", "s3a"):
        # s3fs asks for an object's size (a HEAD) before every whole-object GET, to split
        # objects above 50 MiB into concurrent range requests; archive objects are smaller.
        options.setdefault("max_concurrency", 1)
    if not fsspec.get_filesystem_class(url.split("://", 1)[0]).async_impl:
        return _synchronous_fs_store(url, options, read_only)
    store = zarr.storage.FsspecStore.from_url(url, storage_options=options, read_only=read_only)
    storage_errors.bound_retries(store.fs)
    return store


#: The asynchronous wrapper of each synchronous fsspec file system a store was opened on.
_WRAPPERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _synchronous_fs_store(url: str, options: Mapping[str, Any],
                          read_only: bool) -> zarr.storage.FsspecStore:
    """``FsspecStore.from_url`` for a file system without asynchronous methods
    (``memory://``...): zarr wraps it in fsspec's ``AsyncFileSystemWrapper``, which wraps
    every method of the file system, 3 ms each time (twice per archive recorded). The
    wrapper holds nothing but the file system, so one is made per file system (fsspec
    keeps one file system per URL protocol and options) and shared by its stores."""
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

    fs, path = fsspec.url_to_fs(url, **{"asynchronous": True, **options})
    wrapper = _WRAPPERS.get(fs)
    if wrapper is None:
        wrapper = _WRAPPERS[fs] = AsyncFileSystemWrapper(fs, asynchronous=True)
    return zarr.storage.FsspecStore(fs=wrapper, path=path, read_only=read_only)


def archive_exists(store: zarr.abc.store.Store) -> bool:
    """True if anything (an archive or other objects) is at the store's location."""
    return sync(_store_nonempty(store))


async def _store_nonempty(store: zarr.abc.store.Store) -> bool:
    if await store.exists("zarr.json"):
        return True
    async for _ in store.list():
        return True
    return False


def exists_error(url: str) -> ArchiveExistsError:
    return ArchiveExistsError(
        f"Something is already at {url!r}; flyarchive never overwrites without being "
        "asked. Pass mode='a' to append to that archive, mode='w' to replace it "
        "(its data is deleted), or choose another URL."
    )


def access_denied(url: str, err: BaseException) -> StorageError:
    """The error for storage that refuses access (HTTP 403, file permissions)."""
    return StorageError(
        f"Access to {url!r} was refused ({type(err).__name__}: {err}). Check the credentials "
        "(key and secret, profile, or environment) and the permissions of the location."
    )


@contextlib.contextmanager
def write_faults(url: str, storage_options: Mapping[str, Any] | None, failed: str,
                 after: str) -> Iterator[None]:
    """A write to the archive at ``url``, the storage's faults said as flyarchive errors:
    a client's fault as :func:`~flyarchive.store.storage_errors.translated` says it,
    refused access as :func:`access_denied`, any other ``OSError`` as
    ``StorageError("{failed} {url!r} failed (...). {after}")`` (``failed``: what was
    being done, e.g. ``"Adding world variables to"``; ``after``: what holds after the
    failure and what to do). flyarchive's own errors pass unchanged."""
    try:
        with storage_errors.translated(url, storage_options):
            yield
    except PermissionError as err:
        raise access_denied(url, err) from None
    except OSError as err:
        if isinstance(err, FlyarchiveError):
            raise
        # a cause that a retry cannot mend (a read-only file system, a full disk): its fix
        hint = storage_errors.LOCAL_HINTS.get(err.errno or -1) if err.errno != errno.ENOENT \
            else None
        raise StorageError(f"{failed} {url!r} failed ({type(err).__name__}: {err}). "
                           + (f"{hint} Then: " if hint else "") + after) from None


def unavailable(url: str, err: BaseException) -> StorageError:
    """The error for storage that failed to answer (after the client's retries)."""
    return StorageError(
        f"Reading {url!r} failed ({type(err).__name__}: {err}); the storage did not answer "
        "after retries. Nothing was changed; retry later."
    )


def sync(coro: Any) -> Any:
    from flyarchive.zarr_internals import sync

    return sync(coro)


async def settled(aws: Iterable[Awaitable[Any]]) -> list[Any]:
    """Await ``aws`` concurrently (e.g. writes of independent objects) and return their
    results; once every one has finished, raise the first failure, as it is (not an
    exception group): nothing is left running behind an error, so the caller may undo
    or retry at once.
    """
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results

