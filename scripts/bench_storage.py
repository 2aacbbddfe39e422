"""Bytes per frame of NeuroMechFly qpos under candidate zarr v3 codec pipelines.

Writes a realistic walk (``flyarchive.interop.nmf.walk_qpos``: 73 dofs, video
cadence) into real zarr arrays in a ``MemoryStore`` with chunks ``(1, frames, 73)``
inside one shard, counts the stored bytes, reads them back and checks the error,
next to ``np.savez_compressed`` of the same array. Every pipeline ends with a
CRC-32C checksum. Rows ``flyarchive ...`` are what :mod:`flyarchive.codecs` uses.

Usage::

    python scripts/bench_storage.py [--frames 250] [--bound 1e-6] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from benchlib import (
    Column,
    Table,
    add_json_option,
    host_info,
    nmf_states,
    positive_float,
    positive_int,
    write_json,
)
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, TransposeCodec
from zarr.codecs.numcodecs import PCodec, Shuffle, Zstd
from zarr.storage import MemoryStore

from flyarchive import codecs

Kwargs = dict[str, Any]
T_MAJOR = TransposeCodec(order=(0, 2, 1))  # (world, time, dof) -> (world, dof, time)


@dataclass(frozen=True)
class Candidate:
    name: str
    lossy: bool
    build: Callable[[np.dtype, float], Kwargs]


def _blosc(dtype: np.dtype, shuffle: str = "shuffle", level: int = 5) -> BloscCodec:
    return BloscCodec(cname="zstd", clevel=level, shuffle=shuffle, typesize=dtype.itemsize)


def _shuffle_zstd(dtype: np.dtype, level: int = 5) -> list[Any]:
    return [Shuffle(elementsize=dtype.itemsize), Zstd(level=level)]


def _quant(dtype: np.dtype, bound: float) -> Any:
    from zarr.codecs.numcodecs import FixedScaleOffset

    scale = 1.0 / codecs.quantization_step(bound)
    return FixedScaleOffset(offset=0, scale=scale, dtype=dtype.str, astype=dtype.str)


def _quant_int(dtype: np.dtype, bound: float) -> list[Any]:
    from zarr.codecs.numcodecs import Delta, FixedScaleOffset

    scale = 1.0 / codecs.quantization_step(bound)
    return [FixedScaleOffset(offset=0, scale=scale, dtype=dtype.str, astype="<i8"),
            Delta(dtype="<i8")]


CRC = Crc32cCodec()
CANDIDATES = [
    Candidate("blosc zstd5 shuffle", False,
              lambda d, b: {"compressors": [_blosc(d), CRC]}),
    Candidate("blosc zstd5 bitshuffle", False,
              lambda d, b: {"compressors": [_blosc(d, "bitshuffle"), CRC]}),
    Candidate("blosc zstd9 shuffle", False,
              lambda d, b: {"compressors": [_blosc(d, level=9), CRC]}),
    Candidate("shuffle + zstd5", False,
              lambda d, b: {"compressors": [*_shuffle_zstd(d), CRC]}),
    Candidate("T + blosc zstd5 shuffle", False,
              lambda d, b: {"filters": [T_MAJOR], "compressors": [_blosc(d), CRC]}),
    Candidate("T + shuffle + zstd5", False,
              lambda d, b: {"filters": [T_MAJOR], "compressors": [*_shuffle_zstd(d), CRC]}),
    Candidate("pcodec8 auto", False,
              lambda d, b: {"serializer": PCodec(level=8), "compressors": [CRC]}),
    Candidate("pcodec8 lookback", False,
              lambda d, b: {"serializer": PCodec(level=8, delta_spec="try_lookback"),
                            "compressors": [CRC]}),
    Candidate("T + pcodec8 auto", False,
              lambda d, b: {"filters": [T_MAJOR], "serializer": PCodec(level=8),
                            "compressors": [CRC]}),
    Candidate("T + pcodec8 delta1", False,
              lambda d, b: {"filters": [T_MAJOR],
                            "serializer": PCodec(level=8, delta_spec="try_consecutive",
                                                 delta_encoding_order=1),
                            "compressors": [CRC]}),
    Candidate("T + pcodec8 delta2", False,
              lambda d, b: {"filters": [T_MAJOR],
                            "serializer": PCodec(level=8, delta_spec="try_consecutive",
                                                 delta_encoding_order=2),
                            "compressors": [CRC]}),
    Candidate("T + pcodec12 auto", False,
              lambda d, b: {"filters": [T_MAJOR], "serializer": PCodec(level=12),
                            "compressors": [CRC]}),
    Candidate("flyarchive lossless", False, lambda d, b: codecs.array_codecs("lossless", d)),
    Candidate("q + blosc zstd5 shuffle", True,
              lambda d, b: {"filters": [_quant(d, b)], "compressors": [_blosc(d), CRC]}),
    Candidate("T + q + blosc zstd5 shuffle", True,
              lambda d, b: {"filters": [T_MAJOR, _quant(d, b)], "compressors": [_blosc(d), CRC]}),
    Candidate("T + q-int + delta + blosc zstd5 shuffle", True,
              lambda d, b: {"filters": [T_MAJOR, *_quant_int(d, b)],
                            "compressors": [_blosc(np.dtype("<i8")), CRC]}),
    Candidate("T + q-int + delta + blosc zstd5 bitshuffle", True,
              lambda d, b: {"filters": [T_MAJOR, *_quant_int(d, b)],
                            "compressors": [_blosc(np.dtype("<i8"), "bitshuffle"), CRC]}),
    Candidate("q + pcodec8 auto", True,
              lambda d, b: {"filters": [_quant(d, b)], "serializer": PCodec(level=8),
                            "compressors": [CRC]}),
    Candidate("q + pcodec8 lookback", True,
              lambda d, b: {"filters": [_quant(d, b)],
                            "serializer": PCodec(level=8, delta_spec="try_lookback"),
                            "compressors": [CRC]}),
    Candidate("T + q + pcodec8 auto", True,
              lambda d, b: {"filters": [T_MAJOR, _quant(d, b)], "serializer": PCodec(level=8),
                            "compressors": [CRC]}),
    Candidate("T + q + pcodec8 delta1", True,
              lambda d, b: {"filters": [T_MAJOR, _quant(d, b)],
                            "serializer": PCodec(level=8, delta_spec="try_consecutive",
                                                 delta_encoding_order=1),
                            "compressors": [CRC]}),
    Candidate("T + q + pcodec8 delta2", True,
              lambda d, b: {"filters": [T_MAJOR, _quant(d, b)],
                            "serializer": PCodec(level=8, delta_spec="try_consecutive",
                                                 delta_encoding_order=2),
                            "compressors": [CRC]}),
    Candidate("flyarchive abs", True, lambda d, b: codecs.array_codecs(f"abs:{b!r}", d)),
]


def savez_bytes(qpos: np.ndarray) -> int:
    """Size of ``np.savez_compressed`` of the array, bytes."""
    buf = io.BytesIO()
    np.savez_compressed(buf, qpos=qpos)
    return buf.getbuffer().nbytes


def stored_bytes(objects: dict[str, Any]) -> int:
    """Bytes of chunk data (shards) among a MemoryStore's objects, metadata documents excluded."""
    return sum(len(v) for k, v in objects.items() if not k.endswith("zarr.json"))


