"""The encoding stage of the Warp render pipeline: threads that pipe rendered batches into
one ffmpeg per (world, camera) video and publish each finished video to its final URL.

:class:`Encoders` takes batches of frames in host buffers from
:func:`flyarchive.render.warp_pipeline.render_jobs` and gives each buffer back once
every frame in it is encoded, which bounds host memory by the buffers in flight.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive import config
from flyarchive.render.diagnostics import StageTimer
from flyarchive.render.plan import Batch, Job, Piece, RenderPlan
from flyarchive.video.mosaic import is_mosaic

if TYPE_CHECKING:
    import mujoco

    from flyarchive.video.output_files import OutputWriter

#: Most encoder threads one render starts (and never more than its videos).
MAX_ENCODERS = 64
_STOP = object()


def _leave_render_core() -> None:
    """Keep this encoder thread, and the ffmpeg processes it starts, off one core.

    With an encoder on every core, the thread that drives the renderer waits for a
    time slice at each step and the GPU idles meanwhile. On Linux with at least 4
    usable cores, encoder threads (ffmpeg inherits the affinity of the thread that
    starts it) use all cores but the first, which the render and read threads keep.
    """
    if not hasattr(os, "sched_setaffinity"):  # not Linux
        return
    cores = os.sched_getaffinity(0)
    if len(cores) >= 4:
        os.sched_setaffinity(0, cores - {min(cores)})  # pid 0: this thread only


class Encoders:
    """Encoder threads, each writing the videos given to it (every output of a (video,
    camera): an :class:`~flyarchive.video.output_files.OutputWriter`), each video's frames in order.

    A video (job, camera) goes to the thread with the fewest frames queued when its
    first frames come, and its later frames to the same thread, so they stay in order
    and no thread idles while another has a queue. Each thread opens a
    :class:`VideoWriter` on a video's first frames; after its last frame it closes
    ffmpeg's input and goes on with the next video while ffmpeg finishes the file,
    and publishes the file (copies it to its final URL) once ffmpeg has exited.

    Args:
        plan: The :class:`~flyarchive.render.plan.RenderPlan` (cameras, output, options).
        jobs: The videos to make, indexed by ``Piece.job``.
        tmp: A local folder for videos being encoded.
        pixel_format: Of the frames submitted (see :class:`VideoWriter`).
        buffers: Host frame buffers, by index ``0 .. buffers - 1``.
        parts: The run's parts folder (see :func:`~flyarchive.render.warp_pipeline.render_jobs`).
        timer: Where stage timings go.
        model: The compiled model (the far plane, for the depth maps' attributes).
        on_video: Called with each video's entry once it is published (from the encoder
            thread that published it).

    Raises:
        ConfigError: ``FLYARCHIVE_ENCODERS`` is not a whole number >= 0.
    """

    def __init__(self, plan: RenderPlan, jobs: tuple[Job, ...], tmp: Path, pixel_format: str,
                 buffers: int, parts: str | None = None, timer: StageTimer | None = None,
                 model: mujoco.MjModel | None = None,
                 on_video: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._plan, self._jobs, self._tmp, self._parts = plan, jobs, tmp, parts
        self._pixel_format = pixel_format
        self._cameras = tuple(plan.cameras)
        self._timer = timer if timer is not None else StageTimer()
        # Encoding is the slow stage (x264 on the CPU): one single-threaded encoder per
        # core, fed in parallel, beats fewer multi-threaded ones.
        n_videos = len(jobs) * len(self._cameras)
        n_threads = max(1, min(n_videos, config.encoders(), MAX_ENCODERS))
        video = plan.options.video
        self._model = model
        self._on_video = on_video
        self._outputs = plan.options.outputs
        # One mosaic is one x264 stream: give each the cores its share of threads leaves.
        threads = 1 if not jobs or not is_mosaic(jobs[0]) else max(
            1, (os.cpu_count() or 1) // n_threads)
        self._video = video if video.threads is not None else dataclasses.replace(
            video, threads=threads)
        self._timer.add_results({"encoder_threads": n_threads})
        self._queues: list[queue.Queue[Any]] = [queue.Queue() for _ in range(n_threads)]
        self._free: queue.Queue[int] = queue.Queue()  # host buffers no batch holds
        for buffer in range(buffers):
            self._free.put(buffer)
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}  # host buffer -> pieces not yet encoded
        self._owner: dict[tuple[int, int], int] = {}  # video -> its thread
        self._load = [0] * n_threads  # frames queued per thread
        self._writers: dict[tuple[int, int], OutputWriter] = {}
        self.entries: dict[tuple[int, str], dict[str, Any]] = {}
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"flyarchive-encode-{i}",
                             daemon=True)
            for i in range(n_threads)
        ]
        for thread in self._threads:
            thread.start()

    def reserve(self) -> int:
        """Wait for a free host buffer for one more batch; its index."""
        while True:
            self.raise_if_failed()
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                continue

    def submit(self, batch: Batch, frames: np.ndarray | None, buffer: int,
               maps: np.ndarray | None = None) -> None:
        """Hand a rendered batch over: frames ``(n, ncam, *frame)`` uint8 (None without
        RGB) and maps ``(n, ncam, n_maps, H, W)`` uint16 (None without maps) in host buffer
        ``buffer``.

        The buffer is free again once every piece of the batch is encoded.
        """
        work = [(p, c) for p in batch.pieces for c in range(len(self._cameras))]
        blocks = []
        for piece, cam in work:
            rows = slice(piece.offset, piece.offset + piece.n)
            blocks.append((None if frames is None else frames[rows, cam],
                           None if maps is None else maps[rows, cam]))
        threads = []
        with self._lock:
            self._pending[buffer] = len(work)
            for piece, cam in work:
                thread = self._owner.get((piece.job, cam))
                if thread is None:  # a new video: the least loaded thread
                    thread = min(range(len(self._load)), key=self._load.__getitem__)
                    self._owner[(piece.job, cam)] = thread
                self._load[thread] += piece.n
                threads.append(thread)
        for (piece, cam), (block, block_maps), thread in zip(work, blocks, threads):
            self._queues[thread].put((piece, cam, block, block_maps, buffer))

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def finish(self) -> dict[tuple[int, str], dict[str, Any]]:
        """Wait for every video to be written; returns the manifest entries."""
        self._stop_threads()
        self.raise_if_failed()
        return self.entries

    def abort(self) -> None:
        """Stop the threads and drop partial videos."""
        if self._error is None:
            self._error = RuntimeError("aborted")
        self._stop_threads()
        for writer in self._writers.values():
            writer.abort()

    def _stop_threads(self) -> None:
        for q in self._queues:
            q.put(_STOP)
        for thread in self._threads:
            thread.join()

    def _work(self, index: int) -> None:
        _leave_render_core()
        q = self._queues[index]
        finishing: list[tuple[tuple[int, int], OutputWriter]] = []  # input closed, not yet published
        while True:
            idle = time.perf_counter()
            try:  # while ffmpeg processes finish files, look at them every few ms
                item = q.get(timeout=0.005) if finishing else q.get()
            except queue.Empty:
                self._timer.add("encoder_idle_s", time.perf_counter() - idle)
                self._publish_finished(finishing, wait=False)
                continue
            self._timer.add("encoder_idle_s", time.perf_counter() - idle)
            if item is _STOP:
                break
            piece, cam, frames, maps, buffer = item
            try:
                if self._error is None:
                    done = self._encode(piece, cam, frames, maps)
                    if done is not None:
                        finishing.append(done)
                    self._publish_finished(finishing, wait=False)
            except BaseException as err:
                self._error = self._error or err
            finally:
                self._done(buffer, index, piece.n)
        try:
            if self._error is None:
                self._publish_finished(finishing, wait=True)
        except BaseException as err:
            self._error = self._error or err

    def _done(self, buffer: int, thread: int, n_frames: int) -> None:
        """A piece is encoded: its host buffer is given back with the batch's last piece."""
        with self._lock:
            self._load[thread] -= n_frames
            self._pending[buffer] -= 1
            last = self._pending[buffer] == 0
            if last:
                del self._pending[buffer]
        if last:
            self._free.put(buffer)

    def _encode(self, piece: Piece, cam: int, frames: np.ndarray | None,
                maps: np.ndarray | None) -> tuple[tuple[int, int], OutputWriter] | None:
        """Write a piece's frames and maps; ``(video, writer)`` when that was the video's
        last piece."""
        from flyarchive.render.output_plan import map_attributes
        from flyarchive.video.mosaic import mosaic_size
        from flyarchive.video.output_files import OutputWriter

        plan, job, camera = self._plan, self._jobs[piece.job], self._cameras[cam]
        key = (piece.job, cam)
        writer = self._writers.get(key)
        if writer is None:
            mosaic = is_mosaic(job)
            size = mosaic_size(plan.options.size, (job.rows, job.cols)) if mosaic else plan.options.size
            attrs = ({} if mosaic else map_attributes(plan.options, self._model, job.world_id,
                                                      camera, job.start, plan.fps))
            with self._timer.time("open_s"):
                writer = OutputWriter(self._tmp / f"{piece.job}-{cam}", "video", self._outputs,
                                      fps=plan.fps, size=size, n_frames=job.n_frames,
                                      video=self._video, pixel_format=self._pixel_format,
                                      map_attrs=attrs, map_size=plan.options.size)
            self._writers[key] = writer
        names = [n for n in self._outputs if n != "rgb"]
        with self._timer.time("encode_s"):
            writer.write(frames, {n: maps[:, i] for i, n in enumerate(names)} if names else None)
        if writer.n_frames < job.n_frames:
            return None
        with self._timer.time("close_input_s"):
            writer.close_input()  # ffmpeg finishes the file while this thread goes on
        for kind, seconds in writer.seconds.items():
            self._timer.add(f"write_{kind}_s", seconds)
        return key, writer

    def _publish_finished(self, finishing: list[tuple[tuple[int, int], OutputWriter]],
                          wait: bool) -> None:
        """Publish the videos whose ffmpeg has exited (all of them with ``wait``)."""
        for item in [f for f in finishing if wait or f[1].finished]:
            finishing.remove(item)
            with self._timer.time("publish_s"):
                self._publish(*item)
            self._timer.add("videos", 1)

    def _forget(self, key: tuple[int, int]) -> None:
        del self._writers[key]
        with self._lock:
            del self._owner[key]

    def _publish(self, key: tuple[int, int], writer: OutputWriter) -> None:
        from flyarchive.video.manifest import output_root, video_entry
        from flyarchive.video.workspace import RunFolder

        plan, job, camera = self._plan, self._jobs[key[0]], self._cameras[key[1]]
        with self._timer.time("wait_ffmpeg_s"):
            writer.close()
        urls = plan.output_urls(job, camera)
        if plan.is_kept(job, camera):  # finished by an earlier render: not published again
            writer.abort()
            self._forget(key)
            return
        so, staging = plan.out_storage_options, None
        if self._parts is not None:
            RunFolder.check_open(self._parts, so)
            staging = RunFolder.staging(self._parts, so)
        writer.publish(urls, so, overwrite=plan.options.overwrite, staging_dir=staging,
                       root=output_root(plan.out))
        self._forget(key)
        self.entries[(key[0], camera)] = video_entry(plan, job, camera, urls)
        if self._on_video is not None:
            self._on_video(self.entries[(key[0], camera)])
