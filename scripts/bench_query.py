"""Query speed of archives beside flygym ``.npz`` files and plain zarr, on disk and on S3.

The data: W worlds x F frames of NeuroMechFly state (73 dofs), made from one simulated
flygym walk (:func:`flyarchive.interop.nmf.walk_qpos`, 25 fps, playback 0.2) copied
per world with jitter: a random start within the walk, a random x/y offset of the fly
(mm) and small per-joint angle biases (0.01 rad s.d.). It is stored four ways, each
built once and kept under ``--cache``:

- ``flyarchive``: written by :class:`flyarchive.store.ArchiveWriter` (the import path's
  writer), default codec (pcodec), chunks of 1 world x ``--chunk-frames`` frames in
  shards of ``--shard-worlds`` worlds; read with :func:`flyarchive.open_archive`.
- ``portable``: the same with ``codec="portable"`` (zarr v3 core codecs only).
- ``npz``: one flygym ``RecordedTrajectory`` ``.npz`` per world (``np.savez_compressed``),
  read with ``np.load`` (on S3: ``fs.cat``, many files fetched concurrently).
- ``zarr-zstd``: plain zarr v3, zarr's default compressor (zstd), the same chunks and
  shards; read with ``xarray.open_zarr`` with dask chunks of whole shards (as
  ``open_archive`` has today), no masking.

Queries, each from an already opened dataset: one world (all frames; best of
``--repeat``, its first read beside it, and on S3 the requests of a second read through
the same dataset, which keeps the indexes of shards that can no longer change); a time window
of F/10 frames across all worlds; one dof's mean over worlds; a full scan (per-dof
mean) pinned to one core (also with ``skipna=False``: the same sum without xarray's NaN
masking, to show the decoding apart from the reduction), on all cores, and on a
``distributed.LocalCluster`` of one
and of ``--workers`` single-thread worker processes; ``open`` itself. Beside them: the codec's
own decode speed on the stored chunks of one shard in memory (no zarr, no checksum,
running as long as a short query, so that it meets the same machine load) and the full scan
as a fraction of it (issue 36's target: at least half, for 256 x 250); the same fraction
in CPU seconds beside it (the scan's least CPU time against the codec's CPU rate: on a
busy machine, what waiting for a core does not inflate; pinned to one core, it is the
wall time of an idle machine). Then, on the ``flyarchive`` archive, the hand shard reader
against zarr's own sharded read (issue 35): one world, a time window (64 worlds x frames
200-400) and a full read of ``qpos``, through ``open_archive(...).qpos[sel].values``,
``ShardReader(arr).read(box)`` (:mod:`flyarchive.store.shards` alone) and
``zarr.open_array(...)[sel]`` with zarr's default (batched) codec pipeline, the batched one
with larger batches and concurrency, and the fused one (zarr >= 3.4) on one worker and a
worker per core; on one core and on all, each with its ratio to the hand reader and
whether zarr's best is within 1.5x of it. On S3 (moto on loopback) the times come from
direct requests; request counts and bytes come from a second pass through a counting proxy
(:class:`flyarchive.testing.faultproxy.FaultProxy`). On disk, bytes read are the process's
``rchar`` (``/proc/self/io``). Times are the best of ``--repeat`` runs.

Usage::

    python scripts/bench_query.py [--worlds 1024] [--frames 1000] [--dtypes float64,float32]
        [--no-s3] [--repeat 3] [--scan-repeat 2] [--workers 2] [--cache /tmp/flyarchive-bench-query]
        [--formats flyarchive,npz] [--only scan] [--json PATH]

``--formats`` and ``--only`` (queries whose name holds one of the words, e.g. ``scan``)
run a part of the table, for quick before/after comparisons; ``open`` always runs; only
the formats asked are built. ``--formats flyarchive --only zarr`` runs the zarr comparison
alone.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import struct
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from benchlib import (
    listed,
    nonnegative_int,
    positive_int,
    OUTPUT_FPS,
    PLAYBACK,
    Column,
    Jitter,
    Table,
    add_json_option,
    cached,
    frame_times,
    host_info,
    nmf_states,
    pin_threads,
    write_archive,
    write_json,
)

from flyarchive import open_archive
from flyarchive.layout import ModelLayout

FORMATS = ("flyarchive", "portable", "npz", "zarr-zstd")
#: The scan without NaN skipping: the same sum where xarray's default mean also masks NaN
#: (the data holds none: every world holds every frame), to show what decoding costs apart
#: from the reduction (beside the issue's scan, which stays the default mean).
NO_SKIP = "scan 1 core, skipna=False"
QUERIES = ("open", "one world", "time window", "one dof", "scan 1 core", NO_SKIP,
           "scan all cores")


# ----------------------------------------------------------------------------- data
#: Per-world copies of one walk: a random start, x/y offset (mm), joint biases (rad).
JITTER = Jitter(start_margin=200, xy_mm=5.0, angle_bias_rad=0.01)


@dataclass(frozen=True)
class Built:
    """Where each format lives for one dtype, and the facts the queries need."""

    root: Path
    n_worlds: int
    frames: int
    nq: int
    dtype: str

    def path(self, fmt: str) -> Path:
        return self.root / ("npz" if fmt == "npz" else f"{fmt}.zarr")


def build(cache: Path, args: argparse.Namespace, dtype: str) -> Built:
    """Build every format once (a ``.done`` marker per format); return where they are."""
    root = cache / f"{args.worlds}x{args.frames}-cf{args.chunk_frames}-sw{args.shard_worlds}-{dtype}"
    built = Built(root, args.worlds, args.frames, 73, dtype)

    @functools.cache
    def source() -> tuple[Any, np.ndarray]:  # simulated only if some format is missing
        from flyarchive.interop.nmf import build_world

        world = build_world()
        data = nmf_states(args.worlds, args.frames, world=world, jitter=JITTER, cache=cache)
        return world, data.astype(dtype)

    def builder(fmt: str) -> Callable[[Path], None]:
        def run(path: Path) -> None:
            print(f"building {fmt} ({dtype}, {args.worlds} x {args.frames})...", flush=True)
            BUILDERS[fmt](path, *source(), args)

        return run

    for fmt in args.formats:  # only those asked: a 1024-world build takes minutes
        cached(built.path(fmt), builder(fmt))
    return built


def _build_archive(codec: str) -> Callable[..., None]:
    def run(path: Path, world: Any, data: np.ndarray, args: argparse.Namespace) -> None:
        write_archive(str(path), world.model, data, chunk_frames=args.chunk_frames,
                      shard_worlds=args.shard_worlds, codec=codec, source="flygym-npz")

    return run


def _build_npz(folder: Path, world: Any, data: np.ndarray, args: argparse.Namespace) -> None:
    folder.mkdir()
    times = frame_times(world.model, data.shape[1])
    for w, qpos in enumerate(data):  # flygym 2.1 RecordedTrajectory.save's fields
        np.savez_compressed(folder / f"world{w:05d}.npz", time=times, qpos=qpos,
                            output_fps=np.asarray(OUTPUT_FPS), playback_speed=np.asarray(PLAYBACK),
                            world_id=np.asarray(w))


def _build_zarr_zstd(path: Path, world: Any, data: np.ndarray, args: argparse.Namespace) -> None:
    group = zarr.open_group(zarr.storage.LocalStore(path), mode="w-")
    n_worlds, frames, nq = data.shape
    qpos = group.create_array(
        "qpos", shape=data.shape, dtype=data.dtype, chunks=(1, args.chunk_frames, nq),
        shards=(min(args.shard_worlds, n_worlds), args.chunk_frames, nq), fill_value=np.nan,
        dimension_names=["world", "time", "dof"],
    )  # zarr's default compressor: zstd
    qpos[:] = data
    group.create_array("time", data=frame_times(world.model, frames), dimension_names=["time"])
    group.create_array("world", data=np.arange(n_worlds), dimension_names=["world"])
    labels = np.array(ModelLayout.from_model(world.model).dof_labels, dtype=str)
    group.create_array("dof", data=labels, dimension_names=["dof"])


BUILDERS = {"flyarchive": _build_archive("lossless"), "portable": _build_archive("portable"),
            "npz": _build_npz, "zarr-zstd": _build_zarr_zstd}


# ----------------------------------------------------------------------------- readers
class Reader:
    """How one format answers the queries; ``handle`` is what ``open`` returned."""

    parallel = True  # False: its scan runs on one core anyway (no "all cores" row)

    def open(self, url: str, storage_options: dict[str, Any] | None) -> Any:
        raise NotImplementedError

    def one_world(self, handle: Any, w: int) -> np.ndarray:
        return handle.qpos.isel(world=w).values

    def window(self, handle: Any, t0: int, t1: int) -> np.ndarray:
        return handle.qpos.isel(time=slice(t0, t1)).values

    def dof_mean(self, handle: Any, j: int) -> np.ndarray:
        return handle.qpos.isel(dof=j).mean("world").values

    def scan_mean(self, handle: Any, skipna: bool | None = None) -> np.ndarray:
        return handle.qpos.mean(("world", "time"), skipna=skipna).values


class ArchiveReader(Reader):
    def open(self, url: str, storage_options: dict[str, Any] | None) -> Any:
        return open_archive(url, storage_options)


class PlainZarrReader(Reader):
    """``xarray.open_zarr`` with dask chunks of whole shards, as ``open_archive`` has today."""

    def open(self, url: str, storage_options: dict[str, Any] | None) -> Any:
        ds = xr.open_zarr(url, consolidated=False, chunks=None, storage_options=storage_options)
        shards = ds.qpos.encoding.get("shards") or ds.qpos.encoding["chunks"]
        return xr.open_zarr(url, consolidated=False, storage_options=storage_options,
                            chunks={"world": shards[0], "time": shards[1]})


@dataclass
class NpzFiles:
    paths: list[str]
    fs: Any  # an fsspec filesystem for S3, None on disk


class NpzReader(Reader):
    parallel = False
    def open(self, url: str, storage_options: dict[str, Any] | None) -> NpzFiles:
        if storage_options is None:
            return NpzFiles(sorted(str(p) for p in Path(url).glob("*.npz")), None)
        import s3fs

        fs = s3fs.S3FileSystem(**storage_options)
        return NpzFiles(sorted(fs.find(url.removeprefix("s3://"))), fs)

    def _load(self, files: NpzFiles, indices: range | list[int]) -> list[np.ndarray]:
        paths = [files.paths[i] for i in indices]
        if files.fs is None:
            blobs: list[Any] = paths
        else:
            fetched = files.fs.cat(paths)  # concurrent GETs
            blobs = [io.BytesIO(fetched[p]) for p in paths]
        out = []
        for blob in blobs:
            with np.load(blob, allow_pickle=False) as npz:
                out.append(npz["qpos"])
        return out

    def one_world(self, handle: NpzFiles, w: int) -> np.ndarray:
        return self._load(handle, [w])[0]

    def window(self, handle: NpzFiles, t0: int, t1: int) -> np.ndarray:
        return np.stack([q[t0:t1] for q in self._load(handle, range(len(handle.paths)))])

    def dof_mean(self, handle: NpzFiles, j: int) -> np.ndarray:
        return np.mean([q[:, j] for q in self._load(handle, range(len(handle.paths)))], axis=0)

    def scan_mean(self, handle: NpzFiles, skipna: bool | None = None) -> np.ndarray:
        qs = self._load(handle, range(len(handle.paths)))
        return np.sum([q.sum(axis=0, dtype=np.float64) for q in qs], axis=0) / sum(map(len, qs))


READERS: dict[str, Reader] = {"flyarchive": ArchiveReader(), "portable": ArchiveReader(),
                              "npz": NpzReader(), "zarr-zstd": PlainZarrReader()}


# ----------------------------------------------------------------------------- codec alone
def _shard_chunks(array_dir: Path, w: int) -> tuple[list[bytes], dict[str, Any]]:
    """Stored bytes of every inner chunk of the shard holding world ``w``'s first frames
    (read from disk), and the array's metadata."""
    meta = json.loads((array_dir / "zarr.json").read_text())
    sharding = meta["codecs"][0]
    assert sharding["name"] == "sharding_indexed", sharding["name"]
    sw = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
    shard = (array_dir / "c" / str(w // sw) / "0" / "0").read_bytes()
    index = np.frombuffer(shard[-(16 * sw + 4):-4], "<u8").reshape(-1, 2)  # (offset, nbytes)
    return [shard[o:o + n] for o, n in index], meta


def make_decoder(meta: dict[str, Any]) -> Callable[[bytes], np.ndarray]:
    """Decode one inner chunk with the codecs alone: no zarr, the CRC-32C not checked."""
    import numcodecs

    config = meta["codecs"][0]["configuration"]
    shape, dtype = tuple(config["chunk_shape"]), np.dtype(meta["data_type"]).newbyteorder("<")
    chain = config["codecs"]
    names = [c["name"] for c in chain]
    orders = [c["configuration"]["order"] for c in chain if c["name"] == "transpose"]
    stored_shape = tuple(shape[i] for i in orders[0]) if orders else shape
    inverse = tuple(np.argsort(orders[0])) if orders else None
    strip = 4 if "crc32c" in names else 0
    compressor = (numcodecs.Blosc() if "blosc" in names
                  else numcodecs.Zstd() if "zstd" in names else None)
    serializer = next(c for c in chain if c["name"] in ("bytes", "numcodecs.pcodec"))
    pcodec = (numcodecs.get_codec({"id": "pcodec", **serializer.get("configuration", {})})
              if serializer["name"] != "bytes" else None)

    def decode(raw: bytes) -> np.ndarray:
        buf: Any = memoryview(raw)[:len(raw) - strip]
        if compressor is not None:
            buf = compressor.decode(buf)
        arr = (np.frombuffer(buf, dtype) if pcodec is None
               else np.asarray(pcodec.decode(buf)).view(dtype)).reshape(stored_shape)
        return np.ascontiguousarray(arr.transpose(inverse)) if inverse else arr

    return decode


def codec_speed(built: Built, fmt: str, w: int, seconds: float = 0.5) -> dict[str, float]:
    """MB/s (decoded bytes) of the codec alone, and of CRC-32C, on one stored shard in memory.

    ``codec_MBps`` and ``crc32c_MBps`` run without a pause over the shard's inner chunks for
    about ``seconds``, so that they meet the same machine load as the queries;
    ``codec_best_MBps`` is the fastest decode of world ``w``'s chunk over as many calls
    (the issue's "pcodec decode of one world's chunk, in memory").
    """
    import google_crc32c

    chunks, meta = _shard_chunks(built.path(fmt) / "qpos", w)
    decode = make_decoder(meta)
    decoded = sum(decode(c).nbytes for c in chunks)
    one = chunks[w % len(chunks)]
    passes, cpu_passes = _passes(lambda: [decode(c) for c in chunks], seconds, cpu=True)
    out = {"codec_MBps": decoded * passes / 1e6, "codec_cpu_MBps": decoded * cpu_passes / 1e6,
           "codec_best_MBps": decode(one).nbytes / _best_call(lambda: decode(one), seconds) / 1e6,
           "chunk_decoded_bytes": decoded // len(chunks),
           "chunk_stored_bytes": sum(map(len, chunks)) // len(chunks)}
    if any(c["name"] == "crc32c" for c in meta["codecs"][0]["configuration"]["codecs"]):
        crc = lambda: [google_crc32c.value(c) for c in chunks]  # noqa: E731
        out["crc32c_MBps"] = decoded * _passes(crc, seconds) / 1e6
    return out


def _best_call(fn: Callable[[], Any], seconds: float) -> float:
    """Fastest call of ``fn``, seconds, over about ``seconds`` of calls."""
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _passes(fn: Callable[[], Any], seconds: float, cpu: bool = False) -> Any:
    """Calls of ``fn`` per second, over about ``seconds`` of calls in a row; with ``cpu``
    also per second of this process's CPU time: ``(per wall second, per CPU second)``."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - t0) < seconds:
        fn()
        n += 1
    return (n / elapsed, n / max(time.process_time() - c0, 1e-9)) if cpu else n / elapsed


def world_bytes(built: Built, fmt: str, w: int) -> int:
    """Stored bytes of world ``w``'s qpos (its inner chunks; its file for npz)."""
    if fmt == "npz":
        return (built.path("npz") / f"world{w:05d}.npz").stat().st_size
    array_dir = built.path(fmt) / "qpos"
    meta = json.loads((array_dir / "zarr.json").read_text())
    sw, cf = meta["chunk_grid"]["configuration"]["chunk_shape"][:2]
    total = 0
    for j in range(-(-built.frames // cf)):
        shard = (array_dir / "c" / str(w // sw) / str(j) / "0").read_bytes()
        total += struct.unpack_from("<QQ", shard[-(16 * sw + 4):-4], 16 * (w % sw))[1]
    return total


def stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- measuring
def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


_pin = pin_threads


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        best = min(best, time.perf_counter() - t0)
        _LAST_CPU.append(time.process_time() - c0)
    return best, result


#: CPU seconds of each call :func:`_best` timed, the last first taken by the caller.
_LAST_CPU: list[float] = []


def _best_cpu(since: int) -> float:
    """The least CPU time of the calls :func:`_best` timed since ``len(_LAST_CPU)`` was
    ``since``: on a busy machine the figure that waiting for a core does not inflate."""
    return min(_LAST_CPU[since:])


@dataclass(frozen=True)
class Plan:
    world: int
    window: tuple[int, int]
    dof: int


def _calls(reader: Reader, handle: Any, plan: Plan, only: tuple[str, ...] = ()
           ) -> dict[str, Callable[[], Any]]:
    calls = {
        "one world": lambda: reader.one_world(handle, plan.world),
        "time window": lambda: reader.window(handle, *plan.window),
        "one dof": lambda: reader.dof_mean(handle, plan.dof),
        "scan 1 core": lambda: reader.scan_mean(handle),
        NO_SKIP: lambda: reader.scan_mean(handle, skipna=False),
        "scan all cores": lambda: reader.scan_mean(handle),
    }
    if not reader.parallel:
        del calls["scan all cores"], calls[NO_SKIP]
    return {name: call for name, call in calls.items()
            if not only or any(word in name for word in only)}


def timed_queries(reader: Reader, url: str, so: dict[str, Any] | None, plan: Plan,
                  repeat: int, scan_repeat: int = 1, only: tuple[str, ...] = ()
                  ) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Best-of-``repeat`` seconds per query (and, on disk, bytes read); the results.

    Full scans run ``scan_repeat`` times; on S3 (``so`` given) every other query across
    all worlds runs once. Each row also keeps its first run (``first_s``: for one world,
    the first read of its shards through the opened dataset; for a scan, the first in
    this process, which also grows the process's memory).
    """
    rows: dict[str, dict[str, float]] = {}
    warm = reader.open(url, so)  # warm-up: lazy imports would count as bytes read
    reader.one_world(warm, 0 if plan.world else 1)  # ...also those of the first decode
    r0 = _rchar()
    first_s, handle = _best(lambda: reader.open(url, so), 1)
    read = _rchar() - r0
    rest = _best(lambda: reader.open(url, so), repeat - 1)[0] if repeat > 1 else first_s
    rows["open"] = {"s": min(first_s, rest), "read_bytes": read}
    results = {}
    cpus = os.sched_getaffinity(0)
    for name, call in _calls(reader, handle, plan, only).items():
        if name.startswith("scan 1 core"):
            _pin({min(cpus)})
        try:
            r0, since = _rchar(), len(_LAST_CPU)
            first_s, results[name] = _best(call, 1)
            read = _rchar() - r0
            runs = scan_repeat if "scan" in name else 1 if so is not None and \
                name != "one world" else repeat
            rest = _best(call, runs - 1)[0] if runs > 1 else first_s
            rows[name] = {"s": min(first_s, rest), "first_s": first_s, "read_bytes": read,
                          "cpu_s": _best_cpu(since)}
        finally:
            _pin(cpus)
    return rows, results


def cluster_scans(reader: Reader, url: str, so: dict[str, Any] | None,
                  workers: int) -> dict[str, dict[str, float]]:
    """The full scan on a ``distributed.LocalCluster`` of 1 and of ``workers`` worker
    processes of one thread each (one run each, after a warm-up scan on the cluster)."""
    from distributed import Client, LocalCluster

    rows = {}
    for n in sorted({1, workers}):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster):
            handle = reader.open(url, so)
            reader.scan_mean(handle)  # warm-up: every worker imports and connects
            seconds, _ = _best(lambda: reader.scan_mean(handle), 1)
        rows[f"scan {n} worker{'s' if n > 1 else ''}"] = {"s": seconds}
    return rows


def counted_queries(reader: Reader, url: str, proxy: Any, plan: Plan, only: tuple[str, ...] = ()
                    ) -> dict[str, dict[str, int]]:
    """Requests and bytes of each query (one run) through a counting proxy."""
    so = proxy.storage_options()
    proxy.reset_stats()
    handle = reader.open(url, so)
    counts = {"open": _proxy_counts(proxy)}
    for name, call in _calls(reader, handle, plan, only).items():
        if name in ("scan all cores", NO_SKIP):
            continue  # the same requests as on one core
        proxy.reset_stats()
        call()
        counts[name] = _proxy_counts(proxy)
        if name == "one world":  # again, through the same dataset (kept shard indexes)
            proxy.reset_stats()
            call()
            again = _proxy_counts(proxy)
            counts[name].update(again_requests=again["requests"], again_bytes=again["bytes"])
    return counts


def _proxy_counts(proxy: Any) -> dict[str, int]:
    stats = proxy.stats()
    return {"requests": stats["requests"], "bytes": stats["bytes_out"]}


# ----------------------------------------------------------------------------- zarr's own read
FUSED = "zarr.core.codec_pipeline.FusedCodecPipeline"
#: The reads of the flyarchive archive's ``qpos`` compared: the user's call, the hand shard
#: reader alone (no shard index kept, as zarr keeps none), and zarr's own sharded read
#: (``zarr.open_array(...)[sel]``) in these configurations. zarr picks its codec pipeline
#: when an array is opened and reads ``max_workers`` and ``concurrency`` on each read, so
#: each configuration's array is opened and read inside its ``zarr.config.set`` block.
ARCHIVE, HAND = "open_archive(...).qpos[sel].values", "ShardReader(arr).read(box)"
ZARR_CONFIGS: dict[str, dict[str, Any]] = {
    "zarr, batched pipeline (default)": {},
    "zarr, batched, batch 64, concurrency 64": {"codec_pipeline.batch_size": 64,
                                                "async.concurrency": 64},
    "zarr, fused pipeline, 1 worker": {"codec_pipeline.path": FUSED,
                                       "codec_pipeline.max_workers": 1},
    "zarr, fused pipeline, worker per core": {"codec_pipeline.path": FUSED,
                                              "codec_pipeline.max_workers": None},  # cores
}
ZARR_READS = ("one world", "time window", "full scan")
#: The name ``--only`` matches for these rows (``--only zarr`` runs them alone).
ZARR_READ = "zarr read"
#: zarr is "within" when its best configuration takes at most this many times the hand
#: reader's time (issue 35: then read through zarr, keep only what zarr cannot do).
WITHIN = 1.5


def zarr_boxes(plan: Plan, built: Built) -> dict[str, tuple[slice, ...]]:
    """The reads: one world (every frame), a time window (64 worlds from ``plan.world``,
    frames 200-400 of 1000, scaled to the frames built), every value."""
    n_worlds, frames, dofs = built.n_worlds, built.frames, slice(0, built.nq)
    w0 = min(plan.world, max(n_worlds - 64, 0))
    return {"one world": (slice(plan.world, plan.world + 1), slice(0, frames), dofs),
            "time window": (slice(w0, min(w0 + 64, n_worlds)),
                            slice(frames // 5, 2 * frames // 5), dofs),
            "full scan": (slice(0, n_worlds), slice(0, frames), dofs)}


def zarr_reads(url: str, so: dict[str, Any] | None, plan: Plan, built: Built, repeat: int,
               scan_repeat: int) -> dict[str, Any]:
    """Seconds of each read path (:data:`ZARR_CONFIGS`) for each read (:func:`zarr_boxes`),
    on one core (the process pinned) and on all; each path's first call warms it up (imports,
    thread pools). Best of ``repeat`` (the full scan: of ``scan_repeat``), the paths taking
    turns; every result is checked equal to the hand reader's.

    Returns:
        ``{"1 core" | "all cores": {path: {read: seconds}}}``, ``"differ"``: the paths and
        reads whose values differ from the hand reader's (none, if all is well), and
        ``"codecs"``: zarr's codec classes for the inner chunks (flyarchive's bounded
        decoders, installed in this process by the first ``open_archive``).
    """
    from flyarchive.store.shards import ShardReader

    boxes = zarr_boxes(plan, built)
    array_url = f"{url.rstrip('/')}/qpos"

    def open_zarr() -> zarr.Array:
        return zarr.open_array(array_url, mode="r", storage_options=so)

    ds = open_archive(url, so)  # installs flyarchive's decoders for every zarr read here
    hand = ShardReader(open_zarr())
    paths: dict[str, tuple[dict[str, Any], Callable[[tuple[slice, ...]], np.ndarray]]] = {
        ARCHIVE: ({}, lambda box: ds.qpos[box].values),
        HAND: ({}, hand.read),
    }
    pipelines = {}
    for name, config in ZARR_CONFIGS.items():
        with zarr.config.set(config):
            arr = open_zarr()
        paths[name] = (config, lambda box, arr=arr: arr[box])
        pipelines[name] = type(arr.async_array.codec_pipeline).__name__
    codecs = [type(c).__name__ for c in arr.metadata.codecs[0].codecs]
    cpus = os.sched_getaffinity(0)
    out: dict[str, Any] = {"codecs": codecs, "pipelines": pipelines, "differ": []}
    expected = {read: hand.read(box) for read, box in boxes.items()}
    for cores, pinned in (("1 core", {min(cpus)}), ("all cores", cpus)):
        configs = {name: {**config, "codec_pipeline.max_workers": len(pinned)}
                   if config.get("codec_pipeline.max_workers", 0) is None else config
                   for name, (config, _) in paths.items()}
        _pin(pinned)
        try:
            times: dict[str, dict[str, float]] = {name: {} for name in paths}
            for name, (_, read) in paths.items():
                with zarr.config.set(configs[name]):
                    read(boxes["one world"])  # warm-up
            for what, box in boxes.items():
                # the paths in turn, run after run: a shared machine's load, which drifts
                # from second to second, falls on every path alike
                for _ in range(scan_repeat if what == "full scan" else repeat):
                    for name, (_, read) in paths.items():
                        with zarr.config.set(configs[name]):
                            seconds, value = _best(lambda: read(box), 1)
                        times[name][what] = min(seconds, times[name].get(what, seconds))
                        same = np.array_equal(np.asarray(value).reshape(expected[what].shape),
                                              expected[what], equal_nan=True)
                        if not same and f"{name}: {what}" not in out["differ"]:
                            out["differ"].append(f"{name}: {what}")
                        del value
            out[cores] = times
        finally:
            _pin(cpus)
    return out


def same_results(results: dict[str, Any], reference: dict[str, Any], dtype: str) -> list[str]:
    """Queries whose result differs from the reference format's (none, if all is well)."""
    rtol = 1e-9 if dtype == "float64" else 1e-4
    bad = []
    for name, value in results.items():
        ref = reference.get("scan 1 core" if name == NO_SKIP else name)  # the same mean
        if ref is None:
            continue
        exact = name in ("one world", "time window")
        same = np.array_equal(value, ref) if exact else np.allclose(value, ref, rtol=rtol, atol=0)
        if not same:
            bad.append(name)
    return bad


# ----------------------------------------------------------------------------- runs
def run_storage(built: Built, storage: str, args: argparse.Namespace, s3: Any = None,
                proxy: Any = None) -> dict[str, Any]:
    """Every query of every format on one storage ('local' or 's3'), npz first (the reference)."""
    win = max(built.frames // 10, 1)
    t0 = min(built.frames // 2 + 17, built.frames - win)
    plan = Plan(world=built.n_worlds // 3, window=(t0, t0 + win), dof=_dof_index(built))
    out: dict[str, Any] = {"storage": storage, "dtype": built.dtype, "plan": plan.__dict__,
                           "formats": {}}
    reference: dict[str, Any] | None = None
    for fmt in [f for f in ("npz", "flyarchive", "portable", "zarr-zstd") if f in args.formats]:
        url, so = str(built.path(fmt)), None
        if storage == "s3":
            url = f"s3://{args.bucket}/{built.root.name}/{built.path(fmt).name}"
            so = s3.storage_options()
        print(f"  {storage} {built.dtype} {fmt}...", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: numcodecs codecs are not in the v3 spec
            rows, results = timed_queries(READERS[fmt], url, so, plan, args.repeat,
                                          args.scan_repeat, args.only)
            if args.workers and READERS[fmt].parallel and _wanted("scan", args.only):
                rows.update(cluster_scans(READERS[fmt], url, so, args.workers))
            if proxy is not None:
                for name, counts in counted_queries(READERS[fmt], url, proxy, plan,
                                                    args.only).items():
                    rows[name].update(counts)
        reference = reference or results  # npz's, unless --formats leaves it out
        entry = {"queries": rows, "differs_from_npz": same_results(results, reference, built.dtype),
                 "stored_bytes": stored_bytes(built.path(fmt)),
                 "world_bytes": world_bytes(built, fmt, plan.world)}
        if fmt != "npz":
            entry.update(codec_speed(built, fmt, plan.world))
        out["formats"][fmt] = entry
    if "flyarchive" in args.formats and _wanted(ZARR_READ, args.only):
        url, so = str(built.path("flyarchive")), None
        if storage == "s3":
            url = f"s3://{args.bucket}/{built.root.name}/{built.path('flyarchive').name}"
            so = s3.storage_options()
        print(f"  {storage} {built.dtype} flyarchive through zarr's own read...", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: numcodecs codecs are not in the v3 spec
            out["zarr_read"] = zarr_reads(url, so, plan, built, args.repeat, args.scan_repeat)
    return out


def _wanted(name: str, only: tuple[str, ...]) -> bool:
    return not only or any(word in name for word in only)


def _dof_index(built: Built) -> int:
    stored = next((built.path(f) for f in ("zarr-zstd", "flyarchive", "portable")
                   if built.path(f).with_suffix(".done").exists()), None)
    if stored is None:  # npz alone: the labels from the model
        from flyarchive.interop.nmf import build_world

        labels = ModelLayout.from_model(build_world().model).dof_labels
    else:
        labels = list(zarr.open_array(stored / "dof", mode="r")[:])
    return next((i for i, name in enumerate(labels) if "Tarsus1" in str(name)), len(labels) // 2)


def upload(built: Built, s3: Any, bucket: str, formats: list[str]) -> None:
    fs = s3.filesystem()
    for fmt in formats:
        local = built.path(fmt)
        fs.put(str(local), f"{bucket}/{built.root.name}/{local.name}", recursive=True)


# ----------------------------------------------------------------------------- report
def _cell(row: dict[str, Any] | None, storage: str) -> str:
    if row is None:
        return "-"
    ms = row["s"] * 1e3
    text = f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
    if storage == "s3" and "requests" in row:
        text += f", {row['requests']} req, {row['bytes'] / 1e6:.2f} MB"
    return text


def print_table(run: dict[str, Any], built: Built) -> None:
    fmts = run["formats"]
    decoded = built.n_worlds * built.frames * built.nq * np.dtype(built.dtype).itemsize
    npz = fmts.get("npz")
    extra = [q for e in fmts.values() for q in e["queries"] if q not in QUERIES]
    lines: dict[str, Callable[[dict[str, Any]], str]] = {
        "stored (vs npz)": lambda e: f"{e['stored_bytes'] / 1e6:.1f} MB "
                                     f"({e['stored_bytes'] / npz['stored_bytes']:.2f})",
        **{q: lambda e, q=q: _cell(e["queries"].get(q), run["storage"])
           for q in [*QUERIES, *dict.fromkeys(extra)]},
        "scan MB/s (1 core)": lambda e: f"{decoded / e['queries']['scan 1 core']['s'] / 1e6:,.0f}",
        "scan 1 core, first run": lambda e: _ms(e["queries"]["scan 1 core"].get("first_s")),
        "codec, 1 chunk best MB/s": lambda e: _num(e, "codec_best_MBps"),
        "codec, 1 shard run MB/s": lambda e: _num(e, "codec_MBps"),
        "crc32c, 1 shard run MB/s": lambda e: _num(e, "crc32c_MBps"),
        "scan 1 core / codec best": lambda e: _share(e, decoded, "codec_best_MBps"),
        "scan 1 core / codec run": lambda e: _share(e, decoded, "codec_MBps"),
        "same, CPU time": lambda e: (
            f"{decoded / e['queries']['scan 1 core']['cpu_s'] / 1e6 / e['codec_cpu_MBps']:.0%}"),
        "skipna=False / codec run": lambda e: _share(e, decoded, "codec_MBps", NO_SKIP),
        "workers: speed-up": lambda e: _speedup(e),
        "one world: read / bytes": lambda e: (
            f"{_world_read(e, run['storage']) / e['world_bytes']:.1f}x"
            if _world_read(e, run["storage"]) is not None else "-"),
        "one world, first read": lambda e: _ms(e["queries"]["one world"].get("first_s")),
        "one world again: requests": lambda e: str(
            e["queries"]["one world"].get("again_requests", "-")),
        "one world / npz time": lambda e: (
            f"{e['queries']['one world']['s'] / npz['queries']['one world']['s']:.1f}x"),
        "results differ": lambda e: ",".join(e["differs_from_npz"]) or "no",
    }
    width = 31 if run["storage"] == "s3" else 16
    table = Table([Column("query", 26, "label", align="<"), *(Column(f, width, f) for f in fmts)])
    table.print(
        [{"label": label, **{f: _safe(fn, e) for f, e in fmts.items()}}
         for label, fn in lines.items()],
        title=f"\n{built.dtype}, {'local disk' if run['storage'] == 'local' else 'S3 (moto, loopback)'}: "
              f"{built.n_worlds} worlds x {built.frames} frames x {built.nq} dofs "
              f"({decoded / 1e6:.0f} MB decoded); window {run['plan']['window']}, world "
              f"{run['plan']['world']}, dof {run['plan']['dof']}")


def print_zarr_table(run: dict[str, Any], built: Built) -> None:
    """Each read path's time per read, and its ratio to the hand reader's; then, per read,
    whether zarr's best configuration is within :data:`WITHIN` of the hand reader."""
    found = run.get("zarr_read")
    if found is None:
        return
    boxes = zarr_boxes(Plan(**run["plan"]), built)
    where = "local disk" if run["storage"] == "local" else "S3 (moto, loopback)"
    table = Table([Column("read path", 42, "label", align="<"),
                   *(Column(read, 20, read) for read in ZARR_READS)])
    for cores in ("1 core", "all cores"):
        times = found[cores]
        hand = times[HAND]
        rows = [{"label": name, **{read: f"{_ms(t[read])} ({t[read] / hand[read]:.2f}x)"
                                   for read in ZARR_READS}} for name, t in times.items()]
        best = {read: min((t[read], name) for name, t in times.items() if name in ZARR_CONFIGS)
                for read in ZARR_READS}
        rows.append({"label": f"zarr within {WITHIN}x of the hand reader", **{
            read: f"{'yes' if s / hand[read] <= WITHIN else 'no'} ({s / hand[read]:.2f}x)"
            for read, (s, _) in best.items()}})
        table.print(rows, title=(
            f"\n{built.dtype}, {where}, {cores}: qpos read through zarr's own sharded read "
            f"against flyarchive's (ratio: time / {HAND}); one world {_box(boxes['one world'])}, "
            f"time window {_box(boxes['time window'])}, full scan {_box(boxes['full scan'])}; "
            f"zarr's inner codecs {'+'.join(found['codecs'])}; values differ: "
            f"{', '.join(found['differ']) or 'none'}"))


def _box(box: tuple[slice, ...]) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" if s.start is not None else ":"
                           for s in box) + "]"


def _safe(fn: Callable[[dict[str, Any]], str], entry: dict[str, Any]) -> str:
    """A cell, or "-" when a query it needs did not run (``--only``, ``--formats``)."""
    try:
        return fn(entry)
    except (KeyError, TypeError):
        return "-"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def _speedup(entry: dict[str, Any]) -> str:
    scans = {q: r["s"] for q, r in entry["queries"].items() if q.endswith(("worker", "workers"))}
    one, many = scans.get("scan 1 worker"), [s for q, s in scans.items() if q.endswith("workers")]
    return f"{one / many[0]:.2f}x" if one and many else "-"


def _num(entry: dict[str, Any], key: str) -> str:
    return f"{entry[key]:,.0f}" if key in entry else "-"


def _share(entry: dict[str, Any], decoded: int, key: str, query: str = "scan 1 core") -> str:
    if key not in entry:
        return "-"
    return f"{decoded / entry['queries'][query]['s'] / 1e6 / entry[key]:.0%}"


def _world_read(entry: dict[str, Any], storage: str) -> int | None:
    row = entry["queries"]["one world"]
    return row.get("bytes") if storage == "s3" else row.get("read_bytes")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=positive_int, default=1024, help="worlds (default 1024)")
    parser.add_argument("--frames", type=positive_int, default=1000,
                        help="frames per world (default 1000)")
    parser.add_argument("--dtypes", default="float64,float32", type=listed("float64", "float32"),
                        help="comma-separated")
    parser.add_argument("--chunk-frames", type=positive_int, default=100, help="frames per chunk")
    parser.add_argument("--shard-worlds", type=positive_int, default=64, help="worlds per shard")
    parser.add_argument("--repeat", type=positive_int, default=3, help="best of N (full scans: see "
                        "--scan-repeat; on S3 only one world is repeated)")
    parser.add_argument("--scan-repeat", type=positive_int, default=2,
                        help="best of N for the full scans (default 2: a process's first scan "
                             "also pays for growing its memory; the first is reported beside)")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 runs")
    parser.add_argument("--cache", default="/tmp/flyarchive-bench-query",
                        help="where the data sets are built once and kept")
    parser.add_argument("--bucket", default="bench-query", help="bucket on the S3 server")
    parser.add_argument("--workers", type=nonnegative_int, default=2,
                        help="full scans on a LocalCluster of 1 and of N single-thread worker "
                             "processes (0: skip)")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"comma-separated, of {', '.join(FORMATS)} (default: all)")
    parser.add_argument("--only", default="",
                        help="run only the queries whose name holds one of these comma-separated "
                             "words, e.g. 'scan' or 'one world' (default: all)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    args.formats = tuple(f for f in args.formats.split(",") if f)
    unknown = sorted(set(args.formats) - set(FORMATS))
    if unknown:
        parser.error(f"--formats: unknown {unknown}; choose among {list(FORMATS)}")
    args.only = tuple(w for w in args.only.split(",") if w)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    built = {d: build(cache, args, d) for d in args.dtypes.split(",")}
    runs = [run_storage(b, "local", args) for b in built.values()]
    for b, run in zip(built.values(), runs):
        print_table(run, b)
        print_zarr_table(run, b)
    if not args.no_s3:
        from flyarchive.testing.faultproxy import FaultProxy
        from flyarchive.testing.s3 import S3Server

        with S3Server() as s3, FaultProxy(s3.endpoint_url) as proxy:
            s3.create_bucket(args.bucket)
            for b in built.values():
                print(f"uploading {b.root.name} to the S3 server...", flush=True)
                upload(b, s3, args.bucket, list(args.formats))
                run = run_storage(b, "s3", args, s3, proxy)
                runs.append(run)
                print_table(run, b)
                print_zarr_table(run, b)
    end = os.getloadavg()
    print(f"\nload average at the end: {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")
    meta = {"worlds": args.worlds, "frames": args.frames, "chunk_frames": args.chunk_frames,
            "formats": list(args.formats), "only": list(args.only),
            "shard_worlds": args.shard_worlds, "repeat": args.repeat,
            "scan_repeat": args.scan_repeat, "cpus": os.cpu_count(),
            "load_average": {"start": load, "end": end},
            "zarr": zarr.__version__, "xarray": xr.__version__, "host_info": host_info(),
            "zarr_configs": ZARR_CONFIGS}
    write_json(args.json, {"meta": meta, "runs": runs})

if __name__ == "__main__":
    main()
