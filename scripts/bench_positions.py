"""Speed of keypoint positions from archives: CPU per core, Dask workers, mujoco-warp, gait.

The data: NeuroMechFly (73 dofs, 50 bodies) walking, one simulated flygym walk copied per
world with jitter (``benchlib.nmf_states``), written by flyarchive's own writer (chunks of
1 world x 100 frames in shards of 64 worlds, the default codec) and kept under
``--cache``. Rows (frames/s count world-frames, the read of the archive included):

- ``mj_kinematics loop``: the reference: a plain Python loop setting ``qpos``, calling
  ``mujoco.mj_kinematics`` on the full model and copying ``xpos``, states in memory, one core;
- ``archive -> 50 bodies, 1 core``: ``flyarchive.positions(url).compute()`` with the
  process pinned to one core (``--worlds`` x ``--frames``);
- for these two and the gait rows, ``per CPU s`` is frames per second of the process's CPU
  time (all its threads; ``CPU s`` that time), which a machine shared with other work does
  not inflate as it does wall time; the two are measured in turn ``--repeat`` times, the
  best of each kept, and ``x1`` of the archive row is its ratio to the loop per CPU s;
- ``... all cores``: the same, dask's threads on every core of the process;
- ``Dask 1 worker`` / ``Dask N workers``: positions of ``--dask-worlds`` x ``--frames``
  reduced on the workers (each body's highest point per world) on a
  ``distributed.LocalCluster`` of single-thread worker processes (after a warm-up
  computation), the whole call timed (``positions(...)``, the graph, the compute), and
  their ratio; ``CPU s``: the workers' CPU time (user + system, from /proc) per
  computation, the mean of two;
- ``warp-<device> streamed``: :func:`flyarchive.analyze.warp_stream.load_positions` of
  ``--warp-worlds`` x ``--warp-frames`` float32 frames (an archive as the GPU recorder
  writes it) into host memory: reading, upload, kinematics and copy-back overlapped on
  CUDA. ``s`` and ``frames/s`` are the whole call (opening the archive, finding the
  model, the engine, the pipeline, the labelled result); the pipeline alone (first read
  to last copy: ``pipe f/s``), the set-up (``setup s``: the engine kept by an earlier
  call, or built) and the preparation (``prep s``) beside them; the median of
  ``--repeat`` calls after a first one that builds the engine (``best f/s``: the
  fastest); peak device memory (Warp's pool) and the peak RSS of the process;
- ``... imported float64``: the same call, as a user makes it (no ``model=``: the model
  kept beside the archive), on ``--warp-worlds`` x ``--warp-frames`` float64 frames of an
  archive imported through flyarchive's own flygym ``.npz`` import (``import_npz``: chunks
  of 1 world x 100 frames in shards of 64 worlds);
- stages of the streamed row (a second table): reader threads' busy time, the wait for
  reads, staging into pinned slots, upload, kinematics and copy-back (summed over
  batches; CUDA events on CUDA), copy into the result; peak memory of Warp's pool and of
  the whole device;
- ``read qpos``: the read stage alone, every ``qpos`` of the Warp row's archive into host
  memory through dask and through the streamed reader (one thread, then one per core,
  then one thread per core handing the decoding to as many worker processes: their CPU
  time counted in ``CPU s``);
- the Warp row twice: its state decoded by the reader threads, then by worker processes
  (``load_positions(read_processes=...)``);
- ``gait summary``: :func:`flyarchive.gait_summary` of ``--gait-worlds`` x
  ``--gait-frames`` from the archive (thorax and six tarsus tips computed by this
  process and a worker process per other core, :mod:`flyarchive.analyze.cpu_processes`:
  the first call, which starts the workers, and a second; then on one thread: ``x1`` is
  the ratio of wall times to it; ``CPU s`` counts the workers' too), and the measures
  alone from positions in memory.

The title gives the load average (1, 5, 15 minutes) when the table is printed: on a
shared machine wall times are only as good as it is low.

Usage::

    python scripts/bench_positions.py [--worlds 64] [--frames 1000] [--workers 2] [--dask-worlds 256]
        [--device cpu|cuda] [--warp-worlds 4096] [--warp-frames 250]
        [--gait-worlds 1024] [--gait-frames 1000] [--only cpu,dask,warp,read,gait]
        [--repeat 2] [--cache /tmp/flyarchive-bench-positions] [--model NMF.mjb] [--json PATH]

On the 2-core VM ``--device cpu`` runs the Warp row on Warp's CPU device with
``--warp-worlds 64 --warp-frames 250`` unless given; on a GPU host use ``--device cuda``
(defaults 4096 x 250): ``--device cuda --only warp,read`` gives the GPU row, its stages
and the read alone.
"""

