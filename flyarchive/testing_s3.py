"""A real S3-compatible server on loopback, and a fault-injecting proxy, for tests.

S3 tests in flyarchive talk HTTP to a real server, as they would to AWS or MinIO:
:class:`S3Server` runs moto in server mode as a separate process on
``127.0.0.1``, and s3fs reaches it through ``endpoint_url``. Nothing is patched
in-process and nothing global (environment, AWS config) is changed.

:class:`FaultProxy` sits between s3fs and the server. It forwards every request
and, following a :class:`FaultPlan`, drops the connection, answers 500/503 with
an S3 XML error, or delays a fraction of them, so that tests can check what
retries do to the data.

Example::

    with S3Server() as server, FaultProxy(server.endpoint_url) as proxy:
        server.create_bucket("flies")
        proxy.plan = FaultPlan(error503=0.2, seed=1)
        fs = proxy.filesystem()
        fs.pipe("flies/a.bin", b"data")

The fake credentials exist only in this module, in the server's environment
and in the options handed to s3fs; they are never printed.
"""

from __future__ import annotations

import http.client
import itertools
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, TYPE_CHECKING, Any, Self

from flyarchive.errors import MissingDependencyError

if TYPE_CHECKING:
    import s3fs

__all__ = [
    "REGION", "FaultPlan", "FaultProxy", "S3Server", "S3ServerStartError",
    "s3_filesystem", "s3_storage_options",
]  # fmt: skip

REGION = "us-east-1"
_FAKE_KEY = "flyarchive-testing-key"
_FAKE_SECRET = "flyarchive-testing-secret"
_LOOPBACK = "127.0.0.1"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


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


class _Endpoint:
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
        sock.bind((_LOOPBACK, 0))
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


class S3Server(_Endpoint):
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
        return f"http://{_LOOPBACK}:{self._port}"

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
        cmd = [sys.executable, "-m", "moto.server", "-H", _LOOPBACK, "-p", str(self._port)]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr, env=env
        )
        self._finalizer = weakref.finalize(self, _terminate, self._proc)

    def _wait_until_answering(self) -> None:
        assert self._proc is not None
        url = f"http://{_LOOPBACK}:{self._port}/"
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



_FAULT_KINDS = ("drop", "error500", "error503", "delay")
_ALL_METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "HEAD"})


@dataclass(frozen=True)
class FaultPlan:
    """Which faults :class:`FaultProxy` injects, and how often.

    Each request whose method is in ``methods`` draws one uniform number from
    the proxy's RNG (seeded with ``seed`` when the plan is set) and gets at most
    one fault: ``drop`` with probability ``drop``, then ``error500``,
    ``error503`` and ``delay``. The probabilities must sum to at most 1.

    Attributes:
        drop: Close the connection without any response.
        error500: Answer ``500 InternalError`` (S3 XML body) without forwarding.
        error503: Answer ``503 SlowDown`` (S3 XML body) without forwarding.
        delay: Wait ``delay_s`` seconds, then forward normally.
        delay_s: Delay of a delayed request, seconds.
        seed: Seed of the RNG that decides which requests get faults.
        methods: HTTP methods that may get faults; others are always forwarded.
    """

    drop: float = 0.0
    error500: float = 0.0
    error503: float = 0.0
    delay: float = 0.0
    delay_s: float = 0.5
    seed: int = 0
    methods: frozenset[str] = field(default=_ALL_METHODS)

    def __post_init__(self) -> None:
        if isinstance(self.methods, str):
            raise TypeError(f"FaultPlan.methods must be a set of names, got {self.methods!r}.")
        for kind in _FAULT_KINDS:
            p = getattr(self, kind)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"FaultPlan.{kind} must be a probability in [0, 1], got {p!r}.")
        total = sum(getattr(self, kind) for kind in _FAULT_KINDS)
        if total > 1.0 + 1e-12:
            raise ValueError(
                f"FaultPlan probabilities sum to {total!r}, more than 1. "
                "Each request gets at most one fault; lower some of them."
            )
        if self.delay_s < 0:
            raise ValueError(f"FaultPlan.delay_s must be >= 0 seconds, got {self.delay_s!r}.")
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))

    def choose(self, u: float) -> str | None:
        """Return the fault kind for a uniform draw ``u`` in [0, 1), or ``None``."""
        edge = 0.0
        for kind in _FAULT_KINDS:
            edge += getattr(self, kind)
            if u < edge:
                return kind
        return None


