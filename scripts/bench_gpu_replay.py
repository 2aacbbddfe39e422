"""Archive -> mp4 frames/s on mujoco-warp's batch renderer: flyarchive against flygym 2.1.1.

One run, one model, one archive of ``worlds`` x ``frames`` float32 states (a
NeuroMechFly walk from :func:`flyarchive.interop.nmf.walk_qpos`, shifted and
jittered per world; or the tiny test model). Rows of the table:

1. raw: ``WarpBatchRenderer.render_resident`` loop, ``B`` resident states:
   kinematics + BVH refit + render only, the rendering limit (on CUDA also replayed
   as one captured CUDA graph, printed beside it).
2. batch: ``WarpBatchRenderer.render_batch``: upload, render, uint8 RGB on the
   device, one copy to the host; its note: the same with ``pixel_format="yuv420p"``
   (I420 on the device, half the bytes), what ``render_videos`` uses.
   read: reading every batch's states from the archive, as row 3 does in a
   background thread (a diagnostic: row 3 is bounded below by it).
   pipelined: ``WarpBatchRenderer.submit`` with batch k + 1 queued before batch k's
   yuv420p frames are waited for, as row 3 does: the GPU stage's limit; its
   ``setup_s`` is building the renderer with kernels loaded, ``first_run_s`` the
   first pass, kernel by kernel, that captures the CUDA graphs.
   encode_only: row 3's pipeline (reader, encoder threads, ffmpeg) with the renderer
   replaced by one that hands out frames rendered beforehand: the encoding limit
   (``encode_only_<preset>`` for the extra presets).
3. flyarchive: ``render_videos`` from the archive on disk to one mp4 per world, end
   to end (open, read, render, encode, write; renderer setup included), with the
   backend's default encoder settings (x264 ``ultrafast`` on the GPU).
   ``flyarchive_warm``: the same again, with the renderer built (the steady state of
   a process that renders several times). ``flyarchive_<preset>[_e<k>]``
   (``--presets``, ``--encoders``): other x264 presets and encoder thread counts,
   renderer warm. ``flyarchive_no_graph``: row 3 launching kernel by kernel
   (``FLYARCHIVE_CUDA_GRAPH=0``).
4. whole processes (``--cli``, :mod:`bench_cli`): ``cli`` is ``flyarchive render`` run as
   a subprocess on the same archive, timed from start to exit, on one GPU (``--gpus
   0``); ``cli_all_gpus`` the same on every GPU (the default; two or more GPUs);
   ``cli_s3`` with the archive on a loopback S3 server (moto) and the videos written
   to it (one GPU); ``cli_scheduler`` with ``--scheduler`` of hand-started ``dask
   worker --nthreads 1 --resources GPU=1`` processes, one per GPU
   (``CUDA_VISIBLE_DEVICES``; on ``--device cpu``: two workers). ``ratios`` compares
   them (``cli`` / ``pipelined``, ``cli_all_gpus`` / ``cli``, ...).
5. flygym: ``flygym.warp.recording.render_trajectories_gpu`` on the same states
   (``RecordedTrajectory`` objects built from them) with ``worlds_per_batch`` 32 and
   256, videos written to ``output_path``; the better of the two is compared. The
   model is prepared with flyarchive's ``prepare_for_batch_rendering`` (what flygym's
   ``modify_world_for_batch_rendering`` does to the fly's materials). Its errors are
   reported, not raised.

A frame is one (state, camera) image. Peak RSS is sampled every 20 ms over this
process and its children (ffmpeg), per row; ``cpu_s`` is this process's CPU time
and ``cpu_children_s`` that of its finished children (ffmpeg), per row. flyarchive
rows carry ``stages_s``, the pipeline's stage timers (``PipelineProfile().results``).

Usage:
    python scripts/bench_gpu_replay.py --device cpu --model tiny --worlds 4 --frames 10 \\
        --batch 16 --size 48x64
    python scripts/bench_gpu_replay.py --device cuda --model nmf --worlds 128 --frames 100 \\
        --batch 1024 --json replay.json [--cache /tmp/flyarchive-bench-gpu]
    python scripts/bench_gpu_replay.py --device cuda --model nmf --worlds 1024 --frames 250 \\
        --only-cli --json cli.json    # rows pipelined and cli* only
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from bench_cli import cli_rows, save_mjb
from benchlib import (
    require_device,
    positive_int,
    Column,
    PeakMemory,
    ReplayStates,
    Table,
    add_json_option,
    cached_archive,
    gpu_bench_host_keys,
    parse_size,
    replay_states,
    write_json,
)

CLI_ROWS = ("cli", "cli_all_gpus", "cli_s3", "cli_scheduler")


def main() -> None:
    args = _parse_args()
    import warp as wp

    wp.config.quiet = True
    device = {"cuda": "cuda:0", "cpu": "cpu"}[args.device]
    backend = {"cuda": "gpu", "cpu": "warp-cpu"}[args.device]
    st = replay_states(args.model, args.worlds, args.frames, cache=args.cache,
                       model_file=args.model_file)
    n_frames = args.worlds * args.frames  # one camera: one image per state

    result: dict[str, Any] = {
        "model": args.model, "device": device, "worlds": args.worlds, "frames": args.frames,
        "batch": args.batch, "size": list(args.size), "camera": st.camera, "nq": st.model.nq,
        "ngeom": st.model.ngeom, "images": n_frames, **gpu_bench_host_keys(), "rows": {},
    }
    rows = result["rows"]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-replay-") as tmp:
        url = cached_archive(
            Path(args.cache or tmp), f"{args.model}-{args.worlds}x{args.frames}-float32",
            st.model, lambda: st.qpos, mocap=st.mocap, source="mujoco-warp",
            chunk_frames=min(args.frames, 100), shard_worlds=min(args.worlds, 64))
        if not args.only_cli:
            rows["raw"], rows["batch"] = _renderer_rows(st, args, device)
        _warm_up(url, st, args, device, backend, Path(tmp) / "warm")
        rows["pipelined"] = _pipelined_row(st, args, device)
        which = tuple(r for r in args.cli.split(",") if r)
        rows.update(cli_rows(url, save_mjb(st.model, Path(tmp)), camera=st.camera,
                             size=args.size, backend=backend, n_images=n_frames,
                             folder=Path(tmp), measure=_measure, which=which))
        result["ratios"] = _cli_ratios(rows)
        if args.only_cli:
            _print_table(result)
            write_json(args.json, result, indent=2)
            return
        rows["read"] = _measure(n_frames, lambda: _read_all(url, args.batch))
        presets = [p for p in args.presets.split(",") if p]
        stub = _prerendered(st, args, device)
        for preset in [None, *presets]:
            name = "encode_only" + (f"_{preset}" if preset else "")
            rows[name] = _stages(n_frames, lambda p=preset, n=name: _encode_only(
                url, st, Path(tmp) / n, args, backend, stub, p))
        rows["flyarchive"] = _stages(n_frames, lambda: _flyarchive(
            url, st, Path(tmp) / "fa", args, backend))
        rows["flyarchive_warm"] = _stages(n_frames, lambda: _flyarchive(
            url, st, Path(tmp) / "fa-warm", args, backend))
        for preset in presets:
            for encoders in [int(e) for e in args.encoders.split(",") if e] or [0]:
                name = f"flyarchive_{preset}" + (f"_e{encoders}" if encoders else "")
                rows[name] = _stages(n_frames, lambda p=preset, e=encoders, n=name: _flyarchive(
                    url, st, Path(tmp) / n, args, backend, preset=p, encoders=e))
        if device.startswith("cuda"):  # row 3 launching kernel by kernel (no CUDA graph)
            rows["flyarchive_no_graph"] = _stages(n_frames, lambda: _no_graph(
                lambda: _flyarchive(url, st, Path(tmp) / "fa-ng", args, backend)))
        for wpb in (32, 256) if args.flygym else ():
            rows[f"flygym_b{wpb}"] = _measure(n_frames, lambda wpb=wpb: _flygym(
                st, args, device, wpb, Path(tmp) / f"fg{wpb}"))
    fly = [r for k, r in rows.items() if k.startswith("flygym") and "fps" in r]
    if fly and "fps" in rows["flyarchive"]:
        best = max(fly, key=lambda r: r["fps"])
        result["flygym_best_fps"] = best["fps"]
        result["ratio_flyarchive_over_flygym"] = round(rows["flyarchive"]["fps"] / best["fps"], 3)
    _print_table(result)
    write_json(args.json, result, indent=2)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser, "also write the result as JSON to this path")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="Warp device")
    parser.add_argument("--worlds", type=positive_int, default=128, help="worlds in the archive")
    parser.add_argument("--frames", type=positive_int, default=100, help="frames per world")
    parser.add_argument("--batch", type=positive_int, default=1024,
                        help="B, states per flyarchive batch")
    parser.add_argument("--model", choices=["nmf", "tiny"], default="nmf")
    parser.add_argument("--model-file", metavar="PATH",
                        help="NeuroMechFly compiled from this file (.zip of its spec from "
                             "bench_setup.py --export, .mjb or .xml) instead of flygym's "
                             "build_world; its walk must be in --cache already")
    parser.add_argument("--size", type=parse_size, default=(240, 320),
                        help="frame size HEIGHTxWIDTH (default 240x320)")
    parser.add_argument("--presets", default="veryfast",
                        help="x264 presets of extra flyarchive and encode_only rows (comma list)")
    parser.add_argument("--encoders", default="",
                        help="encoder threads of the extra rows (comma list; default: cores)")
    parser.add_argument("--no-flygym", dest="flygym", action="store_false",
                        help="skip flygym's render_trajectories_gpu rows")
    parser.add_argument("--cli", default=",".join(CLI_ROWS),
                        help="whole-process rows to run (comma list of "
                             f"{', '.join(CLI_ROWS)}; empty: none)")
    parser.add_argument("--only-cli", action="store_true",
                        help="run only the pipelined row and the whole-process rows")
    parser.add_argument("--cache", metavar="DIR", type=Path, default=None,
                        help="keep the walk and the archive here and reuse them "
                             "(default: built again in a temporary folder)")
    args = parser.parse_args()
    require_device(parser, args.device)
    if min(args.worlds, args.frames, args.batch) < 1:
        parser.error("--worlds, --frames and --batch must be positive")
    unknown = [r for r in args.cli.split(",") if r and r not in CLI_ROWS]
    if unknown:
        parser.error(f"--cli {args.cli!r}: unknown row(s) {unknown}; rows: {', '.join(CLI_ROWS)}")
    return args


# ----------------------------------------------------------------------------- rows
def _flat(st: ReplayStates, batch: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], int]:
    """All states one after the other ``(worlds * frames, nq)``, their mocap poses (``()``
    when the model has none), and the batch size ``B`` (at most the number of states)."""
    states = st.qpos.reshape(-1, st.qpos.shape[-1])
    mocap = () if st.mocap is None else tuple(m.reshape(-1, *m.shape[2:]) for m in st.mocap)
    return states, mocap, min(batch, len(states))


def _renderer_rows(st: ReplayStates, args: argparse.Namespace,
                   device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    states, mocap, b = _flat(st, args.batch)
    start = time.perf_counter()
    renderer = WarpBatchRenderer(st.model, st.camera, args.size, batch_worlds=b, device=device)
    renderer.render_batch(states[:b], *(m[:b] for m in mocap))  # compile or load
    setup_s = time.perf_counter() - start
    n_batches = -(-len(states) // b)

    def raw() -> None:
        for _ in range(n_batches):
            renderer.render_resident()
        renderer.synchronize()

    def batch(r: Any) -> None:
        for i in range(0, len(states), b):
            r.render_batch(states[i:i + b], *(m[i:i + b] for m in mocap))

    raw_row = _measure(n_batches * b, raw)
    raw_row["setup_s"] = round(setup_s, 3)
    if renderer.device.startswith("cuda"):  # the same work replayed as one CUDA graph
        import warp as wp

        try:
            with wp.ScopedCapture(device=renderer.device) as capture:
                renderer.render_resident()

            def graph() -> None:
                for _ in range(n_batches):
                    wp.capture_launch(capture.graph)
                renderer.synchronize()

            raw_row["graph"] = _measure(n_batches * b, graph)
        except Exception as err:  # capture is a prototype: report, do not fail
            raw_row["graph"] = {"error": f"{type(err).__name__}: {err}"[:300]}
        print("raw as a CUDA graph:", raw_row["graph"], flush=True)
    batch_row = _measure(len(states), lambda: batch(renderer))
    yuv = WarpBatchRenderer(st.model, st.camera, args.size, batch_worlds=b, device=device,
                            pixel_format="yuv420p")
    yuv.render_batch(states[:b], *(m[:b] for m in mocap))
    batch_row["yuv420p"] = _measure(len(states), lambda: batch(yuv))
    return raw_row, batch_row


def _pipelined_row(st: ReplayStates, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """yuv420p batches submitted one ahead of the one waited for: the GPU stage's limit."""
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    states, mocap, b = _flat(st, args.batch)
    start = time.perf_counter()
    renderer = WarpBatchRenderer(st.model, st.camera, args.size, batch_worlds=b, device=device,
                                 pixel_format="yuv420p", host_buffers=2)
    built = time.perf_counter() - start

    def run() -> None:
        pending = None
        for i, k in enumerate(range(0, len(states), b)):
            submitted = renderer.submit(states[k:k + b], *(m[k:k + b] for m in mocap),
                                        buffer=i % 2)
            if pending is not None:
                pending.wait()
            pending = submitted
        pending.wait()

    start = time.perf_counter()
    run()  # the first batches run kernel by kernel, then the CUDA graphs are captured
    first = time.perf_counter() - start
    row = _measure(len(states), run)
    row["setup_s"] = round(built, 3)  # construction with kernels loaded: model, BVHs
    row["first_run_s"] = round(first, 3)
    print("pipelined:", row, flush=True)
    return row


