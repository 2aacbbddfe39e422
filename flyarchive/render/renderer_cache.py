"""What a process keeps between render tasks: the renderers it built, for the next task
that asks for the same model, cameras, size and outputs (the one renderer cache of every
backend and every caller: segments and batches of videos, blocks of ``render_frames``),
and the archives it reads states from (:func:`state_reader`, :func:`archive_header`:
opened once per process, and again only when the archive was replaced).

Building a renderer costs far more than a task's frames (a GL context and scene, or a
mujoco-warp model, render context and BVH on the device), and a worker renders many
tasks with one model. Each renderer cache (:func:`renderer_cache`, a
:class:`~flyarchive.lru.LRUCache` of one) holds one renderer and closes it when another is
asked for:

- OpenGL renderers (:func:`opengl_renderer`) are kept per thread: a GL context belongs to
  the thread that made it;
- Warp renderers (:func:`warp_renderer`) are kept per process, in slots
  (:func:`warp_slot`), each used by one batch stream at a time under its lock: slot 0
  for a process's render, one slot per render thread sharing Warp's CPU device, and
  :data:`BLOCKS_SLOT` for the blocks of ``render_frames``.

The archives are kept in an :class:`~flyarchive.lru.LRUCache` too (the last
:data:`ARCHIVES_KEPT`).
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from flyarchive import config
from flyarchive.lru import LRUCache
from flyarchive.models import bytes_sha256, model_from_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from flyarchive.replay.opengl_frames import OpenGLRenderer
    from flyarchive.replay.warp_frames import WarpBatchRenderer
    from flyarchive.store.header import ArchiveHeader
    from flyarchive.store.reader import StateReader

#: The Warp slot of the blocks of ``render_frames`` (:mod:`flyarchive.render.frame_blocks`).
BLOCKS_SLOT = -1


#: Archives kept opened (their state reader and header), at most: a worker renders from few.
ARCHIVES_KEPT = 8


def renderer_cache(name: str) -> LRUCache[Hashable, Any]:
    """A cache of one renderer: :meth:`~flyarchive.lru.LRUCache.get` of another key closes
    the renderer kept before it makes the next (two renderers' GL contexts or device
    buffers are never held at once); :meth:`~flyarchive.lru.LRUCache.clear` closes it."""
    return LRUCache(1, on_evict=_close, name=name)


def _close(renderer: Any) -> None:
    if hasattr(renderer, "close"):
        renderer.close()


# ----------------------------------------------------------------------------- OpenGL
_local = threading.local()
_every_thread: list[LRUCache[Hashable, Any]] = []  # closed at exit, before EGL is terminated
_every_lock = threading.Lock()
_exit_hook = False


def opengl_renderer(blob: bytes, cameras: Sequence[str], size: tuple[int, int],
                    outputs: Sequence[str] = ("rgb",)) -> OpenGLRenderer:
    """This thread's OpenGL renderer for a model (MJB bytes), cameras, size and outputs:
    the one kept, or a new one (the one kept is closed). A worker process of a local
    cluster pins Mesa's rasterizer to one thread first (:func:`flyarchive.config.is_worker`).
    """
    from flyarchive.replay.opengl_frames import OpenGLRenderer, pin_rasterizer_threads

    def make() -> OpenGLRenderer:
        if config.is_worker():
            pin_rasterizer_threads(1)
        return OpenGLRenderer(model_from_bytes(blob), tuple(cameras), size, outputs=tuple(outputs))

    key = (bytes_sha256(blob), tuple(cameras), tuple(size), tuple(outputs))
    renderer = thread_renderers().get(key, make)
    _close_at_exit()
    return renderer


def thread_renderers() -> LRUCache[Hashable, Any]:
    """This thread's renderer cache (OpenGL: a GL context is bound to its thread).

    Every thread's renderer is closed when the interpreter exits, before MuJoCo
    terminates EGL (whose own exit hook, registered when the first renderer imported
    it, runs after ours: :func:`_close_at_exit`).
    """
    cache = getattr(_local, "renderers", None)
    if cache is None:
        cache = _local.renderers = renderer_cache(f"OpenGL renderer of {threading.current_thread().name}")
        with _every_lock:
            _every_thread.append(cache)
    return cache


def close_thread_renderers() -> None:
    """Close this thread's renderer (frees its GL context); other threads keep theirs
    (e.g. the threads of a dask computation of frames)."""
    thread_renderers().clear()


def _close_at_exit() -> None:
    """Register, once, the exit hook that closes every thread's renderer: after the first
    renderer exists (so after MuJoCo's EGL hook, hence run before it)."""
    global _exit_hook
    with _every_lock:
        if not _exit_hook:
            atexit.register(_close_every_thread)
            _exit_hook = True


def _close_every_thread() -> None:
    with _every_lock:
        caches = list(_every_thread)
    for cache in caches:
        cache.clear()


# ----------------------------------------------------------------------------- Warp
#: Slot -> its renderer cache and lock (the slots a process uses: not a cache itself).
_slots: dict[int, tuple[LRUCache[Hashable, Any], threading.Lock]] = {}
_slots_lock = threading.Lock()


def warp_slot(slot: int = 0) -> tuple[LRUCache[Hashable, Any], threading.Lock]:
    """This process's Warp renderer cache of ``slot`` and its lock (one batch stream per
    renderer at a time: hold the lock while using it)."""
    with _slots_lock:
        if slot not in _slots:
            _slots[slot] = (renderer_cache(f"Warp renderer of slot {slot}"), threading.Lock())
        return _slots[slot]


def warp_renderer(cache: LRUCache[Hashable, Any], blob: bytes, cameras: str | Sequence[str],
                  size: tuple[int, int], *, batch_worlds: int, device: str,
                  **options: Any) -> WarpBatchRenderer:
    """The :class:`~flyarchive.replay.warp_frames.WarpBatchRenderer` of a model (MJB bytes),
    cameras, size, batch size, device and other renderer ``options`` (``outputs``,
    ``pixel_format``, ``host_buffers``, ``mosaic``...) in ``cache``: the one kept, or a
    new one (the one kept is closed). Call it holding the cache's lock."""
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    def make() -> WarpBatchRenderer:
        # WarpBatchRenderer prepares a copy with prepare_for_batch_rendering.
        return WarpBatchRenderer(model_from_bytes(blob), cameras, size,
                                 batch_worlds=batch_worlds, device=device, **options)

    key = (bytes_sha256(blob), tuple([cameras] if isinstance(cameras, str) else cameras),
           tuple(size), batch_worlds, device, tuple(sorted(options.items())))
    return cache.get(key, make)


def clear_renderers() -> None:
    """Close every Warp renderer this process keeps (the next render builds its own)."""
    with _slots_lock:
        slots = list(_slots.values())
    for cache, lock in slots:
        with lock:
            cache.clear()


# ----------------------------------------------------------------------------- archives
_ARCHIVES: LRUCache[tuple[str, str], tuple[StateReader, ArchiveHeader | None]] = LRUCache(
    ARCHIVES_KEPT, name="archives read by renders")


def _archive_key(url: str, storage_options: Mapping[str, Any] | None) -> tuple[str, str]:
    return url, json.dumps(dict(storage_options or {}), sort_keys=True, default=str)


def keep_archive(url: str, storage_options: Mapping[str, Any] | None,
                 header: ArchiveHeader) -> None:
    """Keep the archive a render planned with (its header, and a :class:`StateReader`
    through the same opened group): this process's tasks read it without opening it again."""
    from flyarchive.store.reader import StateReader

    reader = StateReader(url, storage_options or None, group=header.group,
                         world_ids=header["world"].values)
    _ARCHIVES.put(_archive_key(url, storage_options), (reader, header))


def _kept(url: str, storage_options: Mapping[str, Any] | None, archive_id: str | None,
          frames: int | None = None) -> tuple[StateReader, ArchiveHeader | None]:
    from flyarchive.store.reader import StateReader

    def opened() -> tuple[StateReader, ArchiveHeader | None]:
        return StateReader(url, storage_options or None), None

    key = _archive_key(url, storage_options)
    kept = _ARCHIVES.get(key, opened)
    replaced = archive_id is not None and kept[0].archive_id != archive_id
    grown = frames is not None and kept[0].n_time < frames  # appended to since
    if replaced or grown:
        kept = opened()
        _ARCHIVES.put(key, kept)
    return kept


def state_reader(url: str, storage_options: Mapping[str, Any] | None,
                 archive_id: str | None = None, frames: int | None = None) -> StateReader:
    """This process's :class:`~flyarchive.store.reader.StateReader` of the archive at
    ``url``: the one kept, or a new one when there is none, when it is not the archive
    ``archive_id`` (the one the render planned with: it was replaced at the same URL since
    this process opened it), or when it holds fewer than ``frames`` frames (the render
    planned with frames appended since: the archive's id stays)."""
    return _kept(url, storage_options, archive_id, frames)[0]


def archive_header(url: str, storage_options: Mapping[str, Any] | None,
                   archive_id: str | None = None, frames: int | None = None) -> ArchiveHeader:
    """The header (:func:`flyarchive.store.dataset.open_header`) of the archive that
    :func:`state_reader` reads, kept with it (read through its group when it has none)."""
    from flyarchive.store.dataset import open_header

    reader, header = _kept(url, storage_options, archive_id, frames)
    if header is None:
        header = open_header(url, storage_options or None, group=reader.group)
        _ARCHIVES.put(_archive_key(url, storage_options), (reader, header))
    return header
