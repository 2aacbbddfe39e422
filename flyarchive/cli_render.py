"""``flyarchive render``: its arguments, where it runs (decided once, the cluster started
before the heavy imports: :func:`render_cluster`), and the call of
:func:`flyarchive.render_videos` with that cluster's client.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from flyarchive.cli_args import (
    crf_arg,
    parse_gpus,
    parse_size,
    parse_time,
    path_arg,
    say,
    storage_options_arg,
    where_mask,
    worlds_arg,
)
from flyarchive.errors import FlyarchiveError, Terminated


def add_render_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``flyarchive render`` (but ``--storage-options``)."""
    from flyarchive.replay import BACKENDS, OLD_BACKENDS
    from flyarchive.video import PRESETS

    p.add_argument("url")
    p.add_argument("--model", help="MJCF .xml or compiled .mjb (default: the model kept in "
                   "the archive when it was recorded)")
    p.add_argument("--camera", action="append", required=True, help="camera name (repeatable)")
    p.add_argument("--worlds", help="e.g. 0,3,10-20, or 512- for every world from 512 on "
                   "(default all)")
    p.add_argument("--time", help="START:END seconds of simulated time")
    p.add_argument("--where-world-var", action="append", metavar="NAME=VALUE",
                   help="only worlds whose world variable holds: NAME=VALUE, or with != > >= "
                        "< <= (repeatable: all must hold), e.g. success=1")
    p.add_argument("--where-dof", action="append", metavar="DOF>VALUE",
                   help="only the frames where a dof's qpos holds, e.g. 'joint>0.5' (= != > "
                        ">= < <=; repeatable); each window of frames is a video of its own")
    p.add_argument("--pad", type=float, default=0.0,
                   help="simulated seconds of context around each --where-dof window "
                        "(windows closer than 2*pad merge; default 0)")
    p.add_argument("--size", default="240x320", help="HEIGHTxWIDTH (default 240x320)")
    p.add_argument("--out", default="videos", help="output folder or fsspec URL")
    p.add_argument("--scheduler", help="Dask scheduler address (default: a local cluster)")
    p.add_argument("--workers", type=int, help="local worker processes (default: one per core; "
                   "gpu: one per GPU, see --gpus; warp-cpu: one render thread per core in "
                   "this process unless given; 0: in this process)")
    p.add_argument("--backend", default="opengl", choices=(*BACKENDS, *OLD_BACKENDS),
                   help="opengl (mujoco.Renderer, bit-exact; default), gpu (mujoco-warp on "
                        "CUDA) or warp-cpu (mujoco-warp on Warp's CPU device); cpu is the "
                        "old name of opengl")
    p.add_argument("--batch-worlds", type=int, metavar="N",
                   help="states per batch of the Warp backends (default: 1024 on gpu, 4 "
                        "on warp-cpu); smaller uses less GPU and pinned host memory")
    p.add_argument("--preset", choices=PRESETS,
                   help="x264 preset (default: veryfast; ultrafast with --backend gpu)")
    p.add_argument("--crf", type=crf_arg, help="x264 quality, 0 (lossless) to 51 (default 18)")
    p.add_argument("--outputs", default="rgb", metavar="rgb,depth,segmentation",
                   help="what to make: rgb (mp4), depth and segmentation (lossless 16-bit "
                        "zarr maps beside the mp4; default rgb)")
    p.add_argument("--mosaic", metavar="ROWSxCOLS",
                   help="tile that many worlds (each at --size) into one video per camera, "
                        "labelled with world ids, e.g. 2x3")
    p.add_argument("--overlay", metavar="time,world,speed,VAR",
                   help="text burnt into the frames: time, world, speed and per-world "
                        "variables (default none)")
    p.add_argument("--overwrite", action="store_true", help="replace existing videos")
    p.add_argument("--resume", action="store_true",
                   help="continue a render into --out that stopped (Ctrl-C, a kill): keep the "
                        "finished videos its manifest lists, render the rest")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="show Warp's initialization and "
                   "kernel-loading messages (hidden by default)")
    p.add_argument("--gpus", help="with --backend gpu and no --scheduler: CUDA device numbers "
                   "to use, e.g. 0,1 (default: every visible GPU, one worker process each with "
                   "its share of the cores; one GPU renders in this process)")


def cmd_render(args: argparse.Namespace) -> int:
    from flyarchive.config import set_verbose

    set_verbose(args.verbose)  # Warp's logs, here and in local Dask workers
    args.backend = backend_arg(args.backend)
    with _sigterm_stops(), render_cluster(args) as client:
        return _render(args, client)


