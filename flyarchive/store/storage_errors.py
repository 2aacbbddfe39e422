"""The one place that turns storage faults into :class:`~flyarchive.errors.StorageError`.

Storage clients fail in their own words: botocore's ``EndpointConnectionError``
(a 100-line traceback), ``NoCredentialsError``, s3fs's ``PermissionError:
Forbidden`` or ``FileNotFoundError: The specified bucket does not exist``, a
``TypeError`` deep in botocore for ``endpoint_url: 5``; local disks say
``[Errno 28] No space left on device``. :func:`translate` maps each to one
sentence that names the URL, what went wrong and the likely fix; :func:`translated`
does it for a block of code; :func:`check_storage_options` refuses malformed options
before any client is built.

Secrets never appear: every message is scrubbed of the values of secret-looking
storage options (``secret``, ``key``, ``token``, ``password``...), at any depth.
Nothing here imports botocore, aiohttp or s3fs: their exceptions are recognized by
class name, and only when their module is already loaded.
"""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from flyarchive.errors import FlyarchiveError, StorageError

_SECRET_KEY = re.compile(r"secret|token|password|passwd|credential|key|sas|signature", re.I)
_CREDENTIAL_ERRORS = frozenset({
    "NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError", "ProfileNotFound",
    "CredentialRetrievalError", "TokenRetrievalError", "UnauthorizedSSOTokenError",
    "SSOTokenLoadError", "UnknownCredentialError",
})
# botocore's ConnectionError / HTTPClientError family and aiohttp's ClientConnectionError family
_UNREACHABLE = frozenset({"ConnectionError", "HTTPClientError", "ClientConnectionError"})
_CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs")
LOCAL_HINTS = {
    errno.EACCES: "This user may not write there; choose another location or fix its permissions.",
    errno.EPERM: "This user may not write there; choose another location or fix its permissions.",
    errno.ENOSPC: "The disk is full: free some space or write elsewhere.",
    errno.EDQUOT: "The disk quota is used up: free some space or write elsewhere.",
    errno.EFBIG: "The file is larger than this system allows (a file size limit): write elsewhere.",
    errno.EROFS: "The file system is read-only: choose a writable location.",
    errno.ENOTDIR: "A part of the path is a file, not a folder: choose another path.",
    errno.EEXIST: "A part of the path is a file, not a folder: choose another path.",
    errno.ENOENT: "A folder on the path does not exist: create it or choose another path.",
    errno.EISDIR: "A folder is where a file should be written: choose another path.",
}


def is_remote(url: str) -> bool:
    """True for a URL with a protocol other than ``file://``."""
    return "://" in str(url) and not str(url).startswith("file://")


def _secrets(options: Any, under_secret_key: bool = False) -> list[str]:
    """String values stored under secret-looking keys, at any depth."""
    found: list[str] = []
    if isinstance(options, Mapping):
        for key, value in options.items():
            found += _secrets(value, under_secret_key or bool(_SECRET_KEY.search(str(key))))
    elif isinstance(options, (list, tuple)):
        for value in options:
            found += _secrets(value, under_secret_key)
    elif under_secret_key and isinstance(options, str) and len(options) >= 4:
        found.append(options)
    return found


