"""Cost of recording a mujoco-warp simulation with flyarchive's WarpTrajectoryRecorder.

Runs ``--steps`` steps of ``--nworld`` worlds twice from the same start, without
and with the recorder (``record_as_needed`` after every step, all worlds or the
first ``--record-worlds``), and reports simulation steps/s of each, the recorder's
overhead, host RSS, frames committed and bytes stored. The timed run with the
recorder ends when ``close()`` has committed every frame.

Models:
- ``nmf``: NeuroMechFly on flat ground (``flyarchive.interop.nmf.build_world``), a
  copy with ``noslip_iterations = 0`` (mujoco-warp refuses the noslip solver). Every
  world starts from the ``neutral`` keyframe and its position actuators hold the
  keyframe's targets (constant controls, no host-to-device traffic per step): the
  fly stands under gravity and contacts, which costs the solver what walking costs.
- ``tiny``: ``flyarchive.testing.tiny_model`` with random initial velocities.

On CUDA the step is captured once in a CUDA graph (``wp.ScopedCapture``) and
launched per step, as mujoco-warp's ``testspeed`` does; on the CPU device it is
called directly. Kernel compilation and the first steps are excluded from timing.

Usage:
    python scripts/bench_gpu_record.py --device cpu --model tiny --nworld 8 --steps 200
    python scripts/bench_gpu_record.py --device cuda --model nmf --nworld 4096 --steps 2000 \\
        --json bench_record.json
"""

import argparse
import copy
import tempfile
import time
import warnings
from typing import Any

import fsspec
import mujoco
import numpy as np
from benchlib import (
    require_device,
    positive_int,
    Column,
    PeakMemory,
    Table,
    add_json_option,
    gpu_bench_host_keys,
    tree_memory,
    write_json,
)


def main() -> None:
    args = _parse_args()

    import mujoco_warp as mjw
    import warp as wp

    from flyarchive.recorders import WarpTrajectoryRecorder

    wp.config.quiet = True
    device = wp.get_device({"cuda": "cuda:0", "cpu": "cpu"}[args.device])
    model, data0, label = _model(args.model)
    with wp.ScopedDevice(device), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        m = mjw.put_model(model)
        d = mjw.put_data(model, data0, nworld=args.nworld, **_capacity(args.model))
        start = _snapshot(d)
        setup_start = time.perf_counter()
        step = _stepper(mjw, wp, m, d, device)
        for _ in range(3):
            step()
        wp.synchronize_device(device)
        setup_s = time.perf_counter() - setup_start

        _restore(d, start)
        rss_before = tree_memory()
        base_s = _timed(lambda: _loop(step, args.steps, None, d), wp, device)

        _restore(d, start)
        out = args.out or tempfile.mkdtemp(prefix="bench_gpu_record_") + "/run.zarr"
        worlds = None if args.record_worlds is None else range(args.record_worlds)
        recorder = WarpTrajectoryRecorder(
            out, model, args.nworld, worlds=worlds, chunk_frames=args.chunk_frames, mode="w"
        )
        with PeakMemory(interval_s=0.02) as memory:  # this process (no children)
            recorder.record_as_needed(d)  # creates the archive and records the initial state
            rec_s = _timed(lambda: _loop(step, args.steps, recorder, d), wp, device)
            close_start = time.perf_counter()
            recorder.close()  # commits the frames still buffered
            close_s = time.perf_counter() - close_start

    base_sps = args.steps / base_s
    rec_sps = args.steps / rec_s
    result: dict[str, Any] = {
        "model": label,
        "device": str(device),
        "nworld": args.nworld,
        "recorded_worlds": args.nworld if args.record_worlds is None else args.record_worlds,
        "steps": args.steps,
        "chunk_frames": args.chunk_frames,
        "nq": model.nq,
        "timestep": model.opt.timestep,
        "setup_s": round(setup_s, 3),
        "steps_per_s": round(base_sps, 2),
        "steps_per_s_recording": round(rec_sps, 2),
        "world_steps_per_s": round(base_sps * args.nworld, 1),
        "overhead_pct": round(100.0 * (rec_s - base_s) / base_s, 2),
        "close_s": round(close_s, 3),
        "overhead_incl_close_pct": round(100.0 * (rec_s + close_s - base_s) / base_s, 2),
        "frames": recorder.committed_frames,
        "bytes_stored": _bytes_stored(out),
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_peak_recording_mb": memory.results["peak_mib"],
        "out": out,
        **gpu_bench_host_keys(),
    }
    TABLE.print([result])
    write_json(args.json, result, indent=2)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser, "also write the result as JSON to this path")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="Warp device")
    parser.add_argument("--nworld", type=positive_int, default=4096, help="simulated worlds")
    parser.add_argument("--steps", type=positive_int, default=2000, help="timed steps per run")
    parser.add_argument("--model", choices=["nmf", "tiny"], default="nmf")
    parser.add_argument("--out", help="archive URL (default: a new local temporary folder)")
    parser.add_argument("--record-worlds", type=positive_int,
                        help="record the first N worlds (default all)")
    parser.add_argument("--chunk-frames", type=positive_int, default=16,
                        help="frames per chunk (a flush every chunk, in the background)")
    args = parser.parse_args()
    require_device(parser, args.device)
    if args.nworld < 1 or args.steps < 1 or args.chunk_frames < 1:
        parser.error("--nworld, --steps and --chunk-frames must be positive")
    if args.record_worlds is not None and not 1 <= args.record_worlds <= args.nworld:
        parser.error("--record-worlds must be in 1..nworld")
    return args


