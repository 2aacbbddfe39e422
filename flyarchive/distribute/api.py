"""The public render entry point: worlds and time windows of an archive to videos
(:func:`render_videos`; to lazy frames: :mod:`flyarchive.distribute.frames`).

``render_videos`` opens the archive's header once (:func:`flyarchive.store.dataset.open_header`:
no xarray or dask), selects frames (:mod:`flyarchive.query.selection`), reads the kept
model through the same opened group, makes a plan (:mod:`flyarchive.render.plan`), checks
it before any work, and runs it where it belongs (:func:`run_plan`): in this process
(:mod:`flyarchive.render.opengl_pipeline`, :mod:`flyarchive.render.warp_pipeline`), on a local Dask cluster
it starts, or on the cluster given (which one: see :func:`render_videos`): OpenGL's
segments and joins (:func:`run_segments`), Warp's groups of whole videos
(:mod:`flyarchive.distribute.warp_runs`).
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mujoco

from flyarchive.models.shipping import scatter_model
from flyarchive.distribute.cluster import (
    cancel_quietly,
    connect,
    local_workers_expected,
    started_cold,
    task_result,
    wait_for_local_workers,
)
from flyarchive.distribute.gpus import check_gpus
from flyarchive.distribute.placement import placement
from flyarchive.distribute.warm import wait_for_warm_up, warm_up_here
from flyarchive.distribute.warp_runs import render_on_dask
from flyarchive.errors import RenderOptionsError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.models import check_data, keep_loaded, model_bytes
from flyarchive.query.selection import select_frames
from flyarchive.render.diagnostics import progress_bar
from flyarchive.render.options import RenderOptions
from flyarchive.render.output_plan import plan_outputs
from flyarchive.render.plan import (
    MIN_SEGMENT_FRAMES,
    Job,
    OnVideo,
    RenderPlan,
    preflight,
)
from flyarchive.render.renderer_cache import keep_archive
from flyarchive.store.location import absolute_url
from flyarchive.replay import WARP_BACKENDS
from flyarchive.replay.releases import pin_release_defaults, recorded_release
from flyarchive.replay.sizes import is_int
from flyarchive.store.dataset import open_header
from flyarchive.store.local_files import refuse_inside_archive
from flyarchive.store.location import protocol

if TYPE_CHECKING:
    import xarray as xr

    from flyarchive.store.header import Archive


@dataclass(frozen=True)
class RenderResult:
    """What :func:`render_videos` wrote.

    Attributes:
        videos: One entry per (world, camera), or per (window, camera) with a ``where``
            mask over time, as in the manifest (:mod:`flyarchive.video.manifest`): world,
            camera, path, frames, first_frame, frame_range, start_time, end_time, fps,
            size, backend, video (and window, for a window).
        manifest: Path or URL of the JSON manifest beside the videos.
        kept: With ``resume=True``: how many of ``videos`` (the first ones) an earlier
            render had finished, and were kept.
        notes: What the render changed from what was asked (a mosaic fitted to fewer
            worlds, overlay items left out of small frames), one sentence each.
    """

    videos: list[dict[str, Any]]
    manifest: str
    kept: int = 0
    notes: tuple[str, ...] = ()


def _check_model(ds: Archive, model: mujoco.MjModel) -> None:
    check_compatible(ModelLayout.from_attrs(ds.attrs["layout"]), ModelLayout.from_model(model))


def replay_model(source: str, ds: Archive, model: mujoco.MjModel | None,
                 storage_options: Mapping[str, Any] | None = None
                 ) -> tuple[mujoco.MjModel, bytes]:
    """The model to replay an archive with, and its MJB bytes (what workers get).

    The model's visual defaults are those of the MuJoCo release that recorded the archive
    (:mod:`flyarchive.replay.releases`): where this release changed one, a copy is pinned
    and its bytes are what workers get.

    Args:
        source: The archive's URL.
        ds: The archive, from :func:`flyarchive.open_archive`, or its header
            (:func:`~flyarchive.store.dataset.open_header`), whose opened group the kept
            model is read through.
        model: The compiled model, or a model file's path (loaded here:
            :func:`flyarchive.models.load_model_file`); None: the one kept beside the
            archive (``models/<sha256>.mjb``, :mod:`flyarchive.models.kept`).

    Raises:
        RenderOptionsError: ``model`` is none of these.
        ModelLoadError: ``model`` is None and the archive keeps no model, or the kept
            one is not an MJB this MuJoCo can load (another release: named); a model
            given whose data MuJoCo cannot make (``mujoco.FatalError``).
        UnsafeModelError: the kept model crashed the child process that loaded it first,
            raised ``mujoco.FatalError`` there, or did not finish
            (:func:`flyarchive.models.kept.kept_model`).
        CorruptArchiveError: the kept model's bytes do not hash to its name, or it is
            missing.
        LayoutMismatchError: the model's layout differs from the archive's.
    """
    if isinstance(model, (str, os.PathLike)):  # a file of the caller's, as --model takes
        from flyarchive.models.files import load_model_file

        model = load_model_file(model)
    elif model is not None and not isinstance(model, mujoco.MjModel):
        raise RenderOptionsError(
            f"model must be a mujoco.MjModel, the path of a model file (.xml, .mjz or .mjb) or "
            f"None (the model kept beside the archive), got {type(model).__name__}.")
    if model is None:
        from flyarchive.models.kept import kept_model

        # read through the header's group; checked in a child process first
        model, blob = kept_model(source, storage_options, group=getattr(ds, "group", None))
        keep_loaded(blob, model)  # this process's renderers use it, not a second load
    else:
        check_data(model)  # mujoco.FatalError of a damaged model: a ModelLoadError
        blob = model_bytes(model)
    _check_model(ds, model)
    pinned = pin_release_defaults(model, recorded_release(ds.attrs))
    if pinned is not model:
        model, blob = pinned, model_bytes(pinned)
    return model, blob


def _cameras(cameras: Any) -> tuple[str, ...]:
    """``cameras`` as a tuple of names (one name: a string).

    Raises:
        RenderOptionsError: not a name or a sequence of names.
    """
    names = (cameras,) if isinstance(cameras, str) else cameras
    if not isinstance(names, (list, tuple)) or not all(isinstance(c, str) for c in names):
        raise RenderOptionsError(
            f"cameras must be a camera's name or a list of names, e.g. 'nmf/trackcam', got "
            f"{cameras!r}.")
    return tuple(names)


def check_n_workers(n_workers: Any) -> None:
    """Raise RenderOptionsError unless ``n_workers`` is None (one worker per core) or a
    whole number >= 0 (0: render in this process)."""
    if n_workers is not None and (not is_int(n_workers) or n_workers < 0):
        raise RenderOptionsError(
            f"n_workers must be None (one worker per core) or a whole number >= 0 (0: render "
            f"in this process), got {n_workers!r}."
        )


def render_videos(
    source: str,
    model: mujoco.MjModel | None = None,
    cameras: str | Sequence[str] = (),
    out: str = "videos",
    *,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    where: xr.DataArray | None = None,
    pad: float = 0.0,
    options: RenderOptions = RenderOptions(),
    client: Any = None,
    scheduler: str | None = None,
    n_workers: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    out_storage_options: Mapping[str, Any] | None = None,
    gpus: Sequence[int] | None = None,
    resume: bool = False,
) -> RenderResult:
    """Render worlds of an archive to one mp4 per (world, camera), plus a JSON manifest.

    Videos are ``{out}/world{id:05d}/{name}.mp4`` (:func:`flyarchive.video.safe_video_path`):
    ``name`` is the camera's name when it holds only letters, digits, ``.``, ``_`` and
    ``-``; otherwise other characters become ``_`` and a short hash of the name is
    appended, e.g. camera ``"nmf/trackcam"`` of world 3 ->
    ``{out}/world00003/nmf_trackcam-1b3fdcea.mp4``. The manifest is
    ``{out}/manifest.json``.

    Where the work runs (:func:`flyarchive.distribute.placement.placement`):

    - ``client`` or ``scheduler`` given: on that Dask cluster (``"gpu"``: on workers
      that offer the resource ``GPU``);
    - else ``"opengl"``: a local Dask cluster of ``n_workers`` single-core worker
      processes (None: one per core) that this call starts and stops (in this process on
      a one-core machine);
    - else ``"gpu"``: every GPU of this machine (or those of ``gpus``), one group of
      videos each: one GPU in this process; several on a local Dask cluster of one
      worker process per GPU, each with its share of the cores, that this call starts
      and stops;
    - else ``"warp-cpu"``: one render thread per core (at most one per video) in this
      process by default; a local cluster of ``n_workers`` processes when
      ``n_workers`` >= 2; one thread in this process when ``n_workers`` is 1 or there
      is one core or one video;
    - ``n_workers=0``, or a ``memory://`` archive (worker processes cannot see it):
      always in this process (``"gpu"``: on the first GPU of ``gpus``).

    Local paths (``source``, ``out``, also as ``file://``) are made absolute here, with
    ``~`` expanded, before they go to workers, which may run in other folders. The
    output folder is checked (and created) before anything is rendered. A final video
    name never holds a partial video: segments go to ``{out}/.parts-{run}/``, which is
    removed at the end, on errors and on Ctrl-C; one left by a killed run is removed by
    the next run into ``out`` (:mod:`flyarchive.video.workspace`).

    Finished work is kept: each video is listed in the manifest as soon as it is finished
    (within :data:`~flyarchive.video.manifest.JOURNAL_EVERY_S` seconds), so a render
    stopped by Ctrl-C (KeyboardInterrupt), an error or a kill keeps its finished videos
    and their entries; only partial files go. ``resume=True`` continues it: the videos
    listed for this archive with exactly the entry this render would write are kept, the
    rest rendered (:mod:`flyarchive.render.resume`).

    Output folders are read and written as guarded as archives
    (:mod:`flyarchive.video.guard`): a folder inside ``out`` that is a symbolic link
    leading out of it, or a manifest that is not a small regular JSON file of the
    expected types, is refused before anything is rendered.

    With ``where`` over ``(world, time)``, each window of selected frames is a video of
    its own, named by its archive frames ``[start, stop)``:
    ``{out}/world00003/front.frames000120-000240.mp4``; its manifest entry gives
    ``window`` (its index among the world's windows), ``frame_range``, ``start_time``
    and ``end_time``.

    Args:
        source: Archive URL.
        model: The compiled model it was recorded with (checked against the layout), or
            its file's path (``.xml``, ``.mjz`` or ``.mjb``, loaded here). None (default):
            the model kept beside the archive when it was recorded (``store_model=True``,
            the default of the recorders and ``import_npz``).
        cameras: Camera name(s).
        out: Output folder: a local path or an fsspec URL; created if missing.
        worlds: World ids (default: all with frames).
        time: ``(start, end)`` simulated seconds (default: everything).
        where: A boolean DataArray computed from the archive, over ``(world,)`` (which
            worlds, e.g. ``ds.success == 1``) or ``(world, time)`` (which frames, e.g.
            ``ds.qpos.sel(dof="x") > 0.1``); see :func:`flyarchive.select_frames`.
            Combined with ``worlds`` and ``time``.
        pad: Simulated seconds of context before and after each window of a ``(world,
            time)`` mask; windows closer than ``2 * pad`` merge into one video.
        options: Size, backend, segment length, encoder settings, overwrite, progress.
        storage_options: fsspec options for the archive.
        out_storage_options: fsspec options for ``out`` (default: ``storage_options``
            when ``out`` uses the archive's protocol).
        gpus: Backend ``"gpu"`` without a client or scheduler: the CUDA device numbers
            of the GPUs to use (``[0, 1]``); default: every visible GPU
            (:mod:`flyarchive.distribute.gpus` says how they are found).
        resume: Continue a render into ``out`` that stopped: keep the finished videos its
            manifest lists (when they match this render), render the rest, replacing what
            is in their place. Not with ``options.overwrite``.

    Raises:
        CameraNotFoundError, LayoutMismatchError, FrameSizeError,
        SelectionError (also a ``where`` mask whose dims, world ids or times do not match
        the archive), ModelLoadError (no model given and none kept, or the kept one is
        of another MuJoCo release), UnsafeModelError (no model given, and the kept one
        crashed, or raised ``mujoco.FatalError`` in, the child process that loads it first),
        CorruptArchiveError (the kept model's bytes do not
        hash to its name), OutputExistsError (a video exists without ``overwrite``, or a folder is where a
        video goes), StorageError (``out`` is a file or cannot be written; nothing
        is rendered), RenderBackendError, RenderFailedError (a task failed on a worker;
        the message names the world), RenderOptionsError (``n_workers`` below 0, or
        ``gpus`` is malformed, names a GPU that is not visible, or is given with another
        backend than ``"gpu"`` or with a client or scheduler),
        ConfigError (a ``FLYARCHIVE_*`` environment variable holds a value that is not
        allowed; :mod:`flyarchive.config`), UnsafeFileError (a folder inside ``out``
        linked out of it; a manifest that is a FIFO, a device, a link out or too large),
        ManifestError (a manifest there that is not JSON or has entries of the wrong
        types; move it away).
    """
    from flyarchive.video.manifest import ManifestJournal, describe, manifest_url
    from flyarchive.video.maps import remove_stale_maps
    from flyarchive.video.workspace import RunFolder

    cameras = _cameras(cameras)
    if not isinstance(options, RenderOptions):
        raise RenderOptionsError(
            f"options must be a flyarchive.RenderOptions (e.g. RenderOptions(size=(240, 320))), "
            f"got {type(options).__name__}.")
    _check_out(out, resume, options)
    check_n_workers(n_workers)
    on_cluster = client is not None or scheduler is not None
    check_gpus(gpus, options.backend, on_cluster=on_cluster)
    warm_up_here(options.backend, gpus=gpus, n_workers=n_workers, on_cluster=on_cluster)
    source, out = absolute_url(source), absolute_url(out).rstrip("/")
    ds = open_header(source, storage_options)  # opened once here; planned without xarray
    jobs = select_frames(ds, worlds, time, where=where, pad=pad)
    model, blob = replay_model(source, ds, model, storage_options)
    options, jobs, notes = plan_outputs(options, ds, model, jobs)  # mosaics grouped
    if out_storage_options is None and protocol(out) == protocol(source) != "file":
        out_storage_options = storage_options
    elif out_storage_options is not None:  # the output's own: checked as the archive's are
        from flyarchive.store.storage_errors import check_storage_options

        check_storage_options(out, out_storage_options)
    plan = RenderPlan(
        url=source, storage_options=dict(storage_options or {}), cameras=cameras,
        out=out, out_storage_options=dict(out_storage_options or {}),
        fps=float(ds.attrs["output_fps"]), options=options, jobs=tuple(jobs), notes=notes,
        archive_id=ds.attrs.get("archive_id"), model_sha256=hashlib.sha256(blob).hexdigest(),
    )
    kept: list[dict[str, Any]] = []
    if resume:
        from flyarchive.render.resume import resume_plan

        plan, kept = resume_plan(plan, ds)
        if not plan.jobs:
            return RenderResult(kept, manifest_url(plan.out), len(kept), plan.notes)
    preflight(plan, model)
    keep_archive(source, storage_options, ds)  # what renders in this process reads
    in_process = (n_workers == 0 or source.startswith("memory://")) and client is None
    where = Where(client, scheduler, n_workers, in_process, gpus)
    with RunFolder.create(plan.out, plan.out_storage_options) as run:
        journal = ManifestJournal(plan, ds, staging=run.local)

        def finished(video: dict[str, Any]) -> None:
            # maps of the video it replaced, that this render does not write, go with it
            remove_stale_maps(video["path"], plan.options.outputs, plan.out_storage_options)
            journal.add(video)

        try:
            videos = run_plan(plan, blob, run.url, where, on_video=finished)
        except BaseException:
            journal.close(quiet=True)  # the finished videos stay listed
            raise
        videos = [describe(plan, ds, v) for v in videos]
        manifest = journal.close(videos)
    return RenderResult(kept + videos, manifest, len(kept), plan.notes)


def _check_out(out: Any, resume: bool, options: RenderOptions) -> None:
    """Refuse an empty output location, and ``resume`` with ``overwrite``.

    Raises:
        RenderOptionsError: naming what was given.
    """
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out).strip():
        raise RenderOptionsError(
            f"The output folder is {out!r}; pass a folder (a path, created if missing) or an "
            "fsspec URL such as s3://bucket/videos (CLI: --out videos).")
    if resume and options.overwrite:
        raise RenderOptionsError(
            "resume=True (--resume) keeps the videos a stopped render finished, and "
            "overwrite=True (--overwrite) replaces them; choose one.")
    if protocol(os.fspath(out)) == "file":
        refuse_inside_archive(os.fspath(out).removeprefix("file://"), "--out (out=...)")


# ----------------------------------------------------------------------------- where it runs
@dataclass(frozen=True)
class Where:
    """Where :func:`render_videos` was asked to render (see its text).

    Attributes:
        client, scheduler: A ``distributed.Client``, or a scheduler address used when it
            is None.
        n_workers: Worker processes of a local cluster (``"warp-cpu"``: None is one
            render thread per core in this process; 0 or 1: one thread).
        in_process: Render in this process (when no client or scheduler is given).
        gpus: CUDA device numbers of the GPUs to use (``"gpu"``; default: all).
    """

    client: Any = None
    scheduler: str | None = None
    n_workers: int | None = None
    in_process: bool = False
    gpus: Sequence[int] | None = None


def run_plan(plan: RenderPlan, blob: bytes, parts: str, where: Where = Where(), *,
             on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """Render every video of ``plan``; their manifest entries, in plan order.

    Where :func:`~flyarchive.distribute.placement.placement` says. OpenGL: in this thread
    (:func:`flyarchive.render.opengl_pipeline.render_here`) or as (world, frame segment) tasks on a Dask cluster joined per video
    (:func:`run_segments`). Warp: :func:`~flyarchive.distribute.placement.placement`
    says: in this thread (:func:`flyarchive.render.warp_pipeline.render_jobs`), on render threads
    sharing Warp's CPU device (:func:`flyarchive.render.warp_pipeline.render_threads`), or as
    groups of whole videos on Dask workers
    (:func:`flyarchive.distribute.warp_runs.render_on_dask`). A cluster is
    :class:`~flyarchive.distribute.cluster.connect`'s: the client given, a scheduler's,
    or a local one started and stopped here.

    Args:
        plan: What to render.
        blob: The compiled model as MJB bytes.
        parts: The run's parts folder (:attr:`flyarchive.video.workspace.RunFolder.url`),
            which the caller holds for the whole run and removes afterwards.
        where: Where it was asked to run.
        on_video: Called in this process with each video's entry as soon as the video is
            finished under its final name (any thread; it must be quick), so that a render
            stopped later keeps it listed (:class:`flyarchive.video.manifest.ManifestJournal`).

    Raises:
        RenderBackendError: no CUDA device for ``"gpu"``, or no worker of the cluster
            offers the ``GPU`` resource.
        RenderFailedError: a task failed on the cluster (a worker died, or raised an
            error that is not a flyarchive error); the message names the world(s).
        Any flyarchive error a task raised (e.g. CorruptArchiveError).
    """
    if plan.options.backend not in WARP_BACKENDS:
        gl = placement(plan.options.backend, len(plan.jobs), client=where.client,
                       scheduler=where.scheduler, n_workers=where.n_workers,
                       in_process=where.in_process)
        if gl.where == "here":
            from flyarchive.render.opengl_pipeline import render_here

            return render_here(plan, blob, parts, on_video=on_video)
        with connect(where.client, where.scheduler, gl.n_workers, wait=False) as client:
            return run_segments(plan, blob, parts, client, on_video=on_video)
    here = placement(plan.options.backend, len(plan.jobs), client=where.client,
                     scheduler=where.scheduler, n_workers=where.n_workers,
                     in_process=where.in_process, gpus=where.gpus)
    if here.where in ("here", "threads"):
        from flyarchive.render.warp_pipeline import render_jobs, render_threads, warp_device

        wait_for_warm_up()  # Warp is not imported and initialized by two threads at once
        if here.where == "threads":
            return render_threads(plan, blob, parts, here.n_workers or 1, on_video=on_video)
        if here.device is not None and here.device.startswith("cuda"):
            warp_device("gpu")  # checks that Warp sees a CUDA device
        return render_jobs(plan, blob, plan.jobs, here.device or "cpu", parts=parts,
                           on_video=on_video)
    with connect(where.client, where.scheduler, here.n_workers,
                 gpu_workers=list(here.gpu_workers) or None) as client:
        return render_on_dask(plan, blob, parts, client, own_cluster=here.where == "local-gpus",
                              on_video=on_video)


def run_segments(plan: RenderPlan, blob: bytes, parts: str, client: Any, *,
                 on_video: OnVideo | None = None) -> list[dict[str, Any]]:
    """An OpenGL plan on a Dask cluster: (world, frame segment) tasks
    (:func:`flyarchive.render.opengl_pipeline.render_segment`), each rendered and encoded on its
    own; each video's join (:func:`~flyarchive.render.opengl_pipeline.join_segments`, without
    re-encoding) submitted as soon as its segments are done, so videos finish (and are
    kept on a stop) while others still render. Arguments and errors as :func:`run_plan`.

    On a local cluster flyarchive started for this render (:func:`~flyarchive.distribute.cluster.started_cold`:
    its workers' first task would still import the renderer and the store and open the
    archive, a second or more on two cores), this process renders the first
    :data:`FIRST_FRAMES_HERE` frames itself, in this thread, having done all that
    already, while the other frames' segments are submitted as the workers join
    (:class:`_Submission`): the command's first frame came 1.4-2.0 s after its start
    (2-core VM, NeuroMechFly at 240x320; 1.9-3.3 s before, 0.95 s in one process), and
    the workers have those frames less to render.
    """
    n = local_workers_expected(client) or len(client.scheduler_info().get("workers", {})) or 1
    here = FIRST_FRAMES_HERE if started_cold(client) else 0
    segments = list(plan.segments(n, head=here))
    head = segments[0] if here and segments else None
    submission = _Submission(client, plan, blob, parts, segments[1:] if head else segments)
    joins: dict[Any, tuple[Job, str]] = {}
    bar = progress_bar(len(segments) + len(plan.jobs) * len(plan.cameras),
                       plan.options.progress, what="tasks", unit="task")
    try:
        rendered = None
        if head is not None:
            rendered = (head, _render_here(plan, blob, parts, head))
            if bar is not None:
                bar.update(1)
        resent: dict[str, Any] = {"model": None, "with": set()}

        def again(failed: Any, job: Job, k0: int, k1: int) -> Any:
            """The segment submitted again, with the model sent to the workers again once
            per loss (a segment that failed with the model sent last: lost again)."""
            from flyarchive.render.opengl_pipeline import render_segment

            if resent["model"] is None or failed in resent["with"]:
                resent["model"], resent["with"] = scatter_model(client, blob, again=True), set()
            future = client.submit(render_segment, plan, resent["model"], parts, job, k0, k1,
                                   pure=False)
            resent["with"].add(future)
            return future

        return _collect(plan, parts, client, segments, submission.futures(), joins, rendered,
                        on_video, bar, again)
    except BaseException:
        submission.give_up()
        cancel_quietly(client, [*submission.submitted(), *joins])
        raise
    finally:
        if bar is not None:
            bar.close()


#: Times a segment is submitted again when the model its task needed was lost
#: (:func:`_collect`).
LOST_MODEL_RETRIES = 3


def _lost(err: BaseException) -> bool:
    """Whether a task's error says it was cancelled because data was lost with a worker
    that died: the scattered model it needed ("already forgotten"), or its own result
    before it was fetched ("unknown"). Not a lost scheduler ("scheduler-connection-lost")."""
    return type(err).__name__ == "FutureCancelledError" and any(
        f"reason: {why}" in str(err) for why in ("already forgotten", "unknown"))


#: Frames that :func:`run_segments` renders in the caller's process while the workers of a
#: cluster started for the render warm up (about what two cores render meanwhile: the
#: shortest segment the plan makes).
FIRST_FRAMES_HERE = MIN_SEGMENT_FRAMES


def _render_here(plan: RenderPlan, blob: bytes, parts: str, segment: tuple[Job, int, int]
                 ) -> list[str]:
    """Render one segment in this thread (:func:`run_segments`), then free its renderer."""
    from flyarchive.render.opengl_pipeline import render_segment
    from flyarchive.render.renderer_cache import close_thread_renderers

    try:
        return render_segment(plan, blob, parts, *segment)
    finally:
        close_thread_renderers()  # this process renders nothing more


class _Submission:
    """The segments' tasks submitted on a thread of their own once the client's local
    workers have joined (:func:`run_segments` renders meanwhile); the model is scattered
    to them first."""

    def __init__(self, client: Any, plan: RenderPlan, blob: bytes, parts: str,
                 segments: list[tuple[Job, int, int]]) -> None:
        self._client, self._plan, self._blob, self._parts = client, plan, blob, parts
        self._segments = segments
        self._futures: dict[Any, tuple[Job, int, int]] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no task submitted once give_up has returned
        self._thread = threading.Thread(target=self._submit, name="flyarchive-submit",
                                        daemon=True)
        self._thread.start()

    def _submit(self) -> None:
        from flyarchive.render.opengl_pipeline import render_segment

        if not self._segments:
            return
        try:
            wait_for_local_workers(self._client)
            if self._stop.is_set():
                return
            blob_future = scatter_model(self._client, self._blob)
            for job, k0, k1 in self._segments:
                with self._lock:
                    if self._stop.is_set():
                        return
                    future = self._client.submit(render_segment, self._plan, blob_future,
                                                 self._parts, job, k0, k1, pure=False)
                    self._futures[future] = (job, k0, k1)
        except BaseException as err:  # handed to the caller's thread
            self._error = err

    def futures(self) -> dict[Any, tuple[Job, int, int]]:
        """Every segment's future, once submitted (the submission's error, if it failed)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._futures

    def submitted(self) -> list[Any]:
        """The futures submitted so far (to cancel)."""
        with self._lock:
            return list(self._futures)

    def give_up(self) -> None:
        """Submit nothing more (a submission under way ends before this returns)."""
        with self._lock:
            self._stop.set()


def _collect(plan: RenderPlan, parts: str, client: Any, segments: list[tuple[Job, int, int]],
             futures: dict[Any, tuple[Job, int, int]], joins: dict[Any, tuple[Job, str]],
             done_here: tuple[tuple[Job, int, int], list[str]] | None,
             on_video: OnVideo | None, bar: Any,
             again: Callable[[Any, Job, int, int], Any] | None = None) -> list[dict[str, Any]]:
    """Wait for the segments' tasks (and ``done_here``, a segment rendered in this
    process), join each video as soon as its segments are done (``joins`` gets the
    joins' futures), each task a step of ``bar`` (or None); every video's manifest
    entry, in plan order.

    A segment cancelled because the model sent to the workers, or its own result, was lost
    (the one worker holding it died; a nanny restarts it empty) is submitted again with
    ``again`` (which sends the model again), at most :data:`LOST_MODEL_RETRIES` times,
    with a warning."""
    from distributed import as_completed

    from flyarchive.render.opengl_pipeline import join_segments

    left = {job: sum(j == job for j, _, _ in segments) for job in plan.jobs}
    retried: dict[tuple[Job, int], int] = {}
    results: dict[tuple[Job, int], list[str]] = {}
    entries: dict[tuple[Job, str], dict[str, Any]] = {}
    done = as_completed(futures, loop=client.loop)

    def segment_done(job: Job, k0: int, result: list[str]) -> None:
        results[(job, k0)] = result
        left[job] -= 1
        if left[job]:
            return
        keys = sorted(k for (j, k) in results if j == job)
        for c, camera in enumerate(plan.cameras):
            join = client.submit(join_segments, plan, parts, job, camera,
                                 [results[(job, k)][c] for k in keys], pure=False)
            joins[join] = (job, camera)
            done.add(join)

    if done_here is not None:
        (job, k0, _), result = done_here
        segment_done(job, k0, result)
    for future in done:
        if bar is not None:
            bar.update(1)
        if future in joins:
            job, camera = joins[future]
            entries[(job, camera)] = task_result(
                future, f"world {job.world_id}, camera {camera!r} (joining segments)")
            if entries[(job, camera)] is not None and on_video is not None:
                on_video(entries[(job, camera)])  # None: kept from an earlier render
            continue
        job, k0, k1 = futures[future]
        try:
            result = future.result()
        except Exception as err:
            if again is not None and retried.get((job, k0), 0) < LOST_MODEL_RETRIES \
                    and _lost(err):
                retried[(job, k0)] = retried.get((job, k0), 0) + 1
                repeat = again(future, job, k0, k1)
                futures[repeat] = (job, k0, k1)  # (cancelled with the others on a failure)
                done.add(repeat)
                if bar is not None:
                    bar.total += 1
                continue
            result = task_result(future, f"world {job.world_id}, frames {k0}..{k1 - 1}")
        segment_done(job, k0, result)
    if retried:
        warnings.warn(
            f"{len(retried)} segment(s) were rendered again: what they needed (the model sent "
            "to the Dask workers, or their result) was lost with a worker that died.",
            RuntimeWarning, stacklevel=2)
    return [e for e in (entries[(job, camera)] for job in plan.jobs for camera in plan.cameras)
            if e is not None]