from __future__ import annotations

import argparse
import re
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import (
    require_device,
    listed,
    nonnegative_int,
    positive_int,
    Column,
    Jitter,
    PeakMemory,
    Table,
    add_json_option,
    cached_archive,
    host_info,
    imported_archive,
    nmf_states,
    nmf_world,
    pin_threads,
    write_json,
)

JITTER = Jitter(start_margin=200, xy_mm=5.0, angle_bias_rad=0.01)
ROWS = ("cpu", "dask", "warp", "read", "gait")
#: Stages of the streamed Warp row (StreamStats fields ``<stage>_seconds``).
STAGES = ("read_wait", "stage", "upload", "kinematics", "download", "copy_out", "copy_wait")


def best(fn: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter
         ) -> tuple[float, Any]:
    """The best time of ``repeat`` calls by ``clock``, s, and the last result."""
    seconds, result = float("inf"), None
    for _ in range(repeat):
        t0 = clock()
        result = fn()
        seconds = min(seconds, clock() - t0)
    return seconds, result


def archive(cache: Path, world: Any, worlds: int, frames: int, dtype: str) -> str:
    states = lambda: nmf_states(worlds, frames, world=world, jitter=JITTER, dtype=dtype,  # noqa: E731
                                cache=cache / "walks")
    return cached_archive(cache, f"nmf-{worlds}x{frames}-{dtype}", world.model, states,
                          chunk_frames=100, shard_worlds=64)


def kinematics_loop(model: Any, qpos: np.ndarray, clock: Callable[[], float]) -> float:
    """Frames/s of the reference loop on the full model, this core, by ``clock``."""
    import mujoco

    data = mujoco.MjData(model)
    q, x, kin = data.qpos, data.xpos, mujoco.mj_kinematics
    out = np.empty((len(qpos), model.nbody, 3))

    def run() -> None:
        for i, row in enumerate(qpos):
            q[:] = row
            kin(model, data)
            out[i] = x

    seconds, _ = best(run, 2, clock)
    return len(qpos) / seconds


def cpu_rows(url: str, world: Any, frames: int, repeat: int) -> list[dict[str, Any]]:
    import flyarchive

    cpus = os.sched_getaffinity(0)
    def compute(**kw: Any) -> Any:
        return flyarchive.positions(url, model=world.model, stored=False).compute(**kw)

    rows = []
    pin_threads({min(cpus)})
    try:
        qpos = flyarchive.open_archive(url).qpos.isel(world=0).values[:frames]
        compute(scheduler="synchronous")  # warm: the engine, imports
        loop = {"wall": 0.0, "cpu": 0.0}
        seconds = cpu_s = float("inf")
        for _ in range(repeat):  # interleaved, the best of each: a shared core's noise
            loop["wall"] = max(loop["wall"], kinematics_loop(world.model, qpos, time.perf_counter))
            loop["cpu"] = max(loop["cpu"], kinematics_loop(world.model, qpos, time.process_time))
            s, result = best(lambda: compute(scheduler="synchronous"), 1)
            c, _ = best(lambda: compute(scheduler="synchronous"), 1, time.process_time)
            seconds, cpu_s = min(seconds, s), min(cpu_s, c)
        frames_done = result.shape[0] * result.shape[1]
        rows.append({"row": "mj_kinematics loop (states in memory)", "cores": 1,
                     "frames_per_s": loop["wall"], "cpu_frames_per_s": loop["cpu"]})
        rows.append({"row": "archive -> 50 bodies, 1 core", "cores": 1, "s": seconds,
                     "cpu_s": cpu_s, "frames_per_s": frames_done / seconds,
                     "cpu_frames_per_s": frames_done / cpu_s,
                     "speedup": frames_done / cpu_s / loop["cpu"]})
    finally:
        pin_threads(cpus)
    seconds, result = best(lambda: compute(), repeat)
    rows.append({"row": "archive -> 50 bodies, all cores (threads)", "cores": len(cpus),
                 "s": seconds, "frames_per_s": result.shape[0] * result.shape[1] / seconds})
    return rows


