"""``flyarchive`` command line: each subcommand calls one public function."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from flyarchive.errors import FlyarchiveError, SelectionError, Terminated

#: Most world ids one ``--worlds`` selection may name (a range is refused before it is expanded).
MAX_WORLDS = 1_000_000


def parse_worlds(text: str, *, limit: int = MAX_WORLDS,
                 ids: Sequence[int] | None = None) -> list[int]:
    """``"0,3,10-20"`` -> ``[0, 3, 10, ..., 20]``; ``"512-"`` (an open range) -> the ids of
    ``ids`` (the archive's) from 512 on.

    Raises:
        SelectionError: unreadable text, a range whose end is before its start, an open
            range without ``ids`` or that selects none of them, a world named twice, an
            empty selection, or more than ``limit`` ids (checked before any range is
            expanded).
    """
    bounds: list[tuple[int, int | None]] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            bounds.append((int(lo), int(hi) if hi else None if sep else int(lo)))
    except ValueError:
        raise SelectionError(
            f"Cannot read worlds {text!r}; write ids and ranges like '0,3,10-20' (or '512-' "
            "for every world from 512 on)."
        ) from None
    closed = [(lo, hi) for lo, hi in bounds if hi is not None]
    backwards = [f"{lo}-{hi}" for lo, hi in closed if hi < lo]
    if backwards:
        raise SelectionError(
            f"The world range {backwards[0]!r} in {text!r} ends before it starts; write START-END."
        )
    count = sum(hi - lo + 1 for lo, hi in closed)
    if count > limit:
        raise SelectionError(
            f"The world selection {text!r} names {count:,} worlds; at most {limit:,} can be "
            "selected at once. Select fewer, or leave --worlds out to take every world."
        )
    worlds: list[int] = []
    for lo, hi in bounds:
        worlds += range(lo, hi + 1) if hi is not None else _open_range(text, lo, ids)
    if not worlds:
        raise SelectionError(f"The world selection {text!r} is empty.")
    if len(set(worlds)) < len(worlds):
        from collections import Counter

        twice = sorted(w for w, n in Counter(worlds).items() if n > 1)
        raise SelectionError(
            f"The world selection {text!r} names world(s) {twice[:10]} more than once; name "
            "each world once."
        )
    return worlds


def _open_range(text: str, lo: int, ids: Sequence[int] | None) -> list[int]:
    """The archive's world ids from ``lo`` on (``--worlds 512-``), in the archive's order."""
    if ids is None:
        raise SelectionError(
            f"The world selection {text!r} has an open range ('{lo}-'), which needs the "
            "archive's world ids; write START-END instead."
        )
    found = [int(w) for w in ids if int(w) >= lo]
    if not found:
        raise SelectionError(
            f"The world range '{lo}-' in {text!r} selects no world: the archive's largest "
            f"world id is {max((int(w) for w in ids), default=None)}."
        )
    return found


def _worlds(args: argparse.Namespace, storage_options: dict[str, Any] | None) -> list[int] | None:
    """``--worlds`` of a command on ``args.url``; the archive's world ids are read (its
    header) only for an open range such as ``512-``."""
    if not args.worlds:
        return None
    ids = None
    if any(part.strip().endswith("-") for part in args.worlds.split(",")):
        from flyarchive.query.archive import open_header

        ids = [int(w) for w in open_header(_path(args.url), storage_options).world.values]
    return parse_worlds(args.worlds, ids=ids)


def _path(text: str) -> str:
    """A path or URL as the user gave it, with ``~`` expanded for local paths."""
    return text if "://" in text else os.path.expanduser(text)


def parse_time(text: str) -> tuple[float | None, float | None]:
    """``"0.5:2.0"`` -> ``(0.5, 2.0)``; either side may be empty (open), or ``inf``."""
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        window = (float(lo) if lo.strip() else None, float(hi) if hi.strip() else None)
    except ValueError:
        window = None
    nan = window is not None and any(side is not None and side != side for side in window)
    if window is None or nan:
        raise SelectionError(
            f"Cannot read time window {text!r}{': NaN is no time' if nan else ''}; write "
            "START:END in seconds, e.g. '0.5:2.0' or '1:' (an empty side is open)."
        )
    return window


def parse_gpus(text: str) -> list[int]:
    """``"0,1"`` -> ``[0, 1]``: CUDA device numbers for ``--gpus``.

    Raises:
        RenderOptionsError: not a comma-separated list of whole numbers.
    """
    from flyarchive.errors import RenderOptionsError

    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise RenderOptionsError(
            f"Cannot read GPUs {text!r}; write CUDA device numbers like '0,1' (nvidia-smi "
            "lists them), or leave --gpus out to use every GPU."
        ) from None


def parse_size(text: str) -> tuple[int, int]:
    """``"240x320"`` (height x width) -> ``(240, 320)``."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SelectionError(f"Cannot read size {text!r}; write HEIGHTxWIDTH, e.g. 240x320.") from None
    return h, w