def _model(which: str) -> tuple[mujoco.MjModel, mujoco.MjData, str]:
    """The host model (mujoco-warp ready), its initial state, and a label."""
    if which == "tiny":
        from flyarchive.testing import tiny_model

        model = tiny_model()
        data = mujoco.MjData(model)
        data.qvel[:] = np.random.default_rng(0).normal(0.0, 1.0, model.nv)
        return model, data, "tiny"
    from flyarchive.interop import nmf

    world = nmf.build_world()
    model = copy.deepcopy(world.model)
    model.opt.noslip_iterations = 0
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, world.neutral_key)
    return model, data, "nmf"


def _capacity(which: str) -> dict[str, int]:
    """Contact and constraint capacity per world (flygym's GPUSimulation defaults for nmf)."""
    return {"nconmax": 500, "njmax": 500} if which == "nmf" else {}


def _stepper(mjw: Any, wp: Any, m: Any, d: Any, device: Any) -> Any:
    """A function that advances every world by one step (a CUDA graph launch on CUDA)."""
    if not device.is_cuda:
        return lambda: mjw.step(m, d)
    mjw.step(m, d)  # load the modules before capturing
    with wp.ScopedCapture(device=device) as capture:
        mjw.step(m, d)
    graph = capture.graph
    return lambda: wp.capture_launch(graph)


def _snapshot(d: Any) -> dict[str, np.ndarray]:
    return {k: getattr(d, k).numpy().copy() for k in ("qpos", "qvel", "time", "act", "ctrl",
                                                       "mocap_pos", "mocap_quat")}


def _restore(d: Any, state: dict[str, np.ndarray]) -> None:
    for key, value in state.items():
        if value.size:
            getattr(d, key).assign(value)


def _loop(step: Any, n_steps: int, recorder: Any, d: Any) -> None:
    if recorder is None:
        for _ in range(n_steps):
            step()
        return
    for _ in range(n_steps):  # flushes happen in the background while stepping
        step()
        recorder.record_as_needed(d)


def _timed(run: Any, wp: Any, device: Any) -> float:
    wp.synchronize_device(device)
    start = time.perf_counter()
    run()
    wp.synchronize_device(device)
    return time.perf_counter() - start


def _bytes_stored(url: str) -> int:
    fs, path = fsspec.core.url_to_fs(url)
    return int(sum(fs.du(path, total=False).values()))


TABLE = Table([
    Column("model", 6, "model", align="<"), Column("device", 7, "device", align="<"),
    Column("nworld", 7, "nworld"), Column("rec", 6, "recorded_worlds"), Column("steps", 6, "steps"),
    Column("steps/s", 9, "steps_per_s", ".1f"),
    Column("rec steps/s", 11, "steps_per_s_recording", ".1f"),
    Column("overhead", 9, lambda r: f"{r['overhead_pct']:.1f}%"),
    Column("close s", 8, "close_s", ".2f"), Column("frames", 7, "frames"),
    Column("MB stored", 10, lambda r: r["bytes_stored"] / 1e6, ".2f"),
    Column("RSS MB", 8, "rss_peak_recording_mb", ".0f"),
])


if __name__ == "__main__":
    main()