def measure(
    candidate: Candidate, qpos: np.ndarray, bound: float, repeat: int, chunk_frames: int
) -> dict[str, Any]:
    """Write ``qpos`` (worlds, frames, nq) through one pipeline; size, speed and error."""
    dtype = qpos.dtype
    kwargs = candidate.build(dtype, bound)
    kwargs.setdefault("serializer", BytesCodec())
    shape = qpos.shape
    best_enc, best_dec = math.inf, math.inf
    for _ in range(repeat):
        objects: dict[str, Any] = {}
        store = MemoryStore(objects)
        arr = zarr.create_array(store, name="qpos", shape=shape, dtype=dtype,
                                chunks=(1, chunk_frames, shape[2]),
                                shards=(shape[0], chunk_frames, shape[2]),
                                fill_value=np.nan, **kwargs)
        t0 = time.perf_counter()
        arr[:] = qpos
        best_enc = min(best_enc, time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = arr[:]
        best_dec = min(best_dec, time.perf_counter() - t0)
    n = stored_bytes(objects)
    err = float(np.max(np.abs(back.astype(np.float64) - qpos.astype(np.float64))))
    exact = back.dtype == qpos.dtype and back.tobytes() == qpos.tobytes()
    return {
        "pipeline": candidate.name,
        "lossy": candidate.lossy,
        "dtype": dtype.name,
        "bytes": n,
        "bytes_per_frame": n / (shape[0] * shape[1]),
        "encode_MBps": qpos.nbytes / best_enc / 1e6,
        "decode_MBps": qpos.nbytes / best_dec / 1e6,
        "max_abs_error": err,
        "bit_exact": bool(exact),
        "within_bound": bool(err <= bound) if candidate.lossy else bool(exact),
    }


TABLE = Table([
    Column("pipeline", 44, "pipeline", align="<"), Column("dtype", 7, "dtype", align="<"),
    Column("B/frame", 8, "bytes_per_frame", ".1f"), Column("vs npz", 7, "ratio_to_savez", ".3f"),
    Column("enc MB/s", 9, "encode_MBps", ".1f"), Column("dec MB/s", 9, "decode_MBps", ".1f"),
    Column("max err", 9, "max_abs_error", ".2e"),
    Column("ok", 2, lambda r: "yes" if r["within_bound"] else "NO", align="<"),
])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=positive_int, default=250,
                        help="frames per world (default 250)")
    parser.add_argument("--worlds", type=positive_int, default=1, help="walks with different seeds")
    parser.add_argument("--chunk-frames", type=positive_int, default=None,
                        help="frames per chunk (default: all frames in one chunk)")
    parser.add_argument("--bound", type=positive_float, default=1e-6, help="absolute error bound")
    parser.add_argument("--repeat", type=positive_int, default=3, help="best of N timings")
    add_json_option(parser)
    args = parser.parse_args(argv)

    walks = nmf_states(args.worlds, args.frames)  # independent walks, seeds 0 .. worlds-1
    chunk_frames = args.chunk_frames or args.frames
    rows: list[dict[str, Any]] = []
    for dtype in (np.float64, np.float32):
        qpos = walks.astype(dtype)
        npz = sum(savez_bytes(w) for w in qpos)
        npz_per_frame = npz / (qpos.shape[0] * qpos.shape[1])
        print(f"\n{dtype.__name__}: {qpos.shape}, raw {qpos.itemsize * qpos.shape[2]} B/frame, "
              f"savez_compressed {npz_per_frame:.1f} B/frame")
        print(TABLE.header())
        for candidate in CANDIDATES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # zarr: numcodecs not in spec
                row = measure(candidate, qpos, args.bound, args.repeat, chunk_frames)
            row["ratio_to_savez"] = row["bytes_per_frame"] / npz_per_frame
            row["savez_bytes_per_frame"] = npz_per_frame
            rows.append(row)
            print(TABLE.line(row), flush=True)
    meta = {"frames": args.frames, "worlds": args.worlds, "chunk_frames": chunk_frames,
            "bound": args.bound, "nq": int(walks.shape[2]), "zarr": zarr.__version__,
            "host_info": host_info()}
    write_json(args.json, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
