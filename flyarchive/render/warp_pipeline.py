"""Archive -> mp4 on mujoco-warp's batch renderer (backends ``"gpu"`` and ``"warp-cpu"``).
The twin of :mod:`flyarchive.render.opengl_pipeline`: read states, render, encode.

One process drives one Warp device. The (world, frame) work of a render plan is
packed world-major into batches of ``B = options.batch_worlds`` states, so that a
batch touches few videos. Three stages overlap:

- reader threads load the batches' states (:class:`BatchSource`, through the archive's
  :class:`~flyarchive.store.reader.StateReader`, kept by the process as the OpenGL
  pipeline's: one read per rectangular block of worlds x frames, not one per frame), ``_READERS`` batches at a time and at
  most ``_READ_AHEAD`` batches ahead of the renderer, in order (on S3, a batch's read
  waits on the network: several in flight keep the renderer fed);
- this thread submits each batch with one :meth:`WarpBatchRenderer.submit` call
  (one host-to-device and one device-to-host copy), the next one before waiting for
  the current one's frames, into one of ``FLYARCHIVE_BATCHES_IN_FLIGHT`` (default 4)
  host buffers that the encoders give back when they are done with its frames;
- encoder threads (:mod:`flyarchive.render.encoders`) pipe the frames to one
  ffmpeg process per (world, camera) video, opened when its first frame arrives and
  closed, then copied to its final URL, after its last frame.

At most that many batches hold host buffers at a time, so host memory is bounded by
a few batches, never by the length of a video. Stage timings go to the active
:class:`~flyarchive.render.diagnostics.PipelineProfile` (if any).

A batch (:class:`~flyarchive.render.plan.Batch`) holds pieces of videos, in frames; a
mosaic frame of ``T`` tiles takes ``T`` render slots (slot ``frame * T + tile``). Slots
without a state (a blank tile, or a world past its last frame) are NaN, which renders black
like any non-finite state.

Where this runs is :mod:`flyarchive.distribute`'s choice: in this process
(:func:`render_jobs`), on render threads sharing Warp's CPU device (:func:`render_threads`),
or on each Dask worker for a group of whole videos (:mod:`flyarchive.distribute.warp_runs`).

``import flyarchive`` does not import this module; it imports ``warp`` lazily.
"""

from __future__ import annotations

import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive import config
from flyarchive.errors import RenderBackendError, RenderFailedError
from flyarchive.render.diagnostics import StageTimer, progress_bar
from flyarchive.render.encoders import MAX_ENCODERS, Encoders
from flyarchive.render.options import RenderOptions
from flyarchive.render.output_plan import text_chars
from flyarchive.render.plan import Batch, Job, OnVideo, RenderPlan, pack_batches, split_groups
from flyarchive.render.renderer_cache import archive_header, state_reader, warp_renderer, warp_slot
from flyarchive.render.threads import run_threads
from flyarchive.replay import WARP_BACKENDS
from flyarchive.schema import finite_frames
from flyarchive.store.location import is_remote
from flyarchive.video.mosaic import is_mosaic
from flyarchive.video.workspace import scratch_dir

if TYPE_CHECKING:
    from flyarchive.replay.warp_frames import WarpBatchRenderer
#: Largest batch on Warp's CPU device, which renders a batch's states one after
#: another: bigger batches save nothing there and make partial batches cost more;
#: below 4 the launch overhead shows. NeuroMechFly 240x320 on a 2-core VM: one
#: 150-frame video 15.7 frames/s at 16, 18.1-20.4 at 4, 15.5 at 2; two 250-frame
#: videos 19.0 at both 16 and 4.
_CPU_BATCH_WORLDS = 4
#: States read ahead of the renderer, in batches (a batch's states are small: 1024
#: NeuroMechFly states are 0.3 MB).
_READ_AHEAD = 8
#: Batches read at the same time.
_READERS = 4


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
            f"Backend {backend!r} does not render with Warp. Warp backends: "
            f"{', '.join(map(repr, WARP_BACKENDS))}."
        )
    from flyarchive.warp_log import import_warp, no_cuda

    why = no_cuda(import_warp("backend='gpu'"),
                  "backend='warp-cpu' (the same renderer on the CPU) or backend='opengl'")
    if why is not None:
        raise RenderBackendError(why)
    return "cuda"


