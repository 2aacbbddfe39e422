"""The viewer's connections: its own accept loop in front of aiohttp, which has no bound on
connections and no deadline of its own for a request's head (its ``keepalive_timeout``,
the idle timeout of a connection, covers a connection's first request in recent releases
only, and the viewer keeps it long for the page's connections).

Every accepted connection is known here until it closes. One that has not shown the access
token (*untrusted*) must send a request head within ``header_timeout_s`` of being accepted
or answered, and is the first closed when the viewer needs room: past ``max_per_address``
of its address, or when the connections reach their budget (:meth:`Limits.connections`,
below the process's descriptor limit). A connection that showed the token (*trusted*, as
the middleware of :mod:`flyarchive.view.server` says: :meth:`Connections.trust`) is never
closed to make room for an untrusted one; it is closed after ``idle_timeout_s`` idle.
So clients that open connections and never finish them cannot take the descriptors the
user's browser needs: the oldest of them are dropped as new ones come.

When ``accept`` itself fails for want of descriptors (``EMFILE``), the oldest untrusted
connection is closed and the accept tried again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flyarchive.view.limits import Limits

log = logging.getLogger("flyarchive.view")

#: Accepts in a row before the loop lets other work run.
_BURST = 32
#: Seconds between two log lines about refused or dropped connections.
_SAY_EVERY_S = 10.0


@dataclass(eq=False)
class _Connection:
    transport: Any
    address: str
    last: float  # accepted, or last answered
    busy: int = 0  # requests being answered
    answered: int = 0
    trusted: bool = False


class Connections:
    """The accept loop of one viewer and what it knows of each connection.

    Args:
        sock: The listening socket (made non-blocking here).
        factory: aiohttp's protocol factory (``AppRunner.server``).
        limits: The bounds (:class:`~flyarchive.view.limits.Limits`).
    """

    def __init__(self, sock: socket.socket, factory: Callable[[], Any], limits: Limits) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.factory = factory
        self.limits = limits
        self.budget = limits.connections()
        self._untrusted: OrderedDict[Any, _Connection] = OrderedDict()  # oldest first
        self._by_address: dict[str, OrderedDict[Any, _Connection]] = {}
        self._trusted: dict[Any, _Connection] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0  # untrusted connections closed for room or for their deadline
        self.refused = 0  # connections closed at once: no room
        self._said = 0.0

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Start accepting and sweeping (on the running loop)."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._accept()), loop.create_task(self._sweep())]

    async def close(self) -> None:
        """Stop accepting; close every connection."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self.sock.close()
        for conn in [*self._untrusted.values(), *self._trusted.values()]:
            conn.transport.abort()
        self._untrusted.clear()
        self._by_address.clear()
        self._trusted.clear()

    @property
    def open(self) -> int:
        """Connections known (some may have closed since the last sweep)."""
        return len(self._untrusted) + len(self._trusted)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        burst = 0
        while True:
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._say(f"out of file descriptors ({err.strerror}) with {self.open} "
                              "connections open: closing the oldest that showed no token")
                    if not self._drop_oldest(None):
                        await asyncio.sleep(0.05)  # nothing to drop: wait for one to end
                    continue
                if self.sock.fileno() < 0:
                    return
                log.warning("accepting a connection failed: %s", err)
                await asyncio.sleep(0.01)
                continue
            address = str(peer[0]) if isinstance(peer, tuple) else ""
            if self._room(address):
                try:
                    transport, _ = await loop.connect_accepted_socket(self.factory, conn)
                except OSError:
                    conn.close()
                else:
                    self._add(_Connection(transport, address, time.monotonic()))
            else:
                conn.close()
                self.refused += 1
                self._say(f"refusing connections: {self.open} open, the budget is "
                          f"{self.budget}, and every one showed the token or is answering")
            burst += 1
            if burst >= _BURST:
                burst = 0
                await asyncio.sleep(0)

    def _room(self, address: str) -> bool:
        """Make room for one more connection from ``address``; False: none can be made."""
        mine = self._by_address.get(address)
        if mine is not None and len(mine) >= self.limits.max_per_address:
            self._say(f"{len(mine)} connections from {address} showed no token, the most one "
                      f"address may have: closing the oldest that showed no token")
            self._drop_oldest(address)
        if self.open >= self.budget:
            self._say(f"{self.open} connections open, the budget of this process "
                      f"({self.budget}): closing the oldest that showed no token")
        while self.open >= self.budget:
            if not self._drop_oldest(None):
                self._forget_closed()
                return self.open < self.budget
        return True

    def _add(self, conn: _Connection) -> None:
        self._untrusted[conn.transport] = conn
        self._by_address.setdefault(conn.address, OrderedDict())[conn.transport] = conn

    def _remove(self, conn: _Connection) -> None:
        self._untrusted.pop(conn.transport, None)
        self._trusted.pop(conn.transport, None)
        mine = self._by_address.get(conn.address)
        if mine is not None:
            mine.pop(conn.transport, None)
            if not mine:
                del self._by_address[conn.address]

    def _drop_oldest(self, address: str | None) -> bool:
        """Close the oldest untrusted connection (of ``address``; None: of any); False:
        there is none."""
        order = self._untrusted if address is None else self._by_address.get(address)
        while order:
            conn = next(iter(order.values()))
            self._remove(conn)
            if not conn.transport.is_closing():
                conn.transport.abort()
                self.dropped += 1
                return True
        return False

    def _forget_closed(self) -> None:
        for conn in [*self._untrusted.values(), *self._trusted.values()]:
            if conn.transport.is_closing():
                self._remove(conn)

    async def _sweep(self) -> None:
        """Close connections past their deadline, forget closed ones, a few times a
        second."""
        period = max(0.05, min(1.0, self.limits.header_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            late = 0
            for conn in [*self._untrusted.values(), *self._trusted.values()]:
                if conn.transport.is_closing():
                    self._remove(conn)
                    continue
                allowed = self.limits.idle_timeout_s if conn.trusted else \
                    self.limits.header_timeout_s
                if not conn.busy and now - conn.last > allowed:
                    self._remove(conn)
                    conn.transport.abort()
                    late += 0 if conn.trusted else 1
            if late:
                self.dropped += late
                self._say(f"closed {late} connections that sent no request within "
                          f"{self.limits.header_timeout_s:g} s")

    def _say(self, text: str) -> None:
        now = time.monotonic()
        if now - self._said >= _SAY_EVERY_S:
            self._said = now
            log.warning("%s", text)

    # ------------------------------------------------------------------ requests
    def _find(self, transport: Any) -> _Connection | None:
        return self._untrusted.get(transport) or self._trusted.get(transport)

    def begin(self, transport: Any) -> int:
        """A request's head arrived on ``transport``: it is busy until :meth:`end`.
        Returns the requests answered on it before this one."""
        conn = self._find(transport)
        if conn is None:
            return 0
        conn.busy += 1
        return conn.answered

    def end(self, transport: Any) -> None:
        """The request on ``transport`` was answered: its deadline starts again."""
        conn = self._find(transport)
        if conn is not None:
            conn.busy = max(0, conn.busy - 1)
            conn.answered += 1
            conn.last = time.monotonic()

    def trust(self, transport: Any) -> None:
        """``transport`` showed the token: never dropped to make room; idle timeout."""
        conn = self._untrusted.get(transport)
        if conn is None:
            return
        self._remove(conn)
        conn.trusted = True
        self._trusted[transport] = conn
