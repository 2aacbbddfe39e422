"""The public render entry points: worlds and time windows of an archive to videos
(:func:`render_videos`) or to lazy frames (:func:`render_frames`).

``render_videos`` opens the archive's header once (:func:`flyarchive.store.opening.open_header`:
no xarray or dask), selects frames (:mod:`flyarchive.query.selection`), reads the kept
model through the same opened group, makes a plan (:mod:`flyarchive.render.plan`), checks
it before any work, and runs it where it belongs (:mod:`~flyarchive.distribute.opengl_runs`,
:mod:`~flyarchive.distribute.warp_runs`): in this process, on a local Dask cluster it
starts, or on the cluster given (which one: see :func:`render_videos`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from flyarchive.distribute import opengl_runs, warp_runs
from flyarchive.distribute.gpus import check_gpus
from flyarchive.distribute.warm import warm_up_here
from flyarchive.errors import RenderOptionsError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.models import check_data, model_bytes
from flyarchive.store.opening import open_header
from flyarchive.query.selection import select_frames
from flyarchive.render.options import RenderOptions
from flyarchive.render.output_plan import plan_outputs
from flyarchive.render.plan import RenderPlan, absolute_url, preflight
from flyarchive.render.renderers import keep_archive
from flyarchive.replay import BACKENDS, WARP_BACKENDS, backend_name
from flyarchive.replay.sizes import MAX_GL_SIDE, is_int, parse_frame_size

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

    Args:
        source: The archive's URL.
        ds: The archive, from :func:`flyarchive.open_archive`, or its header
            (:func:`~flyarchive.store.opening.open_header`), whose opened group the kept
            model is read through.
        model: The compiled model; None: the one kept beside the archive
            (``models/<sha256>.mjb``, :mod:`flyarchive.store.kept_models`).

    Raises:
        ModelLoadError: ``model`` is None and the archive keeps no model, or the kept
            one is not an MJB this MuJoCo can load (another release: named); a model
            given whose data MuJoCo cannot make (``mujoco.FatalError``).
        UnsafeModelError: the kept model crashed the child process that loaded it first,
            raised ``mujoco.FatalError`` there, or did not finish
            (:func:`flyarchive.store.kept_models.kept_model`).
        CorruptArchiveError: the kept model's bytes do not hash to its name, or it is
            missing.
        LayoutMismatchError: the model's layout differs from the archive's.
    """
    if model is None:
        from flyarchive.store.kept_models import kept_model

        # read through the header's group; checked in a child process first
        model, blob = kept_model(source, storage_options, group=getattr(ds, "group", None))
    else:
        check_data(model)  # mujoco.FatalError of a damaged model: a ModelLoadError
        blob = model_bytes(model)
    _check_model(ds, model)
    return model, blob


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
    - else ``"opengl"``: a local Dask cluster of ``n_workers`` processes (default: one per
      core) that this call starts and stops;
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
        model: The compiled model it was recorded with (checked against the layout).
            None (default): the model kept beside the archive when it was recorded
            (``store_model=True``, the default of the recorders and ``import_npz``).
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
    from flyarchive.video.workspace import RunFolder

    cameras = (cameras,) if isinstance(cameras, str) else tuple(cameras)
    _check_out(out, resume, options)
    if n_workers is not None and (not is_int(n_workers) or n_workers < 0):
        raise RenderOptionsError(
            f"n_workers must be None (one worker per core) or a whole number >= 0 (0: render "
            f"in this process), got {n_workers!r}."
        )
    on_cluster = client is not None or scheduler is not None
    check_gpus(gpus, options.backend, on_cluster=on_cluster)
    warm_up_here(options.backend, gpus=gpus, n_workers=n_workers, on_cluster=on_cluster)
    source, out = absolute_url(source), absolute_url(out).rstrip("/")
    ds = open_header(source, storage_options)  # opened once here; planned without xarray
    jobs = select_frames(ds, worlds, time, where=where, pad=pad)
    model, blob = replay_model(source, ds, model, storage_options)
    options, jobs, notes = plan_outputs(options, ds, model, jobs)  # mosaics grouped
    if out_storage_options is None and _protocol(out) == _protocol(source) != "file":
        out_storage_options = storage_options
    plan = RenderPlan(
        url=source, storage_options=dict(storage_options or {}), cameras=cameras,
        out=out, out_storage_options=dict(out_storage_options or {}),
        fps=float(ds.attrs["output_fps"]), options=options, jobs=tuple(jobs), notes=notes,
        archive_id=ds.attrs.get("archive_id"),
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
    where = dict(client=client, scheduler=scheduler, n_workers=n_workers, in_process=in_process)
    with RunFolder.create(plan.out, plan.out_storage_options) as run:
        journal = ManifestJournal(plan, ds, staging=run.local)
        try:
            if options.backend in WARP_BACKENDS:
                videos = warp_runs.run_plan(plan, blob, run.url, gpus=gpus,
                                            on_video=journal.add, **where)
            else:
                videos = opengl_runs.run_plan(plan, blob, run.url, on_video=journal.add, **where)
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


def _protocol(url: str) -> str:
    """``"s3"`` for ``s3://...``; ``"file"`` for local paths."""
    protocol, sep, _ = url.partition("://")
    return protocol if sep and protocol != "local" else "file"


def render_frames(
    source: str,
    model: mujoco.MjModel | None = None,
    camera: str | None = None,
    *,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    size: tuple[int, int] = (240, 320),
    block_frames: int = 16,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "opengl",
    outputs: Sequence[str] | None = None,
    depth_scale: float | None = None,
) -> xr.DataArray | xr.Dataset:
    """Frames of one camera as lazy arrays over ``(world, time, y, x[, channel])``.

    Nothing is rendered until computed; computing a slice renders only the blocks of
    ``block_frames`` frames it touches, each a task that makes every output asked for
    from one kinematics pass per frame. The time axis runs from the first to the last
    selected frame of any world; frames past a world's ``n_frames`` (a ragged archive),
    and frames whose state is not finite, show nothing (black, NaN depth, segmentation
    -1). A local ``source`` is made absolute, so the graph computes on workers started in
    other folders. ``model`` None: the model kept beside the archive (as
    :func:`render_videos`). The model reaches the workers once (:func:`graph_model`):
    with a default ``distributed.Client`` in this process, it is sent to its workers
    when this is called, and the frames compute on that client; else it is one key of
    each graph, never one copy per task.

    Args:
        backend: ``"opengl"`` (its old name ``"cpu"`` is accepted with a
            DeprecationWarning), ``"gpu"`` or ``"warp-cpu"`` (mujoco-warp; one renderer
            per process, used by one task at a time).
        outputs: None (default): return the RGB frames as one DataArray, as before. A
            sequence of names from :data:`flyarchive.replay.outputs.OUTPUTS`: return an
            ``xr.Dataset`` with one variable per output: ``rgb`` ``(world, time, y, x,
            channel)`` uint8, ``depth`` ``(world, time, y, x)`` float32 planar depth in
            model length units (NaN: no hit; on the Warp backends a multiple of
            ``depth_scale``), ``segmentation`` ``(world, time, y, x)`` int32 geom ids (-1:
            no geom).
        depth_scale: Warp backends: model units per depth count (None: the far plane /
            65534); the OpenGL depth is not quantized.

    Raises:
        CameraNotFoundError, LayoutMismatchError, SelectionError.
        ModelLoadError, CorruptArchiveError: no model given, and none (or a damaged one)
            kept beside the archive (UnsafeModelError: one that is not safe to load).
        FrameSizeError: ``size`` is not two positive integers (at most 16384 on ``"opengl"``).
        RenderOptionsError: an unknown backend or output.
    """
    import dask
    import dask.array as da
    import xarray as xr

    from flyarchive.render.blocks import render_block_outputs
    from flyarchive.models import camera_ids
    from flyarchive.replay.outputs import check_segmentable, parse_depth_scale, parse_outputs

    backend = backend_name(backend)
    if backend not in BACKENDS:
        raise RenderOptionsError(
            f"Unknown backend {backend!r}. Backends: {', '.join(map(repr, BACKENDS))}.")
    names = ("rgb",) if outputs is None else parse_outputs(outputs)
    depth_scale = parse_depth_scale(depth_scale)
    size = parse_frame_size(size, max_side=MAX_GL_SIDE if backend == "opengl" else None)
    source = absolute_url(source)
    ds = open_header(source, storage_options)  # opened once here
    model, mjb = replay_model(source, ds, model, storage_options)
    keep_archive(source, storage_options, ds)  # what blocks computed in this process read
    camera_ids(model, () if camera is None else camera)
    if "segmentation" in names:
        check_segmentable(model)
    jobs = select_frames(ds, worlds, time)
    start, stop = min(j.start for j in jobs), max(j.stop for j in jobs)
    blob = graph_model(mjb)  # once, not per task nor per compute
    h, w = size
    trailing = {"rgb": ((h, w, 3), np.uint8), "depth": ((h, w), np.float32),
                "segmentation": ((h, w), np.int32)}
    rows: dict[str, list[Any]] = {name: [] for name in names}
    for job in jobs:
        blocks: dict[str, list[Any]] = {name: [] for name in names}
        for k0 in range(start, stop, block_frames):
            k1 = min(k0 + block_frames, stop)
            task = dask.delayed(render_block_outputs, pure=True)(
                source, dict(storage_options or {}), blob, camera, (h, w),
                job.world_index, k0, k1, committed=job.stop, backend=backend, outputs=names,
                depth_scale=depth_scale, archive_id=ds.attrs.get("archive_id"),
            )
            for name in names:
                shape, dtype = trailing[name]
                blocks[name].append(da.from_delayed(task[name], shape=(k1 - k0, *shape),
                                                    dtype=dtype))
        for name in names:
            rows[name].append(da.concatenate(blocks[name], axis=0))
    coords = {"world": [j.world_id for j in jobs], "time": ds.time.values[start:stop]}
    attrs = {"camera": camera, "output_fps": ds.attrs["output_fps"], "backend": backend}
    arrays = {
        name: xr.DataArray(da.stack(rows[name], axis=0),
                           dims=("world", "time", "y", "x", "channel")[:2 + len(trailing[name][0])],
                           coords={**coords, **({"channel": ["r", "g", "b"]} if name == "rgb" else {})},
                           name=camera if outputs is None else name, attrs=attrs)
        for name in names
    }
    if outputs is None:
        return arrays["rgb"]
    return xr.Dataset(arrays, attrs=attrs)


def graph_model(mjb: bytes) -> Any:
    """The model's MJB bytes as the one input of :func:`render_frames`'s tasks that holds it.

    With a default Dask client in this process (``distributed.Client(...)``), the bytes
    are sent to its workers once, now, under a key named by their SHA-256
    (:func:`flyarchive.distribute.cluster.scatter_model`): every later graph of these
    frames holds only that key (a future of the client), so compute them on that
    client. Without one, the bytes are one key of the graph, named by their SHA-256
    (so that frames of two models computed together cannot mix them up), sent with
    each compute.
    """
    import hashlib

    import dask

    client = None
    if "distributed" in sys.modules:  # no client can exist without it: no import
        from distributed import default_client

        try:
            client = default_client()
        except ValueError:  # no default client
            client = None
    if client is not None:
        from flyarchive.distribute.cluster import scatter_model

        return scatter_model(client, mjb)
    return dask.delayed(mjb, name=f"flyarchive-model-{hashlib.sha256(mjb).hexdigest()}")
