"""Speed of the gait measures and step tables: tip-frames per second on one core, and a
4096-world archive's step table.

The data: NeuroMechFly walking (one simulated flygym walk copied per world with jitter,
``benchlib.nmf_states``), written by flyarchive's writer (chunks of 1 world x 100 frames
in shards of 64 worlds) under ``--cache``, with the gait's points (thorax, a point ahead of
it, the six tarsus tips: :func:`flyarchive.gait_points`) kept beside it once
(:func:`flyarchive.keep_positions`, stored as the archive's chunks, plain float64 bytes
with a CRC-32C; that one-time cost is its own row). The gait reads them a chunk of whole
worlds at a time (~3 M values), one read each. A *tip-frame* is one leg tip in one frame:
``worlds x frames x 6``. Rows, the process pinned to one core:

- ``gait summary from kept positions``: :func:`flyarchive.gait_summary` of the archive's
  URL, the whole call (opening it, reading the kept positions, every measure) of
  ``--worlds`` x ``--frames``;
- ``step table from kept positions``: :func:`flyarchive.gait_steps`, the whole call;
- ``gait summary / step table, positions in memory``: the same on positions already
  read (the measures alone);
- ``stance and swing, positions in memory``: :func:`~flyarchive.analyze.steps.stance_state`
  alone (the thresholds, hysteresis and minimum durations);
- ``step events from heights and speeds`` / ``from x, y alone (2-D)``: :func:`~flyarchive.
  analyze.steps.stance_runs` and :func:`~flyarchive.analyze.steps.step_events` on the same
  tips with their heights and without (as a camera from above tracks them: the speeds
  taken over as many frames as the noise needs, each event placed by the tip's ramped
  set-off);
- ``step table, <N> worlds x <F> frames``: ``gait_steps`` of ``--big-worlds`` x
  ``--big-frames`` (4096 x 250 by default: a GPU run's archive), the whole call.

``s`` is wall time, ``CPU s`` the process's CPU time; ``M tip-frames/s`` divides
tip-frames by each (``per CPU s``: what a machine shared with other work does not
inflate). Each row is the best of ``--repeat`` calls. The title gives the load average
when the table is printed.

Usage::

    python scripts/bench_gait.py [--worlds 1024] [--frames 1000] [--big-worlds 4096]
        [--big-frames 250] [--repeat 3] [--cache /tmp/flyarchive-bench-gait] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import (
    positive_int,
    Column,
    Jitter,
    Table,
    add_json_option,
    cached,
    cached_archive,
    host_info,
    nmf_states,
    pin_threads,
    write_json,
)

JITTER = Jitter(start_margin=200, xy_mm=5.0, angle_bias_rad=0.01)
TIPS = 6


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """The best wall and CPU seconds of ``repeat`` calls, and the last result."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    return wall, cpu, result


def kept_archive(cache: Path, world: Any, worlds: int, frames: int) -> tuple[str, float | None]:
    """An NMF archive with the gait's points kept beside it; the seconds keeping them took
    when this run kept them (None: kept by an earlier run)."""
    import flyarchive

    states = lambda: nmf_states(worlds, frames, world=world, jitter=JITTER,  # noqa: E731
                                cache=cache / "walks")
    url = cached_archive(cache, f"nmf-{worlds}x{frames}", world.model, states,
                         chunk_frames=100, shard_worlds=64)
    took: list[float] = []

    def keep(marker: Path) -> None:
        print(f"keeping the gait's points of {url}...", flush=True)
        start = time.perf_counter()
        flyarchive.keep_positions(url, points=flyarchive.gait_points(), model=world.model)
        took.append(time.perf_counter() - start)
        marker.write_text("kept\n")

    cached(Path(cache) / f"nmf-{worlds}x{frames}-gait-points.kept", keep)
    return url, (took[0] if took else None)


def row(label: str, tip_frames: int, wall: float, cpu: float, **extra: Any) -> dict[str, Any]:
    return {"row": label, "tip_frames": tip_frames, "s": wall, "cpu_s": cpu,
            "mtf_per_s": tip_frames / wall / 1e6, "cpu_mtf_per_s": tip_frames / cpu / 1e6,
            **extra}


