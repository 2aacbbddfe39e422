"""What opening an archive costs: ``open_archive`` and ``open_header``, on disk and on a
loopback S3 server (moto), with the requests each open makes.

On S3 the opens go through a counting proxy (:class:`flyarchive.testing.faultproxy.FaultProxy`)
that can delay every request by ``--latency-ms`` (as a distant bucket would): an open
costs one round trip for the root ``zarr.json`` and one round for ``n_frames``, the
coordinates and every array's own ``zarr.json`` (compared with the consolidated copy:
:mod:`flyarchive.store.replicas`), so its time is about two latencies plus the local work.
The archive: ``--worlds`` x ``--frames`` random states of the tiny model
(:func:`flyarchive.testing.synthetic.write_random`). Times are the median and the best
of ``--repeat`` opens, after one warm-up open, and the median CPU time of the process
per open (on a loaded machine, the work without the waiting).

Compare two trees with the same script: ``PYTHONPATH=<tree> python scripts/bench_open.py``.

Usage::

    python scripts/bench_open.py [--worlds 64] [--frames 40] [--repeat 30]
        [--latency-ms 0,20] [--no-s3] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import numbers, Column, Table, add_json_option, host_info, positive_int, write_json

import flyarchive
from flyarchive import open_archive
from flyarchive.store.dataset import open_header

TABLE = Table([
    Column("where", 6, "where", align="<"), Column("latency ms", 10, "latency_ms"),
    Column("call", 12, "call", align="<"), Column("median ms", 9, "median_ms", ".2f"),
    Column("best ms", 8, "best_ms", ".2f"), Column("CPU ms", 7, "cpu_ms", ".2f"),
    Column("requests", 8, "requests"),
])
CALLS: dict[str, Callable[..., Any]] = {"open_archive": open_archive, "open_header": open_header}


def timed(call: Callable[..., Any], url: str, options: dict[str, Any] | None,
          repeat: int) -> dict[str, float]:
    """Median and best wall milliseconds of ``repeat`` calls, after one warm-up call, and
    the median CPU milliseconds of this process (all its threads: on a loaded machine the
    work itself, without the waiting)."""
    call(url, options)
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        call(url, options)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"median_ms": statistics.median(wall) * 1e3, "best_ms": min(wall) * 1e3,
            "cpu_ms": statistics.median(cpu) * 1e3}


def local_rows(folder: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    from flyarchive.testing.synthetic import write_random

    url = str(folder / "open.zarr")
    write_random(url, n_worlds=args.worlds, n_frames=args.frames)
    rows = []
    for name, call in CALLS.items():
        rows.append({"where": "disk", "call": name, **timed(call, url, None, args.repeat)})
    return rows


def s3_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from flyarchive.testing.faultproxy import FaultPlan, FaultProxy
    from flyarchive.testing.s3 import S3Server
    from flyarchive.testing.synthetic import write_random

    rows = []
    with S3Server() as server:
        server.create_bucket("flyarchive-bench")
        url = f"s3://flyarchive-bench/{uuid.uuid4().hex}.zarr"
        write_random(url, n_worlds=args.worlds, n_frames=args.frames,
                     storage_options=server.storage_options())
        with FaultProxy(server.endpoint_url) as proxy:
            options = proxy.storage_options()
            for latency in args.latency_ms:
                proxy.plan = FaultPlan(delay=1.0 if latency else 0.0, delay_s=latency / 1e3)
                for name, call in CALLS.items():
                    times = timed(call, url, options, args.repeat)
                    proxy.reset_stats()
                    call(url, options)
                    rows.append({"where": "S3", "latency_ms": latency, "call": name, **times,
                                 "requests": proxy.stats()["requests"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--worlds", type=positive_int, default=64)
    parser.add_argument("--frames", type=positive_int, default=40)
    parser.add_argument("--repeat", type=positive_int, default=30)
    parser.add_argument("--latency-ms", default="0,20", type=numbers(0),
                        help="comma-separated delays added to every S3 request (default 0,20)")
    parser.add_argument("--no-s3", action="store_true")
    add_json_option(parser)
    args = parser.parse_args(argv)
    args.latency_ms = [float(v) for v in args.latency_ms.split(",") if v.strip()]
    with tempfile.TemporaryDirectory(prefix="flyarchive-bench-open-") as tmp:
        rows = local_rows(Path(tmp), args)
    if not args.no_s3:
        rows += s3_rows(args)
    TABLE.print(rows, title=f"Opening an archive ({args.worlds} worlds x {args.frames} frames; "
                            f"flyarchive from {Path(flyarchive.__file__).parent})")
    write_json(args.json, {"host_info": host_info(), "rows": rows,
                           "flyarchive": str(Path(flyarchive.__file__).parent)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
