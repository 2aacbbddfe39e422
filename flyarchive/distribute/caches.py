"""What a process keeps between render tasks: the renderer it built last, for the next task
that asks for the same model, cameras and size.

Building a renderer costs far more than a task's frames (a GL context and scene, or a
mujoco-warp model, render context and BVH on the device), and a worker renders many
tasks with one model. Each cache holds one renderer and closes it when another is asked
for. OpenGL renderers are kept per thread (a GL context belongs to the thread that made
it: :func:`thread_renderers`); the Warp pipeline keeps one per process for its device.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["RendererCache", "thread_renderers", "close_thread_renderers"]


class RendererCache:
    """The renderer last asked for, by key; asking for another key closes it first.

    Not thread-safe: one cache per thread, or a lock around it.
    """

    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._renderer: Any = None

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The renderer of ``key``: the one held, or ``make()`` (the one held is closed)."""
        if self._renderer is None or key != self._key:
            self.clear()
            self._renderer = make()
            self._key = key
        return self._renderer

    def clear(self) -> None:
        """Close and forget the renderer held (if it has ``close``). Idempotent."""
        renderer, self._renderer, self._key = self._renderer, None, None
        if renderer is not None and hasattr(renderer, "close"):
            renderer.close()


_local = threading.local()
_every_thread: list[RendererCache] = []  # closed at exit, before EGL is terminated
_every_lock = threading.Lock()
_exit_hook = False


def thread_renderers() -> RendererCache:
    """This thread's renderer cache (OpenGL: a GL context is bound to its thread).

    Every thread's renderer is closed when the interpreter exits, before MuJoCo
    terminates EGL (whose own exit hook, registered when the first renderer imported
    it, runs after ours).
    """
    cache = getattr(_local, "renderers", None)
    if cache is None:
        cache = _local.renderers = _ClosedAtExit()
        with _every_lock:
            _every_thread.append(cache)
    return cache


def close_thread_renderers() -> None:
    """Close this thread's renderer (frees its GL context); other threads keep theirs
    (e.g. the threads of a dask computation of frames)."""
    thread_renderers().clear()


class _ClosedAtExit(RendererCache):
    """A cache whose renderers are closed at exit; the exit hook is registered after the
    first renderer exists (so after MuJoCo's EGL hook, hence run before it)."""

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        global _exit_hook
        renderer = super().get(key, make)
        with _every_lock:
            if not _exit_hook:
                atexit.register(_close_every_thread)
                _exit_hook = True
        return renderer


def _close_every_thread() -> None:
    with _every_lock:
        caches = list(_every_thread)
    for cache in caches:
        cache.clear()
