"""What creating an archive and committing a few blocks costs: the tiny model as the
test suite records it hundreds of times, and NeuroMechFly-sized blocks, on local disk
and in memory (``memory://``), with the store requests each makes.

Rows (each on ``disk`` and ``memory``):

- ``record tiny``: ``flyarchive.testing.fixtures.record(tiny_model(), url)``, the whole
  call: a ``TrajectoryRecorder`` simulating 2 worlds for 76 steps, 20 frames committed
  5 at a time (``ArchiveWriter.create``, 4 commits, close);
- ``create tiny`` / ``create nmf``: ``ArchiveWriter.create`` of the archives below (the
  tiny one as ``record()`` makes it: 2 worlds, chunks of 5 frames, the model kept);
- ``commit tiny``: one ``ArchiveWriter.write`` of 5 frames x 2 worlds of the tiny model
  (``--commits`` of them after each creation, the first included);
- ``commit nmf``: one ``write`` of ``--nmf-frames`` frames x ``--nmf-worlds`` worlds of
  NeuroMechFly qpos (73 dofs, jittered copies of one simulated walk:
  ``benchlib.nmf_states``), float64, lossless.

Times are the median and the best wall milliseconds over ``--repeat`` creations (each
into a new URL, after one warm-up), and the median CPU milliseconds of the process (all
its threads: on a loaded machine the work without the waiting). ``requests`` counts
the store calls of one more, untimed run (``get``, ``set``, ``set_if_not_exists``,
``exists``, ``delete``, ``delete_dir``, their ``_sync`` twins and the listings, on the
zarr store classes flyarchive opens): of the whole call, of the creation, and the
median of the commits.

Compare two trees with the same script: ``PYTHONPATH=<tree> python scripts/bench_record_small.py``.

Usage::

    python scripts/bench_record_small.py [--repeat 15] [--commits 4] [--nmf-worlds 8]
        [--nmf-frames 100] [--no-nmf] [--cache /tmp/flyarchive-bench-record] [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import contextvars
import gc
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import Column, Jitter, Table, add_json_option, frame_times, host_info, nmf_states, \
    positive_int, write_json

import flyarchive

TABLE = Table([
    Column("where", 6, "where", align="<"), Column("case", 12, "case", align="<"),
    Column("median ms", 9, "median_ms", ".2f"), Column("best ms", 8, "best_ms", ".2f"),
    Column("CPU ms", 7, "cpu_ms", ".2f"), Column("requests", 8, "requests"),
])


@dataclass(frozen=True)
class Case:
    """An archive to create and the blocks to commit into it."""

    spec: Any  # flyarchive.store.ArchiveSpec
    blocks: list[Any]  # flyarchive.store.FrameBlock, committed in order


# ----------------------------------------------------------------------------- cases
def tiny_case(commits: int) -> Case:
    """The archive ``record()`` writes (2 worlds, chunks of 5 frames, the model kept)."""
    import mujoco

    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.models import model_bytes
    from flyarchive.store import ArchiveSpec, FrameBlock
    from flyarchive.testing import tiny_model

    model = tiny_model()
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(float(model.opt.timestep), 25, 0.2),
                       (0, 1), chunk_frames=5, model=model_bytes(model))
    data = mujoco.MjData(model)
    times = frame_times(model, 5 * commits)
    blocks = []
    for k in range(commits):
        cut = slice(5 * k, 5 * k + 5)
        qpos = np.tile(model.qpos0, (2, 5, 1)) + np.random.default_rng(k).normal(0, 0.01, (2, 5, model.nq))
        pos = np.broadcast_to(data.mocap_pos, (2, 5, *data.mocap_pos.shape)).copy()
        quat = np.broadcast_to(data.mocap_quat, (2, 5, *data.mocap_quat.shape)).copy()
        blocks.append(FrameBlock(times[cut], qpos, pos, quat, sim_time=times[cut],
                                 frame=np.arange(5 * k, 5 * k + 5)))
    return Case(spec, blocks)


def nmf_case(args: argparse.Namespace) -> Case:
    """NeuroMechFly qpos: ``--commits`` blocks of ``--nmf-frames`` x ``--nmf-worlds``."""
    from flyarchive.clock import Timing
    from flyarchive.interop.nmf import build_world
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, FrameBlock

    world = build_world()
    n = args.nmf_frames * args.commits
    qpos = nmf_states(args.nmf_worlds, n, world=world, jitter=Jitter(start_margin=50),
                      cache=Path(args.cache))
    spec = ArchiveSpec(ModelLayout.from_model(world.model),
                       Timing(float(world.model.opt.timestep), 25, 0.2),
                       tuple(range(args.nmf_worlds)), chunk_frames=args.nmf_frames)
    times = frame_times(world.model, n)
    blocks = [FrameBlock(times[t:t + args.nmf_frames], qpos[:, t:t + args.nmf_frames])
              for t in range(0, n, args.nmf_frames)]
    return Case(spec, blocks)


# ----------------------------------------------------------------------------- timing
@dataclass
class Timer:
    """Wall and CPU seconds of each phase of the runs timed, by name."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, start_cpu = time.perf_counter(), time.process_time()
        yield
        self.wall.setdefault(name, []).append(time.perf_counter() - start)
        self.cpu.setdefault(name, []).append(time.process_time() - start_cpu)

    def row(self, name: str) -> dict[str, Any]:
        wall, cpu = self.wall[name], self.cpu[name]
        return {"median_ms": statistics.median(wall) * 1e3, "best_ms": min(wall) * 1e3,
                "cpu_ms": statistics.median(cpu) * 1e3, "runs": len(wall)}


