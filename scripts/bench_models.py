"""What the safety check of a kept model costs, the first time and once its verdict is kept;
and what a kept portable model costs: to make, and to open on a new MuJoCo release.

A model kept beside an archive (``models/<sha256>.mjb``) is loaded first in a short-lived
child process (:mod:`flyarchive.models.check`); the verdict is kept by hash in the
cache folder. For the tiny test model and NeuroMechFly (``flyarchive.interop.nmf``;
needs flygym), this times, best and median of ``--repeat`` runs:

- ``child_start_s``: the child's floor: an isolated interpreter that imports MuJoCo
  (without OpenGL) and exits;
- ``first_s``: :func:`check_model` with no verdict kept (that child, plus loading the
  model, its MjData, one kinematics pass and a scene update, plus writing the verdict);
- ``cached_ms``: :func:`check_model` in a new process with the verdict kept (reading one
  small JSON file), and ``known_ms`` with the verdict known in this process (both given
  the model's SHA-256, as the reader of a kept model has it);
- ``load_here_s``: loading the MJB in this process (what any use of the model costs);
- ``kept_first_s`` and ``kept_cached_s``: ``flyarchive.load_kept_model(archive)`` whole (read
  and hash the kept model, check it, load it), without and with a kept verdict;
- ``child_maxrss_mb``: the child's peak resident memory.

The second table is the portable form (issue 32). "A new release" is this one opening an
archive whose MJB says another release wrote it (its header edited:
:func:`flyarchive.testing.spec_zips.as_another_release`): it cannot load the MJB, so it
compiles the portable form, as MuJoCo 4.0.1 does with a 3.16 archive.

- ``make_s``: :func:`flyarchive.models.portable_model` of the model's source (the tiny
  MJCF; NeuroMechFly's MjSpec, flygym's ``world.mjcf_root``), what a recorder adds to its
  construction (read the files, write the XML, zip, compile the zip to check it);
- ``zip_mb``: the spec zip's size;
- ``first_open_s`` (headline): ``flyarchive.load_kept_model(archive)`` on a new release with
  nothing in the cache, the whole call (open the archive, read and hash the zip, compile
  and check it in a child process, keep the MJB, load it here, check the layout); beside
  it ``compile_child_s``, the child's share;
- ``later_open_s`` (headline): the same call once the compiled model is kept (as in a new
  process: nothing known in this one); beside it ``load_mjb_s``, loading the compiled MJB
  here;
- ``first_open_cpu_s``, ``later_open_cpu_s``: the CPU seconds of those calls, this process
  and its child together: what they cost on a machine that is busy with other work (their
  wall time there is longer).

Usage::

    python scripts/bench_models.py [--models tiny,nmf] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

from benchlib import (  # noqa: E402
    Column,
    Table,
    add_json_option,
    host_info,
    listed,
    positive_int,
    write_json,
)

TABLE = Table([
    Column("model", 5, "model", align="<"), Column("MJB MB", 6, "mjb_mb", ".2f"),
    Column("child start s", 13, "child_start_s", ".3f"), Column("first s", 7, "first_s", ".3f"),
    Column("cached ms", 9, "cached_ms", ".3f"), Column("known ms", 8, "known_ms", ".4f"),
    Column("load here s", 11, "load_here_s", ".3f"),
    Column("kept first s", 12, "kept_first_s", ".3f"),
    Column("kept cached s", 13, "kept_cached_s", ".3f"),
    Column("child MiB", 9, "child_maxrss_mb", ".0f"),
])


def _times(run: Callable[[], Any], repeat: int, setup: Callable[[], Any] = lambda: None,
           cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of ``repeat`` runs (each after ``setup``); with ``cpu``, the CPU seconds
    of each run (this process and the child processes it waited for) are appended to it."""
    out = []
    for _ in range(repeat):
        setup()
        before = _cpu_seconds()
        start = time.perf_counter()
        run()
        out.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(_cpu_seconds() - before)
    return out