def dask_rows(url: str, world: Any, workers: int) -> list[dict[str, Any]]:
    """Each world's highest point of each body, computed on the workers (a result of
    kilobytes: the rate of computing, not of shipping 75 MB of positions back)."""
    from distributed import Client, LocalCluster

    import flyarchive

    rows = []
    for n in sorted({1, workers}):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
        try:
            def call() -> Any:  # the whole call: the graph, the model sent, the compute
                return flyarchive.positions(url, model=world.model, stored=False).max("time")\
                    .compute()

            lazy = flyarchive.positions(url, model=world.model, stored=False).max("time")
            call()  # warm-up: every worker imports, loads the model, connects
            pids = list(client.run(os.getpid).values())
            cpu0 = workers_cpu_seconds(pids)
            seconds, _ = best(call, 2)
            cpu_s = (workers_cpu_seconds(pids) - cpu0) / 2
        finally:
            client.close()
            try:
                cluster.close(timeout=60)  # a busy machine stops workers slowly
            except TimeoutError:
                print(f"the cluster of {n} worker(s) did not stop within 60 s", flush=True)
        frames = lazy.shape[0] * flyarchive.open_archive(url).sizes["time"]
        rows.append({"row": f"Dask {n} worker{'s' if n > 1 else ''}", "cores": n, "s": seconds,
                     "frames_per_s": frames / seconds, "cpu_s": cpu_s,
                     "cpu_frames_per_s": frames / cpu_s})
    if len(rows) == 2:
        rows[1]["speedup"] = rows[1]["frames_per_s"] / rows[0]["frames_per_s"]
    return rows


def warp_rows(url: str, world: Any, device: str, repeat: int) -> list[dict[str, Any]]:
    from flyarchive.analyze.warp_stream import StreamStats, load_positions

    backend = "gpu" if device.startswith("cuda") else "warp-cpu"
    cores = len(os.sched_getaffinity(0))
    return [row for processes in (0, cores)
            for row in warp_row(url, world, backend, repeat, processes)]


