"""What one viewer serves at most, and how long it waits: the bounds every connection and
every request is held to (:class:`Limits`), the share of the process's file descriptors
its connections may take (:func:`descriptor_budget`). A bound met is said by
:class:`~flyarchive.errors.RequestTooLargeError` (HTTP 413: what was asked, the bound, how
to narrow it) or :class:`~flyarchive.errors.ServerBusyError` (HTTP 429: how long to wait).

A request's cost is computed from its parameters before any work (:func:`check_cost`):
nothing is read or allocated for a request that would pass a bound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from flyarchive.errors import RequestTooLargeError

#: Descriptors kept for everything but connections (archive files, the renderer and its
#: encoder, S3 connections, logs): a quarter of the process's limit, at least this many.
RESERVED_DESCRIPTORS = 64


@dataclass(frozen=True)
class Limits:
    """The bounds of one viewer (:func:`flyarchive.view.app.start`).

    Attributes:
        header_timeout_s: From accepting a connection (or its last answer) to a complete
            request head; a connection that has not sent one by then is closed.
        body_timeout_s: From a request's head to the end of its body.
        idle_timeout_s: How long a connection that showed the token may stay open idle
            (aiohttp's ``keepalive_timeout``).
        max_connections: Connections open at once; None: :func:`descriptor_budget`
            (never more than it).
        max_per_address: Connections of one client address that have not shown the token;
            past it, that address's oldest is closed (every client on loopback shares
            ``127.0.0.1``: there, the oldest of all are closed first).
        max_requests_per_connection: Answers on one keep-alive connection before it is
            closed (a browser opens another).
        max_line_bytes, max_field_bytes, max_headers: A request line, one header, and the
            number of headers (aiohttp's ``max_line_size``, ``max_field_size``,
            ``max_headers``).
        max_body_bytes: A request's body.
        max_trace_lines: Lines of one traces request (worlds x dofs, or worlds x 3 for a
            keypoint).
        max_read_bytes: States one request may read: worlds x frames x state values x 8.
        max_out_bytes: Bytes of one answer.
        max_gait_frames: Frames of one gait request (footfalls and paths): worlds x the
            frames of its window, each computed by forward kinematics of the thorax and
            six tarsus tips unless kept.
        max_render_pixels: Pixels one render may encode: frames x height x width.
        max_queued_renders: Renders waiting at once, all clients together.
        max_queued_per_client: Renders one client (one page) may have waiting.
        max_jobs: Render jobs remembered (the oldest finished ones are forgotten first;
            their videos stay in the output folder).
        render_niceness: How much lower the render thread's CPU priority is than the
            server's (Linux ``nice``; the renderer's threads and processes inherit it),
            so that browsing stays quick while a render runs; 0: the same.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    max_connections: int | None = None
    max_per_address: int = 256
    max_requests_per_connection: int = 1000
    max_line_bytes: int = 8190
    max_field_bytes: int = 8190
    max_headers: int = 64
    max_body_bytes: int = 64 << 10
    max_trace_lines: int = 1000
    max_read_bytes: int = 512 << 20
    max_out_bytes: int = 64 << 20
    max_gait_frames: int = 100_000
    max_render_pixels: int = 4_000_000_000
    max_queued_renders: int = 8
    max_queued_per_client: int = 2
    max_jobs: int = 200
    render_niceness: int = 10

    def connections(self) -> int:
        """Connections open at once: ``max_connections`` within :func:`descriptor_budget`."""
        budget = descriptor_budget()
        return budget if self.max_connections is None else min(self.max_connections, budget)


def descriptor_budget() -> int:
    """File descriptors the viewer's connections may take: the process's soft limit
    (``ulimit -n``) less a reserve (a quarter of it, at least :data:`RESERVED_DESCRIPTORS`)
    and less those already open; at least 8."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no rlimits here (Windows)
        soft = 1024
    if soft < 0:  # RLIM_INFINITY
        soft = 1 << 20
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 32
    reserve = max(RESERVED_DESCRIPTORS, soft // 4)
    return max(8, soft - reserve - in_use)


def check_cost(what: str, asked: int, bound: int, unit: str, narrow: str) -> None:
    """Refuse a request whose cost ``asked`` (in ``unit``) passes ``bound``.

    Raises:
        RequestTooLargeError: saying what, how much, the bound, and ``narrow`` (how to ask
            less).
    """
    if asked > bound:
        raise RequestTooLargeError(f"{what} would be {asked:,} {unit}; one request may take at most "
                            f"{bound:,}. {narrow}")