def _cpu_seconds() -> float:
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _model(name: str) -> Any:
    if name == "tiny":
        from flyarchive.testing import tiny_model

        return tiny_model()
    from flyarchive.interop.nmf import build_world

    return build_world().model


def _archive(model: Any, folder: Path) -> str:
    """A small archive that keeps ``model``: 1 world, a few frames."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate

    url = str(folder / "run.zarr")
    with TrajectoryRecorder(url, model, output_fps=25, playback_speed=1.0) as recorder:
        simulate(model, 1, 3, recorder.record_as_needed)
    return url


PORTABLE = Table([
    Column("model", 5, "model", align="<"), Column("zip MB", 6, "zip_mb", ".2f"),
    Column("make s", 6, "make_s", ".3f"), Column("first open s", 12, "first_open_s", ".3f"),
    Column("compile child s", 15, "compile_child_s", ".3f"),
    Column("first CPU s", 11, "first_open_cpu_s", ".3f"),
    Column("later open s", 12, "later_open_s", ".3f"), Column("later CPU s", 11, "later_open_cpu_s", ".3f"),
    Column("load MJB s", 10, "load_mjb_s", ".3f"),
])


def _source(name: str) -> tuple[Any, Any]:
    """The model and its portable source: the tiny MJCF text in a file, NeuroMechFly's spec."""
    if name == "tiny":
        from flyarchive.testing import TINY_XML, tiny_model

        path = Path(tempfile.mkdtemp(prefix="flyarchive-bench-tiny-")) / "tiny.xml"
        path.write_text(TINY_XML)
        return tiny_model(), path
    from flyarchive.interop.nmf import build_world

    world = build_world()
    return world.model, world.spec


def measure_portable(name: str, repeat: int, folder: Path) -> dict[str, Any]:
    import flyarchive
    from flyarchive.models import load_mjb, portable_model
    from flyarchive.models import check as model_check
    from flyarchive.testing import simulate
    from flyarchive.testing.spec_zips import as_another_release

    model, source = _source(name)
    make = _times(lambda: portable_model(source, model=model), repeat)
    url = str(folder / "portable.zarr")
    with flyarchive.TrajectoryRecorder(url, model, output_fps=25, playback_speed=1.0,
                                       model_source=source) as recorder:
        simulate(model, 1, 3, recorder.record_as_needed)
    as_another_release(url)
    kept = portable_model(source, model=model)
    caches = iter(range(10**6))
    children: list[float] = []
    real = model_check.compile_in_child

    def timed_child(*args: Any, **kwargs: Any) -> Any:
        verdict, compiled = real(*args, **kwargs)
        children.append(verdict.seconds)
        return verdict, compiled

    def fresh_cache() -> None:  # a release that never compiled this model
        os.environ["FLYARCHIVE_CACHE_DIR"] = str(folder / f"cache-{next(caches)}")
        model_check.forget()

    def as_new_process() -> None:
        model_check.forget()

    model_check.compile_in_child = timed_child
    first_cpu: list[float] = []
    later_cpu: list[float] = []
    try:
        first = _times(lambda: flyarchive.load_kept_model(url), repeat, fresh_cache, first_cpu)
        later = _times(lambda: flyarchive.load_kept_model(url), repeat * 4, as_new_process, later_cpu)
    finally:
        model_check.compile_in_child = real
    compiled = model_check.compiled_path(kept.sha256).read_bytes()
    here = _times(lambda: load_mjb(compiled), repeat)
    return {
        "model": name, "zip_bytes": len(kept.blob), "zip_mb": len(kept.blob) / 1e6,
        "make_s": min(make), "first_open_s": min(first), "compile_child_s": min(children),
        "first_open_cpu_s": min(first_cpu), "later_open_s": min(later),
        "later_open_cpu_s": min(later_cpu), "load_mjb_s": min(here),
        "median": {"make_s": statistics.median(make), "first_open_s": statistics.median(first),
                   "compile_child_s": statistics.median(children),
                   "later_open_s": statistics.median(later)},
        "targets": {"first_open_s": 3.0, "later_open_s": 0.2},
    }


