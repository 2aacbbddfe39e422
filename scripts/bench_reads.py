"""Per-read cost of the guarded local store: small files and byte ranges of an archive's
shards, the way the viewer and :class:`~flyarchive.store.shards.ShardReader` read them.

Rows (``us/read`` is wall time per read, ``CPU us/read`` the process's CPU time per read,
which a machine shared with other work does not inflate as it does wall time):

- ``zarr LocalStore``: zarr's own store (no guards), the floor;
- ``guarded, long way``: :class:`~flyarchive.store.localstore.GuardedLocalStore` with its
  short way turned off (``os.path.realpath`` of every key, ``lstat`` and open), as it was;
- ``guarded``: the store as it reads now (the key's folder opened and checked, the file
  opened relative to it).

Each for a whole small file (a shard's ``zarr.json``-sized chunk: the archive's
``n_frames`` chunk) and for a byte range (the index at the end of a ``qpos`` shard).

Usage::

    python scripts/bench_reads.py [--archive PATH] [--reads 2000] [--repeat 3] [--json PATH]

Without ``--archive`` a small archive of the tiny model is written to a temporary folder
(:func:`flyarchive.testing.checksums.make_sound`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import Column, Table, add_json_option, host_info, positive_int, write_json

TABLE = Table([
    Column("row", 30, "row", align="<"),
    Column("read", 12, "read", align="<"),
    Column("us/read", 9, "us_per_read", ".1f"),
    Column("CPU us/read", 12, "cpu_us_per_read", ".1f"),
])


def small_archive(folder: str) -> str:
    """A small archive of the tiny model under ``folder`` (the checksum tests' sound one)."""
    from pathlib import Path

    from flyarchive.testing.checksums import make_sound

    return make_sound(Path(folder))


def timed(fn: Callable[[], Any], reads: int, repeat: int) -> tuple[float, float]:
    """The best wall and CPU seconds per read over ``repeat`` runs of ``reads`` calls."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(reads):
            fn()
        wall = min(wall, (time.perf_counter() - t0) / reads)
        cpu = min(cpu, (time.process_time() - c0) / reads)
    return wall, cpu


def rows_for(url: str, reads: int, repeat: int) -> list[dict[str, Any]]:
    import zarr.storage
    from zarr.abc.store import SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype

    from flyarchive.store import localstore

    shard = next(os.path.relpath(os.path.join(d, f), url) for d, _, fs in
                 os.walk(os.path.join(url, "qpos", "c")) for f in fs)
    keys = {"n_frames chunk": (next(os.path.relpath(os.path.join(d, f), url) for d, _, fs in
                                    os.walk(os.path.join(url, "n_frames", "c")) for f in fs),
                               None),
            "shard index": (shard, SuffixByteRequest(1024))}
    proto = default_buffer_prototype()
    stores = {"zarr LocalStore": zarr.storage.LocalStore(url, read_only=True),
              "guarded, long way": localstore.GuardedLocalStore(url, read_only=True),
              "guarded": localstore.GuardedLocalStore(url, read_only=True)}
    rows = []
    short = localstore._FD_LINKS
    for label, store in stores.items():
        localstore._FD_LINKS = None if label == "guarded, long way" else short
        try:
            for what, (key, byte_range) in keys.items():
                def read(store: Any = store, key: str = key, byte_range: Any = byte_range) -> Any:
                    return store.get_sync(key, prototype=proto, byte_range=byte_range)

                assert read() is not None, key
                wall, cpu = timed(read, reads, repeat)
                rows.append({"row": label, "read": what, "key": key,
                             "us_per_read": wall * 1e6, "cpu_us_per_read": cpu * 1e6})
        finally:
            localstore._FD_LINKS = short
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", help="an archive folder (default: a small one written now)")
    parser.add_argument("--reads", type=positive_int, default=2000)
    parser.add_argument("--repeat", type=positive_int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    if args.archive and not (Path(args.archive) / "zarr.json").is_file():
        parser.error(f"--archive {args.archive!r}: no archive there (no zarr.json); give an "
                     "archive folder, or leave it out to write a small one")
    with tempfile.TemporaryDirectory() as folder:
        url = args.archive or small_archive(folder)
        rows = rows_for(url, args.reads, args.repeat)
    TABLE.print(rows, title=f"\nGuarded local store reads ({len(os.sched_getaffinity(0))} cores, "
                            f"load {os.getloadavg()[0]:.1f})")
    write_json(args.json, {"host": host_info(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