class _Prerendered:
    """Stands in for ``WarpBatchRenderer`` in the pipeline: frames rendered beforehand."""

    def __init__(self, frames: np.ndarray, default_state: np.ndarray, model: Any) -> None:
        self.frames = frames  # (B, 1, *frame) yuv420p
        self.pixel_format = "yuv420p"
        self.default_state = default_state
        self.model = model  # the encoders' overlays read it

    def submit(self, qpos: np.ndarray, *_: Any, buffer: int = 0) -> Any:
        frames = self.frames[:len(qpos)]
        return type("Done", (), {"wait": staticmethod(lambda: frames)})()


def _prerendered(st: ReplayStates, args: argparse.Namespace, device: str) -> _Prerendered:
    """The first batch's yuv420p frames, rendered once, handed out for every batch."""
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    states, mocap, b = _flat(st, args.batch)
    renderer = WarpBatchRenderer(st.model, st.camera, args.size, batch_worlds=b, device=device,
                                 pixel_format="yuv420p")
    first = renderer.render_batch(states[:b], *(m[:b] for m in mocap))
    return _Prerendered(first, renderer.default_state, st.model)


def _encode_only(url: str, st: ReplayStates, out: Path, args: argparse.Namespace, backend: str,
                 stub: _Prerendered, preset: str | None) -> None:
    """Row 3 with the renderer replaced by ``stub`` (frames rendered beforehand)."""
    from flyarchive.render import warp_pipeline

    with mock.patch.object(warp_pipeline, "warp_renderer", lambda *_, **__: stub):
        _flyarchive(url, st, out, args, backend, preset=preset)


