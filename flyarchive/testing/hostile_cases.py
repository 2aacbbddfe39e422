"""Hostile archives: a small sound archive (:func:`make_sound`) and an adversary's edits of
copies of it (:data:`CASES`, :func:`make_case`): a chunk that decodes to gigabytes, a chunk
that is a FIFO or a link to ``/dev/zero``, metadata nested 200,000 deep... What each command
does with them is :mod:`flyarchive.testing.hostile`'s.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flyarchive.testing.holes import INCONSISTENT_CASES, MISSING_CASES

__all__ = ["CASES", "make_sound", "make_case", "pcodec_bomb", "rewrite_shard", "snapshot",
           "unpickled_marker", "BOMB_BYTES"]

#: What every bomb decodes to, bytes: well above :data:`MEMORY_CAP` (4 GiB).
BOMB_BYTES = 4 << 30
def make_sound(url: str) -> str:
    """Record a small sound archive: 2 worlds of the tiny model, 20 frames, chunks of 5."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    with TrajectoryRecorder(url, model, chunk_frames=5) as recorder:
        simulate(model, 2, 76, recorder.record_as_needed)
    return url


# ----------------------------------------------------------------------------- building blocks
def _meta(root: Path, name: str) -> tuple[Path, dict]:
    path = root / name / "zarr.json" if name else root / "zarr.json"
    return path, json.loads(path.read_text())


def _crc(data: bytes) -> bytes:
    import google_crc32c

    return np.uint32(google_crc32c.value(data)).tobytes()