# Headers that describe one hop (or that the proxy recomputes), never forwarded as is.
_HOP_BY_HOP = frozenset(
    "connection keep-alive proxy-connection proxy-authenticate proxy-authorization te "
    "trailer transfer-encoding upgrade expect content-length".split()
)
_S3_ERRORS = {
    "error500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "error503": (503, "SlowDown", "Please reduce your request rate."),
}


def _s3_error_body(code: str, message: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{request_id}</RequestId><HostId>flyarchive-fault-proxy</HostId></Error>"
    ).encode()


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one client connection's requests to the upstream, injecting faults."""

    protocol_version = "HTTP/1.1"  # keep-alive, and Expect: 100-continue handled by the base
    timeout = 60  # idle keep-alive connections end eventually
    server: _ProxyServer

    def setup(self) -> None:
        super().setup()
        self._upstream: http.client.HTTPConnection | None = None
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self._upstream is not None:
                self._upstream.close()
            self.server.proxy._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Silence per-request logging."""

    def do_GET(self) -> None:  # noqa: N802
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_GET

    def _handle(self) -> None:
        try:
            body = self._read_body()
        except ValueError:  # truncated or malformed: never forward part of a body
            self.close_connection = True
            return
        fault, plan = self.server.proxy._decide(self.command)
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault in _S3_ERRORS:
            status, code, message = _S3_ERRORS[fault]
            self._reply_error(status, code, message)
            return
        if fault == "delay":
            time.sleep(plan.delay_s)
        self._forward(body)

    def _read_body(self) -> bytes | None:
        """Read the whole request body; ``None`` if it has none.

        Raises:
            ValueError: If the body is malformed or ends early.
        """
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                parts.append(self._read_exactly(size))
                self.rfile.readline()  # CRLF after each chunk
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        length = self.headers.get("Content-Length")
        return None if length is None else self._read_exactly(int(length))

    def _read_exactly(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) != n:
            raise ValueError(f"request body ended after {len(data)} of {n} bytes")
        return data

    def _reply_error(self, status: int, code: str, message: str) -> None:
        request_id = f"fault-{next(self.server.proxy._ids)}"
        payload = _s3_error_body(code, message, request_id)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        if status == 503:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _forward(self, body: bytes | None) -> None:
        try:
            status, reason, headers, payload = self._exchange(body)
        except (OSError, http.client.HTTPException) as err:
            self.server.proxy._count("upstream_errors")
            self._reply_error(502, "BadGateway", f"Upstream failed: {type(err).__name__}")
            return
        self.server.proxy._count("forwarded")
        self.send_response_only(status, reason)  # the upstream's Server and Date pass through
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD" or status in (204, 304) or 100 <= status < 200:
            length = dict((k.lower(), v) for k, v in headers).get("content-length")
            if length is not None and status not in (204, 304):
                self.send_header("Content-Length", length)
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _exchange(self, body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send the request upstream; retry once on a fresh connection if a kept one died."""
        for attempt in range(2):
            reused = self._upstream is not None
            if self._upstream is None:
                host, port = self.server.proxy._upstream_address
                self._upstream = http.client.HTTPConnection(host, port, timeout=60)
            conn = self._upstream
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        conn.putheader(name, value)
                if body is not None:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                resp = conn.getresponse()
                payload = resp.read()
                if resp.will_close:
                    conn.close()
                    self._upstream = None
                return resp.status, resp.reason, resp.getheaders(), payload
            except (OSError, http.client.HTTPException):
                conn.close()
                self._upstream = None
                if not reused or attempt == 1 or self.command == "POST":
                    raise  # only a kept connection gone stale is retried, never a POST
        raise AssertionError("unreachable")


