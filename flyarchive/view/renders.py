"""Render on demand: the selected worlds and time window to one mp4 (a mosaic when there
are several worlds), through :func:`flyarchive.render_videos`, one render at a time on
one thread of the server, so that the renderer it builds stays warm for the next one;
that thread runs at a lower CPU priority than the server's (Linux ``nice``), and so do
the renderer's own threads and processes, which inherit it.

The queue is bounded and fair: each client (a page) may have
:attr:`~flyarchive.view.limits.Limits.max_queued_per_client` renders waiting, all clients
together :attr:`~flyarchive.view.limits.Limits.max_queued_renders`
(:class:`~flyarchive.errors.ServerBusyError` past that, with the expected wait), and the
thread takes the clients' renders in turn, not in the order they came. A render's cost
(frames x pixels) is checked before it is queued. The job table keeps the last
:attr:`~flyarchive.view.limits.Limits.max_jobs` jobs.

Videos land in ``{out}/{job:04d}-worlds-.../`` (the output folder made again if it was
removed); the page gets them back by job number only (no path from the page reaches the
file system).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flyarchive.errors import (
    FlyarchiveError,
    RenderCancelled,
    SelectionError,
    ServerBusyError,
    Terminated,
)
from flyarchive.view.limits import Limits, check_cost

log = logging.getLogger("flyarchive.view")

#: Most worlds one render may tile.
MAX_WORLDS = 16
#: Seconds a render is expected to take before any has finished.
FIRST_RENDER_S = 30.0


def best_backend() -> str:
    """The fastest renderer this machine has: ``"gpu"`` with an NVIDIA GPU and
    mujoco-warp, ``"warp-cpu"`` with mujoco-warp alone, else OpenGL."""
    import importlib.util

    warp = importlib.util.find_spec("mujoco_warp") is not None
    if warp and any(Path("/dev").glob("nvidia[0-9]*")):
        return "gpu"
    if warp:
        return "warp-cpu"
    return "opengl"


@dataclass
class RenderJob:
    """One render asked for by the page.

    Attributes:
        id: 1, 2, ... in this server's life.
        worlds, camera, start, end, size: What to render.
        client: Who asked (the page's id).
        state: ``"queued"``, ``"running"``, ``"done"``, ``"failed"`` or ``"cancelled"``.
        message: What went wrong (failed), or what is happening.
        folder: Where its video goes.
        video: The mp4 (done).
        frames, fps: Of the video (done).
    """

    id: int
    worlds: list[int]
    camera: str
    start: float | None
    end: float | None
    size: tuple[int, int]
    folder: Path
    client: str = ""
    state: str = "queued"
    message: str = ""
    video: Path | None = None
    frames: int = 0
    fps: float = 0.0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    progress: float = 0.0
    cancelling: bool = False
    made_folder: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "worlds": self.worlds, "camera": self.camera, "start": self.start,
                "end": self.end, "state": self.state, "message": self.message,
                "progress": round(self.progress, 3), "frames": self.frames, "fps": self.fps,
                "duration": self.frames / self.fps if self.fps else None,
                "elapsed": round((self.finished or time.monotonic()) - self.started, 2),
                "waiting": self.state == "queued",
                "folder": str(self.folder),
                "video": f"/video/{self.id}.mp4" if self.state == "done" else None}


class Renders:
    """The server's render queue: one thread, clients served in turn.

    Args:
        viewed: The :class:`~flyarchive.view.shown_archive.ViewedArchive`.
        model: The model to render with (None: none yet, or none at all).
        out: The output folder.
        backend: The renderer.
        limits: Queue, job table and cost bounds.
    """

    def __init__(self, viewed: Any, model: Any, out: Path, backend: str,
                 limits: Limits | None = None) -> None:
        self.viewed = viewed
        self.model = model
        self.out = out
        self.backend = backend
        self.limits = limits or Limits()
        self.jobs: dict[int, RenderJob] = {}
        self._waiting: OrderedDict[str, deque[RenderJob]] = OrderedDict()  # next client first
        self._cond = threading.Condition()
        self._next = 1
        self._took: deque[float] = deque(maxlen=8)  # seconds of the last renders
        self._warm_asked = self._warm_due = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, worlds: list[int], camera: str, start: float | None, end: float | None,
               size: tuple[int, int], *, client: str = "") -> RenderJob:
        """Queue a render of ``worlds`` (one video; tiled when several) from camera
        ``camera``, asked for by ``client``.

        Raises:
            SelectionError: no world, too many, unknown ids, no model, an unknown camera,
                a time window without frames, or a size that cannot be encoded.
            RequestTooLargeError: frames x pixels past the limit.
            ServerBusyError: this client's renders, or all clients', already fill the queue.
        """
        self._check(worlds, camera, start, end, size)
        with self._cond:
            room, why = self._room(client)
            if not room:
                raise ServerBusyError(why, self._wait_s(self._waiting_count()))
            return self._queue(worlds, camera, start, end, size, client)

    def submit_many(self, groups: list[list[int]], camera: str, start: float | None,
                    end: float | None, size: tuple[int, int], *, client: str = ""
                    ) -> tuple[list[RenderJob], str]:
        """Queue a render of each group of worlds (one video each, tiled), in order, as many
        as the queue's bounds let ``client`` have waiting now; the others are not queued.

        Returns:
            ``(jobs queued, why the others were not)`` (``""`` when every group was).

        Raises:
            As :meth:`submit` (every group is checked before any is queued);
            ServerBusyError when none could be queued.
        """
        for worlds in groups:
            self._check(worlds, camera, start, end, size)
        jobs: list[RenderJob] = []
        with self._cond:  # queued together: the render thread takes none meanwhile
            for worlds in groups:
                room, why = self._room(client)
                if not room:
                    if not jobs:
                        raise ServerBusyError(why, self._wait_s(self._waiting_count()))
                    return jobs, why
                jobs.append(self._queue(worlds, camera, start, end, size, client))
        return jobs, ""

    def _check(self, worlds: list[int], camera: str, start: float | None, end: float | None,
               size: tuple[int, int]) -> None:
        """Refuse a render that cannot be made (see :meth:`submit`), before it is queued."""
        if self.model is None:
            raise SelectionError("This archive keeps no model, so nothing can be rendered; start "
                                 "`flyarchive view` with --model FILE.")
        if not worlds:
            raise SelectionError("Select at least one world in the table to render.")
        if len(worlds) > MAX_WORLDS:
            raise SelectionError(f"{len(worlds)} worlds are selected; a render tiles at most "
                                 f"{MAX_WORLDS}. Select fewer.")
        self.viewed.index_of(worlds)
        from flyarchive.models import camera_ids

        camera_ids(self.model, camera)
        frames = _frames(self.viewed.frame_window(start, end))
        options = self._options(len(worlds), size)
        tile = options.size[0] * options.size[1]
        narrow = "Render fewer worlds, a smaller size or a shorter time window."
        check_cost("The render", frames * tile * len(worlds), self.limits.max_render_pixels,
                   "pixels", narrow)

    def _waiting_count(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def _room(self, client: str) -> tuple[bool, str]:
        """Whether ``client`` may queue one more render now, and why not (called holding
        the lock)."""
        if self._closed:
            raise SelectionError("The viewer is stopping; it renders nothing more.")
        mine = len(self._waiting.get(client, ()))
        waiting = self._waiting_count()
        wait = self._wait_s(waiting)
        if mine >= self.limits.max_queued_per_client:
            return False, (f"This page has {mine} renders waiting already, the most one page may "
                           f"have; ask again when one has started (in about {wait:.0f} s).")
        if waiting >= self.limits.max_queued_renders:
            return False, (f"{waiting} renders are waiting already, the most the viewer keeps; "
                           f"ask again in about {wait:.0f} s.")
        return True, ""

    def _queue(self, worlds: list[int], camera: str, start: float | None, end: float | None,
               size: tuple[int, int], client: str) -> RenderJob:
        """Add a checked render to the queue (called holding the lock)."""
        number = self._next
        self._next += 1
        job = RenderJob(number, list(worlds), camera, start, end, size,
                        self._folder(number, worlds), client)
        self.jobs[number] = job
        self._forget_old()
        self._waiting.setdefault(client, deque()).append(job)
        self._start_thread()
        self._cond.notify()
        return job

    def _options(self, n_worlds: int, size: tuple[int, int]) -> Any:
        """The render options of a job (size and mosaic checked now, not in the thread)."""
        from flyarchive import RenderOptions

        cols = math.ceil(math.sqrt(n_worlds))
        mosaic = (math.ceil(n_worlds / cols), cols) if n_worlds > 1 else None
        return RenderOptions(size=size, backend=self.backend, mosaic=mosaic,
                             overlays=("world", "time"), progress=True)

    def _wait_s(self, waiting: int) -> float:
        """About how long the renders waiting (and the one running) take, seconds."""
        each = statistics.fmean(self._took) if self._took else FIRST_RENDER_S
        return each * (waiting + 1)

    def _forget_old(self) -> None:
        """Keep :attr:`Limits.max_jobs` jobs: forget the oldest that have finished."""
        extra = len(self.jobs) - self.limits.max_jobs
        for number in [n for n, j in self.jobs.items() if j.finished is not None][:max(extra, 0)]:
            del self.jobs[number]

    def status(self, number: int) -> dict[str, Any]:
        """Job ``number`` as JSON.

        Raises:
            SelectionError: no such job (never asked, or forgotten).
        """
        job = self.jobs.get(number)
        if job is None:
            raise SelectionError(f"No render {str(number)!r} in this viewer (it remembers the "
                                 f"last {self.limits.max_jobs}).")
        return job.as_json()

    def cancel(self, number: int) -> dict[str, Any]:
        """Cancel job ``number``: one waiting leaves the queue; the one running is stopped
        as Ctrl-C stops a render (its partial files removed), and its folder, which holds
        no finished video, removed; the next render starts. A finished one stays as it is.

        Returns:
            The job as JSON (its state ``"cancelled"`` unless it had finished).

        Raises:
            SelectionError: no such job (never asked, or forgotten).
        """
        self.status(number)  # (no such job: said)
        job = self.jobs[number]
        with self._cond:
            if job.state == "queued":
                for client, queue in list(self._waiting.items()):
                    if job in queue:
                        queue.remove(job)
                        if not queue:
                            del self._waiting[client]
                job.state, job.message = "cancelled", "cancelled before it started"
                job.finished = time.monotonic()
            elif job.state == "running" and not job.cancelling:
                job.cancelling = True
                job.message = "cancelling"
                if self._thread is not None:  # at its next Python instruction (see _work)
                    _interrupt(self._thread, RenderCancelled)
        return job.as_json()

    def warm(self) -> None:
        """Start loading the renderer on the render thread (imports of the render stack;
        Warp's on the Warp backends), so that the first render does not wait for them."""
        if self.model is not None and not self._warm_asked:
            with self._cond:
                self._warm_asked = self._warm_due = True
                self._start_thread()
                self._cond.notify()

    def drop_waiting(self, why: str) -> None:
        """Fail every render still waiting, saying ``why``."""
        with self._cond:
            for queue in self._waiting.values():
                for job in queue:
                    job.state, job.message, job.finished = "failed", why, time.monotonic()
            self._waiting.clear()

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, daemon=True,
                                            name="flyarchive-view-render")
            self._thread.start()

    def _take(self) -> RenderJob:
        """The next render, the clients taken in turn (called holding the lock)."""
        client, queue = next(iter(self._waiting.items()))
        job = queue.popleft()
        del self._waiting[client]
        if queue:
            self._waiting[client] = queue  # at the end: the other clients first
        return job

    def _work(self) -> None:
        _lower_priority(self.limits.render_niceness)
        while True:
            try:
                if not self._next_job():
                    return
            except RenderCancelled:  # a cancel that came as its render ended: nothing to stop
                continue
            except Terminated:  # close(): render_videos removed its partial files
                return

    def _next_job(self) -> bool:
        """Wait for a render (or the warm-up) and do it; False once closed."""
        with self._cond:
            while not (self._closed or self._waiting or self._warm_due):
                self._cond.wait()
            if self._closed:
                return False
            job = None if self._warm_due else self._take()
            self._warm_due = False
        if job is None:
            _warm(self.backend)
            return True
        try:
            self._run(job)
        except RenderCancelled:  # cancel(): render_videos removed its partial files
            job.state, job.message = "cancelled", "cancelled while it rendered"
            if job.made_folder:  # (never another's: a name taken by then is not its own)
                shutil.rmtree(job.folder, ignore_errors=True)
            log.info("render %d cancelled", job.id)
        if job.state == "done" and job.finished is not None:
            self._took.append(job.finished - job.started)
        return True

    def _folder(self, number: int, worlds: list[int], *, make: bool = False) -> Path:
        """The render's folder: the first of its names that nothing holds (left by an
        earlier server, or made by another viewer of the same ``--out``: never
        overwritten); with ``make``, made here (at once, so that no other can take it)."""
        shown = "-".join(map(str, worlds[:4])) + ("-etc" if len(worlds) > 4 else "")
        for bump in range(10_000):
            folder = self.out / (f"{number:04d}-worlds-{shown}" if bump == 0 else
                                 f"{number:04d}-{bump}-worlds-{shown}")
            if not make and not folder.exists():
                return folder
            if make:
                try:
                    folder.mkdir()
                    return folder
                except FileExistsError:
                    continue
        raise OSError(f"No free name for a render folder in {str(self.out)!r}; clear it.")

    def _run(self, job: RenderJob) -> None:
        from flyarchive import render_videos

        job.state, job.message, job.started = "running", "rendering", time.monotonic()
        made = None  # the output folder's identity as the render starts
        try:
            self.out.mkdir(parents=True, exist_ok=True)  # removed since the server started?
            made = _identity(self.out)
            job.folder = self._folder(job.id, job.worlds, make=True)  # taken since it queued?
            job.made_folder = True
            log.info("render %d: worlds %s, camera %r, time %s to %s, backend %s -> %s",
                     job.id, job.worlds, job.camera, job.start, job.end, self.backend,
                     job.folder)
            options = self._options(len(job.worlds), job.size)
            watch = threading.Thread(target=self._watch, args=(job,), daemon=True)
            watch.start()
            result = render_videos(
                self.viewed.url, self.model, job.camera, str(job.folder), worlds=job.worlds,
                time=(job.start, job.end), options=options,
                n_workers=None if self.backend in ("gpu", "warp-cpu") else 0,
                storage_options=self.viewed.storage_options or None)
            video = result.videos[0]
            job.video = Path(str(video["path"]))
            job.frames, job.fps = int(video["frames"]), float(video["fps"])
            job.state, job.message, job.progress = "done", f"wrote {job.video}", 1.0
            log.info("render %d done: %d frames in %.1f s: %s", job.id, job.frames,
                     time.monotonic() - job.started, job.video)
        except Exception as err:  # noqa: BLE001 - every failure is reported on the page
            job.state = "failed"
            job.message = str(err) if isinstance(err, FlyarchiveError) else \
                f"{type(err).__name__}: {err}"
            if made is not None and _identity(self.out) != made:  # gone, or made again
                job.message += (f" (the output folder {str(self.out)!r} was removed while it "
                                "rendered; the next render makes it again)")
            log.error("render %d failed: %s", job.id, job.message)
        finally:
            job.finished = time.monotonic()

    def _watch(self, job: RenderJob) -> None:
        """Follow the render's progress bar (``tqdm``) while it runs."""
        try:
            from tqdm import tqdm
        except ImportError:
            return
        while job.state == "running":
            bars = [b for b in list(getattr(tqdm, "_instances", ())) if getattr(b, "total", 0)]
            if bars:
                job.progress = max(min(b.n / b.total, 0.999) for b in bars)
            time.sleep(0.2)

    def video(self, number: int) -> Path | None:
        """The finished video of job ``number``: a regular file inside the output folder."""
        job = self.jobs.get(number)
        if job is None or job.state != "done" or job.video is None:
            return None
        path = Path(os.path.realpath(job.video))
        if not path.is_relative_to(os.path.realpath(self.out)) or not path.is_file():
            return None
        return path

    def close(self, wait_s: float = 10.0) -> None:
        """Render nothing more: renders still waiting fail, and the one running is stopped
        as Ctrl-C stops a render (its partial files removed) and its folder, which holds
        no finished video, removed (the viewer stopped by Ctrl-C or SIGTERM left both)."""
        self.drop_waiting("the viewer stopped before this render started")
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            running = next((j for j in self.jobs.values() if j.state == "running"), None)
        thread = self._thread
        if running is None or thread is None or not thread.is_alive():
            return
        _interrupt(thread)
        thread.join(wait_s)  # a thread inside a long C call takes the interrupt after it
        if running.state != "done":
            running.state, running.message = "failed", "the viewer stopped while it rendered"
            if running.made_folder:
                shutil.rmtree(running.folder, ignore_errors=True)


def _identity(folder: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of a folder (None: none there)."""
    try:
        found = os.stat(folder)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _interrupt(thread: threading.Thread, error: type[BaseException] = Terminated) -> None:
    """Raise ``error`` (:class:`~flyarchive.errors.Terminated`: as SIGTERM raises it in the
    main thread) in ``thread``, at its next Python instruction."""
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(error))


def _lower_priority(niceness: int) -> None:
    """Lower this thread's CPU priority by ``niceness`` (Linux: each thread has its own
    nice value, and the threads and processes it starts inherit it; elsewhere nothing)."""
    if niceness <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) +
                                                 niceness))
    except OSError as err:  # not allowed here: the render runs at the server's priority
        log.info("the render thread keeps the server's priority (%s)", err)


def _frames(window: slice) -> int:
    return max(0, window.stop - window.start)


def _warm(backend: str) -> None:
    import importlib

    try:
        importlib.import_module("flyarchive").render_videos  # noqa: B018  (the import is the work)
        if backend in ("gpu", "warp-cpu"):
            importlib.import_module("warp").init()
            importlib.import_module("mujoco_warp")
    except Exception as err:  # noqa: BLE001 - the render itself reports what is missing
        log.info("warming the renderer: %s", err)