def _read_all(url: str, batch_worlds: int) -> None:
    """Read every batch's states from the archive as ``render_videos`` does (no rendering)."""
    from flyarchive.render.plan import pack_batches
    from flyarchive.query import open_archive, select_frames
    from flyarchive.store import StateReader

    jobs = tuple(select_frames(open_archive(url)))
    reader = StateReader(url)
    for batch in pack_batches(jobs, batch_worlds):
        reader.read_boxes([(jobs[p.job].world_index, jobs[p.job].world_index + 1, p.start, p.stop)
                           for p in batch.pieces])


def _flyarchive(url: str, st: ReplayStates, out: Path, args: argparse.Namespace, backend: str,
                preset: str | None = None, encoders: int = 0) -> None:
    """``render_videos`` of every world; x264 ``preset`` (None: the backend's default)."""
    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.video import VideoOptions

    options = RenderOptions(size=args.size, backend=backend, batch_worlds=args.batch,
                            video=VideoOptions(preset=preset) if preset else None)
    with mock.patch.dict(os.environ, {"FLYARCHIVE_ENCODERS": str(encoders)}):  # 0: one per core
        render_videos(url, st.model, st.camera, str(out), options=options, n_workers=0)


def _no_graph(run: Callable[[], None]) -> None:
    """``run()`` with a fresh renderer that launches kernel by kernel (no CUDA graph)."""
    from flyarchive.render.renderer_cache import clear_renderers

    clear_renderers()
    try:
        with mock.patch.dict(os.environ, {"FLYARCHIVE_CUDA_GRAPH": "0"}):
            run()
    finally:
        clear_renderers()