def measure(name: str, repeat: int, folder: Path) -> dict[str, Any]:
    import flyarchive
    from flyarchive.models import load_mjb, model_bytes
    from flyarchive.models import check as model_check

    model = _model(name)
    blob = model_bytes(model)
    digest = hashlib.sha256(blob).hexdigest()  # a kept model's reader has it already
    caches = iter(range(10**6))
    cache = folder / "cache"

    def fresh_cache() -> None:  # no verdict kept anywhere
        nonlocal cache
        cache = folder / f"cache-{next(caches)}"
        os.environ["FLYARCHIVE_CACHE_DIR"] = str(cache)
        model_check.forget()

    child = [sys.executable, "-I", "-c", "import mujoco"]
    env = {**os.environ, "MUJOCO_GL": "disable"}
    start = _times(lambda: subprocess.run(child, env=env, check=True), repeat)
    def check() -> None:
        model_check.check_model(blob, name, sha256=digest, cache=cache)

    first = _times(check, repeat, fresh_cache)
    cached = _times(check, repeat * 20, model_check.forget)
    known = _times(check, repeat * 20)
    here = _times(lambda: load_mjb(blob), repeat)
    url = _archive(model, folder)
    kept_first = _times(lambda: flyarchive.load_kept_model(url), repeat, fresh_cache)
    kept_cached = _times(lambda: flyarchive.load_kept_model(url), repeat, model_check.forget)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    row = {
        "model": name, "mjb_bytes": len(blob), "mjb_mb": len(blob) / 1e6,
        "child_start_s": min(start), "first_s": min(first), "cached_ms": 1e3 * min(cached),
        "known_ms": 1e3 * min(known), "load_here_s": min(here), "kept_first_s": min(kept_first),
        "kept_cached_s": min(kept_cached), "child_maxrss_mb": rss,
        "median": {"child_start_s": statistics.median(start), "first_s": statistics.median(first),
                   "cached_ms": 1e3 * statistics.median(cached),
                   "kept_first_s": statistics.median(kept_first),
                   "kept_cached_s": statistics.median(kept_cached)},
        "child_memory_cap_bytes": model_check.child_memory(len(blob)),
    }
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--models", default="tiny,nmf", type=listed("tiny", "nmf"),
                        help="comma-separated: tiny,nmf")
    parser.add_argument("--repeat", type=positive_int, default=5,
                        help="runs per timing (best shown)")
    add_json_option(parser)
    parser.add_argument("--only", choices=("check", "portable"),
                        help="run one of the two tables (default both)")
    args = parser.parse_args(argv)
    info = host_info()
    rows, portable = [], []
    with tempfile.TemporaryDirectory(prefix="flyarchive-bench-models-") as tmp:
        for name in (n.strip() for n in args.models.split(",") if n.strip()):
            folder = Path(tmp) / name
            folder.mkdir()
            if args.only in (None, "check"):
                rows.append(measure(name, args.repeat, folder))
            if args.only in (None, "portable"):
                portable.append(measure_portable(name, args.repeat, folder))
    where = f"on {info['host']}, {info['cpus']} CPUs, load {info.get('loadavg')}"
    if rows:
        TABLE.print(rows, title=f"\nModel check (best of {args.repeat}; cached/known: best of "
                                f"{args.repeat * 20}) {where}")
    if portable:
        PORTABLE.print(portable, title=f"\nPortable model on a new MuJoCo release (best of "
                                       f"{args.repeat}; later: of {args.repeat * 4}) {where}; "
                                       "targets for NeuroMechFly: first open <= 3 s, later <= 0.2 s")
    print("\nmedians: " + "; ".join(f"{r['model']}: " + ", ".join(
        f"{k} {v:.3f}" for k, v in r["median"].items()) for r in [*rows, *portable]))
    write_json(args.json, {"host_info": info, "repeat": args.repeat, "rows": rows,
                           "portable": portable})
    return 0


if __name__ == "__main__":
    sys.exit(main())
