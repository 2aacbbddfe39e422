"""Host-CPU ceiling of H.264 encoding of many short videos at once, without rendering.

Encodes ``videos`` synthetic clips the way flyarchive's GPU replay does: one ffmpeg
(libx264) process per video, raw frames piped to its stdin, ``jobs`` encoders at a
time, each driven by a Python thread taking videos from a shared queue. Frames (a
static gradient plus a moving disc, so x264 has motion to encode) are generated once
and reused, so only encoding is timed. A case is one (preset, input format, encoder
threads, jobs): ``rgb24`` input makes ffmpeg convert to yuv420p with swscale,
``yuv420p`` input (BT.601 limited range, converted with ``flyarchive.testing.rgb_to_i420``,
the GPU renderer's conversion in numpy) needs no conversion.

Per case: wall time for all videos, frames/s = videos * frames / wall, the mean ffmpeg
process lifetime, and the CPU of the children (``RUSAGE_CHILDREN`` user + sys) per
frame. ``--long`` adds, per preset and format, one single-threaded video of all
``videos * frames`` frames: the per-process start-up cost against streaming. The first
video of the first preset is decoded in both formats as a sanity check
(``yuv_vs_rgb_mean_abs_diff``, in 0..255 units).

Usage::

    python scripts/bench_encode.py --videos 8 --frames 50 --jobs 2
    python scripts/bench_encode.py [--size 240x320] [--videos 128] [--frames 100] \\
        [--jobs 4,8,16] [--presets ultrafast,veryfast] [--formats rgb24,yuv420p] \\
        [--threads-per-encoder 1,2] [--long] [--json encode.json]
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import imageio_ffmpeg
import numpy as np
from benchlib import (
    Column,
    Table,
    add_json_option,
    host_info,
    listed,
    parse_size,
    positive_int,
    write_json,
)
from flyarchive.testing import rgb_to_i420
from flyarchive.video import read_video

CHUNK = 32  # frames per pipe write


def main() -> None:
    args = _parse_args()
    exe = imageio_ffmpeg.get_ffmpeg_exe()
    rgb = make_frames(args.frames, *args.size)
    inputs = {"rgb24": rgb, "yuv420p": rgb_to_i420(rgb)}
    version = subprocess.run([exe, "-version"], capture_output=True, text=True).stdout
    info = host_info()
    result: dict[str, Any] = {
        "machine": {"platform": info["platform"], "host": info["host"],
                    "cpu_count": info["cpus_total"], "ffmpeg": version.splitlines()[0]},
        "args": vars(args), "rows": [], "host_info": info,
    }
    rows = result["rows"]
    with tempfile.TemporaryDirectory(prefix="bench-encode-") as tmp:
        firsts: dict[str, Path] = {}
        for preset in args.presets:
            for fmt in args.formats:
                for threads in args.threads_per_encoder:
                    for jobs in args.jobs:
                        name = f"{preset} {fmt} t{threads}"
                        out = Path(tmp) / f"{preset}-{fmt}-t{threads}-j{jobs}"
                        rows.append(run_case(exe, name, inputs[fmt], fmt, preset, threads,
                                             jobs, args.videos, out))
                        print(TABLE.line(rows[-1]), flush=True)
                        firsts.setdefault(fmt, out / "v00000.mp4")
                if args.long:
                    out = Path(tmp) / f"{preset}-{fmt}-long"
                    rows.append(run_case(exe, f"{preset} {fmt} long", inputs[fmt], fmt, preset,
                                         1, 1, 1, out, repeat=args.videos))
                    print(TABLE.line(rows[-1]), flush=True)
        if {"rgb24", "yuv420p"} <= firsts.keys():
            result["sanity"] = sanity(firsts["rgb24"], firsts["yuv420p"], rgb)
            print("sanity:", result["sanity"], flush=True)
    _print_table(result)
    write_json(args.json, result, indent=2)


#: x264's presets, fastest first.
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                "slower", "veryslow", "placebo")


def _parse_args() -> argparse.Namespace:
    def ints(s: str) -> list[int]:
        return [int(v) for v in s.split(",")]

    def words(s: str) -> list[str]:
        return [v.strip() for v in s.split(",") if v.strip()]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser, "also write the result as JSON to this path")
    parser.add_argument("--size", type=parse_size, default=(240, 320),
                        help="frame size HEIGHTxWIDTH (default 240x320)")
    parser.add_argument("--frames", type=positive_int, default=100, help="frames per video")
    parser.add_argument("--videos", type=positive_int, default=128, help="videos per case")
    parser.add_argument("--jobs", type=ints, default=[os.cpu_count() or 1],
                        help="concurrent encoders, comma list (default: cpu count)")
    parser.add_argument("--presets", type=lambda s: words(listed(*X264_PRESETS)(s)),
                        default=["ultrafast", "superfast", "veryfast"])
    parser.add_argument("--formats", type=words, default=["rgb24", "yuv420p"],
                        help="raw input pixel formats: rgb24, yuv420p")
    parser.add_argument("--threads-per-encoder", type=ints, default=[1],
                        help="ffmpeg -threads per encoder, comma list (default 1)")
    parser.add_argument("--long", action="store_true",
                        help="also encode one single-threaded video of videos*frames frames")
    args = parser.parse_args()
    if min(args.frames, args.videos, *args.jobs, *args.threads_per_encoder) < 1:
        parser.error("--frames, --videos, --jobs and --threads-per-encoder must be positive")
    if args.size[0] % 2 or args.size[1] % 2:
        parser.error("--size must be HEIGHTxWIDTH with both even (yuv420p)")
    if not set(args.formats) <= {"rgb24", "yuv420p"}:
        parser.error("--formats must be among rgb24, yuv420p")
    return args


# ----------------------------------------------------------------------------- frames
def make_frames(n: int, h: int, w: int) -> np.ndarray:
    """``(n, h, w, 3)`` uint8 RGB: a static gradient and a disc moving along a Lissajous path."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    bg = np.stack([40 + 150 * x / w, 60 + 120 * y / h, 90 + 60 * (x + y) / (w + h)], axis=-1)
    bg = np.clip(bg, 0, 255).astype(np.uint8)
    frames = np.empty((n, h, w, 3), np.uint8)
    radius = max(2.0, min(h, w) / 8)
    for i in range(n):
        t = 2 * np.pi * i / max(n, 1)
        cy = h / 2 + (h / 2 - radius) * np.sin(2 * t)
        cx = w / 2 + (w / 2 - radius) * np.cos(t)
        disc = (y - cy) ** 2 + (x - cx) ** 2 <= radius**2
        frames[i] = bg
        frames[i][disc] = (220, 200 - 60 * np.sin(t), 40)
    return frames