def gait_rows(url: str, model: Any, worlds: int, frames: int, repeat: int,
              kept_s: float | None) -> list[dict[str, Any]]:
    import dask
    import numpy as np

    import flyarchive
    from flyarchive.analyze.gait_params import GaitParams
    from flyarchive.analyze.steps import stance_runs, stance_state, step_events

    tip_frames = worlds * frames * TIPS
    rows = []
    if kept_s is not None:
        rows.append({"row": f"keep the gait's points, {worlds} x {frames} (once)", "s": kept_s,
                     "tip_frames": tip_frames, "mtf_per_s": tip_frames / kept_s / 1e6})
    with dask.config.set(scheduler="synchronous"):
        wall, cpu, summary = timed(lambda: flyarchive.gait_summary(url, model=model, processes=0), repeat)
        rows.append(row(f"gait summary from kept positions, {worlds} x {frames}", tip_frames,
                        wall, cpu))
        wall, cpu, steps = timed(lambda: flyarchive.gait_steps(url, model=model, processes=0), repeat)
        rows.append(row(f"step table from kept positions, {worlds} x {frames}", tip_frames,
                        wall, cpu, steps=len(steps)))
        positions = flyarchive.gait_positions(url, model=model, processes=0)
    wall, cpu, _ = timed(lambda: flyarchive.gait_summary(positions), repeat)
    rows.append(row("gait summary, positions in memory", tip_frames, wall, cpu))
    wall, cpu, _ = timed(lambda: flyarchive.gait_steps(positions), repeat)
    rows.append(row("step table, positions in memory", tip_frames, wall, cpu))
    values = np.asarray(positions.values)[:, :, 2:]
    tips = np.ascontiguousarray(values.transpose(3, 0, 2, 1)).reshape(3, -1, frames)
    times = np.asarray(positions.time.values)
    wall, cpu, _ = timed(lambda: stance_state(times, tips.transpose(1, 2, 0), GaitParams()),
                         repeat)
    rows.append(row("stance and swing, positions in memory", tip_frames, wall, cpu))
    for height, label in ((True, "heights and speeds"), (False, "x, y alone (2-D)")):
        def events(height: bool = height) -> Any:
            runs = stance_runs(times, tips.transpose(1, 2, 0), GaitParams(), height=height)
            return step_events(times, runs, tips.transpose(1, 2, 0), GaitParams(), height=height)
        wall, cpu, found = timed(events, repeat)
        rows.append(row(f"step events from {label}, in memory", tip_frames, wall, cpu,
                        steps=len(found)))
    print(f"(step frequency of world 0, lf: {summary.step_frequency_lf.values[0]:.2f} Hz)")
    return rows


def big_rows(url: str, model: Any, worlds: int, frames: int, repeat: int,
             kept_s: float | None) -> list[dict[str, Any]]:
    import dask

    import flyarchive

    tip_frames = worlds * frames * TIPS
    rows = []
    if kept_s is not None:
        rows.append({"row": f"keep the gait's points, {worlds} x {frames} (once)", "s": kept_s,
                     "tip_frames": tip_frames, "mtf_per_s": tip_frames / kept_s / 1e6})
    with dask.config.set(scheduler="synchronous"):
        wall, cpu, steps = timed(lambda: flyarchive.gait_steps(url, model=model, processes=0), repeat)
    rows.append(row(f"step table, {worlds} worlds x {frames} frames", tip_frames, wall, cpu,
                    steps=len(steps)))
    return rows


TABLE = Table([
    Column("what", 52, "row", align="<"),
    Column("tip-frames", 12, "tip_frames", ",.0f"),
    Column("s", 8, "s", ".2f"),
    Column("CPU s", 8, "cpu_s", ".2f"),
    Column("M tip-frames/s", 15, "mtf_per_s", ".2f"),
    Column("per CPU s", 10, "cpu_mtf_per_s", ".2f"),
    Column("steps", 9, "steps", ",.0f"),
])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=positive_int, default=1024)
    parser.add_argument("--frames", type=positive_int, default=1000)
    parser.add_argument("--big-worlds", type=positive_int, default=4096)
    parser.add_argument("--big-frames", type=positive_int, default=250)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--core", type=int, default=0, help="the core this process runs on")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flyarchive-bench-gait"))
    add_json_option(parser)
    args = parser.parse_args()
    from flyarchive.interop.nmf import build_world

    world = build_world()
    url, kept_s = kept_archive(args.cache, world, args.worlds, args.frames)
    big, big_kept_s = kept_archive(args.cache, world, args.big_worlds, args.big_frames)
    pin_threads({args.core})
    rows = gait_rows(url, world.model, args.worlds, args.frames, args.repeat, kept_s)
    rows += big_rows(big, world.model, args.big_worlds, args.big_frames, args.repeat, big_kept_s)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    TABLE.print(rows, title=f"\nGait of NeuroMechFly walks, 1 core (load average {load})")
    write_json(args.json, {"host": host_info(), "load_average": os.getloadavg(),
                           "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})


if __name__ == "__main__":
    main()
