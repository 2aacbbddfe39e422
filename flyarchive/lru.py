"""What a process keeps between calls: :class:`LRUCache`, a small bounded cache of things
that are slow to make (a compiled model, a kinematics engine on a device, a renderer), the
least recently used going first.

One helper instead of a dictionary per module: the same bound, the same lock, each value
made once when several threads ask for it at the same time, and what goes is released
(``on_evict``: a renderer's ``close``) before its replacement is made, so that two big
values of different models are not held at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """Values by key, at most ``max_items`` of them (and at most ``max_weight`` together),
    the least recently used going first.

    Args:
        max_items: Values kept at most (>= 1).
        max_weight: What the values kept may weigh together (``weight`` of each, e.g.
            bytes); None: no bound but ``max_items``. The value just made is kept even
            when it alone weighs more.
        weight: The weight of a value (needed with ``max_weight``).
        on_evict: Called with each value that goes (evicted, popped or cleared), e.g.
            to close it; None: the value is only forgotten (freed when nothing else
            holds it).
        name: For ``repr``.

    Thread-safe. :meth:`get` of a key no value is kept for makes it once: other threads
    asking for the same key wait for it; other keys are served meanwhile.
    """

    def __init__(self, max_items: int, *, max_weight: int | None = None,
                 weight: Callable[[V], int] | None = None,
                 on_evict: Callable[[V], object] | None = None, name: str = "") -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items!r}.")
        if max_weight is not None and weight is None:
            raise ValueError("max_weight needs weight (the weight of a value).")
        self.max_items, self.max_weight = max_items, max_weight
        self._weight, self._on_evict, self._name = weight, on_evict, name
        self._values: OrderedDict[K, V] = OrderedDict()  # the least recently used first
        self._weights: dict[K, int] = {}
        self._lock = threading.Lock()
        self._making: dict[K, threading.Lock] = {}

    def __repr__(self) -> str:
        return f"LRUCache({self._name or 'unnamed'}: {len(self)} of {self.max_items})"

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._values

    def keys(self) -> Iterator[K]:
        """The keys kept, the least recently used first (a copy)."""
        with self._lock:
            return iter(list(self._values))

    def peek(self, key: K) -> V | None:
        """The value kept for ``key`` (None: none), without making it nor counting a use."""
        with self._lock:
            return self._values.get(key)

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``: the one kept, or ``make()`` (kept, unless it raises).

        Before a value is made, the least recently used values go until there is room
        for one more (``max_items``); after, until the values weigh at most
        ``max_weight`` (the new one stays).
        """
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            making = self._making.setdefault(key, threading.Lock())
        with making:
            with self._lock:  # made by another thread while this one waited
                if key in self._values:
                    self._values.move_to_end(key)
                    return self._values[key]
                gone = self._shrink(self.max_items - 1, None)
            self._release(gone)
            try:
                value = make()
            finally:
                with self._lock:
                    self._making.pop(key, None)
            with self._lock:
                self._values[key] = value
                if self._weight is not None:
                    self._weights[key] = int(self._weight(value))
                gone = self._shrink(self.max_items, self.max_weight, keep=key)
        self._release(gone)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key``, as the most recently used (a value that was kept for
        ``key`` goes, ``on_evict`` called); then the least recently used values go until
        at most ``max_items`` are left, weighing at most ``max_weight`` (the new one stays).
        For values made elsewhere, kept only when they may be (e.g. a verdict that may be
        remembered)."""
        with self._lock:
            old = self._values.pop(key, None)
            self._weights.pop(key, None)
            self._values[key] = value
            if self._weight is not None:
                self._weights[key] = int(self._weight(value))
            gone = [old] if old is not None and old is not value else []
            gone += self._shrink(self.max_items, self.max_weight, keep=key)
        self._release(gone)

    def pop(self, key: K) -> V | None:
        """Forget the value of ``key`` (``on_evict`` is called); returns it (None: none)."""
        with self._lock:
            value = self._values.pop(key, None)
            self._weights.pop(key, None)
        if value is not None:
            self._release([value])
        return value

    def clear(self) -> None:
        """Forget every value (``on_evict`` is called for each)."""
        with self._lock:
            gone = self._shrink(0, None)
        self._release(gone)

    def weight(self) -> int:
        """What the values kept weigh together (0 without ``weight``)."""
        with self._lock:
            return sum(self._weights.values())

    def _shrink(self, items: int, weight: int | None, keep: K | None = None) -> list[V]:
        """Take out the least recently used values (not ``keep``) until at most ``items``
        are left weighing at most ``weight``; the caller holds the lock."""
        gone = []
        for key in list(self._values):
            over = len(self._values) > items or \
                (weight is not None and sum(self._weights.values()) > weight)
            if not over:
                break
            if key == keep:
                continue
            gone.append(self._values.pop(key))
            self._weights.pop(key, None)
        return gone

    def _release(self, values: list[V]) -> None:
        if self._on_evict is not None:
            for value in values:
                self._on_evict(value)