def warp_row(url: str, world: Any, backend: str, repeat: int, processes: int | None,
             what: str = "", kept_model: bool = False) -> list[dict[str, Any]]:
    """The streamed row, its state decoded by the reader threads (``processes`` 0), by
    that many worker processes, or as ``load_positions`` chooses (None); the model given,
    or (``kept_model``) the one kept beside the archive."""
    from flyarchive.analyze.warp_stream import StreamStats, load_positions

    rows = []
    how = "threads" if processes == 0 else "default reader" if processes is None else \
        f"{processes} processes"
    model = None if kept_model else world.model
    for attempt in range(repeat + 1):  # the first builds the engine (and Warp's kernels)
        stats = StreamStats()
        with PeakMemory(interval_s=0.05) as memory:
            t0 = time.perf_counter()
            load_positions(url, model=model, backend=backend, stats=stats,
                           read_processes=processes)
            total = time.perf_counter() - t0
        if attempt == 0:
            continue
        mib = lambda b: None if b is None else b / 2**20  # noqa: E731
        rows.append({"row": f"{backend} streamed, 50 bodies{what}, read by {how}",
                     "cores": len(os.sched_getaffinity(0)),
                     "s": total, "frames_per_s": stats.frames / total,
                     "pipeline_s": stats.seconds,
                     "pipeline_frames_per_s": stats.frames / stats.seconds,
                     "setup_s": stats.setup_seconds, "prepare_s": stats.prepare_seconds,
                     "engine": stats.engine, "reader": stats.reader,
                     "batches": stats.batches, "read_core_s": stats.read_seconds,
                     **{f"{stage}_s": getattr(stats, f"{stage}_seconds") for stage in STAGES},
                     "peak_device_mib": mib(stats.peak_device_bytes),
                     "peak_device_used_mib": mib(stats.peak_device_used_bytes),
                     "pinned_mib": stats.pinned_bytes / 2**20,
                     "peak_rss_mib": memory.results["peak_mib"]})
    if not rows:
        return []
    # The median call (by wall time) of ``repeat``, with every call's time beside it.
    median = sorted(rows, key=lambda r: r["s"])[(len(rows) - 1) // 2]
    return [{**median, "row": f"{median['row']} (median of {len(rows)})",
             "runs_s": [r["s"] for r in rows],
             "best_frames_per_s": max(r["frames_per_s"] for r in rows)}]


def read_rows(url: str, world: Any, repeat: int) -> list[dict[str, Any]]:
    """The read stage alone: every frame's ``qpos`` of the archive into host memory,
    through dask (``ds.qpos.values``, dask's threads) and through the streamed reader
    (:mod:`flyarchive.store.window_reader`, batches of whole shards on one thread per core)."""
    from concurrent.futures import ThreadPoolExecutor

    import flyarchive
    from flyarchive.analyze.keypoints import KeypointRequest
    from flyarchive.analyze.prepare import prepare
    from flyarchive.store.window_reader import _POOL, window_reader

    ds = flyarchive.open_archive(url)
    frames = ds.sizes["world"] * ds.sizes["time"]
    cores = len(os.sched_getaffinity(0))
    prepared = prepare(ds, KeypointRequest.of("*", None, None), model=world.model)
    threads = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=0)
    processes = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=cores)
    step = 256 * ds.sizes["time"]  # 4 shards of 64 worlds
    bounds = [(r0, min(frames, r0 + step)) for r0 in range(0, frames, step)]

    def streamed(reader: Any, n: int) -> None:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda b: reader.read(*b), bounds))

    def cpu_clock() -> float:  # this process's CPU time and its reader processes'
        return time.process_time() + workers_cpu_seconds(_POOL.pids)

    rows = []
    for label, fn, n in (("read qpos: dask (ds.qpos.values)", lambda: ds.qpos.values, cores),
                         ("read qpos: window_reader, 1 thread", lambda: streamed(threads, 1), 1),
                         (f"read qpos: window_reader, {cores} threads",
                          lambda: streamed(threads, cores), cores),
                         (f"read qpos: window_reader, {cores} processes",
                          lambda: streamed(processes, cores), cores)):
        fn()  # warm: file cache, shard indexes, the processes' opened archive
        seconds, _ = best(fn, repeat)
        cpu_s, _ = best(fn, repeat, cpu_clock)
        rows.append({"row": label, "cores": n, "s": seconds, "cpu_s": cpu_s,
                     "frames_per_s": frames / seconds, "cpu_frames_per_s": frames / cpu_s})
    return rows


def workers_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far (Linux's /proc; the
    ones gone count 0)."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / tick