def _storage_options(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SelectionError(f"--storage-options must be a JSON object ({err}).") from None
    if not isinstance(value, dict):
        raise SelectionError("--storage-options must be a JSON object, e.g. '{\"anon\": true}'.")
    return value


def cmd_info(args: argparse.Namespace) -> int:
    from flyarchive.summary import summarize

    info = summarize(_path(args.url), _storage_options(args.storage_options))
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        from flyarchive.summary import summary_lines

        lines = summary_lines(info)
        width = max(len(k) for k in lines)
        for key, value in lines.items():
            print(f"{key:<{width}}  {value}")
    return 0


def cmd_import_npz(args: argparse.Namespace) -> int:
    from flyarchive.interop.flygym_npz import find_npz_files, import_npz
    from flyarchive.models import load_model

    if args.resume and args.overwrite:
        raise SelectionError("--resume finishes an import and --overwrite replaces it; "
                             "choose one.")
    model = load_model(_path(args.model))
    files = find_npz_files([_path(p) for p in args.paths])
    url = import_npz(files, _path(args.to), model,
                     mode="w" if args.overwrite else "w-", resume=args.resume,
                     renumber=args.renumber, storage_options=_storage_options(args.storage_options),
                     codec=args.codec, store_model=not args.no_store_model,
                     takeover=args.takeover)
    print(f"imported {len(files)} file(s) into {url}")
    return 0


def cmd_export_npz(args: argparse.Namespace) -> int:
    from flyarchive.interop.flygym_npz import export_npz

    storage_options = _storage_options(args.storage_options)
    worlds = _worlds(args, storage_options)
    out = _path(args.to)
    done = export_npz(_path(args.url), out, worlds=worlds, overwrite=args.overwrite,
                      storage_options=storage_options,
                      out_storage_options=_storage_options(args.out_storage_options))
    print(f"wrote {len(done.files)} file(s) to {out}")
    if done.skipped:
        print(f"skipped {len(done.skipped)} world(s) with no committed frames: "
              f"{done.skipped[:20]}{' ...' if len(done.skipped) > 20 else ''}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from flyarchive.store.integrity import verify

    report = verify(_path(args.url), _storage_options(args.storage_options))
    writing = f" It is being written by {report.writer}." if report.writer else ""
    if report.ok:
        print(f"OK: {args.url}: {report.n_worlds} worlds, {report.frames_checked} committed "
              f"frames read, all finite, checksums match.{writing}")
        for note in report.being_written:
            print(f"  - being written: {note}")
        return 0
    print(f"FAILED: {args.url}:", file=sys.stderr)
    for problem in report.problems:
        print(f"  - {problem}", file=sys.stderr)
    if report.writer:
        print(f"  ({writing.strip()} No writer makes the damage above; stop it before "
              "restoring anything.)", file=sys.stderr)
    return 1


def cmd_render(args: argparse.Namespace) -> int:
    from flyarchive.config import set_verbose

    set_verbose(args.verbose)  # Warp's logs, here and in local Dask workers
    args.backend = _backend(args.backend)
    with _sigterm_stops(), _render_cluster(args) as client:
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


def _backend(backend: str | None) -> str | None:
    """``--backend`` by its current name; an old one (``cpu``) with a note on stderr."""
    from flyarchive.replay import OLD_BACKENDS

    if backend in OLD_BACKENDS:
        _say(f"note: --backend {backend} is called --backend {OLD_BACKENDS[backend]} now; "
             f"{backend} will be removed.")
        return OLD_BACKENDS[backend]
    return backend


def _render_cluster(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
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
    """The render of ``args`` on ``client`` (:func:`_render_cluster`), or where
    :func:`flyarchive.render_videos` places it when None."""
    from flyarchive.distribute.api import render_videos
    from flyarchive.render.options import RenderOptions
    from flyarchive.models import load_model

    storage_options = _storage_options(args.storage_options)
    where = _where(_path(args.url), storage_options, args.where_world_var, args.where_dof)
    written = render_videos(
        _path(args.url), load_model(_path(args.model)) if args.model else None, args.camera,
        _path(args.out),
        worlds=_worlds(args, storage_options),
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


def _where(url: str, storage_options: dict[str, Any] | None, world_vars: list[str] | None,
           dofs: list[str] | None) -> Any:
    """The ``where`` mask of ``--where-world-var`` and ``--where-dof`` (None without any)."""
    if not world_vars and not dofs:
        return None
    from flyarchive.query import open_archive
    from flyarchive.query.conditions import where_from_conditions

    return where_from_conditions(open_archive(url, storage_options), world_vars or [], dofs or [])


def _number(text: str) -> float | None:
    from flyarchive.query.conditions import parse_number

    return parse_number(text)


def parse_world_var(text: str) -> tuple[str, Any]:
    """``"success=1,0,1"`` -> ``("success", array([1, 0, 1]))``.

    Values: comma-separated numbers (all whole numbers: int64; else float64, ``nan``
    allowed), ``true`` / ``false`` (bool), or text when no value is a number
    (``genotype=wt,mutA``: str); or ``@file.npy`` / ``@file.json`` (a list, e.g. of
    strings for text that looks like numbers).

    Raises:
        OptionsError: no ``=``, an empty name, numbers mixed with values that are not
            numbers (or with true/false), or a file that cannot be read.
    """
    import numpy as np

    from flyarchive.errors import OptionsError

    name, sep, rhs = text.partition("=")
    name, rhs = name.strip(), rhs.strip()
    how = ("write NAME=V1,V2,... with one value per world (e.g. success=1,0,1, "
           "ok=true,false,true or genotype=wt,mutA,wt), or NAME=@values.npy / NAME=@values.json")
    if not sep or not name or not rhs:
        raise OptionsError(f"Cannot read the world variable {text!r}; {how}.")
    if rhs.startswith("@"):
        return name, _values_file(name, _path(rhs[1:]), how)
    items = [item.strip() for item in rhs.split(",")]
    if "" in items:
        raise OptionsError(
            f"Cannot read the world variable {text!r}: value {items.index('') + 1} is empty; "
            f"{how}.")
    if all(item.lower() in ("true", "false") for item in items):
        return name, np.array([item.lower() == "true" for item in items])
    bad = [item for item in items if _number(item) is None or item.lower() in ("true", "false")]
    if len(bad) == len(items):  # no number: text
        return name, np.array(items, dtype=str)
    if bad:
        raise OptionsError(
            f"Cannot read the world variable {text!r}: {bad[0]!r} is not a number, and other "
            "values are (true/false only when every value is one; text only when no value is "
            f"a number: for text that looks like numbers use @values.json); {how}.")
    try:
        return name, np.array([int(item) for item in items], dtype=np.int64)
    except ValueError:
        return name, np.array([float(item) for item in items], dtype=np.float64)


def _values_file(name: str, path: str, how: str) -> Any:
    import numpy as np

    from flyarchive.errors import OptionsError

    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        if path.endswith(".json"):
            with open(path) as f:
                return np.asarray(json.load(f))
    except (OSError, ValueError) as err:
        raise OptionsError(f"Cannot read the values of {name!r} from {path!r} ({err}).") from None
    raise OptionsError(f"The values of {name!r} come from {path!r}; {how} (.npy or .json).")


def cmd_set_world_var(args: argparse.Namespace) -> int:
    from flyarchive.store.world_vars import add_world_vars

    variables = dict(parse_world_var(text) for text in args.assignments)
    names = add_world_vars(_path(args.url), variables, overwrite=args.overwrite,
                           storage_options=_storage_options(args.storage_options),
                           takeover=args.takeover)
    print(f"set {', '.join(names)} in {args.url}")
    return 0


def _video_options(args: argparse.Namespace) -> Any:
    """``--preset`` / ``--crf`` over the backend's defaults (``None`` when neither is given)."""
    from dataclasses import replace

    from flyarchive.render.options import default_video_options

    if args.preset is None and args.crf is None:
        return None
    chosen = {k: v for k, v in (("preset", args.preset), ("crf", args.crf)) if v is not None}
    return replace(default_video_options(args.backend), **chosen)


def cmd_plot(args: argparse.Namespace) -> int:
    from flyarchive.plot import plot_traces

    path = plot_traces(_path(args.url), args.world, _path(args.out), dofs=args.dof or None,
                       storage_options=_storage_options(args.storage_options))
    print(f"wrote {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from flyarchive.demo import run_demo

    run_demo(_path(args.out), n_worlds=args.worlds, seconds=args.seconds, render=not args.no_render,
             overwrite=args.overwrite, n_workers=args.workers)
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    try:
        from flyarchive.view.app import run_view
    except ImportError as err:
        if err.name != "aiohttp":
            raise
        from flyarchive.errors import missing_dependency

        raise missing_dependency("aiohttp", "view", "flyarchive view") from None
    return run_view(_path(args.url), storage_options=_storage_options(args.storage_options),
                    model_path=_path(args.model) if args.model else None, host=args.host,
                    port=args.port, out=_path(args.out), backend=_backend(args.backend))


def _crf(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 51:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer from 0 to 51")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    from flyarchive.replay import BACKENDS, OLD_BACKENDS
    from flyarchive.video import PRESETS

    parser = argparse.ArgumentParser(prog="flyarchive", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    def storage(p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage-options", help="fsspec options as JSON, e.g. S3 endpoint_url")

    def takeover(p: argparse.ArgumentParser) -> None:
        p.add_argument("--takeover", action="store_true",
                       help="take over the writer claim that a crashed writer left on the "
                            "archive (one that died on this host is taken over without it); "
                            "never while that writer still runs")

    p = add("info", cmd_info, "Summarize an archive.")
    p.add_argument("url")
    p.add_argument("--json", action="store_true", help="print JSON")
    storage(p)
    p = add("import-npz", cmd_import_npz, "Import flygym RecordedTrajectory .npz files.")
    p.add_argument("paths", nargs="+", help=".npz files or folders of them")
    p.add_argument("--to", required=True, help="archive URL to create")
    p.add_argument("--model", required=True, help="MJCF .xml or compiled .mjb")
    p.add_argument("--codec", default="lossless", help="'lossless' or 'abs:1e-6'")
    p.add_argument("--overwrite", action="store_true", help="replace an existing archive")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted import into --to (same files, same model)")
    p.add_argument("--renumber", action="store_true",
                   help="number worlds 0, 1, ... in file order (flygym CPU files all have "
                        "world_id 0); the files' ids are kept as 'original_world_id'")
    p.add_argument("--no-store-model", action="store_true",
                   help="do not keep the model beside the archive (render then needs --model)")
    takeover(p)
    storage(p)
    p = add("export-npz", cmd_export_npz, "Export worlds as flygym .npz files.")
    p.add_argument("url")
    p.add_argument("--to", required=True, help="output folder or fsspec URL (e.g. s3://lab/npz)")
    p.add_argument("--worlds", help="e.g. 0,3,10-20, or 512- for every world from 512 on "
                   "(default all)")
    p.add_argument("--overwrite", action="store_true")
    storage(p)
    p.add_argument("--out-storage-options",
                   help="fsspec options of --to as JSON (default: --storage-options)")
    p = add("verify", cmd_verify, "Check schema, commit markers and every committed chunk.")
    p.add_argument("url")
    storage(p)
    p = add("render", cmd_render, "Render worlds of an archive to mp4 videos.")
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
    p.add_argument("--crf", type=_crf, help="x264 quality, 0 (lossless) to 51 (default 18)")
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
    storage(p)
    p = add("set-world-var", cmd_set_world_var,
            "Add per-world variables to an archive (committed atomically).")
    p.add_argument("url")
    p.add_argument("assignments", nargs="+", metavar="NAME=VALUES",
                   help="one value per world in the archive's world order: success=1,0,1, "
                        "ok=true,false, reward=0.5,1e-3, genotype=wt,mutA (int, float, bool "
                        "or text), or NAME=@values.npy / NAME=@values.json")
    p.add_argument("--overwrite", action="store_true",
                   help="replace variables of these names (keeping their dtype)")
    takeover(p)
    storage(p)
    p = add("plot", cmd_plot, "Plot joint traces of one world to a PNG.")
    p.add_argument("url")
    p.add_argument("--world", type=int, required=True, help="world id")
    p.add_argument("--dof", action="append", help="dof label (repeatable; default: a few)")
    p.add_argument("--out", required=True, help="PNG path")
    storage(p)
    from flyarchive.cli_analyze import CliTools, add_commands

    add_commands(add, storage, CliTools(parse_worlds, parse_time, _storage_options))
    p = add("demo", cmd_demo, "Simulate walking NeuroMechFly worlds, record, verify, render.")
    p.add_argument("--out", default="demo-out", help="output folder (default demo-out)")
    p.add_argument("--worlds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=1.0, help="simulated seconds")
    p.add_argument("--workers", type=int, help="render worker processes (default: one per core)")
    p.add_argument("--no-render", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier demo's output")
    p = add("view", cmd_view, "Browse, filter and watch the worlds of an archive in the browser.")
    p.add_argument("url")
    p.add_argument("--model", help="MJCF .xml or compiled .mjb (default: the model kept in the "
                   "archive; without one: table and traces only)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8750, help="port (default 8750, or a free one "
                   "if it is taken; 0: any free port)")
    p.add_argument("--out", default="view-videos",
                   help="folder for the videos rendered from the page (default view-videos)")
    p.add_argument("--backend", choices=(*BACKENDS, *OLD_BACKENDS),
                   help="renderer of the page's renders (default: the fastest here: gpu, "
                        "warp-cpu, else OpenGL)")
    storage(p)
    return parser


def _one_line(args: argparse.Namespace, err: BaseException) -> str:
    """The error as one line, with the storage options' secrets scrubbed."""
    from flyarchive.store.storage_errors import scrub, translate

    options: Any = {}
    for name in ("storage_options", "out_storage_options"):
        try:
            options[name] = _storage_options(getattr(args, name, None))
        except SelectionError:
            pass
    if not isinstance(err, (FlyarchiveError, OSError)):  # a storage client's own exception
        where = getattr(args, "url", None) or getattr(args, "to", None) or ""
        err = translate(err, str(where), options.get("storage_options")) or err
    text = str(err) if isinstance(err, FlyarchiveError) else f"{type(err).__name__}: {err}"
    return " ".join(scrub(text, options).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flyarchive`` command.

    Returns the exit status: 0 done, 1 ``verify`` found problems, 2 an error (one line
    on stderr: ``flyarchive <command>: error: ...``), 130 interrupted (Ctrl-C), 143
    ``render`` stopped by SIGTERM. A closed output pipe (``flyarchive info | head``) ends
    the command quietly.
    """
    args = build_parser().parse_args(argv)
    from flyarchive.store.storage_errors import client_errors

    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # Python's documented recipe: no more output; stdout's close at exit is silent too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt as stop:
        import logging

        # zarr's event loop may still hold the interrupted write; asyncio would report the
        # task as "destroyed but pending" at exit: noise after Ctrl-C.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        terminated = isinstance(stop, Terminated)
        _say(f"flyarchive {args.command}: {'terminated' if terminated else 'interrupted'}")
        return 143 if terminated else 130
    except (FlyarchiveError, OSError, *client_errors(), *_mujoco_errors()) as err:
        _say(f"flyarchive {args.command}: error: {_one_line(args, err)}")
        return 2


def _mujoco_errors() -> tuple[type[BaseException], ...]:
    """``mujoco.FatalError`` once MuJoCo is loaded: MuJoCo's own failures are one line too."""
    mujoco = sys.modules.get("mujoco")
    return (mujoco.FatalError,) if mujoco is not None else ()


def _say(line: str) -> None:
    """``line`` on stderr, never while Warp's start in another thread has captured it."""
    from flyarchive.warp_log import STDERR_LOCK

    with STDERR_LOCK:
        print(line, file=sys.stderr, flush=True)


def run() -> None:
    """The ``flyarchive`` console script: :func:`main`, then exit with its status.

    Before exiting, the objects that exist are frozen out of the garbage collector
    (:func:`gc.freeze`): the interpreter's final collections would otherwise walk the
    large graph of objects that importing mujoco_warp makes, for nothing (measured on
    a 2-core VM: 1.3 s of a 14 s ``flyarchive render --backend warp-cpu``).
    """
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
