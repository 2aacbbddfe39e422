"""Render on demand: the selected worlds and time window to one mp4 (a mosaic when there
are several worlds), through :func:`flyarchive.render_videos`, one render at a time on
one thread of the server, so that the renderer it builds stays warm for the next one.

Videos land in ``{out}/{job:04d}-worlds-.../``; the page gets them back by job number
only (no path from the page reaches the file system).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flyarchive.errors import FlyarchiveError, SelectionError

log = logging.getLogger("flyarchive.view")

#: Most worlds one render may tile.
MAX_WORLDS = 16


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
        state: ``"queued"``, ``"running"``, ``"done"`` or ``"failed"``.
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
    state: str = "queued"
    message: str = ""
    video: Path | None = None
    frames: int = 0
    fps: float = 0.0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    progress: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "worlds": self.worlds, "camera": self.camera, "start": self.start,
                "end": self.end, "state": self.state, "message": self.message,
                "progress": round(self.progress, 3), "frames": self.frames, "fps": self.fps,
                "duration": self.frames / self.fps if self.fps else None,
                "elapsed": round((self.finished or time.monotonic()) - self.started, 2),
                "folder": str(self.folder),
                "video": f"/video/{self.id}.mp4" if self.state == "done" else None}


class Renders:
    """The server's render queue: one thread, jobs kept for the server's life."""

    def __init__(self, viewed: Any, model: Any, out: Path, backend: str) -> None:
        self.viewed = viewed
        self.model = model
        self.out = out
        self.backend = backend
        self.jobs: dict[int, RenderJob] = {}
        self._lock = threading.Lock()
        self._warmed = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flyarchive-view-render")

    def submit(self, worlds: list[int], camera: str, start: float | None, end: float | None,
               size: tuple[int, int]) -> RenderJob:
        """Queue a render of ``worlds`` (one video; tiled when several) from camera ``camera``.

        Raises:
            SelectionError: no world, too many, unknown ids, no model, or an unknown camera.
        """
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
        with self._lock:
            number = max(self.jobs, default=0) + 1
            folder = self._folder(number, worlds)
            job = RenderJob(number, list(worlds), camera, start, end, size, folder)
            self.jobs[number] = job
        self._thread.submit(self._run, job)
        return job

    def warm(self) -> None:
        """Start loading the renderer on the render thread (imports of the render stack;
        Warp's on the Warp backends), so that the first render does not wait for them."""
        if self.model is not None and not self._warmed:
            self._warmed = True
            self._thread.submit(_warm, self.backend)

    def _folder(self, number: int, worlds: list[int]) -> Path:
        shown = "-".join(map(str, worlds[:4])) + ("-etc" if len(worlds) > 4 else "")
        folder = self.out / f"{number:04d}-worlds-{shown}"
        bump = 0
        while folder.exists():  # left by an earlier server: never overwritten
            bump += 1
            folder = self.out / f"{number:04d}-{bump}-worlds-{shown}"
        return folder

    def _run(self, job: RenderJob) -> None:
        from flyarchive import RenderOptions, render_videos

        job.state, job.message, job.started = "running", "rendering", time.monotonic()
        log.info("render %d: worlds %s, camera %r, time %s to %s, backend %s -> %s", job.id,
                 job.worlds, job.camera, job.start, job.end, self.backend, job.folder)
        try:
            n = len(job.worlds)
            cols = math.ceil(math.sqrt(n))
            mosaic = (math.ceil(n / cols), cols) if n > 1 else None
            options = RenderOptions(size=job.size, backend=self.backend, mosaic=mosaic,
                                    overlays=("world", "time"), progress=True)
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

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def _warm(backend: str) -> None:
    import importlib

    try:
        importlib.import_module("flyarchive").render_videos  # noqa: B018  (the import is the work)
        if backend in ("gpu", "warp-cpu"):
            importlib.import_module("warp").init()
            importlib.import_module("mujoco_warp")
    except Exception as err:  # noqa: BLE001 - the render itself reports what is missing
        log.info("warming the renderer: %s", err)
