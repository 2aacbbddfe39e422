"""The ``flyarchive`` command line's parser and subcommands: each calls one public function.

``render`` decides where it runs once, starting its cluster before the heavy imports
(:func:`render_cluster`), and calls :func:`flyarchive.render_videos` with that cluster's
client. The parsers the subcommands share, and the arguments of ``render``, are
:mod:`flyarchive.cli.args`'s; the analysis subcommands are :mod:`flyarchive.cli.analysis`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from flyarchive.cli.args import (
    add_render_arguments,
    parse_gpus,
    parse_size,
    parse_time,
    parse_world_var,
    parse_worlds,
    path_arg,
    say,
    storage_options_arg,
    where_mask,
    worlds_arg,
)
from flyarchive.errors import FlyarchiveError, SelectionError, Terminated


def cmd_info(args: argparse.Namespace) -> int:
    from flyarchive.summary import summarize

    info = summarize(path_arg(args.url), storage_options_arg(args.storage_options))
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
    from flyarchive.models import load_model_file

    if args.resume and args.overwrite:
        raise SelectionError("--resume finishes an import and --overwrite replaces it; "
                             "choose one.")
    model_path = path_arg(args.model)
    model = load_model_file(model_path)
    portable = not args.no_store_model and model_path.lower().endswith((".xml", ".mjz", ".zip"))
    files = find_npz_files([path_arg(p) for p in args.paths])
    url = import_npz(files, path_arg(args.to), model,
                     mode="w" if args.overwrite else "w-", resume=args.resume,
                     renumber=args.renumber, storage_options=storage_options_arg(args.storage_options),
                     codec=args.codec, store_model=not args.no_store_model,
                     takeover=args.takeover, model_source=model_path if portable else None)
    print(f"imported {len(files)} file(s) into {url}")
    return 0


def cmd_export_npz(args: argparse.Namespace) -> int:
    from flyarchive.interop.flygym_npz import export_npz

    storage_options = storage_options_arg(args.storage_options)
    worlds = worlds_arg(args, storage_options)
    out = path_arg(args.to)
    done = export_npz(path_arg(args.url), out, worlds=worlds, overwrite=args.overwrite,
                      storage_options=storage_options,
                      out_storage_options=storage_options_arg(args.out_storage_options,
                                                              "--out-storage-options"))
    print(f"wrote {len(done.files)} file(s) to {out}")
    if done.skipped:
        print(f"skipped {len(done.skipped)} world(s) with no committed frames: "
              f"{done.skipped[:20]}{' ...' if len(done.skipped) > 20 else ''}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from flyarchive.store.integrity import verify

    report = verify(path_arg(args.url), storage_options_arg(args.storage_options))
    writing = f" It is being written by {report.writer}." if report.writer else ""
    what = "a derived group of " if report.is_derived else ""
    derived = (f" Derived groups checked too: {', '.join(report.derived)}." if report.derived
               else "")
    if report.ok:
        print(f"OK: {args.url}: {what}{report.n_worlds} worlds, {report.frames_checked} "
              f"committed frames read, all finite, checksums match.{writing}{derived}")
        for note in report.being_written:
            print(f"  - being written: {note}")
        for note in report.notes:
            print(f"  - note: {note}")
        return 0
    print(f"FAILED: {args.url}:", file=sys.stderr)
    for problem in report.problems:
        print(f"  - {problem}", file=sys.stderr)
    for note in report.notes:
        print(f"  - note: {note}", file=sys.stderr)
    if report.writer:
        print(f"  ({writing.strip()} No writer makes the damage above; stop it before "
              "restoring anything.)", file=sys.stderr)
    return 1


def cmd_model_attach(args: argparse.Namespace) -> int:
    from flyarchive.models.kept import attach_model

    url = path_arg(args.url)
    entry = attach_model(url, path_arg(args.model),
                         storage_options=storage_options_arg(args.storage_options),
                         replace=args.replace, takeover=args.takeover)
    print(f"{url} keeps the portable model {entry['path']} (sha256 {entry['sha256'][:16]}..., "
          f"{entry['size']:,} bytes): any MuJoCo release can replay it.")
    return 0


def cmd_set_world_var(args: argparse.Namespace) -> int:
    from flyarchive.store.world_vars import add_world_vars

    parsed = [parse_world_var(text) for text in args.assignments]
    variables = dict(parsed)
    if len(variables) < len(parsed):
        from flyarchive.errors import OptionsError

        twice = sorted({name for name, _ in parsed if [n for n, _ in parsed].count(name) > 1})
        raise OptionsError(f"The world variable(s) {twice} are given more than once; give each "
                           "name once.")
    names = add_world_vars(path_arg(args.url), variables, overwrite=args.overwrite,
                           storage_options=storage_options_arg(args.storage_options),
                           takeover=args.takeover)
    print(f"set {', '.join(names)} in {args.url}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from flyarchive.plot import plot_traces

    path = plot_traces(path_arg(args.url), args.world, path_arg(args.out), dofs=args.dof or None,
                       storage_options=storage_options_arg(args.storage_options),
                       overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from flyarchive.demo import run_demo

    run_demo(path_arg(args.out), n_worlds=args.worlds, seconds=args.seconds, render=not args.no_render,
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
    with _sigterm_stops():  # stopped as on Ctrl-C: a render under way and its files go
        return run_view(path_arg(args.url),
                        storage_options=storage_options_arg(args.storage_options),
                        model_path=path_arg(args.model) if args.model else None,
                        host=args.host, port=args.port, out=path_arg(args.out),
                        backend=backend_arg(args.backend))


# ----------------------------------------------------------------------------- render
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

    if args.scheduler:  # its workers start warming Warp; connected once
        warm = {"gpu": "cuda", "warp-cpu": "cpu"}.get(args.backend)
        return scheduler_client(args.scheduler, warm) if args.gpus is None else \
            contextlib.nullcontext()  # refused by the render: --gpus with --scheduler
    if (args.workers is not None and args.workers < 1) or args.url.startswith("memory://"):
        return contextlib.nullcontext()
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
    from flyarchive.models import load_model_file

    storage_options = storage_options_arg(args.storage_options)
    where = where_mask(path_arg(args.url), storage_options, args.where_world_var, args.where_dof)
    written = render_videos(
        path_arg(args.url), load_model_file(path_arg(args.model)) if args.model else None,
        args.camera,
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
        out_storage_options=storage_options_arg(args.out_storage_options,
                                                "--out-storage-options"),
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


# ----------------------------------------------------------------------------- the command
#: What ``flyarchive --help`` says before its commands (the module's doc is for developers).
DESCRIPTION = ("Record the kinematic state of MuJoCo simulations (qpos and mocap poses) into an "
               "xarray/zarr archive on disk or S3, query it, and render chosen worlds to video "
               "later, on CPU or GPU.")


def build_parser() -> argparse.ArgumentParser:
    from flyarchive.replay import BACKENDS, OLD_BACKENDS

    parser = argparse.ArgumentParser(prog="flyarchive", description=DESCRIPTION,
                                     epilog="`flyarchive <command> --help` lists a command's "
                                            "options.")
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
    p.add_argument("--model", required=True,
                   help="MJCF .xml (with its files), spec zip (.mjz) or compiled .mjb; an .xml "
                        "or .mjz is also kept as the model's portable form")
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
    add_render_arguments(p)
    storage(p)
    p = add("model", None, "The model kept beside an archive.")
    model_sub = p.add_subparsers(dest="model_command", required=True)
    help_attach = ("Keep a portable model (MJCF and its files) beside an archive that keeps "
                   "none, after checking that it compiles to the recorded layout: any MuJoCo "
                   "release can then replay it. Nothing else in the archive changes.")
    p = model_sub.add_parser("attach", help=help_attach, description=help_attach)
    p.set_defaults(func=cmd_model_attach)
    p.add_argument("url")
    p.add_argument("--model", required=True,
                   help="the model the archive was recorded with: MJCF .xml (with its files) or "
                        "spec zip (.mjz, .zip)")
    p.add_argument("--replace", action="store_true",
                   help="replace a portable model the archive keeps already")
    takeover(p)
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
    p.add_argument("--out", required=True, help="PNG path (or a folder: world<id>.png in it)")
    p.add_argument("--overwrite", action="store_true", help="replace the image if it exists")
    storage(p)
    from flyarchive.cli.analysis import CliTools, add_commands

    add_commands(add, storage, CliTools(parse_worlds, parse_time, storage_options_arg), takeover)
    p = add("demo", cmd_demo, "Simulate walking NeuroMechFly worlds, record, verify, render.")
    p.add_argument("--out", default="demo-out", help="output folder (default demo-out)")
    p.add_argument("--worlds", type=int, default=4, help="walking flies (default 4)")
    p.add_argument("--seconds", type=float, default=1.0, help="simulated seconds (default 1)")
    p.add_argument("--workers", type=int, help="render worker processes (default: a local "
                   "cluster of one per core; 0: render in this process)")
    p.add_argument("--no-render", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier demo's output")
    p = add("view", cmd_view, "Browse, filter and watch the worlds of an archive in the browser.")
    p.add_argument("url")
    p.add_argument("--model", help="MJCF .xml, spec zip (.mjz) or compiled .mjb (default: the "
                   "model kept in the archive; without one: table and traces only)")
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
            options[name] = storage_options_arg(getattr(args, name, None))
        except SelectionError:
            pass
    if not isinstance(err, (FlyarchiveError, OSError)):  # a storage client's own exception
        where = getattr(args, "url", None) or getattr(args, "to", None) or ""
        out, chosen = getattr(args, "out", None), options.get("storage_options")
        if isinstance(out, str) and "://" in out and "://" not in str(where):
            where, chosen = out, options.get("out_storage_options")  # a local archive's output
        err = translate(err, str(where), chosen) or err
    text = str(err) if isinstance(err, FlyarchiveError) else f"{type(err).__name__}: {err}"
    return " ".join(scrub(text, options).split())


#: Options whose value may start with '-' (a time window before zero: ``--time -1:0``),
#: which argparse would take for an option of its own.
_SIGNED_VALUES = ("--time",)


def _joined_values(argv: Sequence[str]) -> list[str]:
    """``--time -1:0`` as ``--time=-1:0``, which argparse reads as the option's value."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] in _SIGNED_VALUES and i + 1 < len(items) and \
                re.match(r"-[\d.]", items[i + 1]):
            out.append(f"{items[i]}={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flyarchive`` command.

    Returns the exit status: 0 done, 1 ``verify`` found problems, 2 an error (one line
    on stderr: ``flyarchive <command>: error: ...``), 130 interrupted (Ctrl-C), 143
    ``render`` stopped by SIGTERM. A closed output pipe (``flyarchive info | head``) ends
    the command quietly.
    """
    args = build_parser().parse_args(_joined_values(sys.argv[1:] if argv is None else argv))
    from flyarchive.store.storage_errors import client_errors

    try:
        with warnings.catch_warnings():
            # zarr warns of every file in an archive's folder that is not a node (a
            # .DS_Store, a plot saved there): noise on every command, never damage
            warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr")
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
        say(f"flyarchive {args.command}: {'terminated' if terminated else 'interrupted'}")
        return 143 if terminated else 130
    except (FlyarchiveError, OSError, *client_errors(), *_mujoco_errors()) as err:
        say(f"flyarchive {args.command}: error: {_one_line(args, err)}")
        return 2


def _mujoco_errors() -> tuple[type[BaseException], ...]:
    """``mujoco.FatalError`` once MuJoCo is loaded: MuJoCo's own failures are one line too."""
    mujoco = sys.modules.get("mujoco")
    return (mujoco.FatalError,) if mujoco is not None else ()


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