def pcodec_bomb(n_bytes: int = BOMB_BYTES) -> bytes:
    """Standalone pcodec data of float64 zeros that decodes to ``n_bytes`` (in kilobytes).

    pcodec stores 2**18 equal values in a 33-byte chunk; the bomb repeats that chunk.
    """
    from numcodecs.pcodec import PCodec

    one = PCodec(level=8, delta_spec="try_lookback").encode(np.zeros(1 << 18))
    header, body, end = one[:12], one[12:-1], one[-1:]
    return header + body * max(1, n_bytes // (8 << 18)) + end


def rewrite_shard(path: Path, n_inner: int, replace: dict[int, bytes]) -> None:
    """Replace inner chunks of a shard (pcodec + crc32c, index at the end) by new pcodec
    data, with valid checksums, so that only decoding can tell them apart."""
    data = path.read_bytes()
    table = np.frombuffer(data[-(n_inner * 16 + 4):-4], "<u8").reshape(n_inner, 2)
    chunks = [data[int(o):int(o + n)] for o, n in table]
    for i, payload in replace.items():
        chunks[i] = payload + _crc(payload)
    offsets = np.cumsum([0] + [len(c) for c in chunks[:-1]])
    index = np.stack([offsets, [len(c) for c in chunks]], axis=1).astype("<u8").tobytes()
    path.write_bytes(b"".join(chunks) + index + _crc(index))


def _gzip_bomb(root: Path) -> None:
    """n_frames: metadata names gzip; a chunk of ~4 MB decodes to 4 GiB."""
    path, meta = _meta(root, "n_frames")
    meta["codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}},
                      {"name": "gzip", "configuration": {"level": 9}}]
    path.write_text(json.dumps(meta))
    member = gzip.compress(bytes(64 << 20), compresslevel=9)  # gzip members concatenate
    (root / "n_frames" / "c" / "0").write_bytes(member * (BOMB_BYTES // (64 << 20)))


def _pcodec_bomb(root: Path) -> None:
    """qpos: the pipeline flyarchive writes, a shard whose first chunk declares 4 GiB."""
    rewrite_shard(root / "qpos" / "c" / "0" / "1" / "0", 2, {0: pcodec_bomb()})


def _huge_file(root: Path) -> None:
    """n_frames: a 4 GiB (sparse) chunk file where 20 bytes belong."""
    with open(root / "n_frames" / "c" / "0", "r+b") as f:
        f.truncate(BOMB_BYTES)


def _dev_zero(root: Path) -> None:
    chunk = root / "qpos" / "c" / "0" / "1" / "0"
    chunk.unlink()
    chunk.symlink_to("/dev/zero")


def _fifo(root: Path) -> None:
    chunk = root / "time" / "c" / "1"
    chunk.unlink()
    os.mkfifo(chunk)


def _huge_chunk_shape(root: Path) -> None:
    path, meta = _meta(root, "n_frames")
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [10**12]
    path.write_text(json.dumps(meta))


def _deep_attrs(root: Path) -> None:
    path, meta = _meta(root, "")
    meta["attributes"]["notes"] = "DEEP"
    path.write_text(json.dumps(meta).replace('"DEEP"', "[" * 200_000 + "]" * 200_000))


def _attr(name: str, value: object) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        path, meta = _meta(root, "")
        meta["attributes"][name] = value
        path.write_text(json.dumps(meta))

    return edit


def _zstd_labels(root: Path) -> None:
    """dof labels: a zstd frame whose header declares 4 GiB (64 MiB of zeros inside)."""
    from numcodecs.zstd import Zstd

    frame = bytearray(Zstd(level=1).encode(bytes(64 << 20)))
    descriptor = frame[4]
    assert descriptor >> 6 == 2 and not (descriptor >> 5) & 1 and not descriptor & 3
    frame[6:10] = (BOMB_BYTES - 1).to_bytes(4, "little")  # after the window descriptor
    (root / "dof" / "c" / "0").write_bytes(bytes(frame))


def _zarr_v2_pickle(root: Path) -> None:
    """The archive as zarr v2: qpos's compressor is pickle; a chunk holds a pickle that
    would make a folder."""
    path, meta = _meta(root, "")
    (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (root / ".zattrs").write_text(json.dumps(meta["attributes"]))
    path.unlink()
    qpos, meta = _meta(root, "qpos")
    (root / "qpos" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": meta["shape"], "chunks": [2, 5, 13], "dtype": "<f8",
        "compressor": {"id": "pickle"}, "filters": None, "fill_value": "NaN", "order": "C",
        "dimension_separator": "/"}))
    dims = {"_ARRAY_DIMENSIONS": ["world", "time", "dof"]}
    (root / "qpos" / ".zattrs").write_text(json.dumps(dims))
    qpos.unlink()
    shutil.rmtree(root / "qpos" / "c")
    (root / "qpos" / "0" / "0").mkdir(parents=True)
    (root / "qpos" / "0" / "0" / "0").write_bytes(_mkdir_pickle(root))


def _mkdir_pickle(root: Path) -> bytes:
    """Protocol-0 pickle bytes that call ``os.mkdir(<root>.unpickled)`` when unpickled."""
    return f"cos\nmkdir\n(V{root.parent / (root.name + '.unpickled')}\ntR.".encode()


def _pickle_codec(root: Path) -> None:
    """qpos names numcodecs.pickle, and a chunk holds a pickle that would make a folder."""
    path, meta = _meta(root, "qpos")
    meta["codecs"][0]["configuration"]["codecs"].insert(0, {"name": "numcodecs.pickle"})
    path.write_text(json.dumps(meta))
    rewrite_shard(root / "qpos" / "c" / "0" / "0" / "0", 2, {0: _mkdir_pickle(root)})


def _flip(*parts: str) -> Callable[[Path], None]:
    def flip(root: Path) -> None:
        from flyarchive.testing import flip_bits

        flip_bits(root.joinpath(parts[0], "c", *parts[1:]))

    return flip


#: Hostile cases: name -> edit of a copy of :func:`make_sound`'s archive.
CASES: dict[str, Callable[[Path], None]] = {
    "n_frames chunk: gzip, 4 MB -> 4 GiB": _gzip_bomb,
    "qpos chunk: pcodec, 4 GiB of zeros": _pcodec_bomb,
    "n_frames chunk file of 4 GiB": _huge_file,
    "qpos chunk -> /dev/zero": _dev_zero,
    "time chunk is a FIFO": _fifo,
    "n_frames chunk shape 10**12": _huge_chunk_shape,
    "attributes nested 200,000 deep": _deep_attrs,
    "codec attribute a string": _attr("codec", "lossless"),
    "layout attribute a string": _attr("layout", "joints"),
    "dof labels: zstd frame declaring 4 GiB": _zstd_labels,
    "qpos codec numcodecs.pickle": _pickle_codec,
    "zarr v2 archive, qpos compressor pickle": _zarr_v2_pickle,
    "flipped bits in a time chunk": _flip("time", "1"),
    "flipped bits in a qpos shard": _flip("qpos", "0", "1", "0"),
    # committed frames missing, and archives whose parts disagree (flyarchive.testing.holes)
    **{name: edit for name, (edit, _) in MISSING_CASES.items()},
    **INCONSISTENT_CASES,
}


def make_case(sound: str, name: str, target: Path) -> str:
    """Copy the sound archive to ``target`` and apply case ``name``; returns its URL."""
    shutil.copytree(sound, target, symlinks=True)
    CASES[name](target)
    return str(target)


def unpickled_marker(url: str) -> Path:
    """The folder a pickle case's payload would create if anything unpickled it."""
    root = Path(url)
    return root.parent / f"{root.name}.unpickled"


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root`` without following links or opening anything but small
    regular files: relative path -> bytes (regular files up to 16 MiB), else
    ``(kind, size, mtime_ns, link target)``."""
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and st.st_size <= 16 << 20:
            out[str(path.relative_to(root))] = path.read_bytes()
        else:
            target = os.readlink(path) if path.is_symlink() else None
            out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size,
                                                st.st_mtime_ns, target)
    return out
