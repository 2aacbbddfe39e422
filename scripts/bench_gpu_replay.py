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
4. flygym: ``flygym.warp.recording.render_trajectories_gpu`` on the same states
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
        --batch 1024 --json replay.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mujoco
import numpy as np


def main() -> None:
    args = _parse_args()
    import warp as wp

    wp.config.quiet = True
    device = {"cuda": "cuda:0", "cpu": "cpu"}[args.device]
    backend = {"cuda": "gpu", "cpu": "warp-cpu"}[args.device]
    model, camera, qpos, mocap = _states(args.model, args.worlds, args.frames)
    n_frames = args.worlds * args.frames  # one camera: one image per state

    result: dict[str, Any] = {
        "model": args.model, "device": device, "worlds": args.worlds, "frames": args.frames,
        "batch": args.batch, "size": list(args.size), "camera": camera, "nq": model.nq,
        "ngeom": model.ngeom, "images": n_frames, "host": platform.node(),
        "mujoco": mujoco.__version__, "warp": wp.config.version, "rows": {},
    }
    rows = result["rows"]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-replay-") as tmp:
        url = _write_archive(Path(tmp) / "run.zarr", model, qpos, mocap)
        rows["raw"], rows["batch"] = _renderer_rows(model, camera, qpos, mocap, args, device)
        _warm_up(url, model, camera, qpos, mocap, args, device, backend, Path(tmp) / "warm")
        rows["read"] = _measure(n_frames, lambda: _read_all(url, args.batch))
        rows["pipelined"] = _pipelined_row(model, camera, qpos, mocap, args, device)
        presets = [p for p in args.presets.split(",") if p]
        stub = _prerendered(model, camera, qpos, mocap, args, device)
        for preset in [None, *presets]:
            name = "encode_only" + (f"_{preset}" if preset else "")
            rows[name] = _stages(n_frames, lambda p=preset, n=name: _encode_only(
                url, model, camera, Path(tmp) / n, args, backend, stub, p))
        rows["flyarchive"] = _stages(n_frames, lambda: _flyarchive(
            url, model, camera, Path(tmp) / "fa", args, backend))
        rows["flyarchive_warm"] = _stages(n_frames, lambda: _flyarchive(
            url, model, camera, Path(tmp) / "fa-warm", args, backend))
        for preset in presets:
            for encoders in [int(e) for e in args.encoders.split(",") if e] or [0]:
                name = f"flyarchive_{preset}" + (f"_e{encoders}" if encoders else "")
                rows[name] = _stages(n_frames, lambda p=preset, e=encoders, n=name: _flyarchive(
                    url, model, camera, Path(tmp) / n, args, backend, preset=p, encoders=e))
        if device.startswith("cuda"):  # row 3 launching kernel by kernel (no CUDA graph)
            rows["flyarchive_no_graph"] = _stages(n_frames, lambda: _no_graph(
                lambda: _flyarchive(url, model, camera, Path(tmp) / "fa-ng", args, backend)))
        for wpb in (32, 256) if args.flygym else ():
            rows[f"flygym_b{wpb}"] = _measure(n_frames, lambda wpb=wpb: _flygym(
                model, camera, qpos, mocap, args, device, wpb, Path(tmp) / f"fg{wpb}"))
    fly = [r for k, r in rows.items() if k.startswith("flygym") and "fps" in r]
    if fly and "fps" in rows["flyarchive"]:
        best = max(fly, key=lambda r: r["fps"])
        result["flygym_best_fps"] = best["fps"]
        result["ratio_flyarchive_over_flygym"] = round(rows["flyarchive"]["fps"] / best["fps"], 3)
    _print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the result as JSON to this path")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="Warp device")
    parser.add_argument("--worlds", type=int, default=128, help="worlds in the archive")
    parser.add_argument("--frames", type=int, default=100, help="frames per world")
    parser.add_argument("--batch", type=int, default=1024, help="B, states per flyarchive batch")
    parser.add_argument("--model", choices=["nmf", "tiny"], default="nmf")
    parser.add_argument(
        "--size", type=lambda s: tuple(int(v) for v in s.split("x")), default=(240, 320),
        help="frame size HEIGHTxWIDTH (default 240x320)",
    )
    parser.add_argument("--presets", default="veryfast",
                        help="x264 presets of extra flyarchive and encode_only rows (comma list)")
    parser.add_argument("--encoders", default="",
                        help="encoder threads of the extra rows (comma list; default: cores)")
    parser.add_argument("--no-flygym", dest="flygym", action="store_false",
                        help="skip flygym's render_trajectories_gpu rows")
    args = parser.parse_args()
    if min(args.worlds, args.frames, args.batch) < 1:
        parser.error("--worlds, --frames and --batch must be positive")
    return args