def gait_rows(url: str, world: Any) -> list[dict[str, Any]]:
    """The summary from the archive computed by this process and one worker process per
    other core (the first call starts them), again (started), and on one thread (no
    processes, dask's synchronous scheduler); then the measures alone from positions in
    memory. ``CPU s`` counts the worker processes' CPU time too."""
    import dask

    import flyarchive
    from flyarchive.analyze.gait import gait_summary
    from flyarchive.store.window_reader import _POOL

    def cpu_clock() -> float:
        return time.process_time() + workers_cpu_seconds(_POOL.pids)

    rows = []
    cores = len(os.sched_getaffinity(0))
    for label, processes, scheduler in (
            (f"{cores} processes, first call", cores - 1, "threads"),
            (f"{cores} processes, started", cores - 1, "threads"),
            ("1 thread", 0, "synchronous")):
        with dask.config.set(scheduler=scheduler):
            t0, c0 = time.perf_counter(), cpu_clock()
            summary = gait_summary(url, model=world.model, processes=processes)
            end_to_end, cpu_s = time.perf_counter() - t0, cpu_clock() - c0
        frames = summary.sizes["world"] * flyarchive.open_archive(url).sizes["time"]
        rows.append({"row": f"gait summary from the archive, {label}", "s": end_to_end,
                     "cpu_s": cpu_s, "frames_per_s": frames / end_to_end,
                     "cpu_frames_per_s": frames / cpu_s, "cores": 1 if processes == 0 else cores})
    for row in rows[:2]:
        row["speedup"] = rows[2]["s"] / row["s"]
    pos = flyarchive.positions(url, ["nmf/c_thorax"], points=flyarchive.tarsus_tips(),
                               model=world.model, orientations=True).compute()
    seconds, _ = best(lambda: gait_summary(pos), 2)
    measures_cpu_s, _ = best(lambda: gait_summary(pos), 1, time.process_time)
    return [*rows,
            {"row": "gait measures, positions in memory", "s": seconds, "cpu_s": measures_cpu_s,
             "frames_per_s": frames / seconds, "cpu_frames_per_s": frames / measures_cpu_s,
             "cores": 1}]


TABLE = Table([
    Column("what", 64, "row", align="<"),
    Column("cores", 5, "cores"),
    Column("s", 8, "s", ".3f"),
    Column("CPU s", 8, "cpu_s", ".2f"),
    Column("frames/s", 12, "frames_per_s", ",.0f"),
    Column("best f/s", 12, "best_frames_per_s", ",.0f"),
    Column("per CPU s", 10, "cpu_frames_per_s", ",.0f"),
    Column("x1", 6, "speedup", ".2f"),
    Column("pipe f/s", 12, "pipeline_frames_per_s", ",.0f"),
    Column("setup s", 8, "setup_s", ".3f"),
    Column("prep s", 7, "prepare_s", ".3f"),
    Column("dev MiB", 8, "peak_device_mib", ",.0f"),
    Column("RSS MiB", 8, "peak_rss_mib", ",.0f"),
])


