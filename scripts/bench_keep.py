"""What keeping positions costs, and what holding them to the states' guarantees adds
(issue 33): ``flyarchive positions URL`` the first time, run again on a sound group (every
committed chunk of the group read back and checked), run again after one shard of the group
was deleted (that shard recomputed), reading the kept positions, and ``verify`` of the
archive with and without its derived group.

The data: NeuroMechFly walking (73 dofs, all 50 bodies kept) as ``bench_positions.py`` makes
it (``benchlib.nmf_states``, chunks of 1 world x 100 frames in shards of 64 worlds, kept
under ``--cache``), or with ``--tiny`` random states of the tiny model
(:func:`flyarchive.testing.synthetic.write_random`; no flygym needed). Each row is the
whole call a user makes, in this process, the best of ``--repeat`` (wall seconds and this
process's CPU seconds); ``x first keep`` is its ratio to the first keep. On a shared
machine the wall times are only as good as the load average in the title.

Usage::

    python scripts/bench_keep.py [--worlds 64] [--frames 1000] [--tiny] [--repeat 2]
        [--cache /tmp/flyarchive-bench-positions] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import Column, Jitter, Table, add_json_option, cached_archive, host_info, nmf_states
from benchlib import positive_int, write_json

import flyarchive

TABLE = Table([
    Column("call", 44, "call", align="<"), Column("wall s", 8, "wall_s", ".3f"),
    Column("CPU s", 7, "cpu_s", ".3f"), Column("x first keep", 12, "ratio", ".2f"),
])
JITTER = Jitter(start_margin=200, xy_mm=5.0, angle_bias_rad=0.01)


def timed(call: Callable[[], Any], repeat: int, before: Callable[[], Any] | None = None
          ) -> dict[str, float]:
    """Best wall and CPU seconds of ``repeat`` calls (``before()`` untimed before each)."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        if before is not None:
            before()
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return {"wall_s": wall, "cpu_s": cpu}


def source_archive(args: argparse.Namespace, folder: Path) -> tuple[str, Any]:
    """The archive and its model (the benchmark archives keep none: it is passed)."""
    if args.tiny:
        from flyarchive.testing import tiny_model
        from flyarchive.testing.synthetic import write_random

        url = str(folder / "tiny.zarr")
        write_random(url, args.worlds, args.frames, chunk_frames=100)
        return url, tiny_model()
    from flyarchive.interop.nmf import build_world

    world = build_world()
    states = lambda: nmf_states(args.worlds, args.frames, world=world, jitter=JITTER,  # noqa: E731
                                cache=args.cache / "walks")
    return cached_archive(args.cache, f"nmf-{args.worlds}x{args.frames}-float64", world.model,
                          states, chunk_frames=100, shard_worlds=64), world.model


def rows(url: str, model: Any, repeat: int) -> list[dict[str, Any]]:
    from flyarchive.store.derived import derived_url

    derived = Path(url) / "derived"

    def forget() -> None:
        shutil.rmtree(derived, ignore_errors=True)

    first = timed(lambda: flyarchive.keep_positions(url, model=model), repeat, before=forget)
    group = flyarchive.keep_positions(url, model=model)
    name = group.rsplit("/", 1)[1]
    shard = Path(derived_url(url, name)) / "position" / "c" / "0" / "1" / "0" / "0"
    found: list[dict[str, Any]] = [
        {"call": "keep_positions, first", **first},
        {"call": "keep_positions again, sound (checked)",
         **timed(lambda: flyarchive.keep_positions(url, model=model), repeat)},
        {"call": "keep_positions again, one shard deleted",
         **timed(lambda: flyarchive.keep_positions(url, model=model), repeat,
                 before=lambda: shard.unlink(missing_ok=True))},
        {"call": "positions(url).compute(), kept (read)",
         **timed(lambda: flyarchive.positions(url, model=model).compute(), repeat)},
        {"call": "positions(url, stored=False).compute()",
         **timed(lambda: flyarchive.positions(url, model=model, stored=False).compute(), repeat)},
        {"call": "verify, with the derived group",
         **timed(lambda: flyarchive.verify(url), repeat)},
    ]
    shutil.move(str(derived), str(derived) + ".aside")
    found.append({"call": "verify, without it",
                  **timed(lambda: flyarchive.verify(url), repeat)})
    shutil.move(str(derived) + ".aside", str(derived))
    for row in found:
        row["ratio"] = row["wall_s"] / first["wall_s"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=positive_int, default=64)
    parser.add_argument("--frames", type=positive_int, default=1000)
    parser.add_argument("--tiny", action="store_true", help="random states of the tiny model")
    parser.add_argument("--repeat", type=positive_int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flyarchive-bench-positions"))
    add_json_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source, model = source_archive(args, Path(tmp))
        url = str(Path(tmp) / "kept.zarr")
        shutil.copytree(source, url)
        shutil.rmtree(Path(url) / "derived", ignore_errors=True)
        found = rows(url, model, args.repeat)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    model = "tiny model, random states" if args.tiny else "NeuroMechFly, 50 bodies"
    TABLE.print(found, title=f"keep positions: {args.worlds} worlds x {args.frames} frames, "
                f"{model} (load {load})")
    write_json(args.json, {"host": host_info(), "worlds": args.worlds, "frames": args.frames,
                           "model": model, "rows": found})


if __name__ == "__main__":
    main()