class Requests:
    """Store requests of each phase of a run, by name (see :func:`counting`)."""

    def __init__(self, counts: collections.Counter[str]) -> None:
        self.counts = counts
        self.by: dict[str, list[int]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        before = sum(self.counts.values())
        yield
        self.by.setdefault(name, []).append(sum(self.counts.values()) - before)


#: Store methods counted as requests; a call inside another counted call (zarr's
#: ``set_if_not_exists`` calling ``exists`` and ``set``...) is not counted again.
COUNTED = ("get", "set", "set_if_not_exists", "exists", "delete", "delete_dir", "get_sync",
           "set_sync")
LISTINGS = ("list", "list_dir", "list_prefix")
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("inside", default=False)


@contextlib.contextmanager
def counting() -> Iterator[collections.Counter[str]]:
    """Count the calls of :data:`COUNTED` and :data:`LISTINGS` on the zarr store classes
    flyarchive opens (its guarded local store, fsspec's for ``memory://`` and S3), by
    method name, while the block runs."""
    import zarr.storage

    from flyarchive.store.localstore import GuardedLocalStore

    counts: collections.Counter[str] = collections.Counter()
    saved = []
    for cls in (GuardedLocalStore, zarr.storage.FsspecStore):
        for name in COUNTED + LISTINGS:
            method = getattr(cls, name, None)
            if method is None:
                continue
            saved.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, _counted(method, name, counts))
    try:
        yield counts
    finally:
        for cls, name, original in saved:
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)