STAGE_TABLE = Table([
    Column("stages of the streamed row", 28, "row", align="<"),
    Column("reader", 7, "reader", align="<"),
    Column("batches", 7, "batches"),
    Column("pipe s", 7, "pipeline_s", ".3f"),
    Column("read*", 7, "read_core_s", ".2f"),
    Column("wait rd", 7, "read_wait_s", ".3f"),
    Column("pin s", 7, "stage_s", ".3f"),
    Column("upload", 7, "upload_s", ".3f"),
    Column("kinem.", 7, "kinematics_s", ".3f"),
    Column("copy bk", 7, "download_s", ".3f"),
    Column("out s", 7, "copy_out_s", ".3f"),
    Column("wait out", 8, "copy_wait_s", ".3f"),
    Column("dev MiB", 8, "peak_device_mib", ",.0f"),
    Column("GPU used", 8, "peak_device_used_mib", ",.0f"),
    Column("pinned", 7, "pinned_mib", ",.0f"),
    Column("RSS MiB", 8, "peak_rss_mib", ",.0f"),
])
STAGE_NOTE = ("pipe s = first read to last copy (the whole call is the first table's s); "
              "read* = reader threads' busy time summed (s); wait rd = the pipeline waiting "
              "for reads; pin s = state into pinned slots; upload / kinem. / copy bk = device "
              "stages summed over batches (CUDA events on CUDA; overlapped, so they may sum to "
              "more than wall); out s = pinned slot -> result (copy threads, summed); wait out "
              "= the pipeline waiting for those copies; GPU used = peak of the whole "
              "device's memory in use (every process), dev MiB = Warp's pool high-water mark")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=positive_int, default=64)
    parser.add_argument("--frames", type=positive_int, default=1000)
    parser.add_argument("--workers", type=nonnegative_int, default=2)
    parser.add_argument("--dask-worlds", type=positive_int, default=256)
    parser.add_argument("--device", default="cpu", help="Warp row: cpu or cuda[:N]")
    parser.add_argument("--warp-worlds", type=positive_int)
    parser.add_argument("--warp-frames", type=positive_int, default=250)
    parser.add_argument("--gait-worlds", type=positive_int, default=1024)
    parser.add_argument("--gait-frames", type=positive_int, default=1000)
    parser.add_argument("--only", default=",".join(ROWS), type=listed(*ROWS),
                        help=f"rows: {','.join(ROWS)}")
    parser.add_argument("--repeat", type=positive_int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flyarchive-bench-positions"))
    parser.add_argument("--model", type=Path,
                        help="NeuroMechFly from this file (a host without flygym: the .zip "
                             "of bench_setup.py --export, or .mjb / .xml; the walks must be "
                             "in --cache/walks)")
    add_json_option(parser)
    args = parser.parse_args()
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device!r}: give cpu or cuda[:N]")
    require_device(parser, args.device)
    only = set(args.only.split(","))
    world = nmf_world(args.model)
    rows: list[dict[str, Any]] = []
    if "cpu" in only:
        url = archive(args.cache, world, args.worlds, args.frames, "float64")
        rows += cpu_rows(url, world, args.frames, args.repeat)
    if "dask" in only and args.workers:
        url = archive(args.cache, world, args.dask_worlds, args.frames, "float64")
        rows += dask_rows(url, world, args.workers)
    if "warp" in only:
        warp_worlds = args.warp_worlds or (4096 if args.device.startswith("cuda") else 64)
        url = archive(args.cache, world, warp_worlds, args.warp_frames, "float32")
        rows += warp_rows(url, world, args.device, args.repeat)
        import mujoco

        imported = imported_archive(
            args.cache, f"imported-{warp_worlds}x{args.warp_frames}-float64-mujoco"
                        f"{mujoco.__version__}", world.model,
            lambda: nmf_states(warp_worlds, args.warp_frames, world=world, jitter=JITTER,
                               dtype="float64", cache=args.cache / "walks"))
        rows += warp_row(imported, world, "gpu" if args.device.startswith("cuda") else "warp-cpu",
                         args.repeat, None, what=", imported float64", kept_model=True)
    if "read" in only:
        warp_worlds = args.warp_worlds or (4096 if args.device.startswith("cuda") else 64)
        url = archive(args.cache, world, warp_worlds, args.warp_frames, "float32")
        rows += read_rows(url, world, args.repeat)
    if "gait" in only:
        url = archive(args.cache, world, args.gait_worlds, args.gait_frames, "float64")
        rows += gait_rows(url, world)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    TABLE.print(rows, title=f"\nNeuroMechFly positions ({len(os.sched_getaffinity(0))} cores, "
                            f"load average {load})")
    streamed = [r for r in rows if "streamed" in r["row"]]
    if streamed:
        STAGE_TABLE.print(streamed, title="")
        print(STAGE_NOTE)
    write_json(args.json, {"host": host_info(), "load_average": os.getloadavg(),
                           "args": {k: str(v) for k, v in vars(args).items()},
                           "rows": rows})


if __name__ == "__main__":
    main()