# ----------------------------------------------------------------------------- encoding
def encode(exe: str, frames: np.ndarray, fmt: str, size: tuple[int, int], preset: str,
           threads: int, path: Path, repeat: int = 1) -> float:
    """Pipe ``frames`` (``repeat`` times) to one ffmpeg; its start-to-exit seconds."""
    h, w = size
    cmd = [exe, "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", fmt,
           "-s", f"{w}x{h}", "-r", "25", "-i", "-", "-an", "-c:v", "libx264",
           "-pix_fmt", "yuv420p", "-crf", "18", "-preset", preset, "-threads", str(threads),
           str(path)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        for _ in range(repeat):
            for k in range(0, len(frames), CHUNK):
                proc.stdin.write(memoryview(frames[k:k + CHUNK]).cast("B"))
    except BrokenPipeError:
        pass  # ffmpeg died: its stderr and return code say why
    _, err = proc.communicate()  # closes stdin, waits
    if proc.returncode != 0:
        raise RuntimeError(f"ffmpeg failed ({proc.returncode}): {err.decode(errors='replace')}")
    return time.perf_counter() - t0


def run_case(exe: str, name: str, frames: np.ndarray, fmt: str, preset: str, threads: int,
             jobs: int, videos: int, out: Path, repeat: int = 1) -> dict[str, Any]:
    """Encode ``videos`` videos with ``jobs`` encoder threads; a table row."""
    out.mkdir(parents=True)
    size = (frames.shape[1] * 2 // 3 if fmt == "yuv420p" else frames.shape[1], frames.shape[2])
    todo: queue.Queue[int] = queue.Queue()
    for i in range(videos):
        todo.put(i)
    lifetimes: list[float] = []
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                lifetimes.append(encode(exe, frames, fmt, size, preset, threads,
                                        out / f"v{i:05d}.mp4", repeat))
            except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
                errors.append(err)

    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(min(jobs, videos))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if errors:
        raise errors[0]
    for p in out.iterdir():  # keep only the first video, for the sanity check
        if p.name != "v00000.mp4":
            p.unlink()
    n_frames = videos * len(frames) * repeat
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"case": name, "jobs": len(pool), "threads": threads, "frames": n_frames,
            "wall_s": round(wall, 3), "fps": round(n_frames / wall, 1),
            "proc_mean_s": round(sum(lifetimes) / len(lifetimes), 3),
            "cpu_s": round(cpu, 3), "cpu_ms_per_frame": round(1e3 * cpu / n_frames, 3)}


def sanity(rgb_mp4: Path, yuv_mp4: Path, source: np.ndarray) -> dict[str, float]:
    """Mean absolute differences of the decoded videos, with each other and the source."""
    a = read_video(rgb_mp4).astype(np.float32)
    b = read_video(yuv_mp4).astype(np.float32)
    src = source.astype(np.float32)
    return {"yuv_vs_rgb_mean_abs_diff": round(float(np.abs(a - b).mean()), 3),
            "rgb_vs_source_mean_abs_diff": round(float(np.abs(a - src).mean()), 3),
            "yuv_vs_source_mean_abs_diff": round(float(np.abs(b - src).mean()), 3)}


# ----------------------------------------------------------------------------- output
TABLE = Table([
    Column("case", 28, "case", align="<"), Column("jobs", 5, "jobs"),
    Column("frames", 8, "frames"), Column("wall s", 9, "wall_s", ".2f"),
    Column("frames/s", 10, "fps", ".1f"), Column("proc s", 10, "proc_mean_s", ".3f"),
    Column("cpu ms/frame", 13, "cpu_ms_per_frame", ".3f"),
])


def _print_table(result: dict[str, Any]) -> None:
    m = result["machine"]
    TABLE.print(result["rows"], title=f"\n{m['host']}: {m['cpu_count']} cpus, {m['ffmpeg']}")
    for k, v in result.get("sanity", {}).items():
        print(f"{k} {v}")


if __name__ == "__main__":
    main()
