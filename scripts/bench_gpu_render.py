"""Frames per second of flyarchive's mujoco-warp batch replay.

Two numbers per run:
- raw: kinematics + BVH refit + render of ``B`` resident states on the device, no
  host transfer (``WarpBatchRenderer.render_resident``): the rendering limit.
- batch: ``WarpBatchRenderer.render_batch`` end to end: pack and upload states,
  kinematics, render, uint8 conversion on the device, copy to the host.

A frame is one (state, camera) image. Setup (model upload, BVH build, kernel
compilation or cache load, first render) is timed separately.

Usage:
    python scripts/bench_gpu_render.py --device cpu --model tiny --worlds 16 --frames 64
    python scripts/bench_gpu_render.py --device cuda --model nmf --worlds 1024 --frames 8192 \\
        --json bench.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import mujoco
import numpy as np
from benchlib import (
    require_device,
    positive_int,
    Column,
    Table,
    add_json_option,
    gpu_bench_host_keys,
    parse_size,
    replay_states,
    write_json,
)


def main() -> None:
    args = _parse_args()
    model, camera, qpos = _states(args.model, args.frames)
    height, width = args.size

    import warp as wp

    from flyarchive.replay.warp_frames import WarpBatchRenderer

    wp.config.quiet = True
    device = {"cuda": "cuda:0", "cpu": "cpu"}[args.device] if args.device else None

    start = time.perf_counter()
    renderer = WarpBatchRenderer(
        model, camera, (height, width), batch_worlds=args.worlds, device=device
    )
    renderer.render_batch(qpos[: args.worlds])  # compile or load kernels, first render
    setup_s = time.perf_counter() - start

    n_batches = max(1, args.frames // args.worlds)
    raw_s = _time(lambda: renderer.render_resident(), n_batches, renderer)
    batches = [qpos[i : i + args.worlds] for i in range(0, args.frames, args.worlds)]
    batch_s = _time_batches(renderer, batches)

    result: dict[str, Any] = {
        "model": args.model,
        "device": renderer.device,
        "worlds": args.worlds,
        "frames": args.frames,
        "size": [height, width],
        "camera": camera,
        "nq": model.nq,
        "ngeom": model.ngeom,
        "setup_s": round(setup_s, 3),
        "raw_fps": round(n_batches * args.worlds / raw_s, 2),
        "batch_fps": round(args.frames / batch_s, 2),
        **gpu_bench_host_keys(),
    }
    TABLE.print([result])
    write_json(args.json, result, indent=2)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser, "also write the result as JSON to this path")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="Warp device (default: Warp's)")
    parser.add_argument("--worlds", type=positive_int, default=16, help="B, states per batch")
    parser.add_argument("--frames", type=positive_int, default=64,
                        help="states rendered in the timed run")
    parser.add_argument("--model", choices=["tiny", "nmf"], default="tiny")
    parser.add_argument("--size", type=parse_size, default=(240, 320),
                        help="frame size HEIGHTxWIDTH (default 240x320)")
    args = parser.parse_args()
    require_device(parser, args.device)
    if args.worlds < 1 or args.frames < 1:
        parser.error("--worlds and --frames must be positive")
    return args


def _states(which: str, n_frames: int) -> tuple[mujoco.MjModel, str, np.ndarray]:
    """The model, its camera, and ``(n_frames, nq)`` float32 qpos to render: one world's
    states of :func:`benchlib.replay_states`, at most 100 of them, repeated."""
    states = replay_states(which, 1, min(n_frames, 100))
    qpos = np.resize(states.qpos[0], (n_frames, states.model.nq))
    return states.model, states.camera, qpos


def _time(step: Any, n: int, renderer: Any) -> float:
    renderer.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    renderer.synchronize()
    return time.perf_counter() - start


def _time_batches(renderer: Any, batches: list[np.ndarray]) -> float:
    start = time.perf_counter()
    for batch in batches:
        renderer.render_batch(batch)
    return time.perf_counter() - start


TABLE = Table([
    Column("model", 6, "model", align="<"), Column("device", 8, "device", align="<"),
    Column("B", 6, "worlds"), Column("frames", 7, "frames"),
    Column("HxW", 9, lambda r: f"{r['size'][0]}x{r['size'][1]}"),
    Column("setup s", 8, "setup_s", ".1f"), Column("raw f/s", 10, "raw_fps", ".1f"),
    Column("batch f/s", 10, "batch_fps", ".1f"),
])


if __name__ == "__main__":
    main()