# ----------------------------------------------------------------------------- data
def _states(which: str, n_worlds: int, n_frames: int
            ) -> tuple[mujoco.MjModel, str, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """The model, its camera, ``(worlds, frames, nq)`` float32 qpos and mocap poses or None."""
    rng = np.random.default_rng(0)
    if which == "tiny":
        from flyarchive.testing import tiny_model

        model = tiny_model()
        qpos = np.tile(model.qpos0, (n_worlds, n_frames, 1))
        qpos[..., 7] = rng.uniform(-1.0, 1.0, (n_worlds, n_frames))  # shoulder
        qpos[..., 12] = rng.uniform(-0.1, 0.1, (n_worlds, n_frames))  # slider
        data = mujoco.MjData(model)
        mocap_pos = np.broadcast_to(data.mocap_pos, (n_worlds, n_frames, model.nmocap, 3))
        mocap_quat = np.broadcast_to(data.mocap_quat, (n_worlds, n_frames, model.nmocap, 4))
        mocap = (mocap_pos.astype(np.float32), mocap_quat.astype(np.float32))
        return model, "front", qpos.astype(np.float32), mocap
    from flyarchive.interop import nmf

    world = nmf.build_world()
    walk = nmf.walk_qpos(n_frames, dtype=np.float64, world=world)  # (frames, nq)
    qpos = np.repeat(walk[None], n_worlds, axis=0)
    qpos[:, :, :2] += rng.normal(0.0, 2.0, (n_worlds, 1, 2))  # per-world offset, mm
    qpos[:, :, 7:] += rng.normal(0.0, 0.02, (n_worlds, n_frames, walk.shape[1] - 7))  # rad
    return world.model, world.cameras[0], qpos.astype(np.float32), None


def _write_archive(url: Path, model: mujoco.MjModel, qpos: np.ndarray,
                   mocap: tuple[np.ndarray, np.ndarray] | None) -> str:
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock

    n_worlds, n_frames, _ = qpos.shape
    timing = Timing(float(model.opt.timestep), 25.0, 0.2)
    spec = ArchiveSpec(ModelLayout.from_model(model), timing, tuple(range(n_worlds)),
                       dtype="float32", source="mujoco-warp", chunk_frames=min(n_frames, 100),
                       shard_worlds=min(n_worlds, 64))
    writer = ArchiveWriter.create(str(url), spec)
    times = np.arange(n_frames) * timing.interval
    writer.write(FrameBlock(times, qpos, *(mocap or (None, None))))
    return str(url)


# ----------------------------------------------------------------------------- rows
def _renderer_rows(model: mujoco.MjModel, camera: str, qpos: np.ndarray,
                   mocap: tuple[np.ndarray, np.ndarray] | None, args: argparse.Namespace,
                   device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from flyarchive.replay.warp import WarpBatchRenderer

    states = qpos.reshape(-1, qpos.shape[-1])
    flat_mocap = None if mocap is None else tuple(m.reshape(-1, *m.shape[2:]) for m in mocap)
    b = min(args.batch, len(states))
    start = time.perf_counter()
    renderer = WarpBatchRenderer(model, camera, args.size, batch_worlds=b, device=device)
    renderer.render_batch(states[:b], *(m[:b] for m in flat_mocap or ()))  # compile or load
    setup_s = time.perf_counter() - start
    n_batches = -(-len(states) // b)

    def raw() -> None:
        for _ in range(n_batches):
            renderer.render_resident()
        renderer.synchronize()

    def batch(r: Any) -> None:
        for i in range(0, len(states), b):
            r.render_batch(states[i:i + b], *(m[i:i + b] for m in flat_mocap or ()))

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
    yuv = WarpBatchRenderer(model, camera, args.size, batch_worlds=b, device=device,
                            pixel_format="yuv420p")
    yuv.render_batch(states[:b], *(m[:b] for m in flat_mocap or ()))
    batch_row["yuv420p"] = _measure(len(states), lambda: batch(yuv))
    return raw_row, batch_row


def _pipelined_row(model: mujoco.MjModel, camera: str, qpos: np.ndarray,
                   mocap: tuple[np.ndarray, np.ndarray] | None, args: argparse.Namespace,
                   device: str) -> dict[str, Any]:
    """yuv420p batches submitted one ahead of the one waited for: the GPU stage's limit."""
    from flyarchive.replay.warp import WarpBatchRenderer

    states = qpos.reshape(-1, qpos.shape[-1])
    flat_mocap = None if mocap is None else tuple(m.reshape(-1, *m.shape[2:]) for m in mocap)
    b = min(args.batch, len(states))
    start = time.perf_counter()
    renderer = WarpBatchRenderer(model, camera, args.size, batch_worlds=b, device=device,
                                 pixel_format="yuv420p", host_buffers=2)
    built = time.perf_counter() - start

    def run() -> None:
        pending = None
        for i, k in enumerate(range(0, len(states), b)):
            submitted = renderer.submit(states[k:k + b], *(m[k:k + b] for m in flat_mocap or ()),
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

    def __init__(self, frames: np.ndarray, default_state: np.ndarray) -> None:
        self.frames = frames  # (B, 1, *frame) yuv420p
        self.pixel_format = "yuv420p"
        self.default_state = default_state

    def submit(self, qpos: np.ndarray, *_: Any, buffer: int = 0) -> Any:
        frames = self.frames[:len(qpos)]
        return type("Done", (), {"wait": staticmethod(lambda: frames)})()


def _prerendered(model: mujoco.MjModel, camera: str, qpos: np.ndarray,
                 mocap: tuple[np.ndarray, np.ndarray] | None, args: argparse.Namespace,
                 device: str) -> _Prerendered:
    """The first batch's yuv420p frames, rendered once, handed out for every batch."""
    from flyarchive.replay.warp import WarpBatchRenderer

    states = qpos.reshape(-1, qpos.shape[-1])
    b = min(args.batch, len(states))
    renderer = WarpBatchRenderer(model, camera, args.size, batch_worlds=b, device=device,
                                 pixel_format="yuv420p")
    first = renderer.render_batch(states[:b], *(m.reshape(-1, *m.shape[2:])[:b]
                                                for m in mocap or ()))
    return _Prerendered(first, renderer.default_state)


def _encode_only(url: str, model: mujoco.MjModel, camera: str, out: Path,
                 args: argparse.Namespace, backend: str, stub: _Prerendered,
                 preset: str | None) -> None:
    """Row 3 with the renderer replaced by ``stub`` (frames rendered beforehand)."""
    from flyarchive.distribute import warp_pipeline as gpu_videos

    real = gpu_videos._renderer
    gpu_videos._renderer = lambda *_, **__: stub
    try:
        _flyarchive(url, model, camera, out, args, backend, preset=preset)
    finally:
        gpu_videos._renderer = real


def _read_all(url: str, batch_worlds: int) -> None:
    """Read every batch's states from the archive as ``render_videos`` does (no rendering)."""
    from flyarchive.distribute.plan import pack_batches
    from flyarchive.query import open_archive, select_frames
    from flyarchive.store import StateReader

    jobs = tuple(select_frames(open_archive(url)))
    reader = StateReader(url)
    for batch in pack_batches(jobs, batch_worlds):
        reader.read([(jobs[p.job].world_index, p.start, p.stop) for p in batch.pieces])


def _flyarchive(url: str, model: mujoco.MjModel, camera: str, out: Path,
                args: argparse.Namespace, backend: str, preset: str | None = None,
                encoders: int = 0) -> None:
    """``render_videos`` of every world; x264 ``preset`` (None: the backend's default)."""
    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.video import VideoOptions

    options = RenderOptions(size=args.size, backend=backend, batch_worlds=args.batch,
                            video=VideoOptions(preset=preset) if preset else None)
    with _environ("FLYARCHIVE_ENCODERS", str(encoders)):  # 0: one per core
        render_videos(url, model, camera, str(out), options=options, n_workers=0)


def _no_graph(run: Callable[[], None]) -> None:
    """``run()`` with a fresh renderer that launches kernel by kernel (no CUDA graph)."""
    from flyarchive.distribute import warp_pipeline as gpu_videos

    gpu_videos._renderers.clear()
    try:
        with _environ("FLYARCHIVE_CUDA_GRAPH", "0"):
            run()
    finally:
        gpu_videos._renderers.clear()


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block, as it was after it."""
    import os

    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before


def _flygym(model: mujoco.MjModel, camera: str, qpos: np.ndarray,
            mocap: tuple[np.ndarray, np.ndarray] | None, args: argparse.Namespace,
            device: str, worlds_per_batch: int, out: Path | None) -> None:
    import warp as wp
    from flygym.recording import RecordedTrajectory
    from flygym.warp.recording import render_trajectories_gpu

    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    times = np.arange(qpos.shape[1]) * 0.2 / 25.0
    trajectories = [
        RecordedTrajectory(
            time=times, qpos=qpos[w], output_fps=25, playback_speed=0.2, world_id=w,
            mocap_pos=None if mocap is None else mocap[0][w],
            mocap_quat=None if mocap is None else mocap[1][w],
        )
        for w in range(qpos.shape[0])
    ]
    with wp.ScopedDevice(device):
        render_trajectories_gpu(prepare_for_batch_rendering(model), trajectories, camera, out,
                                camera_res=tuple(args.size), worlds_per_batch=worlds_per_batch)


def _warm_up(url: str, model: mujoco.MjModel, camera: str, qpos: np.ndarray,
             mocap: tuple[np.ndarray, np.ndarray] | None, args: argparse.Namespace,
             device: str, backend: str, out: Path) -> None:
    """Compile (or load) both libraries' kernels on one frame, so no timed row pays for it.

    Renderer setup (model upload, BVH build) stays in both end-to-end rows: flyarchive's
    cached renderer is dropped, and flygym builds its own on every call anyway.
    """
    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.distribute import warp_pipeline as gpu_videos

    options = RenderOptions(size=args.size, backend=backend, batch_worlds=args.batch)
    render_videos(url, model, camera, str(out / "fa"), worlds=[0], time=(0.0, 0.0),
                  options=options)
    gpu_videos._renderers.clear()
    if args.flygym:
        one = (qpos[:1, :1], None if mocap is None else (mocap[0][:1, :1], mocap[1][:1, :1]))
        _measure(1, lambda: _flygym(model, camera, *one, args, device, 1, None))


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
    with _peak_rss() as peak:
        start = time.perf_counter()
        try:
            run()
        except Exception as err:  # reported in the table, not raised
            traceback.print_exc()
            return {"error": f"{type(err).__name__}: {err}"[:300], "peak_rss_mb": peak()}
        wall = time.perf_counter() - start
    return {"wall_s": round(wall, 3), "fps": round(n_images / wall, 2), "peak_rss_mb": peak(),
            "cpu_s": round(cpu(resource.RUSAGE_SELF) - before[0], 2),
            "cpu_children_s": round(cpu(resource.RUSAGE_CHILDREN) - before[1], 2)}


def _stages(n_images: int, run: Callable[[], None]) -> dict[str, Any]:
    """:func:`_measure` of a flyarchive run, with the pipeline's stage timers."""
    from flyarchive.distribute.diagnostics import PipelineProfile

    with PipelineProfile() as profile:
        row = _measure(n_images, run)
    row["stages_s"] = {k: round(v, 3) for k, v in profile.results.items()}
    print(f"{row.get('fps')} frames/s, stages: {row['stages_s']}", flush=True)
    return row


@contextmanager
def _peak_rss(interval_s: float = 0.02) -> Iterator[Callable[[], float]]:
    import psutil

    me = psutil.Process()
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while True:
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], total)
            if done.wait(interval_s):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: round(peak[0] / 2**20, 1)
    finally:
        done.set()
        thread.join()


def _print_table(r: dict[str, Any]) -> None:
    size = f"{r['size'][0]}x{r['size'][1]}"
    print(f"\n{r['model']} on {r['device']}: {r['worlds']} worlds x {r['frames']} frames, "
          f"{size}, B={r['batch']}, camera {r['camera']!r}")
    print(f"{'row':<26} {'wall s':>9} {'frames/s':>10} {'peak RSS MB':>12} "
          f"{'CPU s self+ffmpeg':>18}  note")
    for name, row in r["rows"].items():
        wall = f"{row['wall_s']:.2f}" if "wall_s" in row else "-"
        fps = f"{row['fps']:.1f}" if "fps" in row else "-"
        note = row.get("error", f"setup {row['setup_s']:.1f} s" if "setup_s" in row else "")
        if "fps" in row.get("yuv420p", {}):
            note += f"yuv420p on the device: {row['yuv420p']['fps']:.1f} frames/s"
        cpu = (f"{row['cpu_s']:.1f}+{row['cpu_children_s']:.1f}" if "cpu_s" in row else "-")
        print(f"{name:<26} {wall:>9} {fps:>10} {row['peak_rss_mb']:>12.0f} {cpu:>18}  {note}")
    if "ratio_flyarchive_over_flygym" in r:
        print(f"flyarchive / best flygym: {r['ratio_flyarchive_over_flygym']:.2f}x "
              f"(flygym best {r['flygym_best_fps']:.1f} frames/s)")


if __name__ == "__main__":
    main()