class FaultProxy(_Endpoint):
    """HTTP reverse proxy on ``127.0.0.1`` that injects faults into S3 traffic.

    Requests are read whole (Content-Length or chunked bodies; ``Expect:
    100-continue`` is answered), then either forwarded to ``upstream_url`` with
    the client's headers (``Host`` kept, so request signatures still match) or
    faulted as :attr:`plan` says. Responses are buffered and sent back with a
    Content-Length; HEAD, range GETs and keep-alive work as against the upstream.
    A faulted request never reaches the upstream. Bodies are held in memory:
    this is a test tool for small objects.

    Args:
        upstream_url: ``http://host:port`` of the S3 endpoint, e.g.
            ``S3Server.endpoint_url``.
        plan: Initial fault plan; default none.
    """

    def __init__(self, upstream_url: str, plan: FaultPlan | None = None) -> None:
        match = re.fullmatch(r"http://([^/:]+):(\d+)/?", upstream_url)
        if match is None:
            raise ValueError(f"upstream_url must be like 'http://host:port', got {upstream_url!r}.")
        self._upstream_address = (match[1], int(match[2]))
        self._lock = threading.Lock()
        self._plan = FaultPlan()
        self._rng = random.Random(0)
        self._stats: dict[str, int] = {}
        self._ids = itertools.count()
        self._connections: set[socket.socket] = set()
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None
        self.plan = plan if plan is not None else FaultPlan()
        self.reset_stats()

    @property
    def plan(self) -> FaultPlan:
        """The current fault plan; setting it reseeds the RNG with ``plan.seed``."""
        return self._plan

    @plan.setter
    def plan(self, plan: FaultPlan) -> None:
        if not isinstance(plan, FaultPlan):
            raise TypeError(f"plan must be a FaultPlan, got {type(plan).__name__}.")
        with self._lock:
            self._plan = plan
            self._rng = random.Random(plan.seed)

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running proxy.

        Raises:
            RuntimeError: If the proxy is not running.
        """
        if self._server is None:
            raise RuntimeError("The fault proxy is not running. Use `with FaultProxy(url) as p:`.")
        return f"http://{_LOOPBACK}:{self._server.server_address[1]}"

    def stats(self) -> dict[str, int]:
        """Return counts since start or the last :meth:`reset_stats`.

        Returns:
            A new dict with ``requests`` (all received), ``forwarded`` (answered by
            the upstream), ``upstream_errors`` (upstream unreachable, answered
            502), ``faults`` (all injected) and one count per fault kind:
            ``drop``, ``error500``, ``error503``, ``delay``. A delayed request
            is also counted as forwarded.
        """
        with self._lock:
            return dict(self._stats)

    def reset_stats(self) -> None:
        """Set every count to zero."""
        keys = ("requests", "forwarded", "upstream_errors", "faults", *_FAULT_KINDS)
        with self._lock:
            self._stats = dict.fromkeys(keys, 0)

    def start(self) -> Self:
        """Start serving in a background thread.

        Returns:
            ``self``.
        """
        if self._server is not None:
            raise RuntimeError("The fault proxy is already started.")
        server = _ProxyServer((_LOOPBACK, 0), _ProxyHandler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.1,), daemon=True, name="flyarchive-fault-proxy"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close open client connections. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _decide(self, method: str) -> tuple[str | None, FaultPlan]:
        with self._lock:
            self._stats["requests"] += 1
            plan = self._plan
            if method.upper() not in plan.methods:
                return None, plan
            fault = plan.choose(self._rng.random())
            if fault is not None:
                self._stats[fault] += 1
                self._stats["faults"] += 1
            return fault, plan

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