# ----------------------------------------------------------------------------- one process
#: Held while a renderer is built and while it submits its first batch of a call: Warp
#: loads a module on its first launch without a lock of its own, so two threads must not
#: load one module at the same time; later batches run side by side.
_loading = threading.Lock()


def batch_worlds_of(options: RenderOptions) -> int:
    """States per batch: ``options.batch_worlds``, at most ``_CPU_BATCH_WORLDS`` on the CPU."""
    if options.backend == "warp-cpu":
        return min(options.batch_worlds, _CPU_BATCH_WORLDS)
    return options.batch_worlds


#: Fewest states a lane gives a batch: each piece is one read of the archive.
_MIN_PIECE = 8
#: Fewest mosaic frames a lane gives a batch: the tiles of a batch are read at once, but
#: a tile's piece decodes its world's whole stored chunk of frames.
_MIN_MOSAIC_PIECE = 2


def _lanes(jobs: tuple[Job, ...], plan: RenderPlan, frames_per_batch: int,
           mosaic: bool = False) -> int:
    """Videos fed by each batch: one per encoder thread (a job makes a video per camera),
    so that every encoder works while the host holds only a few batches; no more than
    pieces of :data:`_MIN_PIECE` states (mosaics: :data:`_MIN_MOSAIC_PIECE` frames) allow.
    Archives on remote storage: 1 (each piece is a request; on an H200 with a loopback
    S3 server, 16 lanes took the S3 row from 0.88 to 0.43 of the local one)."""
    if is_remote(plan.url):
        return 1
    cameras = max(1, len(plan.cameras))
    threads = max(1, min(len(jobs) * cameras, config.encoders(), MAX_ENCODERS))
    smallest = _MIN_MOSAIC_PIECE if mosaic else _MIN_PIECE
    return max(1, min(-(-threads // cameras), frames_per_batch // smallest))


def render_jobs(plan: RenderPlan, blob: bytes, jobs: Sequence[Job], device: str, *,
                parts: str | None = None, on_frames: Callable[[int], None] | None = None,
                slot: int = 0, on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """Render and encode every video of ``jobs`` in this process, on one Warp device.

    Stage timings and counts go to the
    :class:`~flyarchive.render.diagnostics.PipelineProfile` s active in the calling
    context (none: nothing is measured).

    Args:
        plan: The :class:`flyarchive.render.plan.RenderPlan` (archive, cameras, output,
            options).
        blob: The compiled model as MJB bytes.
        jobs: The videos to make (a subset of ``plan.jobs``, or all of them).
        device: Warp device, ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
        parts: The run's parts folder (:class:`flyarchive.video.workspace.RunFolder`): finished
            videos are staged in it on local disk, and none is published once it is gone
            (the run was given up). None: stage beside each video.
        on_frames: Called with the number of frames of each batch rendered (for a
            progress bar elsewhere); None: a progress bar here when
            ``plan.options.progress``; if it raises, the render stops (partial
            videos removed) and the error propagates.
        slot: Which of this process's kept renderers to use: threads that render at
            the same time on Warp's CPU device each use their own; calls on one slot
            wait for each other.
        on_video: Called (from an encoder thread) with each video's entry once it is
            published under its final name.

    Returns:
        Manifest entries ``{"world", "camera", "path", "frames", "first_frame", "fps",
        "size"}``, in ``jobs`` order, then camera order.

    Raises:
        OutputExistsError: a video exists and ``plan.options.overwrite`` is False.
        ConfigError: ``FLYARCHIVE_ENCODERS`` or ``FLYARCHIVE_BATCHES_IN_FLIGHT`` is not
            allowed (:mod:`flyarchive.config`).
        VideoEncodeError, StorageError, NonFiniteStateError (never for committed NaN
            frames: those render black, as on the CPU backend).
    """
    jobs = tuple(jobs)
    options = plan.options
    timer = StageTimer()  # the profiles active here; the threads below get it explicitly
    buffers = config.batches_in_flight()  # a batch's frames stay valid until it is encoded
    config.encoders()  # a bad FLYARCHIVE_ENCODERS fails before the renderer is built
    mosaic = options.mosaic
    tiles = 1 if mosaic is None else mosaic[0] * mosaic[1]
    # No bigger than the work: a partial batch costs a full one. Mosaics: whole frames.
    frames_per_batch = min(max(1, batch_worlds_of(options) // tiles),
                           sum(job.n_frames for job in jobs))
    lanes = _lanes(jobs, plan, frames_per_batch, mosaic=tiles > 1)
    batches = pack_batches(jobs, frames_per_batch, lanes=lanes)
    source = BatchSource(plan, jobs, tiles)
    cache, lock = warp_slot(slot)
    with lock:  # one batch stream per renderer at a time
        with timer.time("setup_s"), _loading:  # imports, kernels and device state when not kept
            # I420 on the device: half the bytes to copy, and no RGB conversion in ffmpeg.
            renderer = warp_renderer(
                cache, blob, tuple(plan.cameras), tuple(options.size),
                batch_worlds=frames_per_batch * tiles, device=device, host_buffers=buffers,
                pixel_format="yuv420p", outputs=options.outputs, mosaic=mosaic,
                depth_scale=options.depth_scale, text_chars=text_chars(options))
        with tempfile.TemporaryDirectory(prefix="flyarchive-warp-", dir=scratch_dir()) as tmp:
            encoders = Encoders(plan, jobs, Path(tmp), renderer.pixel_format, buffers, parts,
                                timer, model=renderer.model, on_video=on_video)
            bar = None
            if on_frames is None:
                bar = progress_bar(sum(b.n for b in batches), options.progress)
                on_frames = None if bar is None else bar.update
            try:
                _render_batches(source, batches, renderer, encoders, on_frames, timer)
                entries = encoders.finish()
            except BaseException:
                encoders.abort()
                raise
            finally:
                if bar is not None:
                    bar.close()
    return [entries[(i, c)] for i in range(len(jobs)) for c in plan.cameras
            if (i, c) in entries]  # not those kept from an earlier render (plan.kept)


def render_threads(plan: RenderPlan, blob: bytes, parts: str | None, n_threads: int, *,
                   on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """Every video in this process on Warp's CPU device: groups of whole videos, balanced
    by frames (:func:`~flyarchive.render.plan.split_groups`), one per thread, each with
    its own renderer (kept for the next call, :func:`render_jobs`'s ``slot``).

    Warp's CPU kernels run without the GIL, so the threads render on as many cores
    (each builds its renderer and submits its first batch alone: Warp loads modules on
    first launch). A failed group stops the others at their next batch; its error is
    raised; Ctrl-C stops them the same way, and is raised once they stopped
    (:func:`~flyarchive.render.threads.run_threads`). Call it once Warp is imported and
    initialized (not by two threads at once).

    Raises:
        As :func:`render_jobs`.
    """
    groups = split_groups(plan.jobs, batch_worlds_of(plan.options), n_threads)
    bar = progress_bar(sum(job.n_frames for job in plan.jobs), plan.options.progress)
    stop = threading.Event()
    results: list[list[dict[str, Any]]] = [[] for _ in groups]

    def on_frames(n: int) -> None:
        if stop.is_set():
            raise RenderFailedError("Stopped: another group of videos failed, or the render "
                                    "was interrupted.")
        if bar is not None:
            bar.update(n)

    def group(i: int) -> Callable[[], None]:
        def run() -> None:
            results[i] = render_jobs(plan, blob, groups[i], "cpu", parts=parts,
                                     on_frames=on_frames, slot=i, on_video=on_video)
        return run

    try:
        run_threads([group(i) for i in range(len(groups))], stop)
    finally:
        if bar is not None:
            bar.close()
    return [entry for group in results for entry in group]


def _render_batches(source: BatchSource, batches: list[Batch], renderer: WarpBatchRenderer,
                    encoders: Encoders, on_frames: Callable[[int], None] | None,
                    timer: StageTimer) -> None:
    """Render every batch, submitting batch k + 1 before handing batch k to the encoders.

    On CUDA, :meth:`WarpBatchRenderer.submit` only queues the work, so the GPU renders
    the next batch while this thread waits for the current one's frames and passes
    them on: the GPU does not wait for the host between batches. Slots whose state is
    not finite render black (and "nothing there" in maps): blackened here, or by the
    device in mosaic frames.
    """
    pending: tuple[Batch, Any, np.ndarray, int] | None = None
    mosaic = getattr(renderer, "mosaic", None) is not None

    def hand_over() -> None:
        """Wait for the pending batch's frames and give them to the encoders."""
        assert pending is not None
        batch, submitted, valid, buffer = pending
        with timer.time("wait_gpu_s"):
            frames = submitted.wait()  # (n, ncam, *frame), a view of host buffer `buffer`
        maps = getattr(submitted, "maps", None)
        if not mosaic and not valid.all():
            if frames is not None:
                _blacken(frames, ~valid, renderer.pixel_format)
            if maps is not None:
                maps[~valid] = 0
        encoders.submit(batch, frames, buffer, maps)
        timer.add("frames", batch.n)
        if on_frames is not None:
            on_frames(batch.n)

    with _read_ahead(source, batches) as states:
        for batch in batches:
            with timer.time("wait_read_s"):
                qpos, mocap_pos, mocap_quat, texts = next(states)
            encoders.raise_if_failed()
            valid = _fill_invalid(qpos, mocap_pos, mocap_quat, renderer.default_state)
            extras: dict[str, Any] = {} if texts is None else {"texts": texts}
            if mosaic:
                extras["valid"] = valid
            with timer.time("wait_encoders_s"):
                buffer = encoders.reserve()  # blocks while every host buffer waits to be encoded
            with timer.time("submit_s"), (_loading if pending is None else nullcontext()):
                submitted = renderer.submit(qpos, mocap_pos, mocap_quat, buffer=buffer, **extras)
            timer.add("batches", 1)
            if pending is not None:
                hand_over()
            pending = (batch, submitted, valid, buffer)
    if pending is not None:
        hand_over()


def _blacken(frames: np.ndarray, rows: np.ndarray, pixel_format: str) -> None:
    """Make ``frames[rows]`` black: RGB zeros, or I420 luma 16 and chroma 128."""
    if pixel_format == "rgb24":
        frames[rows] = 0
        return
    luma_rows = frames.shape[-2] * 2 // 3
    frames[rows, :, :luma_rows] = 16
    frames[rows, :, luma_rows:] = 128


def _fill_invalid(qpos: np.ndarray, mocap_pos: np.ndarray | None, mocap_quat: np.ndarray | None,
                  default: np.ndarray) -> np.ndarray:
    """Rows with NaN or infinity get the model's default state (rendered, then blacked)."""
    valid = finite_frames(qpos, mocap_pos, mocap_quat)
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
def _read_ahead(source: BatchSource, batches: list[Batch], *, depth: int = _READ_AHEAD,
                readers: int = _READERS) -> Iterator[Iterator[Any]]:
    """States of each batch, in order, read by ``readers`` threads at most ``depth``
    batches ahead of the consumer, from the moment the block is entered; a failed read
    raises when its batch is reached."""
    pool = ThreadPoolExecutor(max_workers=max(1, min(readers, depth)),
                              thread_name_prefix="flyarchive-read")
    pending: deque[Future[Any]] = deque()
    todo = iter(batches)

    def fill() -> None:
        while len(pending) < depth:
            batch = next(todo, None)
            if batch is None:
                return
            pending.append(pool.submit(source.read, batch))

    def consume() -> Iterator[Any]:
        while pending:
            states = pending.popleft().result()
            fill()
            yield states

    try:
        fill()  # reads start now, before the first batch is asked for
        yield consume()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)


# ----------------------------------------------------------------------------- read
class BatchSource:
    """Reads the states (and texts) of batches of ``jobs``.

    Args:
        plan: The render plan (archive, options: ``overlay``).
        jobs: The videos, indexed by ``Piece.job``: all per-world or all mosaics.
        tiles: Slots per frame: ``rows * cols`` for mosaics, else 1.
    """

    def __init__(self, plan: RenderPlan, jobs: tuple[Job, ...], tiles: int = 1) -> None:
        frames = max((job.stop for job in jobs), default=None)
        self._reader = state_reader(plan.url, plan.storage_options, plan.archive_id, frames)
        self._jobs, self._tiles = jobs, tiles
        self._mosaic = bool(jobs) and is_mosaic(jobs[0])
        items = plan.options.overlays
        self._overlay = None
        if items or self._mosaic:
            from flyarchive.replay.overlay_text import OverlayText

            header = archive_header(plan.url, plan.storage_options, plan.archive_id, frames)
            self._overlay = OverlayText(header, items, label_world=self._mosaic,
                                        size=tuple(plan.options.size))

    def read(self, batch: Batch) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None,
                                          list[str] | None]:
        """qpos ``(n, nq)``, mocap poses (None without mocap bodies), float32 host arrays,
        and one text per slot (None without overlay) of a batch's slots."""
        if self._mosaic:
            return self._read_mosaic(batch)
        pieces = [(self._jobs[p.job].world_index, p.start, p.stop) for p in batch.pieces]
        states = self._reader.read_boxes([(w, w + 1, k0, k1) for w, k0, k1 in pieces],
                                         dtype=np.float32)
        qpos, mocap_pos, mocap_quat = (states["qpos"], states.get("mocap_pos"),
                                       states.get("mocap_quat"))
        texts = None
        if self._overlay is not None:
            texts = [t for w, k0, k1 in pieces for t in self._overlay.texts(w, k0, k1)]
        return qpos, mocap_pos, mocap_quat, texts

    def _read_mosaic(self, batch: Batch) -> tuple[np.ndarray, np.ndarray | None,
                                                  np.ndarray | None, list[str] | None]:
        """The tiles of every mosaic frame of the batch, in one read of the archive (the
        tiles of a mosaic are often consecutive worlds over the same frames: one block)."""
        tiles = self._tiles
        slots = batch.n * tiles
        out = {name: np.full((slots, *a.shape[2:]), np.nan, np.float32)
               for name, a in self._reader.arrays.items()}
        texts = [""] * slots
        reads: list[tuple[int, int, int]] = []  # (world index, start, stop) per tile piece
        rows: list[np.ndarray] = []  # the slots each one fills
        for piece in batch.pieces:
            for t, tile in enumerate(self._jobs[piece.job].tiles):
                last = piece.stop if tile is None else min(piece.stop, tile.stop)
                if tile is None or last <= piece.start:
                    continue
                reads.append((tile.world_index, piece.start, last))
                rows.append((piece.offset + np.arange(last - piece.start)) * tiles + t)
        if not reads:
            return out["qpos"], out.get("mocap_pos"), out.get("mocap_quat"), texts
        states = self._reader.read_boxes([(w, w + 1, k0, k1) for w, k0, k1 in reads],
                                         dtype=np.float32)
        where = np.concatenate(rows)
        for name, values in states.items():
            out[name][where] = values
        assert self._overlay is not None
        for (world, start, stop), slot_rows in zip(reads, rows):
            for row, text in zip(slot_rows, self._overlay.texts(world, start, stop)):
                texts[row] = text
        return out["qpos"], out.get("mocap_pos"), out.get("mocap_quat"), texts
