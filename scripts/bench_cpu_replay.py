"""CPU replay of NeuroMechFly: flygym's render_trajectories against flyarchive, same frames.

One run builds a NeuroMechFly archive (``walk_qpos`` for ``--worlds`` worlds, seeds
0..W-1, float64, written with ``ArchiveWriter``; kept under ``--cache`` when given) and
renders the same frames with:

- ``flygym``: flygym 2.1.1 ``flygym.recording.render_trajectories`` on
  ``RecordedTrajectory`` objects holding the same qpos, without and with an mp4
  output (flygym keeps every frame in memory, then encodes);
- ``renderer``: flyarchive's ``OpenGLRenderer`` alone, render only (no encode, no
  read), with ``LP_NUM_THREADS=1`` and with Mesa's default (every core);
- ``videos``: ``render_videos(..., n_workers=0)``, archive -> mp4 in this process;
- ``dask-k``: ``render_videos(client=...)`` on a ``LocalCluster`` of k single-thread
  worker processes (one rasterizer thread each), timed with and without the
  cluster's start-up;
- ``warp-cpu``: ``render_videos(options=RenderOptions(backend="warp-cpu"))``, the
  mujoco-warp batch renderer on Warp's CPU device, cold (kernel load included)
  and warm (a one-frame render first, in the same process);
- ``flygym-warp-cpu``: flygym 2.1.1 ``flygym.warp.recording.render_trajectories_gpu``
  on Warp's CPU device (``wp.ScopedDevice("cpu")``), with mp4 output, the model
  prepared as flygym's ``modify_world_for_batch_rendering`` does
  (``prepare_for_batch_rendering``), ``worlds_per_batch`` = ``--worlds``; the call timed;
- ``cli-warp-cpu``: ``flyarchive render --backend warp-cpu`` run as a subprocess (what a
  user types: its default, one render thread per core), timed as a whole process from
  start to exit (``scripts/bench_cli.py``);
- ``cli-opengl``: ``flyarchive render`` with its defaults (OpenGL on a local Dask
  cluster of one single-core worker process per core), the same way: the default path as
  a user waits for it, cluster start-up included;
- ``cli-opengl-here``: the same with ``--workers 0`` (one thread in the process; render
  threads with a GL context each were measured no faster: 9.3 frames/s against the
  cluster's 16.1, and are gone);
- ``rss-N``: peak memory of ``render_videos(n_workers=0)`` for N = F and 10 F
  frames of one world (the 10 F archive repeats the F-frame walk).
- ``profile``: where the time of archive -> mp4 goes: archive reads per segment,
  rendering, encoding (one stream and per segment), joining.

Every case runs in a fresh subprocess. Memory is reported two ways: ``tree`` is
the peak of the summed PSS (proportional set size, so pages shared after a fork
count once) of the case's process and all its descendants (psutil, sampled every
2 s, as reading PSS is not free; includes ffmpeg and Dask workers); ``maxrss`` is
``ru_maxrss`` of the case's process from ``os.wait4`` (the largest single process
of its tree that was waited for, not a sum). Frames/s counts (world, frame, camera)
images per second of wall time. The 1-minute load average before each case is
printed: the machine may be shared. ``--repeat N`` runs every case N times, in rounds
that interleave the cases (a shared VM's speed drifts over minutes): each target's ratio
is then the median over rounds of its two cases' ratio within a round, with their range.

Usage:
    python scripts/bench_cpu_replay.py --frames 250 --workers 1,2 --json cpu.json
    python scripts/bench_cpu_replay.py --frames 40 --size 120x160 --no-flygym
    python scripts/bench_cpu_replay.py --cases dask --sync-reads --workers 1,2
    python scripts/bench_cpu_replay.py --cases flygym-mp4,cli --repeat 5 --json cli.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import (
    listed,
    numbers,
    Column,
    PeakMemory,
    Table,
    add_json_option,
    cached_archive,
    host_info,
    nmf_states,
    parse_size,
    positive_int,
    write_json,
)

TARGETS = (
    ("cli-opengl", "flygym-mp4", 1.5,
     "`flyarchive render` (default path) whole process >= 1.5x flygym OpenGL + mp4"),
    ("dask-2", "flygym-mp4", 1.3, "archive->mp4, default path (2 workers), >= 1.3x flygym+mp4"),
    ("videos", "flygym-mp4", 1.3, "archive->mp4, one process, >= 1.3x flygym with mp4"),
    ("renderer-default", "flygym", 1.0, "OpenGLRenderer one process >= flygym render only"),
    ("dask-2", "dask-1", 1.8, "2 single-thread workers >= 1.8x one (excl. start-up)"),
    ("dask-2-sync", "dask-1-sync", 1.8, "same, workers reading synchronously (prototype)"),
    ("warp-cpu", "flygym-mp4", 3.0, "warp-cpu archive->mp4, one process, vs flygym with mp4"),
    ("warp-cpu-dask-2", "flygym-mp4", 3.0, "warp-cpu, 2 workers (warm), >= 3x flygym with mp4"),
    ("cli-warp-cpu", "flygym-warp-cpu", 1.5,
     "`flyarchive render --backend warp-cpu` whole process >= 1.5x flygym Warp-CPU + mp4"),
    ("cli-warp-cpu", "flygym-mp4", 3.0,
     "`flyarchive render --backend warp-cpu` whole process >= 3x flygym OpenGL + mp4"),
)


# ----------------------------------------------------------------------------- parent
def main() -> None:
    args = _parse_args()
    if args.child:
        print("RESULT " + json.dumps(_run_child(json.loads(args.child))), flush=True)
        return
    camera = "nmf/trackcam"
    base = {"size": list(args.size), "camera": camera, "segment_frames": args.segment_frames}
    if not _cases(args, {"main": "", "long": ""}, Path("."), base):  # before any work
        print(f"bench_cpu_replay.py: error: no case matches --cases {args.cases!r} with "
              f"--backends {args.backends!r}", file=sys.stderr)
        sys.exit(2)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-cpu-replay-", dir=args.workdir))
    try:
        _run_all(args, work, camera, base)
    finally:
        if args.workdir is None:  # a folder of its own in /tmp: archives, videos
            shutil.rmtree(work, ignore_errors=True)


def _run_all(args: argparse.Namespace, work: Path, camera: str, base: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    archives = _build_archives(Path(args.cache) if args.cache else work, args.worlds, args.frames)
    build_s = time.perf_counter() - t0
    cases = _cases(args, archives, work, base)
    rows = []
    print(ROW_TABLE.header())
    for round_ in range(args.repeat):  # rounds interleave the cases: the VM's speed drifts
        for name, spec, env in cases:
            row = {**_run_case(name, spec, env), "round": round_}
            rows.append(row)
            print(ROW_TABLE.line(row), flush=True)
    summary = _summary(rows)
    info = host_info()
    meta = {
        "host": info["host"], "cpus": info["cpus_total"], "python": info["python"],
        "versions": info["versions"], "worlds": args.worlds, "frames_per_world": args.frames,
        "size": list(args.size), "segment_frames": args.segment_frames,
        "batch_worlds": args.batch_worlds, "archive_build_s": round(build_s, 2),
        "repeat": args.repeat,
        "loadavg_end": os.getloadavg(), "host_info": info,
    }
    _print_summary(summary, meta)
    write_json(args.json, {"meta": meta, "rows": rows, "summary": summary})


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser)
    parser.add_argument("--frames", type=positive_int, default=250, help="frames per world")
    parser.add_argument("--worlds", type=positive_int, default=2, help="worlds rendered")
    parser.add_argument("--workers", default="1,2", type=numbers(1, whole=True),
                        help="Dask worker counts, comma-separated")
    parser.add_argument("--size", default="240x320", type=parse_size, help="HxW pixels")
    parser.add_argument("--backends", default="cpu,warp-cpu", type=listed("cpu", "warp-cpu"),
                        help="cpu and/or warp-cpu")
    parser.add_argument("--flygym", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rss", action=argparse.BooleanOptionalAction, default=True,
                        help="peak RSS of F vs 10 F frames")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--segment-frames", type=positive_int, default=100)
    parser.add_argument("--batch-worlds", type=positive_int, default=64, help="warp-cpu batch size")
    parser.add_argument("--workdir", default=None,
                        help="where archives and videos go and stay (default: a temporary "
                             "folder, removed at the end)")
    parser.add_argument("--cache", metavar="DIR", default=None,
                        help="keep the archives here and reuse them (default: built in --workdir)")
    parser.add_argument("--sync-reads", action="store_true",
                        help="also run dask-k-sync: workers read the archive with dask's "
                        "synchronous scheduler (prototype of a distributed.py fix)")
    parser.add_argument("--cases", default=None,
                        help="run only cases whose name starts with one of these (comma list)")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="rounds of every case, interleaved (ratios: median over rounds)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args()


def _build_archives(folder: Path, n_worlds: int, n_frames: int) -> dict[str, str]:
    """The main archive (n_worlds independent walks, seeds 0..W-1, x n_frames, float64) and
    a one-world archive of 10 n_frames (world 0's walk ten times), built once in ``folder``."""
    import numpy as np

    from flyarchive.interop.nmf import build_world

    world = build_world()
    walks = functools.cache(lambda: nmf_states(n_worlds, n_frames, world=world, cache=folder))
    return {
        "main": cached_archive(folder, f"walk-{n_worlds}x{n_frames}", world.model, walks),
        "long": cached_archive(folder, f"walk10-{n_frames}", world.model,
                               lambda: np.tile(walks()[:1], (1, 10, 1))),
    }


def _cases(args: argparse.Namespace, archives: dict[str, str], work: Path,
           base: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    main, single = archives["main"], {"LP_NUM_THREADS": "1"}
    backends = args.backends.split(",")
    cases: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    if args.flygym:
        cases += [("flygym", {"kind": "flygym", "url": main, "out": None}, {}),
                  ("flygym-mp4", {"kind": "flygym", "url": main, "out": str(work / "fg")}, {})]
    if "cpu" in backends:
        cases.append(("cli-opengl", {"kind": "cli", "url": main, "out": str(work / "cli-gl"),
                                     "workdir": str(work), "backend": "opengl"}, {}))
        cases.append(("cli-opengl-here", {"kind": "cli", "url": main,
                                          "out": str(work / "cli-gl-here"),
                                          "workdir": str(work), "backend": "opengl",
                                          "extra": ["--workers", "0"]}, {}))
        cases += [("renderer-lp1", {"kind": "renderer", "url": main}, single),
                  ("renderer-default", {"kind": "renderer", "url": main}, {}),
                  ("videos", {"kind": "videos", "url": main, "out": str(work / "v0")}, {})]
        for k in [int(x) for x in args.workers.split(",") if x]:
            for sync in (False, True) if args.sync_reads else (False,):
                name = f"dask-{k}{'-sync' if sync else ''}"
                cases.append((name, {"kind": "dask", "url": main, "workers": k,
                                     "sync_reads": sync, "out": str(work / name)}, {}))
    if "warp-cpu" in backends and args.flygym:
        cases.append(("flygym-warp-cpu", {"kind": "flygym-warp", "url": main,
                                          "out": str(work / "fgw")}, {}))
    if "warp-cpu" in backends:
        cases.append(("cli-warp-cpu", {"kind": "cli", "url": main, "out": str(work / "cli"),
                                       "workdir": str(work), "backend": "warp-cpu"}, {}))
        cases.append(("warp-cpu", {"kind": "warp", "url": main, "out": str(work / "warp"),
                                   "batch_worlds": args.batch_worlds}, {}))
        for k in [int(x) for x in args.workers.split(",") if x]:
            cases.append((f"warp-cpu-dask-{k}", {"kind": "warp-dask", "url": main, "workers": k,
                                                 "out": str(work / f"warp-dask-{k}"),
                                                 "batch_worlds": args.batch_worlds}, {}))
    if args.rss:
        for n in (args.frames, 10 * args.frames):
            cases.append((f"rss-{n}", {"kind": "videos", "url": archives["long"], "frames": n,
                                       "out": str(work / f"rss{n}")}, {}))
    if args.profile and "cpu" in backends:
        cases.append(("profile", {"kind": "profile", "url": main, "out": str(work / "prof")}, {}))
    if args.cases:
        prefixes = tuple(args.cases.split(","))
        cases = [c for c in cases if c[0].startswith(prefixes)]
    return [(name, {**base, **spec}, env) for name, spec, env in cases]


#: Seconds between memory samples. Reading one process's PSS (``/proc/PID/smaps``)
#: costs about 11 ms of CPU for a rendering process here and holds its memory map
#: lock: every 0.2 s over the 7 processes of a 2-worker Dask case that took about
#: 12 % of a 2-core machine and made 2 workers look 1.5x one instead of 2x.
_PSS_INTERVAL_S = 2.0


def _run_case(name: str, spec: dict[str, Any], extra_env: dict[str, str]) -> dict[str, Any]:
    """Run one case in a fresh interpreter; measure its process tree's memory."""
    env = {k: v for k, v in os.environ.items() if k != "LP_NUM_THREADS"}
    env.update({"MUJOCO_GL": "egl", **extra_env})
    load = os.getloadavg()[0]
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    with PeakMemory(proc.pid, interval_s=_PSS_INTERVAL_S, kind="pss") as memory:
        stdout, stderr, maxrss_kib = _communicate_wait4(proc)
    row: dict[str, Any] = {"case": name, "loadavg_1m": round(load, 2),
                           "peak_pss_tree_mib": memory.results["peak_mib"],
                           "maxrss_mib": round(maxrss_kib / 1024, 1)}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        row["error"] = (stderr.strip().splitlines() or ["no output"])[-1][:300]
        return row
    row.update(json.loads(lines[-1][len("RESULT "):]))
    return row


def _communicate_wait4(proc: subprocess.Popen[str]) -> tuple[str, str, int]:
    """Read the child's output, then reap it with wait4: (stdout, stderr, ru_maxrss KiB)."""
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.append(s.read()), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return "".join(out), "".join(err), int(usage.ru_maxrss)


# ----------------------------------------------------------------------------- children
def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    from flyarchive.interop.nmf import build_world

    children = {"flygym": _child_flygym, "renderer": _child_renderer, "videos": _child_videos,
                "dask": _child_dask, "warp": _child_warp, "warp-dask": _child_warp_dask,
                "profile": _child_profile, "flygym-warp": _child_flygym_warp,
                "cli": _child_cli}
    if spec["kind"] not in children:
        raise ValueError(f"unknown case kind {spec['kind']!r}; kinds: {', '.join(children)}")
    return children[spec["kind"]](spec, build_world().model)


def _states(url: str) -> Any:
    from flyarchive.query import open_archive

    ds = open_archive(url)
    return ds, ds.qpos.values, ds.time.values


def _rate(frames: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"frames": frames, "seconds": round(seconds, 3), "fps": round(frames / seconds, 2),
            **extra}


def _child_flygym(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    from flygym.recording import RecordedTrajectory, render_trajectories

    ds, qpos, times = _states(spec["url"])
    trajectories = [RecordedTrajectory(time=times, qpos=qpos[w], output_fps=25,
                                       playback_speed=0.2, world_id=w)
                    for w in range(qpos.shape[0])]
    start = time.perf_counter()
    render_trajectories(model, trajectories, spec["camera"], spec["out"],
                        camera_res=tuple(spec["size"]))
    return _rate(qpos.shape[0] * qpos.shape[1], time.perf_counter() - start)


def _child_flygym_warp(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    """flygym's mujoco-warp path on Warp's CPU device, with mp4, the call timed."""
    import warp as wp
    from flygym.recording import RecordedTrajectory
    from flygym.warp.recording import render_trajectories_gpu

    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    _, qpos, times = _states(spec["url"])
    trajectories = [RecordedTrajectory(time=times, qpos=qpos[w], output_fps=25,
                                       playback_speed=0.2, world_id=w)
                    for w in range(qpos.shape[0])]
    start = time.perf_counter()
    with wp.ScopedDevice("cpu"):
        render_trajectories_gpu(prepare_for_batch_rendering(model), trajectories,
                                spec["camera"], spec["out"], camera_res=tuple(spec["size"]),
                                worlds_per_batch=qpos.shape[0])
    return _rate(qpos.shape[0] * qpos.shape[1], time.perf_counter() - start)


def _child_cli(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    """``flyarchive render --backend <spec's>`` as a subprocess, timed whole."""
    from bench_cli import run_render, save_mjb

    _, qpos, _ = _states(spec["url"])
    mjb = save_mjb(model, Path(spec["workdir"]))
    done = run_render(spec["url"], spec["out"], camera=spec["camera"],
                      size=tuple(spec["size"]), backend=spec["backend"], model=mjb,
                      extra=spec.get("extra", ()))
    return _rate(qpos.shape[0] * qpos.shape[1], done["wall_s"])


def _child_renderer(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    from flyarchive.replay.opengl_frames import OpenGLRenderer

    _, qpos, _ = _states(spec["url"])
    start = time.perf_counter()
    with OpenGLRenderer(model, spec["camera"], tuple(spec["size"])) as renderer:
        setup = time.perf_counter() - start
        start = time.perf_counter()
        for world in qpos:
            for frame in world:
                renderer.render_frame(frame)
        seconds = time.perf_counter() - start
    return _rate(qpos.shape[0] * qpos.shape[1], seconds, setup_s=round(setup, 3),
                 lp_num_threads=os.environ.get("LP_NUM_THREADS", "default"))


def _options(spec: dict[str, Any], **extra: Any) -> Any:
    from flyarchive.distribute.api import RenderOptions

    return RenderOptions(size=tuple(spec["size"]), segment_frames=spec["segment_frames"],
                         overwrite=True, **extra)


def _frames_of(result: Any) -> int:
    return sum(v["frames"] for v in result.videos)


def _child_videos(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    from flyarchive.distribute.api import render_videos

    window = None
    if spec.get("frames"):
        from flyarchive.query import open_archive

        window = (None, float(open_archive(spec["url"]).time.values[spec["frames"] - 1]))
    start = time.perf_counter()
    result = render_videos(spec["url"], model, spec["camera"], spec["out"], time=window,
                           options=_options(spec), n_workers=0)
    return _rate(_frames_of(result), time.perf_counter() - start)


def _child_dask(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    from flyarchive.distribute.api import render_videos

    start = time.perf_counter()
    env = {"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "FLYARCHIVE_WORKER": "1"}  # what render_videos' own LocalCluster sets
    with LocalCluster(n_workers=spec["workers"], threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", env=env, silence_logs=40) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(spec["workers"])
        if spec.get("sync_reads"):
            client.run(_synchronous_dask)
        ready = time.perf_counter()
        result = render_videos(spec["url"], model, spec["camera"], spec["out"],
                               options=_options(spec), client=client)
        end = time.perf_counter()
    frames = _frames_of(result)
    return _rate(frames, end - ready, startup_s=round(ready - start, 3),
                 fps_with_startup=round(frames / (end - start), 2), workers=spec["workers"])


def _synchronous_dask() -> None:
    """In a worker: compute dask collections inside tasks on the task's own thread.

    Without it, ``ds.qpos.values`` in a task (distributed._states) goes to the cluster:
    the task secedes while its read tasks run, the single worker thread starts the next
    segment, and several segments render at once, each thread with its own GL context.
    """
    import dask

    dask.config.set({"scheduler": "synchronous"})


def _child_warp(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    from flyarchive.distribute.api import render_videos

    options = _options(spec, backend="warp-cpu", batch_worlds=spec["batch_worlds"])
    start = time.perf_counter()
    render_videos(spec["url"], model, spec["camera"], spec["out"] + "-warmup",
                  time=(0.0, 0.0), options=options, n_workers=0)
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    result = render_videos(spec["url"], model, spec["camera"], spec["out"], options=options,
                           n_workers=0)
    seconds = time.perf_counter() - start
    frames = _frames_of(result)
    return _rate(frames, seconds, warmup_s=round(warmup, 3),
                 fps_with_warmup=round(frames / (seconds + warmup), 2))


def _child_warp_dask(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    """warp-cpu on render_videos' own LocalCluster (``distributed.connect``), k workers:
    a cold render (worker start-up included), then the same render warm (timed)."""
    from flyarchive.distribute.api import render_videos
    from flyarchive.distribute.cluster import connect

    options = _options(spec, backend="warp-cpu", batch_worlds=spec["batch_worlds"])
    start = time.perf_counter()
    with connect(n_workers=spec["workers"]) as client:
        client.wait_for_workers(spec["workers"])
        ready = time.perf_counter()
        # Cold: every worker imports mujoco-warp, loads its kernels and builds a renderer.
        render_videos(spec["url"], model, spec["camera"], spec["out"] + "-cold",
                      options=options, client=client)
        warm = time.perf_counter()
        result = render_videos(spec["url"], model, spec["camera"], spec["out"],
                               options=options, client=client)
        end = time.perf_counter()
    frames = _frames_of(result)
    return _rate(frames, end - warm, cluster_s=round(ready - start, 3),
                 cold_s=round(warm - ready, 3), workers=spec["workers"],
                 fps_cold_with_cluster=round(frames / (warm - start), 2))


def _child_profile(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    """Seconds spent per stage of archive -> mp4 for all frames, measured one by one."""
    from flyarchive.query import open_archive
    from flyarchive.replay.opengl_frames import OpenGLRenderer
    from flyarchive.video import VideoOptions, VideoWriter, concat_segments

    size, seg = tuple(spec["size"]), spec["segment_frames"]
    t: dict[str, float] = {}
    start = time.perf_counter()
    ds = open_archive(spec["url"])
    t["open_archive"] = time.perf_counter() - start
    n_worlds, n_frames = ds.sizes["world"], ds.sizes["time"]
    start = time.perf_counter()
    qpos = [[ds.isel(world=w, time=slice(k, k + seg)).qpos.values  # as distributed._states
             for k in range(0, n_frames, seg)] for w in range(n_worlds)]
    t["read_segments"] = time.perf_counter() - start
    with OpenGLRenderer(model, spec["camera"], size) as renderer:
        start = time.perf_counter()
        for world in qpos:
            for block in world:
                for frame in block:
                    renderer.render_frame(frame)
        t["render"] = time.perf_counter() - start
        scene = renderer._renderer  # noqa: SLF001 -- profiling only
        data = renderer._data  # noqa: SLF001
        from flyarchive.replay.kinematics import set_state

        start = time.perf_counter()
        for world in qpos:
            for block in world:
                for frame in block:
                    set_state(model, data, frame)
                    scene.update_scene(data, spec["camera"])
        t["kinematics_and_scene_only"] = time.perf_counter() - start
        sample = [renderer.render_frame(block[0])[0] for block in qpos[0]]
    frames = [sample[i % len(sample)] for i in range(n_worlds * n_frames)]
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    for name, options in (("encode_one_stream", VideoOptions()),
                          ("encode_one_stream_1thread", VideoOptions(threads=1))):
        start = time.perf_counter()
        with VideoWriter(out / f"{name}.mp4", 25.0, size, options=options, overwrite=True) as w:
            for frame in frames:
                w.write(frame)
        t[name] = time.perf_counter() - start
    start = time.perf_counter()
    parts = []
    for i in range(0, len(frames), seg):
        parts.append(out / f"part{i:06d}.mp4")
        with VideoWriter(parts[-1], 25.0, size, options=VideoOptions(threads=1),
                         overwrite=True) as w:
            for frame in frames[i:i + seg]:
                w.write(frame)
    t["encode_segments_1thread"] = time.perf_counter() - start
    start = time.perf_counter()
    concat_segments(parts, out / "joined.mp4", overwrite=True)
    t["join"] = time.perf_counter() - start
    total = n_worlds * n_frames
    return {"frames": total, "segments": len(parts),
            **{f"{k}_s": round(v, 3) for k, v in t.items()},
            **{f"{k}_ms_per_frame": round(1000 * v / total, 2) for k, v in t.items()
               if k not in ("open_archive", "join")}}


# ----------------------------------------------------------------------------- output
def _fps(rows: dict[str, dict[str, Any]], name: str) -> float | None:
    row = rows.get(name, {})
    return row.get("fps")


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target's ratio: the median over rounds of the two cases' ratio in the same
    round (with the rounds' range); the other figures from the last round."""
    rounds: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        rounds.setdefault(r.get("round", 0), {})[r["case"]] = r
    by = rounds[max(rounds)] if rounds else {}
    out: dict[str, Any] = {"targets": []}
    for a, b, target, text in TARGETS:
        ratios = sorted(fa / fb for one in rounds.values()
                        if (fa := _fps(one, a)) and (fb := _fps(one, b)))
        ratio = None if not ratios else round(float(statistics.median(ratios)), 2)
        out["targets"].append({"target": text, "measured_ratio": ratio, "wanted": target,
                               "met": None if ratio is None else ratio >= target,
                               "rounds": len(ratios),
                               "range": [round(ratios[0], 2), round(ratios[-1], 2)]
                               if ratios else None})
    rates: dict[str, list[float]] = {}
    for r in rows:
        if "fps" in r:
            rates.setdefault(r["case"], []).append(r["fps"])
    out["median_fps"] = {c: statistics.median(v) for c, v in sorted(rates.items())}
    if "dask-1" in by and "dask-2" in by and "fps_with_startup" in by["dask-1"]:
        out["dask_2_over_1_with_startup"] = round(
            by["dask-2"]["fps_with_startup"] / by["dask-1"]["fps_with_startup"], 2)
    rss = [r for r in rows if r["case"].startswith("rss-") and "fps" in r]
    if len(rss) == 2:
        out["rss_pss_tree_mib"] = {r["case"]: r["peak_pss_tree_mib"] for r in rss}
        out["rss_maxrss_mib"] = {r["case"]: r["maxrss_mib"] for r in rss}
    return out


_COLUMNS = {"case": 18, "frames": 6, "seconds": 8, "fps": 7, "peak_pss_tree_mib": 9,
            "maxrss_mib": 7, "loadavg_1m": 5}
_TITLES = {"seconds": "s", "peak_pss_tree_mib": "tree PSS", "maxrss_mib": "maxrss",
           "loadavg_1m": "load1"}


def _notes(row: dict[str, Any]) -> str:
    return " " + (row.get("error") or ", ".join(
        f"{k}={v}" for k, v in row.items() if k not in _COLUMNS))


ROW_TABLE = Table([
    *(Column(_TITLES.get(key, key), width, key, align="<" if key == "case" else ">")
      for key, width in _COLUMNS.items()),
    Column(" notes", 0, _notes, align="<"),
])


def _print_summary(summary: dict[str, Any], meta: dict[str, Any]) -> None:
    print(f"\n{meta['worlds']} worlds x {meta['frames_per_world']} frames, {meta['size']}, "
          f"{meta['cpus']} CPUs, load at end {tuple(round(x, 2) for x in meta['loadavg_end'])}")
    if meta.get("repeat", 1) > 1:
        print(f"  median frames/s over {meta['repeat']} rounds: " + ", ".join(
            f"{case} {fps:.2f}" for case, fps in summary["median_fps"].items()))
    for t in summary["targets"]:
        spread = f" [{t['range'][0]}-{t['range'][1]} in {t['rounds']} rounds]" \
            if t["rounds"] > 1 else ""
        print(f"  {t['target']:60} ratio {t['measured_ratio']}{spread} "
              f"({'met' if t['met'] else 'MISSED' if t['met'] is not None else 'n/a'})")
    for key in ("dask_2_over_1_with_startup", "rss_pss_tree_mib", "rss_maxrss_mib"):
        if key in summary:
            print(f"  {key}: {summary[key]}")


if __name__ == "__main__":
    main()
