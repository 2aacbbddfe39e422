"""A real S3-compatible server on loopback, for tests.

S3 tests in flyarchive talk HTTP to a real server, as they would to AWS or MinIO:
:class:`S3Server` runs moto in server mode as a separate process on
``127.0.0.1``, and s3fs reaches it through ``endpoint_url``. Nothing is patched
in-process and nothing global (environment, AWS config) is changed.

:class:`flyarchive.testing.faultproxy.FaultProxy` can sit between s3fs and the server to
inject faults.

The fake credentials exist only in this module, in the server's environment
and in the options handed to s3fs; they are never printed.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from typing import IO, TYPE_CHECKING, Any, Self

from flyarchive.errors import MissingDependencyError

if TYPE_CHECKING:
    import s3fs

__all__ = ["REGION", "S3Server", "S3ServerStartError", "s3_filesystem", "s3_storage_options"]

REGION = "us-east-1"
_FAKE_KEY = "flyarchive-testing-key"
_FAKE_SECRET = "flyarchive-testing-secret"
LOOPBACK = "127.0.0.1"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
#: moto's server (``python -m moto.server``), routing each request once per host: moto 5
#: finds the service of a request by listing its package folder and stat-ing every entry
#: (about 180 system calls, twice a request), then by matching about 90 URL patterns, a
#: third of its CPU time. Arguments as moto.server's.
_SERVER_MAIN = (
    "import functools, sys\n"
    "from moto import backends\n"
    "from moto.moto_server import werkzeug_app\n"
    "backends.list_of_moto_modules = functools.cache("
    "lambda listed=backends.list_of_moto_modules: tuple(listed()))\n"
    "app = werkzeug_app.DomainDispatcherApplication\n"
    "app.get_backend_for_host = functools.lru_cache(maxsize=64)(app.get_backend_for_host)\n"
    "from moto.server import main\n"
    "main(sys.argv[1:])\n"
)


class S3ServerStartError(RuntimeError):
    """The moto server process did not start or did not answer in time."""


def s3_storage_options(
    endpoint_url: str, *, botocore_attempts: int = 2, **extra: Any
) -> dict[str, Any]:
    """Build fsspec/s3fs storage options that talk only to ``endpoint_url``.

    Explicit fake credentials and region mean botocore never looks up
    credentials, instance metadata or a region; an explicit proxy mapping means
    ``HTTP_PROXY``/``HTTPS_PROXY`` are ignored. For ``fsspec.filesystem("s3",
    **opts)``, ``s3fs.S3FileSystem(**opts)`` or ``FsspecStore.from_url``.

    Args:
        endpoint_url: URL of the S3-compatible endpoint, e.g. ``http://127.0.0.1:5000``.
        botocore_attempts: Total attempts botocore makes per request (1 means no
            botocore retry). s3fs adds its own retries on top for connection errors
            and ``SlowDown`` (see :func:`s3_filesystem`).
        **extra: More options. ``client_kwargs`` and ``config_kwargs`` are merged
            key by key into the defaults; every other key replaces the default.

    Returns:
        A new dict; ``extra`` is not modified.

    Raises:
        ValueError: If ``botocore_attempts`` is below 1.
    """
    if botocore_attempts < 1:
        raise ValueError(f"botocore_attempts must be >= 1; got {botocore_attempts!r}.")
    extra = dict(extra)
    client_kwargs = dict(extra.pop("client_kwargs", {}))
    config_kwargs = {
        # Region in the botocore Config, not client_kwargs: s3fs's mkdir turns a
        # client_kwargs region into a LocationConstraint, which us-east-1 refuses.
        "region_name": REGION,
        "retries": {"total_max_attempts": botocore_attempts, "mode": "standard"},
        # A non-empty mapping stops botocore from reading proxies from the
        # environment; an empty URL means "no proxy" for plain http.
        "proxies": {"http": "", "https": ""},
        "connect_timeout": 5,
        "read_timeout": 15,
        **extra.pop("config_kwargs", {}),
    }
    return {"key": _FAKE_KEY, "secret": _FAKE_SECRET, "endpoint_url": endpoint_url,
            "client_kwargs": client_kwargs, "config_kwargs": config_kwargs, **extra}  # fmt: skip


def s3_filesystem(endpoint_url: str, *, retries: int = 2, **extra: Any) -> s3fs.S3FileSystem:
    """Create a fresh, uncached ``s3fs.S3FileSystem`` for ``endpoint_url``.

    Args:
        endpoint_url: URL of the S3-compatible endpoint.
        retries: s3fs's own attempts per call (class default 5; storage options
            cannot set it). s3fs retries connection errors and ``SlowDown``; each
            attempt may itself be retried by botocore (``botocore_attempts``).
        **extra: Passed to :func:`s3_storage_options`.

    Returns:
        A synchronous filesystem, built with ``skip_instance_cache=True``.

    Raises:
        MissingDependencyError: If s3fs is not installed.
        ValueError: If ``retries`` is below 1.
    """
    if retries < 1:
        raise ValueError(f"retries must be at least 1, got {retries!r}.")
    try:
        import s3fs
    except ImportError as err:
        raise MissingDependencyError(
            "S3 access needs s3fs, which is not installed: pip install 'flyarchive[s3]'"
        ) from err
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options(endpoint_url, **extra))
    fs.retries = retries
    return fs


def _check_bucket_name(name: str) -> None:
    if not _BUCKET_RE.match(name):
        raise ValueError(
            f"Invalid bucket name {name!r}. A bucket name has 3 to 63 characters: "
            "lowercase letters, digits, dots and hyphens, starting and ending with a "
            "letter or digit (moto refuses shorter names)."
        )


class Endpoint:
    """Shared client helpers for anything that has an ``endpoint_url``."""

    @property
    def endpoint_url(self) -> str:
        raise NotImplementedError

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """Return s3fs storage options for this endpoint; see :func:`s3_storage_options`."""
        return s3_storage_options(self.endpoint_url, **extra)

    def filesystem(self, *, retries: int = 2, **extra: Any) -> s3fs.S3FileSystem:
        """Return a fresh ``s3fs.S3FileSystem`` for this endpoint; see :func:`s3_filesystem`."""
        return s3_filesystem(self.endpoint_url, retries=retries, **extra)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` through this endpoint.

        Raises:
            ValueError: If ``name`` is not a valid bucket name.
        """
        _check_bucket_name(name)
        self.filesystem().mkdir(name)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class S3Server(Endpoint):
    """moto in server mode, in its own process, on ``127.0.0.1`` and a free port.

    Use it as a context manager; the process is terminated on exit, on errors and,
    as a last resort, when the object is collected or the interpreter exits.

    Args:
        startup_timeout_s: Seconds to wait for the server to answer HTTP.
    """

    def __init__(self, *, startup_timeout_s: float = 30.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running server.

        Raises:
            RuntimeError: If the server is not running.
        """
        if self._port is None or self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("The S3 server is not running. Use `with S3Server() as s:`.")
        return f"http://{LOOPBACK}:{self._port}"

    def start(self) -> Self:
        """Start the server and wait until it answers HTTP.

        Returns:
            ``self``.

        Raises:
            MissingDependencyError: If moto's server mode is not installed.
            S3ServerStartError: If it exits or does not answer within
                ``startup_timeout_s``; the message includes its stderr.
        """
        if self._proc is not None:
            raise RuntimeError("The S3 server is already started.")
        try:
            import moto.server  # noqa: F401
        except ImportError as err:
            raise MissingDependencyError(
                "The S3 test server needs moto's server mode, which is not installed: "
                "pip install 'flyarchive[test]' (or 'moto[server]')."
            ) from err
        for attempt in range(3):  # another process may take the free port first
            self._launch()
            try:
                self._wait_until_answering()
                return self
            except S3ServerStartError as err:
                self.stop()
                if attempt == 2 or "in use" not in str(err):
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        self._port = _free_port()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": _FAKE_KEY,
               "AWS_SECRET_ACCESS_KEY": _FAKE_SECRET, "AWS_DEFAULT_REGION": REGION}  # fmt: skip
        self._stderr = tempfile.TemporaryFile()
        cmd = [sys.executable, "-c", _SERVER_MAIN, "-H", LOOPBACK, "-p", str(self._port)]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr, env=env
        )
        self._finalizer = weakref.finalize(self, _terminate, self._proc)

    def _wait_until_answering(self) -> None:
        assert self._proc is not None
        url = f"http://{LOOPBACK}:{self._port}/"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise S3ServerStartError(
                    f"moto server exited with code {self._proc.returncode} before answering "
                    f"on {url}. Its output:\n{self._read_stderr()}"
                )
            try:
                with opener.open(url, timeout=1.0):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP answer means it is up
            except OSError:
                time.sleep(0.05)
        raise S3ServerStartError(
            f"moto server did not answer on {url} within {self.startup_timeout_s} s. "
            f"Its output:\n{self._read_stderr()}\n"
            "Pass a larger startup_timeout_s if the machine is slow."
        )

    def _read_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-8000:].decode(errors="replace")

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit in 5 s). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _terminate once
            self._finalizer = None
        self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
