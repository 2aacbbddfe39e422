"""Archive -> mp4 on mujoco-warp's batch renderer (backends ``"gpu"`` and ``"warp-cpu"``).

One process drives one Warp device. The (world, frame) work of a render plan is
packed world-major into batches of ``B = options.batch_worlds`` states, so that a
batch touches few videos. Three stages overlap:

- a reader thread loads each batch's states from the archive (one read per
  rectangular block of worlds x frames, not one per frame) into a bounded queue;
- this thread submits each batch with one :meth:`WarpBatchRenderer.submit` call
  (one host-to-device and one device-to-host copy), the next one before waiting for
  the current one's frames, into one of ``_BATCHES_IN_FLIGHT`` host buffers that
  the encoders give back when they are done with its frames;
- encoder threads pipe the frames to one ffmpeg process per (world, camera) video,
  opened when its first frame arrives and closed, then copied to its final URL,
  after its last frame.

At most ``_BATCHES_IN_FLIGHT`` batches hold host buffers at a time, so host memory
is bounded by a few batches, never by the length of a video.

With a Dask client (or a scheduler address), the jobs are split into groups of
whole videos, about equal in frames and cut on batch multiples, and each group is
submitted with ``resources={"GPU": 1}`` to a worker that runs the same
single-process routine. Workers must be started with that resource, one worker per
GPU, e.g. ``dask worker SCHEDULER --nthreads 1 --resources GPU=1`` with
``CUDA_VISIBLE_DEVICES`` set to its GPU (dask-cuda's ``LocalCUDACluster`` sets it).
Resources are passed to ``client.submit`` explicitly: Dask drops ``annotate``
resources during graph optimization (dask #7036).

``import flyarchive`` does not import this module; it imports ``warp`` lazily.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.distribute.plan import Batch, Piece, pack_batches
from flyarchive.distribute.workspace import scratch_dir
from flyarchive.errors import RenderBackendError
from flyarchive.store import StateReader

__all__ = ["warp_device", "render_jobs", "batch_worlds_of", "progress_bar", "STATS"]

#: Host frame buffers, one batch each: batches being rendered or waiting for their
#: encoders at one time (the host memory bound).
_BATCHES_IN_FLIGHT = 4
#: Largest batch on Warp's CPU device, which renders a batch's states one after
#: another: bigger batches save nothing there and make partial batches cost more;
#: below 4 the launch overhead shows. NeuroMechFly 240x320 on a 2-core VM: one
#: 150-frame video 15.7 frames/s at 16, 18.1-20.4 at 4, 15.5 at 2; two 250-frame
#: videos 19.0 at both 16 and 4.
_CPU_BATCH_WORLDS = 4
#: States read ahead of the renderer, in batches.
_READ_AHEAD = 2
#: Seconds spent per stage in this process (summed over threads), for benchmarks:
#: main thread waiting for reads / for encoder room / submitting batches / waiting for
#: their frames; encoder threads piping frames to ffmpeg / finishing and publishing.
STATS: dict[str, float] = dict.fromkeys(
    ("wait_read_s", "wait_encoders_s", "submit_s", "wait_gpu_s", "encode_s", "publish_s",
     "encoder_threads"), 0.0)
_STOP = object()


def warp_device(backend: str) -> str:
    """The Warp device of a backend: ``"cuda"`` for ``"gpu"``, ``"cpu"`` for ``"warp-cpu"``.

    Raises:
        RenderBackendError: ``"gpu"`` was asked for and Warp sees no CUDA device, or the
            backend is not a Warp backend.
    """
    if backend == "warp-cpu":
        return "cpu"
    if backend != "gpu":
        raise RenderBackendError(
            f"Backend {backend!r} does not render with Warp. Warp backends: 'gpu', 'warp-cpu'."
        )
    import warp as wp

    from flyarchive.warp_log import configure_warp  # interop: Warp quiet unless verbose

    configure_warp(wp)
    wp.init()
    if wp.get_cuda_device_count() < 1:
        raise RenderBackendError(
            "backend='gpu' needs a CUDA device, and Warp sees none on this machine "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Pass "
            "backend='warp-cpu' (the same renderer on the CPU) or backend='cpu' (OpenGL)."
        )
    return "cuda"


# ----------------------------------------------------------------------------- one process
_renderers: dict[tuple[Any, ...], Any] = {}
_renderers_lock = threading.Lock()


def _in_flight() -> int:
    """Host frame buffers (memory: that many batches); at least 2, as batch k + 1 is
    submitted before batch k is handed to the encoders."""
    return max(2, int(os.environ.get("FLYARCHIVE_BATCHES_IN_FLIGHT", 0)) or _BATCHES_IN_FLIGHT)


def batch_worlds_of(options: Any) -> int:
    """States per batch: ``options.batch_worlds``, at most ``_CPU_BATCH_WORLDS`` on the CPU."""
    if options.backend == "warp-cpu":
        return min(options.batch_worlds, _CPU_BATCH_WORLDS)
    return options.batch_worlds


def _renderer(blob: bytes, cameras: tuple[str, ...], size: tuple[int, int],
              batch_worlds: int, device: str) -> Any:
    """One cached :class:`WarpBatchRenderer` per process (the last one asked for)."""
    from flyarchive.models import model_from_bytes
    from flyarchive.replay.warp import WarpBatchRenderer

    buffers = _in_flight()  # a batch's frames stay valid until it is encoded
    key = (hashlib.sha256(blob).hexdigest(), cameras, tuple(size), batch_worlds, device, buffers)
    if key not in _renderers:
        _renderers.clear()
        # WarpBatchRenderer prepares a copy with prepare_for_batch_rendering.
        # I420 on the device: half the bytes to copy, and no RGB conversion in ffmpeg.
        _renderers[key] = WarpBatchRenderer(
            model_from_bytes(blob), cameras, size, batch_worlds=batch_worlds, device=device,
            host_buffers=buffers, pixel_format="yuv420p",
        )
    return _renderers[key]


def render_jobs(plan: Any, blob: bytes, jobs: Sequence[Any], device: str, *,
                parts: str | None = None, on_frames: Callable[[int], None] | None = None
                ) -> list[dict[str, Any]]:
    """Render and encode every video of ``jobs`` in this process, on one Warp device.

    Args:
        plan: The :class:`flyarchive.distribute.cpu_tasks.RenderPlan` (archive, cameras, output,
            options).
        blob: The compiled model as MJB bytes.
        jobs: The videos to make (a subset of ``plan.jobs``, or all of them).
        device: Warp device, ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
        parts: The run's parts folder (:class:`flyarchive.distribute.workspace.RunFolder`): finished
            videos are staged in it on local disk, and none is published once it is gone
            (the run was given up). None: stage beside each video.
        on_frames: Called with the number of frames of each batch rendered (for a
            progress bar elsewhere); None: a progress bar here when
            ``plan.options.progress``.

    Returns:
        Manifest entries ``{"world", "camera", "path", "frames", "first_frame", "fps",
        "size"}``, in ``jobs`` order, then camera order.

    Raises:
        OutputExistsError: a video exists and ``plan.options.overwrite`` is False.
        VideoEncodeError, StorageError, NonFiniteStateError (never for committed NaN
            frames: those render black, as on the CPU backend).
    """
    jobs = tuple(jobs)
    options = plan.options
    # No bigger than the work: a partial batch costs a full one.
    batch_worlds = min(batch_worlds_of(options), sum(job.n_frames for job in jobs))
    batches = pack_batches(jobs, batch_worlds)
    source = StateReader(plan.url, plan.storage_options)
    with _renderers_lock:  # one batch stream per device at a time in a process
        renderer = _renderer(blob, tuple(plan.cameras), tuple(options.size), batch_worlds,
                             device)
        with tempfile.TemporaryDirectory(prefix="flyarchive-warp-", dir=scratch_dir()) as tmp:
            encoders = _Encoders(plan, jobs, Path(tmp), renderer.pixel_format, parts)
            bar = None
            if on_frames is None:
                bar = progress_bar(sum(b.n for b in batches), options.progress)
                on_frames = None if bar is None else bar.update
            try:
                _render_batches(source, jobs, batches, renderer, renderer.default_state,
                                encoders, on_frames)
                entries = encoders.finish()
            except BaseException:
                encoders.abort()
                raise
            finally:
                if bar is not None:
                    bar.close()
    return [entries[(i, c)] for i in range(len(jobs)) for c in plan.cameras]


def _render_batches(source: tuple[str, dict[str, Any]], jobs: tuple[Any, ...],
                    batches: list[Batch], renderer: Any, default: np.ndarray, encoders: _Encoders,
                    on_frames: Callable[[int], None] | None) -> None:
    """Render every batch, submitting batch k + 1 before handing batch k to the encoders.

    On CUDA, :meth:`WarpBatchRenderer.submit` only queues the work, so the GPU renders
    the next batch while this thread waits for the current one's frames and passes
    them on: the GPU does not wait for the host between batches.
    """
    pending: tuple[Batch, Any, np.ndarray, int] | None = None
    with _read_ahead(source, jobs, batches) as states:
        clock = time.perf_counter()
        for batch, (qpos, mocap_pos, mocap_quat) in zip(batches, states):
            STATS["wait_read_s"] += time.perf_counter() - clock
            encoders.raise_if_failed()
            valid = _fill_invalid(qpos, mocap_pos, mocap_quat, default)
            clock = time.perf_counter()
            buffer = encoders.reserve()  # blocks while every host buffer waits to be encoded
            STATS["wait_encoders_s"] += time.perf_counter() - clock
            clock = time.perf_counter()
            submitted = renderer.submit(qpos, mocap_pos, mocap_quat, buffer=buffer)
            STATS["submit_s"] += time.perf_counter() - clock
            if pending is not None:
                _hand_over(*pending, renderer.pixel_format, encoders, on_frames)
            pending = (batch, submitted, valid, buffer)
            clock = time.perf_counter()
    if pending is not None:
        _hand_over(*pending, renderer.pixel_format, encoders, on_frames)


def _hand_over(batch: Batch, submitted: Any, valid: np.ndarray, buffer: int, pixel_format: str,
               encoders: _Encoders, on_frames: Callable[[int], None] | None) -> None:
    """Wait for a submitted batch's frames and give them to the encoders."""
    clock = time.perf_counter()
    frames = submitted.wait()  # (n, ncam, *frame), a view of host buffer `buffer`
    STATS["wait_gpu_s"] += time.perf_counter() - clock
    if not valid.all():
        _blacken(frames, ~valid, pixel_format)
    encoders.submit(batch, frames, buffer)
    if on_frames is not None:
        on_frames(batch.n)