def _counted(method: Callable[..., Any], name: str,
             counts: collections.Counter[str]) -> Callable[..., Any]:
    def count() -> contextvars.Token[bool] | None:
        if _INSIDE.get():
            return None
        counts[name] += 1
        return _INSIDE.set(True)

    if name in LISTINGS:
        async def lister(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = count()
            try:
                async for item in method(self, *args, **kwargs):
                    yield item
            finally:
                if token is not None:
                    _INSIDE.reset(token)
        return lister
    if name.endswith("_sync"):
        def call_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = count()
            try:
                return method(self, *args, **kwargs)
            finally:
                if token is not None:
                    _INSIDE.reset(token)
        return call_sync

    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = count()
        try:
            return await method(self, *args, **kwargs)
        finally:
            if token is not None:
                _INSIDE.reset(token)
    return call


# ----------------------------------------------------------------------------- runs
Phase = Callable[[str], contextlib.AbstractContextManager[None]]


def write_case(url: str, case: Case, phase: Phase, label: str) -> None:
    """``create <label>``: ``ArchiveWriter.create``; ``commit <label>``: each commit; then
    the writer is closed (untimed)."""
    from flyarchive.store import ArchiveWriter

    with phase(f"create {label}"):
        writer = ArchiveWriter.create(url, case.spec)
    for block in case.blocks:
        with phase(f"commit {label}"):
            writer.write(block)
    writer.close()


def record_tiny(url: str, phase: Phase) -> None:
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record

    model = tiny_model()
    with phase("record tiny"):
        record(model, url)


class Places:
    """New URLs on local disk (under a temporary folder) or in memory; removed after."""

    def __init__(self, where: str, folder: Path) -> None:
        self.where, self.folder = where, folder

    def url(self) -> str:
        name = f"bench-{uuid.uuid4().hex}.zarr"
        return str(self.folder / name) if self.where == "disk" else f"memory://{name}"

    def drop(self, url: str) -> None:
        import shutil

        import fsspec

        if self.where == "disk":
            shutil.rmtree(url, ignore_errors=True)
        else:
            fsspec.filesystem("memory").rm(url, recursive=True)


def rows_for(where: str, folder: Path, cases: dict[str, Case], args: argparse.Namespace
             ) -> list[dict[str, Any]]:
    """The rows of one place: each run ``--repeat`` times after a warm-up, then once
    more with its requests counted."""
    places = Places(where, folder)
    runs: dict[str, Callable[[str, Phase], None]] = {"tiny record": record_tiny}
    for label, case in cases.items():
        runs[label] = lambda url, phase, c=case, lab=label: write_case(url, c, phase, lab)
    timer = Timer({}, {})
    rows = []
    for run in runs.values():
        names_before = set(timer.wall)
        for attempt in range(args.repeat + 1):  # the first one warms up
            url = places.url()
            gc.collect()
            run(url, timer if attempt else Timer({}, {}))
            places.drop(url)
        with counting() as counts:
            requests = Requests(counts)
            url = places.url()
            run(url, requests)
            places.drop(url)
        for name in sorted(set(timer.wall) - names_before, key=lambda n: n.split()[0] != "create"):
            rows.append({"where": where, "case": name, **timer.row(name),
                         "requests": int(statistics.median(requests.by[name]))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--repeat", type=positive_int, default=15)
    parser.add_argument("--commits", type=positive_int, default=4,
                        help="commits per archive (default 4)")
    parser.add_argument("--nmf-worlds", type=positive_int, default=8)
    parser.add_argument("--nmf-frames", type=positive_int, default=100,
                        help="frames per NeuroMechFly commit (the recorders' default chunk)")
    parser.add_argument("--no-nmf", action="store_true", help="leave out the NeuroMechFly rows")
    parser.add_argument("--cache", default="/tmp/flyarchive-bench-record",
                        help="folder that keeps the simulated NeuroMechFly walk between runs")
    add_json_option(parser)
    args = parser.parse_args(argv)
    cases = {"tiny": tiny_case(args.commits)}
    if not args.no_nmf:
        cases["nmf"] = nmf_case(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="flyarchive-bench-record-") as tmp:
        for where in ("disk", "memory"):
            rows += rows_for(where, Path(tmp), cases, args)
    TABLE.print(rows, title=f"Creating an archive and committing {args.commits} blocks "
                            f"(flyarchive from {Path(flyarchive.__file__).parent})")
    write_json(args.json, {"host_info": host_info(), "rows": rows, "commits": args.commits,
                           "nmf_worlds": args.nmf_worlds, "nmf_frames": args.nmf_frames,
                           "flyarchive": str(Path(flyarchive.__file__).parent)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
