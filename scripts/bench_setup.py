"""What a user waits for, set-up included: keypoint positions of an archive imported from
flygym ``.npz`` files, and renders from the moment the process starts to its first frame.

Every headline is a whole call or a whole process; the pipeline and the set-up are
columns beside it. Rows:

- ``positions``: ``flyarchive.load_positions(url, backend=...)`` of every body of
  NeuroMechFly (49 besides the world) over ``--worlds`` x ``--frames`` float64 frames of
  an archive imported through flyarchive's own flygym ``.npz`` import (``import_npz``:
  chunks of 1 world x 100 frames in shards of 64 worlds, the model kept beside it), the
  kept model used (no ``model=``):

  - ``fresh process, first call``: a new Python process imports flyarchive, then
    calls (Warp, mujoco-warp, the CUDA context, the engine and the kept model all
    loaded by the call; kernels from Warp's cache: a warm-up process ran first);
    ``process s`` is from the process's start to the result;
  - ``first call, engine built``: in this process, the engines dropped first
    (``clear_engines``): imports and kernel modules are loaded, the engine (device
    model, data, pinned slots) is built by the call;
  - ``second call, engine kept``: the median of ``--repeat`` calls after it;
  - ``lazy compute, second``: ``flyarchive.positions(url, backend=...).compute()``.

  Columns: whole-call seconds and frames/s (the headline), the pipeline's seconds and
  frames/s (first read to last copy), the set-up (engine found or built, readers
  started), the preparation (archive opened, model and keypoints found), and whether
  the engine was built or kept.
- ``render``: ``flyarchive render URL --backend B`` as a subprocess (the kept model, a
  ``--render-worlds`` x ``--render-frames`` float32 archive, 240x320): seconds from the
  process's start to its first frame handed to an encoder (any process of its tree:
  Dask workers too; found by a ``sitecustomize`` written to a temporary folder on
  ``PYTHONPATH``, which notes the first ``OutputWriter.write`` of each process), and to
  its exit; the median of ``--repeat`` runs after a warm-up run (kernels compiled, the
  model's safety verdict kept; ``MUJOCO_GL`` as the caller set it: flyarchive's OpenGL
  renders use EGL on Linux either way). ``imports`` gives the cumulative import seconds of the
  heaviest packages in one more run (``python -X importtime``), the floor of the start.
- on ``--device cuda`` also ``bench_gpu_replay.py --only-cli --cli cli`` in a
  subprocess: ``flyarchive render --backend gpu`` whole process against the GPU stage's
  frame rate (``pipelined``); its ``cli / pipelined`` ratio is a target.

Targets (printed met or missed; from issue 36): positions second call >= 3 M frames/s,
first call (engine built) >= 1 M frames/s, the engine built in <= 0.5 s, the fresh
process's first call <= 2 s (CUDA); a render's first frame <= 2.5 s on the GPU and
<= 1.5 s on the CPU (OpenGL, warp-cpu); ``cli / pipelined`` >= 0.9.

NeuroMechFly on a host without flygym: ``--export DIR`` (here, with flygym) writes
``DIR/nmf.zip`` (its portable form: the spec zip with its meshes inside; compiles on
MuJoCo 3.16 and 4.0.1 alike) and the walks under ``DIR/walks``; there, ``--model-file DIR/nmf.zip
--cache DIR`` builds the archives from them (they are cached in ``DIR``, named by the
MuJoCo release, whose MJB the archives keep).

Usage::

    python scripts/bench_setup.py --export .gpu-bench            # here, with flygym
    python scripts/bench_setup.py --device cuda --model-file .gpu-bench/nmf.zip \\
        --cache .gpu-bench --json setup-gpu.json                  # a GPU host
    python scripts/bench_setup.py --device cpu --json setup-cpu.json   # the 2-core VM

Defaults: ``--worlds`` 4096 on CUDA, 256 on the CPU; ``--frames`` 250; ``--repeat`` 3;
``--render-worlds`` 16 on CUDA, 2 on the CPU; ``--render-frames`` 100;
``--render-backends`` ``gpu`` on CUDA, ``opengl,warp-cpu`` on the CPU (each with its
default placement: OpenGL on a local Dask cluster of one worker per core, warp-cpu on
render threads in the process; ``opengl-here`` is ``--workers 0``, one thread;
``opengl-dask`` is ``--workers`` one per core, as the default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    positive_int,
    NMF_CAMERA,
    Column,
    Jitter,
    Table,
    add_json_option,
    cached_archive,
    export_nmf,
    host_info,
    imported_archive,
    nmf_states,
    nmf_world,
    write_json,
)

JITTER = Jitter(start_margin=200, xy_mm=5.0, angle_bias_rad=0.01)  # bench_positions' walks
#: Walk lengths the archives are made from (``--frames`` + the jitter's margin; renders;
#: bench_gpu_replay.py's 100 frames, unjittered start).
WALKS = (250 + JITTER.start_margin, 100 + JITTER.start_margin, 100)
SIZE = (240, 320)
#: Packages whose cumulative import time the ``imports`` line reports.
IMPORTS = ("mujoco_warp", "warp", "mujoco", "zarr", "xarray", "dask.array", "distributed",
           "numpy", "flyarchive.store", "flyarchive.render.warp_pipeline", "flyarchive.replay.warp_frames",
           "flyarchive.distribute.api", "flyarchive.cli")

#: Written to a temporary folder put first on PYTHONPATH of the rendering processes:
#: notes the wall time of each process's first frame handed to a writer.
PROBE = '''\
import os, sys, time, importlib.abc, importlib.util
_OUT = os.environ.get("FLYARCHIVE_BENCH_FIRST_FRAME")
class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "flyarchive.video.output_files":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            write = module.OutputWriter.write
            def first(self, *args, **kwargs):
                module.OutputWriter.write = write
                with open(_OUT, "a") as f:
                    f.write(f"{time.time()!r} {os.getpid()}\\n")
                return write(self, *args, **kwargs)
            module.OutputWriter.write = first
        spec.loader.exec_module = exec_module
        return spec
if _OUT:
    sys.meta_path.insert(0, _Hook())
'''


# ----------------------------------------------------------------------------- positions
#: A fresh process's first call: run as ``python -c CHILD URL BACKEND``; prints JSON.
CHILD = """
import os, sys, time, json
with open("/proc/self/stat") as f:
    ticks = int(f.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as f:
    started = time.perf_counter() - (float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
t0 = time.perf_counter()
import flyarchive
from flyarchive.analyze.warp_stream import StreamStats
imported = time.perf_counter()
stats = StreamStats()
flyarchive.load_positions(sys.argv[1], backend=sys.argv[2], stats=stats)
done = time.perf_counter()
print(json.dumps({"interpreter_s": t0 - started, "import_flyarchive_s": imported - t0,
                  "process_s": done - started, "call_s": done - imported,
                  "frames": stats.frames, "pipeline_s": stats.seconds,
                  "setup_s": stats.setup_seconds, "prepare_s": stats.prepare_seconds,
                  "engine": stats.engine, "reader": stats.reader}))
"""


def _stats(stats: Any, call_s: float) -> dict[str, Any]:
    return {"call_s": call_s, "frames": stats.frames, "frames_per_s": stats.frames / call_s,
            "pipeline_s": stats.seconds, "pipeline_frames_per_s": stats.frames / stats.seconds,
            "setup_s": stats.setup_seconds, "prepare_s": stats.prepare_seconds,
            "engine": stats.engine, "reader": stats.reader}


def positions_rows(url: str, backend: str, repeat: int) -> list[dict[str, Any]]:
    import flyarchive
    from flyarchive.analyze.warp_positions import clear_engines
    from flyarchive.analyze.warp_stream import StreamStats

    command = [sys.executable, "-c", CHILD, url, backend]
    print("positions: a warm-up process (kernels compiled when Warp's cache lacks them)...",
          flush=True)
    warm = subprocess.run(command, capture_output=True, text=True)
    if warm.returncode:
        raise RuntimeError(f"the warm-up process failed: {warm.stderr.strip()[-800:]}")
    fresh = []
    for _ in range(repeat):
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        run = json.loads(done.stdout.strip().splitlines()[-1])
        fresh.append({**run, "frames_per_s": run["frames"] / run["call_s"],
                      "pipeline_frames_per_s": run["frames"] / run["pipeline_s"]})
    rows = [{"row": f"fresh process, first call (median of {repeat})",
             **_median(fresh, "process_s")}]

    def call() -> dict[str, Any]:
        stats = StreamStats()
        t0 = time.perf_counter()
        flyarchive.load_positions(url, backend=backend, stats=stats)
        return _stats(stats, time.perf_counter() - t0)

    call()  # this process: imports, CUDA context, kernel modules, the kept model
    clear_engines()
    rows.append({"row": "first call, engine built", **call()})
    kept = [call() for _ in range(repeat)]
    rows.append({"row": f"second call, engine kept (median of {repeat})",
                 **_median(kept, "call_s"), "best_frames_per_s": max(r["frames_per_s"] for r in kept)})
    lazy = flyarchive.positions(url, backend=backend, stored=False)
    lazy.compute()
    t0 = time.perf_counter()
    flyarchive.positions(url, backend=backend, stored=False).compute()
    seconds = time.perf_counter() - t0
    rows.append({"row": "lazy positions(...).compute(), second", "call_s": seconds,
                 "frames": int(lazy.shape[0] * lazy.shape[1]),
                 "frames_per_s": lazy.shape[0] * lazy.shape[1] / seconds})
    return rows


def _median(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The row of the median ``key`` (the lower one of an even count), with every run's."""
    ordered = sorted(rows, key=lambda r: r[key])
    return {**ordered[(len(ordered) - 1) // 2], f"runs_{key}": [r[key] for r in rows]}


# ----------------------------------------------------------------------------- renders
def render_command(url: str, out: str, backend: str) -> list[str]:
    name = "opengl" if backend.startswith("opengl") else backend
    workers = {"opengl-here": "0", "opengl-dask": str(os.cpu_count() or 1)}.get(backend)
    return [sys.executable, "-c", "from flyarchive.cli import run; run()", "render", url,
            "--camera", NMF_CAMERA, "--size", f"{SIZE[0]}x{SIZE[1]}", "--backend", name,
            "--out", out, "--quiet", "--overwrite",
            *(["--workers", workers] if workers else []),
            *(["--gpus", "0"] if backend == "gpu" else [])]


def render_once(url: str, backend: str, folder: Path, probe: Path) -> dict[str, Any]:
    """One ``flyarchive render`` process: seconds to its first frame and to its exit."""
    marks = folder / f"first-{time.monotonic_ns()}.txt"
    env = {**os.environ, "FLYARCHIVE_BENCH_FIRST_FRAME": str(marks),
           "PYTHONPATH": os.pathsep.join([str(probe), *filter(None, [os.environ.get("PYTHONPATH")])])}
    start = time.time()
    done = subprocess.run(render_command(url, str(folder / "videos"), backend), env=env,
                          capture_output=True, text=True)
    exited = time.time() - start
    if done.returncode:
        return {"error": done.stderr.strip()[-400:]}
    firsts = [float(line.split()[0]) for line in marks.read_text().splitlines()] \
        if marks.exists() else []
    return {"first_frame_s": min(firsts) - start if firsts else None, "process_s": exited}


def import_seconds(url: str, backend: str, folder: Path) -> dict[str, float]:
    """Cumulative import seconds of :data:`IMPORTS` in one render process (-X importtime)."""
    command = render_command(url, str(folder / "videos"), backend)
    done = subprocess.run([command[0], "-X", "importtime", *command[1:]], capture_output=True,
                          text=True)
    found: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split("|"))
        if name in IMPORTS and cumulative.isdigit():
            found[name] = max(found.get(name, 0.0), int(cumulative) / 1e6)
    return found


def render_rows(url: str, backends: list[str], repeat: int, frames: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-setup-") as tmp:
        probe = Path(tmp) / "probe"
        probe.mkdir()
        (probe / "sitecustomize.py").write_text(PROBE)
        for backend in backends:
            folder = Path(tmp) / backend
            folder.mkdir()
            print(f"render {backend}: a warm-up process...", flush=True)
            warm = render_once(url, backend, folder, probe)
            if "error" in warm:
                rows.append({"row": f"render --backend {backend}", **warm})
                continue
            runs = [render_once(url, backend, folder, probe) for _ in range(repeat)]
            ok = [r for r in runs if "error" not in r and r["first_frame_s"] is not None]
            if not ok:
                rows.append({"row": f"render --backend {backend}", **runs[-1]})
                continue
            row = _median(ok, "first_frame_s")
            rows.append({"row": f"render --backend {backend} (median of {len(ok)})", **row,
                         "frames": frames, "frames_per_s": frames / row["process_s"],
                         "imports": import_seconds(url, backend, folder)})
    return rows


def replay_ratio(args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    """``bench_gpu_replay.py --only-cli --cli cli`` in a subprocess: its JSON."""
    out = cache / "gpu-replay.json"
    command = [sys.executable, str(Path(__file__).with_name("bench_gpu_replay.py")),
               "--device", "cuda", "--only-cli", "--cli", "cli", "--no-flygym",
               "--worlds", str(args.replay_worlds), "--frames", "100",
               "--cache", str(cache / "walks"), "--json", str(out)]
    if args.model_file:
        command += ["--model-file", str(args.model_file)]
    print("bench_gpu_replay.py --only-cli ...", flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip()[-600:]}
    return json.loads(out.read_text())


# ----------------------------------------------------------------------------- output
TABLE = Table([
    Column("what", 44, "row", align="<"),
    Column("call s", 7, "call_s", ".3f"),
    Column("frames/s", 11, "frames_per_s", ",.1f"),
    Column("process s", 9, "process_s", ".2f"),
    Column("1st frame", 9, "first_frame_s", ".2f"),
    Column("pipe s", 7, "pipeline_s", ".3f"),
    Column("pipe f/s", 11, "pipeline_frames_per_s", ",.1f"),
    Column("setup s", 7, "setup_s", ".3f"),
    Column("prep s", 7, "prepare_s", ".3f"),
    Column("engine", 6, "engine", align="<"),
])


def targets(rows: list[dict[str, Any]], device: str, replay: dict[str, Any] | None
            ) -> list[dict[str, Any]]:
    by = {r["row"].split(" (")[0]: r for r in rows}
    checks: list[tuple[str, Any, str, float]] = []
    if device == "cuda":
        checks += [
            ("positions, second call >= 3 M frames/s",
             by.get("second call, engine kept", {}).get("frames_per_s"), ">=", 3e6),
            ("positions, first call (engine built) >= 1 M frames/s",
             by.get("first call, engine built", {}).get("frames_per_s"), ">=", 1e6),
            ("positions, engine built in <= 0.5 s",
             by.get("first call, engine built", {}).get("setup_s"), "<=", 0.5),
            ("positions, fresh process's first call <= 2 s",
             by.get("fresh process, first call", {}).get("call_s"), "<=", 2.0),
            ("render --backend gpu: first frame <= 2.5 s",
             by.get("render --backend gpu", {}).get("first_frame_s"), "<=", 2.5),
            ("render --backend gpu whole process >= 0.9 of the GPU stage",
             (replay or {}).get("ratios", {}).get("cli/pipelined"), ">=", 0.9)]
    else:
        for backend in ("opengl", "opengl-here", "opengl-dask", "warp-cpu"):
            checks.append((f"render --backend {backend}: first frame <= 1.5 s",
                           by.get(f"render --backend {backend}", {}).get("first_frame_s"),
                           "<=", 1.5))
    out = []
    for text, value, op, wanted in checks:
        met = None if value is None else (value >= wanted if op == ">=" else value <= wanted)
        out.append({"target": text, "measured": value, "met": met})
    return out


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cpu")
    parser.add_argument("--worlds", type=positive_int)
    parser.add_argument("--frames", type=positive_int, default=250)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--render-worlds", type=positive_int)
    parser.add_argument("--render-frames", type=positive_int, default=100)
    parser.add_argument("--render-backends")
    parser.add_argument("--replay-worlds", type=positive_int, default=128,
                        help="worlds of bench_gpu_replay.py's archive (CUDA)")
    parser.add_argument("--only", default="positions,render,replay",
                        help="sections: positions, render, replay (CUDA)")
    parser.add_argument("--model-file", type=Path,
                        help="NeuroMechFly from this file (.zip from --export, .mjb, .xml) "
                             "instead of flygym's build_world; the walks in --cache/walks")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flyarchive-bench-setup"))
    parser.add_argument("--export", type=Path, metavar="DIR",
                        help="write NeuroMechFly's spec zip and walks to DIR and stop")
    add_json_option(parser)
    args = parser.parse_args()
    if args.export:
        print(export_nmf(args.export, WALKS))
        return
    cuda = args.device == "cuda"
    only = set(args.only.split(","))
    worlds = args.worlds or (4096 if cuda else 256)
    render_worlds = args.render_worlds or (16 if cuda else 2)
    backends = (args.render_backends or ("gpu" if cuda else "opengl,warp-cpu")).split(",")
    import mujoco

    world = nmf_world(args.model_file)
    walks = args.cache / "walks"
    rows: list[dict[str, Any]] = []
    print(TABLE.header(), flush=True)

    def save(section: list[dict[str, Any]], replay: dict[str, Any] | None = None) -> None:
        """Print a section's rows and write the JSON so far (a run cut short keeps them)."""
        rows.extend(section)
        for row in section:
            print(TABLE.line(row), flush=True)
        write_json(args.json, {"host": host_info(), "load_average": os.getloadavg(),
                               "args": {k: str(v) for k, v in vars(args).items()},
                               "rows": rows, "replay": replay,
                               "targets": targets(rows, args.device, replay)})

    if "positions" in only:
        url = imported_archive(
            args.cache, f"imported-{worlds}x{args.frames}-float64-mujoco{mujoco.__version__}",
            world.model, lambda: nmf_states(worlds, args.frames, world=world, jitter=JITTER,
                                            dtype="float64", cache=walks))
        save(positions_rows(url, "gpu" if cuda else "warp-cpu", args.repeat))
    if "render" in only:
        url = cached_archive(
            args.cache, f"render-{render_worlds}x{args.render_frames}-float32-mujoco"
                        f"{mujoco.__version__}", world.model,
            lambda: nmf_states(render_worlds, args.render_frames, world=world, jitter=JITTER,
                               dtype="float32", cache=walks), keep_model=True,
            shard_worlds=min(64, render_worlds))
        save(render_rows(url, backends, args.repeat, render_worlds * args.render_frames))
    replay = replay_ratio(args, args.cache) if cuda and "replay" in only else None
    save([], replay)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    TABLE.print(rows, title=f"\nSet-up included ({args.device}, {len(os.sched_getaffinity(0))} "
                            f"cores, load average {load})")
    for row in rows:
        if row.get("imports"):
            print(f"  imports of {row['row'].split(' (')[0]}: " + ", ".join(
                f"{k} {v:.2f} s" for k, v in sorted(row["imports"].items(), key=lambda kv: -kv[1])))
        if row.get("error"):
            print(f"  {row['row']}: {row['error']}")
    if replay is not None:
        print(f"  bench_gpu_replay --only-cli: ratios {replay.get('ratios')}"
              + (f", error {replay['error']}" if "error" in replay else ""))
    for t in targets(rows, args.device, replay):
        verdict = "n/a" if t["met"] is None else "met" if t["met"] else "MISSED"
        print(f"  {t['target']:62} {t['measured']!s:>12.12} {verdict}")


if __name__ == "__main__":
    main()