def _blacken(frames: np.ndarray, rows: np.ndarray, pixel_format: str) -> None:
    """Make ``frames[rows]`` black: RGB zeros, or I420 luma 16 and chroma 128."""
    if pixel_format == "rgb24":
        frames[rows] = 0
        return
    luma_rows = frames.shape[-2] * 2 // 3
    frames[rows, :, :luma_rows] = 16
    frames[rows, :, luma_rows:] = 128


def progress_bar(total: int, show: bool) -> Any:
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="frames", unit="frame")


def _fill_invalid(qpos: np.ndarray, mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None,
                  default: np.ndarray) -> np.ndarray:
    """Rows with NaN or infinity get the model's default state (rendered, then blacked)."""
    valid = np.isfinite(qpos).all(axis=1)
    for extra in (mocap_pos, mocap_quat):
        if extra is not None:
            valid &= np.isfinite(extra.reshape(len(extra), -1)).all(axis=1)
    if valid.all():
        return valid
    nq = qpos.shape[1]
    qpos[~valid] = default[:nq]
    if mocap_pos is not None and mocap_quat is not None:
        nm = mocap_pos.shape[1]
        mocap_pos[~valid] = default[nq:nq + 3 * nm].reshape(nm, 3)
        mocap_quat[~valid] = default[nq + 3 * nm:].reshape(nm, 4)
    return valid