def scrub(text: str, storage_options: Mapping[str, Any] | None) -> str:
    """``text`` with every secret value of ``storage_options`` replaced by ``***``."""
    for secret in sorted(_secrets(storage_options or {}), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _names(err: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(err).__mro__}


def _from_client(err: BaseException) -> bool:
    """True if the exception class comes from a storage client library."""
    return any(cls.__module__.split(".")[0] in _CLIENT_MODULES for cls in type(err).__mro__)


def client_errors() -> tuple[type[BaseException], ...]:
    """Base classes of the storage clients' own exceptions (those loaded in this process).

    For an ``except client_errors() as err:`` clause: botocore's ``BotoCoreError`` and
    ``ClientError``, aiohttp's ``ClientError``. Empty when no such client was imported,
    so that it costs nothing for local archives.
    """
    out: list[type[BaseException]] = []
    boto = sys.modules.get("botocore.exceptions")
    if boto is not None:
        out += [boto.BotoCoreError, boto.ClientError]
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and hasattr(aiohttp, "ClientError"):
        out.append(aiohttp.ClientError)
    return tuple(out)


def _endpoint(err: BaseException, storage_options: Mapping[str, Any] | None) -> str | None:
    options = dict(storage_options or {})
    client = options.get("client_kwargs")
    for value in (options.get("endpoint_url"),
                  client.get("endpoint_url") if isinstance(client, Mapping) else None):
        if isinstance(value, str):
            return value
    kwargs = getattr(err, "kwargs", None)
    url = kwargs.get("endpoint_url") if isinstance(kwargs, Mapping) else None
    if isinstance(url, str):
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"
    return None


def _bucket(url: str) -> str:
    return urlsplit(url).netloc


def _describe(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def translate(
    err: BaseException, url: str, storage_options: Mapping[str, Any] | None = None
) -> StorageError | None:
    """The :class:`StorageError` for a storage client's exception, or None if it is not one.

    Recognized: unreachable endpoints, missing or refused credentials, a missing
    bucket, and any other exception raised by botocore, aiobotocore, aiohttp or an
    fsspec cloud backend. For remote URLs only; local paths: see :func:`local_error`.

    Args:
        err: The exception caught.
        url: The URL that was being read or written (named in the message).
        storage_options: The options used (to name the endpoint and scrub secrets).
    """
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]  # zarr's concurrent reads (a TaskGroup): the first fault
    if isinstance(err, FlyarchiveError):
        return None
    names = _names(err)
    endpoint = _endpoint(err, storage_options)
    where = f" at {endpoint}" if endpoint else ""
    if names & _CREDENTIAL_ERRORS:
        message = (
            f"No usable credentials were found for {url!r} ({_describe(err)}). Pass \"key\" and "
            "\"secret\" (or \"profile\") in the storage options, set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or pass {\"anon\": true} for a public bucket."
        )
    elif names & _UNREACHABLE and _from_client(err):
        message = (
            f"Cannot reach the storage of {url!r}: nothing answered{where} ({_describe(err)}). "
            "Check that the server is running, that \"endpoint_url\" in the storage options is "
            "right (e.g. \"http://127.0.0.1:9000\"), and the network or proxy settings. "
            "Nothing was changed."
        )
    elif not is_remote(url):
        return None
    elif isinstance(err, PermissionError):
        message = (
            f"Access to {url!r} was refused{where} ({_describe(err)}). Check the credentials "
            "(key and secret, profile, or environment) and the permissions of the bucket: "
            "reading needs s3:GetObject and s3:ListBucket, writing also s3:PutObject."
        )
    elif isinstance(err, FileNotFoundError) and "bucket" in str(err).lower():
        bucket = _bucket(url)
        message = (
            f"The bucket {bucket!r} of {url!r} does not exist{where}. Create it first "
            f"(e.g. `aws s3 mb s3://{bucket}`), or fix the bucket name in the URL."
        )
    elif _from_client(err) or isinstance(err, (OSError, TimeoutError)):
        message = (
            f"The storage of {url!r} failed{where} ({_describe(err)}). Check the URL and the "
            "storage options (endpoint_url, credentials, region), or retry if it was busy."
        )
    else:
        return None
    return StorageError(scrub(message, storage_options))


def local_error(path: str, err: OSError, action: str = "write") -> StorageError:
    """The :class:`StorageError` for a local file-system error, with the likely fix.

    Args:
        path: The file or folder involved.
        err: The ``OSError`` (its ``errno`` picks the hint).
        action: What was attempted, e.g. ``"write"``, ``"create the folder"``.
    """
    hint = LOCAL_HINTS.get(err.errno or -1, "Choose a writable location.")
    reason = err.strerror or str(err) or type(err).__name__
    return StorageError(f"Cannot {action} {str(path)!r}: {reason}. {hint}")


@contextmanager
def translated(url: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Run a block; re-raise storage client faults as :class:`StorageError` (see :func:`translate`).

    Errors flyarchive raised itself, and exceptions that are not storage faults, pass
    unchanged.
    """
    try:
        yield
    except Exception as err:
        new = translate(err, str(url), storage_options)
        if new is None:
            raise
        raise new from None


def _check_endpoint(url: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https") \
            or not urlsplit(value).netloc:
        raise StorageError(
            f"The storage option {name!r} for {url!r} must be a URL such as "
            f"'http://127.0.0.1:9000' or 'https://s3.example.org'; got {value!r}."
        )


def check_storage_options(url: str, storage_options: Mapping[str, Any] | None) -> None:
    """Refuse storage options that no client could use, before any client is built.

    Checks: the options are a mapping; ``endpoint_url`` (top level or in
    ``client_kwargs``) is an http(s) URL; ``client_kwargs`` and ``config_kwargs`` are
    mappings; ``key``, ``secret``, ``token`` and ``profile`` are strings (their values
    are never quoted); ``anon`` is a boolean.

    Raises:
        StorageError: naming the option, the URL and the expected form.
    """
    if storage_options is None:
        return
    if not isinstance(storage_options, Mapping):
        raise StorageError(
            f"storage_options for {url!r} must be a mapping (a JSON object), got "
            f"{type(storage_options).__name__}."
        )
    for name in ("client_kwargs", "config_kwargs"):
        if name in storage_options and not isinstance(storage_options[name], Mapping):
            raise StorageError(
                f"The storage option {name!r} for {url!r} must be a mapping (a JSON object), "
                f"got {type(storage_options[name]).__name__}."
            )
    if "endpoint_url" in storage_options:
        _check_endpoint(url, "endpoint_url", storage_options["endpoint_url"])
    client = storage_options.get("client_kwargs") or {}
    if "endpoint_url" in client:
        _check_endpoint(url, "client_kwargs.endpoint_url", client["endpoint_url"])
    for name in ("key", "secret", "token", "profile"):
        value = storage_options.get(name)
        if value is not None and not isinstance(value, str):
            raise StorageError(
                f"The storage option {name!r} for {url!r} must be a string, got "
                f"{type(value).__name__}."
            )
    if "anon" in storage_options and not isinstance(storage_options["anon"], bool):
        raise StorageError(
            f"The storage option 'anon' for {url!r} must be true or false, got "
            f"{type(storage_options['anon']).__name__}."
        )
    if url.split("://", 1)[0] in ("s3", "s3a"):
        _check_s3_options(url, storage_options)


#: Storage options s3fs takes beside its constructor's own parameters (it passes them to
#: fsspec's file system, or reads them in fsspec's instance cache).
_S3_FSSPEC_OPTIONS = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths",
                                "skip_instance_cache"})

#: botocore client settings an ``s3://`` file system gets unless its storage options'
#: ``config_kwargs`` set them (botocore's own: 60 s to connect, 60 s without a byte, 5
#: attempts). With :data:`S3_FS_RETRIES` they bound what one request to a server that
#: stopped answering mid-run waits to about 2 minutes (2 s3fs tries × 3 attempts × 20 s; a
#: whole-object read nests s3fs's tries: 4 minutes), uploads included
#: (:func:`_sends_bodies_at_once`),
#: where the defaults of s3fs (5 tries of 5, nested) and botocore waited two hours; a slow
#: server that answers is never cut off (the read timeout counts seconds without a byte).
S3_CLIENT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10,
    "read_timeout": 20,
    "retries": {"total_max_attempts": 3, "mode": "standard"},
}
#: s3fs's own tries per call (its class default is 5, and a whole-object read nests
#: them: 25 tries); storage options cannot set it, so flyarchive sets it on its file
#: systems. botocore retries connection errors, timeouts, throttling and 5xx answers itself.
S3_FS_RETRIES = 2


def client_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The storage options a file system of ``url`` is made with: a copy of
    ``storage_options``, and for ``s3://`` the :data:`S3_CLIENT_DEFAULTS` its
    ``config_kwargs`` leave out."""
    options = dict(storage_options or {})
    if url.split("://", 1)[0] in ("s3", "s3a"):
        options["config_kwargs"] = {**S3_CLIENT_DEFAULTS, **(options.get("config_kwargs") or {})}
    return options


def bound_retries(fs: Any) -> Any:
    """``fs``, if it is an s3fs file system (fsspec shares one per set of options: others
    made with the same options get it too), with s3fs's own tries lowered to
    :data:`S3_FS_RETRIES` and its uploads sent without ``Expect: 100-continue``
    (:func:`_sends_bodies_at_once`)."""
    if type(fs).__module__.split(".")[0] != "s3fs":
        return fs
    if getattr(fs, "retries", 0) > S3_FS_RETRIES:
        fs.retries = S3_FS_RETRIES
    _sends_bodies_at_once(fs)
    return fs


def _sends_bodies_at_once(fs: Any) -> None:
    """Make the s3fs file system ``fs`` send each upload's body with its headers, not after
    the server's ``100 Continue``.

    botocore asks for ``100 Continue`` before every upload, and aiohttp starts a request's
    read timeout only once the body is sent: a server that took the connection and then
    stopped answering (a stalled endpoint, a network partition) held every write for
    ever (a recorder's commit waited more than 15 minutes, and again when it closed),
    whatever ``read_timeout`` says. Without it, the read timeout counts from the body's
    last byte, as it does for reads. The handler that asks for it is taken off each client
    the file system uses (its ``set_session``, which every call awaits, returns it)."""
    if getattr(fs, "_flyarchive_whole_puts", False):
        return
    from botocore.handlers import add_expect_header

    original = fs.set_session

    async def set_session(*args: Any, **kwargs: Any) -> Any:
        client = await original(*args, **kwargs)
        if client is not None and not getattr(client, "_flyarchive_whole_puts", False):
            client.meta.events.unregister("before-call.s3", add_expect_header)
            client._flyarchive_whole_puts = True
        return client

    fs.set_session = set_session
    fs._flyarchive_whole_puts = True


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs`` with :func:`client_options` and :func:`bound_retries`."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **client_options(url, storage_options))
    return bound_retries(fs), path


def unreachable(err: BaseException) -> bool:
    """True for a storage client's connection failure or timeout (nothing answered)."""
    return bool(_names(err) & _UNREACHABLE) and _from_client(err)


#: Options of botocore's client configuration that are a number of seconds.
_SECONDS = ("connect_timeout", "read_timeout")


def _check_s3_options(url: str, storage_options: Mapping[str, Any]) -> None:
    """Names s3fs does not take (it passes them on to ``AioSession``, which fails with a
    message about the session), and a ``config_kwargs`` botocore cannot use."""
    import inspect

    try:
        import aiobotocore.session
        import botocore.config
        import botocore.exceptions
        import s3fs
    except ImportError:  # open_store says which package is missing
        return
    taken = {*inspect.signature(s3fs.S3FileSystem.__init__).parameters,
             *inspect.signature(aiobotocore.session.AioSession.__init__).parameters,
             *_S3_FSSPEC_OPTIONS} - {"self", "kwargs"}
    unknown = sorted(str(name) for name in storage_options if name not in taken)
    if unknown:
        raise StorageError(
            f"The storage option(s) {unknown} for {url!r} are not options of s3fs. It takes "
            f"{', '.join(sorted(taken))} (see s3fs.S3FileSystem).")
    config = storage_options.get("config_kwargs") or {}
    for name in _SECONDS:
        value = config.get(name)
        if name in config and (isinstance(value, bool) or not isinstance(value, (int, float))
                               or not value > 0):
            raise StorageError(
                f"The storage option 'config_kwargs.{name}' for {url!r} must be a number of "
                f"seconds > 0, got {value!r}.")
    if "retries" in config and not isinstance(config["retries"], Mapping):
        raise StorageError(
            f"The storage option 'config_kwargs.retries' for {url!r} must be a mapping such as "
            f"{{\"total_max_attempts\": 3}}, got {type(config['retries']).__name__}.")
    try:
        botocore.config.Config(**config)
    except (TypeError, ValueError, botocore.exceptions.BotoCoreError) as err:
        raise StorageError(
            f"The storage option 'config_kwargs' for {url!r} is not a botocore client "
            f"configuration ({err}). See botocore.config.Config for its options.") from None
