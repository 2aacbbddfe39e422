"""What depth and segmentation maps, mosaics and overlays cost in ``render_videos``.

One archive (``--model tiny`` or ``nmf``, ``--worlds`` x ``--frames``, kept under
``--cache``) is rendered archive -> files by ``render_videos(n_workers=0)`` (in this
process) on each backend of ``--backends`` with:

- ``rgb``: RGB only (the baseline);
- ``maps``: RGB + depth + segmentation (one kinematics pass feeds all three);
- ``mosaic``: RGB tiled ``--mosaic`` into one video per camera (tile labels included);
- ``overlays``: RGB with ``time,world,speed`` burnt in.

Each case runs ``--repeat`` times after one warm-up render (kernels loaded, renderer
built); the best wall time counts, and its
stage timings (:class:`~flyarchive.render.diagnostics.PipelineProfile`) go to the
row's ``stages`` in the JSON. A frame is one (world, frame, camera) image, a tile of
a mosaic counting as one. Ratios, against ``rgb`` of the same backend: ``maps_ratio``
(time, target <= 1.3 on the GPU), ``mosaic_fps_ratio`` (tile-frames/s over per-world
frames/s, target >= 0.8) and ``overlay_cost_pct`` (extra time, target <= 5 %).

Usage:
    python scripts/bench_outputs.py --backends cpu,warp-cpu --model tiny --worlds 4 \\
        --frames 20 --size 48x64 --mosaic 2x2
    python scripts/bench_outputs.py --backends gpu --model nmf --worlds 256 --frames 200 \\
        --batch-worlds 256 --mosaic 4x4 --json outputs.json
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    listed,
    positive_int,
    Column,
    Table,
    add_json_option,
    cached_archive,
    host_info,
    parse_size,
    replay_states,
    write_json,
)

CASES = ("rgb", "maps", "mosaic", "overlays")


def main() -> None:
    args = _parse_args()
    states = replay_states(args.model, args.worlds, args.frames)
    cache = Path(args.cache or tempfile.mkdtemp(prefix="bench-outputs-"))
    url = cached_archive(cache, f"{args.model}-w{args.worlds}-f{args.frames}", states.model,
                         lambda: states.qpos, mocap=states.mocap)
    rows = []
    table = Table([Column("backend", 9, "backend", align="<"), Column("case", 9, "case", align="<"),
                   Column("frames", 8, "frames", ",d"), Column("s", 8, "seconds", ".2f"),
                   Column("frames/s", 10, "fps", ",.1f"), Column("vs rgb", 8, "ratio", ".3f")])
    print(table.header(), flush=True)
    for backend in args.backends:
        base = None
        for case in args.cases:
            row = _run(url, states, backend, case, args)
            if case == "rgb":
                base = row
            if base is not None:
                row["ratio"] = row["seconds"] / base["seconds"]
            rows.append(row)
            print(table.line(row), flush=True)
    summary = _summary(rows)
    for backend, ratios in summary.items():
        print(f"{backend}: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    write_json(args.json, {"host": host_info(), "args": vars(args), "rows": rows,
                           "summary": summary})


def _options(backend: str, case: str, args: argparse.Namespace) -> Any:
    from flyarchive.distribute.api import RenderOptions

    extra: dict[str, Any] = {
        "rgb": {}, "maps": {"outputs": ("rgb", "depth", "segmentation")},
        "mosaic": {"mosaic": args.mosaic}, "overlays": {"overlays": ("time", "world", "speed")},
    }[case]
    return RenderOptions(backend=backend, size=args.size, batch_worlds=args.batch_worlds,
                         segment_frames=args.segment_frames, **extra)


def _run(url: str, states: Any, backend: str, case: str, args: argparse.Namespace
         ) -> dict[str, Any]:
    """Best wall time of ``--repeat`` renders of one case, after a warm-up."""
    from flyarchive.distribute.api import render_videos
    from flyarchive.render.diagnostics import PipelineProfile

    options = _options(backend, case, args)
    best, stages = float("inf"), {}
    with tempfile.TemporaryDirectory(prefix="bench-outputs-out-") as tmp:
        for attempt in range(args.repeat + 1):
            out = Path(tmp) / f"out{attempt}"
            worlds = [0] if attempt == 0 else None  # warm-up: one world
            start = time.perf_counter()
            with PipelineProfile() as profile:
                render_videos(url, states.model, states.camera, str(out), worlds=worlds,
                              options=options, n_workers=args.workers)
            elapsed = time.perf_counter() - start
            if attempt and elapsed < best:
                best, stages = elapsed, {k: round(v, 3) for k, v in profile.results.items()}
            shutil.rmtree(out, ignore_errors=True)
    frames = args.worlds * args.frames  # one camera; mosaic: tile-frames (blank tiles not)
    return {"backend": backend, "case": case, "frames": frames, "seconds": best,
            "fps": frames / best, "stages": stages}


def _summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per backend: maps_ratio, mosaic_fps_ratio, overlay_cost_pct (what is measured)."""
    out: dict[str, dict[str, float]] = {}
    for backend in dict.fromkeys(r["backend"] for r in rows):
        by = {r["case"]: r for r in rows if r["backend"] == backend}
        if "rgb" not in by:
            continue
        rgb, ratios = by["rgb"], {}
        if "maps" in by:
            ratios["maps_ratio"] = by["maps"]["seconds"] / rgb["seconds"]
        if "mosaic" in by:
            ratios["mosaic_fps_ratio"] = by["mosaic"]["fps"] / rgb["fps"]
        if "overlays" in by:
            ratios["overlay_cost_pct"] = 100 * (by["overlays"]["seconds"] / rgb["seconds"] - 1)
        out[backend] = ratios
    return out


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="cpu,warp-cpu",
                   type=lambda s: [b.strip() for b in listed("cpu", "opengl", "warp-cpu", "gpu")(s)
                                   .split(",") if b.strip()],
                   help="comma-separated: cpu, warp-cpu, gpu (default cpu,warp-cpu)")
    p.add_argument("--cases", default=",".join(CASES),
                   type=lambda s: [c.strip() for c in s.split(",") if c.strip()],
                   help=f"comma-separated, from {', '.join(CASES)} (rgb first for ratios)")
    p.add_argument("--model", choices=("tiny", "nmf"), default="tiny")
    p.add_argument("--worlds", type=positive_int, default=4)
    p.add_argument("--frames", type=positive_int, default=20)
    p.add_argument("--size", type=parse_size, default=(240, 320), help="HEIGHTxWIDTH")
    p.add_argument("--mosaic", type=lambda s: tuple(int(v) for v in s.lower().split("x")),
                   default=(2, 2), help="ROWSxCOLS (default 2x2)")
    p.add_argument("--batch-worlds", type=positive_int, default=4, help="Warp backends' batch")
    p.add_argument("--segment-frames", type=positive_int, default=100,
                   help="cpu backend's segments")
    p.add_argument("--workers", type=int, default=0,
                   help="render_videos n_workers (default 0: this process)")
    p.add_argument("--repeat", type=positive_int, default=2,
                   help="timed renders per case (best counts)")
    p.add_argument("--cache", help="folder keeping the archive between runs")
    add_json_option(p)
    args = p.parse_args()
    for case in args.cases:
        if case not in CASES:
            p.error(f"unknown case {case!r}; cases: {', '.join(CASES)}")
    return args


if __name__ == "__main__":
    main()