@contextmanager
def _read_ahead(source: tuple[str, dict[str, Any]], jobs: tuple[Any, ...], batches: list[Batch]
                ) -> Iterator[Iterator[Any]]:
    """States of each batch, read by a background thread at most ``_READ_AHEAD`` ahead."""
    results: queue.Queue[Any] = queue.Queue(maxsize=_READ_AHEAD)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        """Put ``item`` in the queue unless the consumer has gone; False when it has."""
        while not stop.is_set():
            try:
                results.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read_all() -> None:
        try:
            for batch in batches:
                pieces = [(jobs[p.job].world_index, p.start, p.stop) for p in batch.pieces]
                if not offer(source.read(pieces)):
                    return
        except BaseException as err:  # handed to the consumer
            offer(err)

    def consume() -> Iterator[Any]:
        for _ in batches:
            item = results.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    thread = threading.Thread(target=read_all, name="flyarchive-read", daemon=True)
    thread.start()
    try:
        yield consume()
    finally:
        stop.set()
        thread.join()


# ----------------------------------------------------------------------------- encoding
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


class _Encoders:
    """Encoder threads, each writing the videos given to it, each video's frames in order.

    A video (job, camera) goes to the thread with the fewest frames queued when its
    first frames come, and its later frames to the same thread, so they stay in order
    and no thread idles while another has a queue. Each thread opens a
    :class:`VideoWriter` on a video's first frames; after its last frame it closes
    ffmpeg's input and goes on with the next video while ffmpeg finishes the file,
    and publishes the file (copies it to its final URL) once ffmpeg has exited.
    """

    def __init__(self, plan: Any, jobs: tuple[Any, ...], tmp: Path, pixel_format: str,
                 parts: str | None = None) -> None:
        self._plan, self._jobs, self._tmp, self._parts = plan, jobs, tmp, parts
        self._pixel_format = pixel_format  # of the frames submitted, see VideoWriter
        self._cameras = tuple(plan.cameras)
        # Encoding is the slow stage (x264 on the CPU): one single-threaded encoder per
        # core, fed in parallel, beats fewer multi-threaded ones.
        n_videos = len(jobs) * len(self._cameras)
        n_threads = int(os.environ.get("FLYARCHIVE_ENCODERS", 0)) or (os.cpu_count() or 1)
        n_threads = max(1, min(n_videos, n_threads, 64))
        video = plan.options.video
        self._video = video if video.threads is not None else dataclasses.replace(video, threads=1)
        STATS["encoder_threads"] = n_threads
        self._queues: list[queue.Queue[Any]] = [queue.Queue() for _ in range(n_threads)]
        self._free: queue.Queue[int] = queue.Queue()  # host buffers no batch holds
        for buffer in range(_in_flight()):
            self._free.put(buffer)
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}  # host buffer -> pieces not yet encoded
        self._owner: dict[tuple[int, int], int] = {}  # video -> its thread
        self._load = [0] * n_threads  # frames queued per thread
        self._writers: dict[tuple[int, int], Any] = {}
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

    def submit(self, batch: Batch, frames: np.ndarray, buffer: int) -> None:
        """Hand a rendered batch ``(n, ncam, *frame)`` uint8 in host buffer ``buffer`` over.

        The buffer is free again once every piece of the batch is encoded.
        """
        work = [(p, c) for p in batch.pieces for c in range(len(self._cameras))]
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
        for (piece, cam), thread in zip(work, threads):
            self._queues[thread].put((piece, cam, frames, buffer))

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
        finishing: list[tuple[tuple[int, int], Any]] = []  # input closed, not yet published
        while True:
            try:  # while ffmpeg processes finish files, look at them every few ms
                item = q.get(timeout=0.005) if finishing else q.get()
            except queue.Empty:
                self._publish_finished(finishing, wait=False)
                continue
            if item is _STOP:
                break
            piece, cam, frames, buffer = item
            try:
                if self._error is None:
                    done = self._encode(piece, cam, frames[piece.offset:piece.offset + piece.n, cam])
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
        with self._lock:
            self._load[thread] -= n_frames
            self._pending[buffer] -= 1
            last = self._pending[buffer] == 0
            if last:
                del self._pending[buffer]
        if last:
            self._free.put(buffer)

    def _encode(self, piece: Piece, cam: int, frames: np.ndarray
                ) -> tuple[tuple[int, int], Any] | None:
        """Write a piece's frames; ``(video, writer)`` when that was the video's last piece."""
        from flyarchive.video import VideoWriter, safe_video_path

        plan, job, camera = self._plan, self._jobs[piece.job], self._cameras[cam]
        key = (piece.job, cam)
        writer = self._writers.get(key)
        if writer is None:
            local = Path(safe_video_path(self._tmp, job.world_id, camera))
            writer = VideoWriter(local, plan.fps, plan.options.size, options=self._video,
                                 pixel_format=self._pixel_format)
            self._writers[key] = writer
        clock = time.perf_counter()
        writer.write(frames)
        STATS["encode_s"] += time.perf_counter() - clock
        if writer.n_frames < job.n_frames:
            return None
        writer.close_input()  # ffmpeg finishes the file while this thread goes on
        return key, writer

    def _publish_finished(self, finishing: list[tuple[tuple[int, int], Any]], wait: bool) -> None:
        """Publish the videos whose ffmpeg has exited (all of them with ``wait``)."""
        for item in [f for f in finishing if wait or f[1].finished]:
            finishing.remove(item)
            clock = time.perf_counter()
            self._publish(*item)
            STATS["publish_s"] += time.perf_counter() - clock

    def _publish(self, key: tuple[int, int], writer: Any) -> None:
        from flyarchive.distribute.cpu_tasks import given_up_error, local_staging
        from flyarchive.distribute.workspace import RunFolder
        from flyarchive.video import write_output

        plan, job, camera = self._plan, self._jobs[key[0]], self._cameras[key[1]]
        writer.close()
        url = plan.video_url(job.world_id, camera)
        so, staging = plan.out_storage_options, None
        if self._parts is not None:
            if not RunFolder.is_open(self._parts, so):
                raise given_up_error(self._parts)
            staging = local_staging(self._parts, so)
        write_output(writer.path, url, so, overwrite=plan.options.overwrite, staging_dir=staging)
        writer.path.unlink(missing_ok=True)
        del self._writers[key]
        with self._lock:
            del self._owner[key]
        self.entries[(key[0], camera)] = {
            "world": job.world_id, "camera": camera, "path": url, "frames": job.n_frames,
            "first_frame": job.start, "fps": plan.fps, "size": list(plan.options.size),
        }