@contextlib.contextmanager
def _sigterm_stops() -> Any:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (a render stops
    as on Ctrl-C: finished videos and their manifest entries are kept, partial files go)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def backend_arg(backend: str | None) -> str | None:
    """``--backend`` by its current name; an old one (``cpu``) with a note on stderr."""
    from flyarchive.replay import OLD_BACKENDS

    if backend in OLD_BACKENDS:
        say(f"note: --backend {backend} is called --backend {OLD_BACKENDS[backend]} now; "
            f"{backend} will be removed.")
        return OLD_BACKENDS[backend]
    return backend


def render_cluster(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """Where the render runs, decided once, before the imports and the archive's opening:
    a client of the local Dask cluster the render runs on, started now
    (:func:`flyarchive.distribute.cluster.local_cluster`), or of ``--scheduler``, its
    workers warming Warp meanwhile (:func:`~flyarchive.distribute.cluster.scheduler_client`);
    None when it renders in this process, or the options are wrong (the render says what
    is wrong). The client is passed to :func:`flyarchive.render_videos`."""
    from flyarchive.distribute.cluster import local_cluster, scheduler_client
    from flyarchive.distribute.placement import placement
    from flyarchive.replay import WARP_BACKENDS

    if args.scheduler:  # its workers start warming Warp; connected once
        warm = {"gpu": "cuda", "warp-cpu": "cpu"}.get(args.backend)
        return scheduler_client(args.scheduler, warm) if args.gpus is None else \
            contextlib.nullcontext()  # refused by the render: --gpus with --scheduler
    if (args.workers is not None and args.workers < 1) or args.url.startswith("memory://"):
        return contextlib.nullcontext()

    if args.backend not in WARP_BACKENDS:  # OpenGL: a worker process per core
        return local_cluster(args.workers)
    try:
        where = placement(args.backend, sys.maxsize, n_workers=args.workers,
                          gpus=parse_gpus(args.gpus) if args.gpus is not None else None)
    except FlyarchiveError:
        return contextlib.nullcontext()
    if where.where == "local-gpus":
        return local_cluster(gpu_workers=list(where.gpu_workers))
    if where.where == "local":
        return local_cluster(where.n_workers)
    return contextlib.nullcontext()


def _render(args: argparse.Namespace, client: Any = None) -> int:
    """The render of ``args`` on ``client`` (:func:`render_cluster`), or where
    :func:`flyarchive.render_videos` places it when None."""
    from flyarchive.distribute.api import render_videos
    from flyarchive.render.options import RenderOptions
    from flyarchive.models import load_model

    storage_options = storage_options_arg(args.storage_options)
    where = where_mask(path_arg(args.url), storage_options, args.where_world_var, args.where_dof)
    written = render_videos(
        path_arg(args.url), load_model(path_arg(args.model)) if args.model else None, args.camera,
        path_arg(args.out),
        worlds=worlds_arg(args, storage_options),
        time=parse_time(args.time) if args.time else None,
        where=where, pad=args.pad,
        options=RenderOptions(size=parse_size(args.size), backend=args.backend,
                              batch_worlds=args.batch_worlds,
                              overwrite=args.overwrite, progress=not args.quiet,
                              video=_video_options(args), **_output_options(args)),
        client=client, scheduler=None if client is not None else args.scheduler,
        n_workers=args.workers, storage_options=storage_options,
        gpus=parse_gpus(args.gpus) if args.gpus is not None and client is None else None,
        resume=args.resume,
    )
    kept = f", kept {written.kept} finished before" if written.kept else ""
    print(f"wrote {len(written.videos) - written.kept} video(s){kept} and {written.manifest}")
    for note in written.notes:
        print(f"note: {note}")
    return 0


def _output_options(args: argparse.Namespace) -> dict[str, Any]:
    """``RenderOptions`` fields of ``--outputs``, ``--mosaic`` and ``--overlay`` (checked
    there: their errors name the flag's text)."""
    return {"outputs": args.outputs, "mosaic": args.mosaic, "overlays": args.overlay or ()}


def _video_options(args: argparse.Namespace) -> Any:
    """``--preset`` / ``--crf`` over the backend's defaults (``None`` when neither is given)."""
    from dataclasses import replace

    from flyarchive.render.options import default_video_options

    if args.preset is None and args.crf is None:
        return None
    chosen = {k: v for k, v in (("preset", args.preset), ("crf", args.crf)) if v is not None}
    return replace(default_video_options(args.backend), **chosen)