def _flygym(st: ReplayStates, args: argparse.Namespace, device: str, worlds_per_batch: int,
            out: Path | None) -> None:
    import warp as wp
    from flygym.recording import RecordedTrajectory
    from flygym.warp.recording import render_trajectories_gpu

    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    times = np.arange(st.qpos.shape[1]) * 0.2 / 25.0
    trajectories = [
        RecordedTrajectory(
            time=times, qpos=st.qpos[w], output_fps=25, playback_speed=0.2, world_id=w,
            mocap_pos=None if st.mocap is None else st.mocap[0][w],
            mocap_quat=None if st.mocap is None else st.mocap[1][w],
        )
        for w in range(st.qpos.shape[0])
    ]
    with wp.ScopedDevice(device):
        render_trajectories_gpu(prepare_for_batch_rendering(st.model), trajectories, st.camera,
                                out, camera_res=tuple(args.size), worlds_per_batch=worlds_per_batch)


def _warm_up(url: str, st: ReplayStates, args: argparse.Namespace, device: str, backend: str,
             out: Path) -> None:
    """Compile (or load) both libraries' kernels on one frame, so no timed row pays for it.

    Renderer setup (model upload, BVH build) stays in both end-to-end rows: flyarchive's
    cached renderer is dropped, and flygym builds its own on every call anyway.
    """
    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.render.renderer_cache import clear_renderers

    options = RenderOptions(size=args.size, backend=backend, batch_worlds=args.batch)
    render_videos(url, st.model, st.camera, str(out / "fa"), worlds=[0], time=(0.0, 0.0),
                  options=options, n_workers=0)
    clear_renderers()
    if args.flygym:
        mocap = None if st.mocap is None else (st.mocap[0][:1, :1], st.mocap[1][:1, :1])
        one = ReplayStates(st.model, st.camera, st.qpos[:1, :1], mocap)
        _measure(1, lambda: _flygym(one, args, device, 1, None))


