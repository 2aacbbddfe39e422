"""A fault-injecting HTTP proxy between s3fs and an S3 server, for reliability tests.

:class:`FaultProxy` forwards every request to the upstream server and, following
a :class:`FaultPlan`, drops the connection, answers 500/503 with an S3 XML error,
or delays a fraction of them, so that tests can check what retries do to the data.

Example::

    with S3Server() as server, FaultProxy(server.endpoint_url) as proxy:
        server.create_bucket("flies")
        proxy.plan = FaultPlan(error503=0.2, seed=1)
        fs = proxy.filesystem()
        fs.pipe("flies/a.bin", b"data")
"""

from __future__ import annotations

import http.client
import itertools
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from flyarchive.testing.s3 import LOOPBACK, Endpoint

__all__ = ["FaultPlan", "FaultProxy"]

_FAULT_KINDS = ("drop", "error500", "error503", "delay", "silent")
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
        silent: Answer nothing at all for ``delay_s`` seconds (not even the ``100
            Continue`` an upload asks for first, its body left unread), then close the
            connection: a server that took the connection and stopped answering (a stalled
            endpoint, a network partition).
        delay_s: Delay of a delayed request, seconds.
        seed: Seed of the RNG that decides which requests get faults.
        methods: HTTP methods that may get faults; others are always forwarded.
    """

    drop: float = 0.0
    error500: float = 0.0
    error503: float = 0.0
    delay: float = 0.0
    silent: float = 0.0
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

    def handle_expect_100(self) -> bool:
        """The fault of a request that asks for ``100 Continue`` is decided here, before
        the base class sends it (a silent server never does)."""
        self._decided = self.server.proxy._decide(self.command)
        if self._decided[0] == "silent":
            self._fall_silent(self._decided[1])
            return False
        return super().handle_expect_100()

    def _fall_silent(self, plan: FaultPlan) -> None:
        time.sleep(plan.delay_s)
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _handle(self) -> None:
        decided, self._decided = getattr(self, "_decided", None), None
        fault, plan = decided or self.server.proxy._decide(self.command)
        if fault == "silent":
            self._fall_silent(plan)
            return
        try:
            body = self._read_body()
        except ValueError:  # truncated or malformed: never forward part of a body
            self.close_connection = True
            return
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
        self.server.proxy._count("bytes_in", len(body or b""))
        self.server.proxy._count("bytes_out", 0 if self.command == "HEAD" else len(payload))
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


class FaultProxy(Endpoint):
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
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def stats(self) -> dict[str, int]:
        """Return counts since start or the last :meth:`reset_stats`.

        Returns:
            A new dict with ``requests`` (all received), ``forwarded`` (answered by
            the upstream), ``upstream_errors`` (upstream unreachable, answered
            502), ``bytes_in`` and ``bytes_out`` (body bytes of forwarded requests
            and of their responses), ``faults`` (all injected) and one count per fault kind:
            ``drop``, ``error500``, ``error503``, ``delay``. A delayed request
            is also counted as forwarded.
        """
        with self._lock:
            return dict(self._stats)

    def reset_stats(self) -> None:
        """Set every count to zero."""
        keys = ("requests", "forwarded", "upstream_errors", "bytes_in", "bytes_out", "faults",
                *_FAULT_KINDS)
        with self._lock:
            self._stats = dict.fromkeys(keys, 0)

    def start(self) -> Self:
        """Start serving in a background thread.

        Returns:
            ``self``.
        """
        if self._server is not None:
            raise RuntimeError("The fault proxy is already started.")
        server = _ProxyServer((LOOPBACK, 0), _ProxyHandler)
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

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