# ----------------------------------------------------------------------------- measuring
def _measure(n_images: int, run: Callable[[], None]) -> dict[str, Any]:
    """Wall time, images/s, CPU and peak RSS (this process + children) of ``run()``.

    Errors are caught and reported in the row.
    """
    import resource

    def cpu(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    before = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    error = None
    with PeakMemory(interval_s=0.02) as memory:
        start = time.perf_counter()
        try:
            run()
        except Exception as err:  # reported in the table, not raised
            traceback.print_exc()
            error = f"{type(err).__name__}: {err}"[:300]
        wall = time.perf_counter() - start
    if error is not None:
        return {"error": error, "peak_rss_mb": memory.results["peak_mib"]}
    return {"wall_s": round(wall, 3), "fps": round(n_images / wall, 2),
            "peak_rss_mb": memory.results["peak_mib"],
            "cpu_s": round(cpu(resource.RUSAGE_SELF) - before[0], 2),
            "cpu_children_s": round(cpu(resource.RUSAGE_CHILDREN) - before[1], 2)}


def _stages(n_images: int, run: Callable[[], None]) -> dict[str, Any]:
    """:func:`_measure` of a flyarchive run, with the pipeline's stage timers."""
    from flyarchive.render.diagnostics import PipelineProfile

    with PipelineProfile() as profile:
        row = _measure(n_images, run)
    row["stages_s"] = {k: round(v, 3) for k, v in profile.results.items()}
    print(f"{row.get('fps')} frames/s, stages: {row['stages_s']}", flush=True)
    return row


def _cli_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What the issue's targets compare: ``cli`` / ``pipelined`` (>= 0.9), ``cli_all_gpus``
    / ``cli`` (>= 1.9 on 2 GPUs), ``cli_s3`` / ``cli`` (>= 0.8), ``cli_scheduler`` /
    ``cli`` (>= 1.9 on 2 GPUs)."""
    pairs = (("cli", "pipelined"), ("cli_all_gpus", "cli"), ("cli_s3", "cli"),
             ("cli_scheduler", "cli"))
    fps = {k: r["fps"] for k, r in rows.items() if "fps" in r}
    return {f"{a}/{b}": round(fps[a] / fps[b], 3) for a, b in pairs if a in fps and b in fps}


def _note(row: dict[str, Any]) -> str:
    note = row.get("error", f"setup {row['setup_s']:.1f} s" if "setup_s" in row else "")
    if "fps" in row.get("yuv420p", {}):
        note += f"yuv420p on the device: {row['yuv420p']['fps']:.1f} frames/s"
    return " " + note


TABLE = Table([
    Column("row", 26, "name", align="<"), Column("wall s", 9, "wall_s", ".2f"),
    Column("frames/s", 10, "fps", ".1f"), Column("peak RSS MB", 12, "peak_rss_mb", ".0f"),
    Column("CPU s self+ffmpeg", 18,
           lambda r: f"{r['cpu_s']:.1f}+{r['cpu_children_s']:.1f}" if "cpu_s" in r else None),
    Column(" note", 0, _note, align="<"),
])


def _print_table(r: dict[str, Any]) -> None:
    TABLE.print([{"name": name, **row} for name, row in r["rows"].items()],
                title=f"\n{r['model']} on {r['device']}: {r['worlds']} worlds x {r['frames']} "
                      f"frames, {r['size'][0]}x{r['size'][1]}, B={r['batch']}, "
                      f"camera {r['camera']!r}")
    if r.get("ratios"):
        print("whole-process ratios:", ", ".join(f"{k} {v:.2f}" for k, v in r["ratios"].items()))
    if "ratio_flyarchive_over_flygym" in r:
        print(f"flyarchive / best flygym: {r['ratio_flyarchive_over_flygym']:.2f}x "
              f"(flygym best {r['flygym_best_fps']:.1f} frames/s)")


if __name__ == "__main__":
    main()
