"""What flyarchive accepts from an archive before it decodes a byte of it.

An archive is untrusted input: a file from a colleague, a bucket, a download. Before
any chunk of an array is read, its metadata must name one of the codec pipelines
flyarchive writes (an allowlist: a pickle, gzip or blosc stage is refused before
zarr builds it), with chunks small enough to decode in bounded memory. Metadata
files must be small and shallow (JSON nested 200,000 deep exhausts Python's
recursion). The local store (:mod:`flyarchive.store.localstore`) applies these limits
to every file it reads; :func:`check_arrays` applies them on any storage. While
chunks decode, the decoders of :mod:`flyarchive.store.decoders` keep to the declared
shapes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.storage

from flyarchive.schema import MAX_STRING_CHUNK_BYTES, MAX_STRINGS
from flyarchive.errors import CorruptArchiveError, SchemaError
from flyarchive.schema import MAX_JSON_DEPTH, STATE_VARS, is_state, json_depth_of
from flyarchive.store.decoders import BLOSC_HEADER, install_bounded_decoders

#: Largest metadata file (``zarr.json``) read; large per-world data belongs in world variables.
MAX_METADATA_BYTES = 4 << 20
#: Largest decoded chunk (the unit a codec decodes at once), bytes.
MAX_CHUNK_BYTES = 256 << 20
#: Largest decoded shard (what one read of a stored object may allocate), bytes.
MAX_SHARD_BYTES = 1 << 30
#: Most stored objects (shards or chunks) per array: dask builds a task per object.
MAX_OBJECTS = 1 << 22

_FIXED_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64", "complex64", "complex128"}
)
#: Data types with a configuration, as zarr writes world variables of numpy dtypes U, M, m.
_CONFIGURED_DTYPES = ("fixed_length_utf32", "numpy.datetime64", "numpy.timedelta64")
_SERIALIZERS = ("bytes", "numcodecs.pcodec")
_FILTERS = ("numcodecs.fixedscaleoffset", "transpose")
_COMPRESSORS = ("blosc",)  # between the serializer and crc32c (codec="portable")
_WRITTEN = (
    "sharding_indexed(numcodecs.pcodec, crc32c) or numcodecs.pcodec, crc32c for state, "
    "sharding_indexed(transpose, bytes, blosc, crc32c) for portable state; "
    "bytes, crc32c for numbers; vlen-utf8 with zstd or crc32c for labels"
)
#: The chunk pipelines of state arrays (inside ``sharding_indexed``): lossless, ``abs:<bound>``
#: and portable (:mod:`flyarchive.codecs`). Each ends in CRC-32C.
_STATE_PIPELINES = (
    ["numcodecs.pcodec", "crc32c"],
    ["numcodecs.fixedscaleoffset", "numcodecs.pcodec", "crc32c"],
    ["transpose", "bytes", "blosc", "crc32c"],
    ["bytes", "crc32c"],
)
_STATE_WRITTEN = ("numcodecs.pcodec, crc32c (lossless); numcodecs.fixedscaleoffset, "
                  "numcodecs.pcodec, crc32c (abs:<bound>); transpose, bytes, blosc, crc32c "
                  "(portable); bytes, crc32c (kept positions), each inside sharding_indexed "
                  "with index codecs bytes, crc32c")
#: Arrays flyarchive always writes with :data:`_LITTLE` then crc32c (world variables may be
#: big-endian numbers, as a user's array was).
FIXED_NUMBERS = ("n_frames", "time", "sim_time", "frame", "world")
_LITTLE = {"name": "bytes", "configuration": {"endian": "little"}}
_NO_CHECKSUM = ("; flyarchive ends every chunk of numbers with a CRC-32C checksum, and without "
                "one damaged bytes would be read as data")


@dataclass(frozen=True)
class ChunkLimits:
    """Bounds on one stored object (chunk or shard file) of an array.

    Attributes:
        file_bytes: Most bytes an encoded object can need for the declared shapes.
        zstd_bytes: For string arrays compressed with zstd, the most bytes a zstd frame
            may declare it decodes to; None when the pipeline has no zstd stage.
    """

    file_bytes: int
    zstd_bytes: int | None = None


def refuse(where: str, problem: str, archive: str) -> SchemaError:
    """The error for a metadata file flyarchive does not accept, naming it and the problem."""
    return SchemaError(
        f"{where}: {problem}. flyarchive reads only what it writes, so nothing was decoded. "
        f"The archive was damaged or tampered with; run `flyarchive verify {archive}` to "
        "list every problem, and restore the file from a backup."
    )


def _ints(value: Any, ndim: int | None, what: str) -> tuple[int, ...]:
    ok = isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)
    if not ok or (ndim is not None and len(value) != ndim) or len(value) > 8:
        raise ValueError(f"{what} is {str(value)[:80]!r}, not a list of non-negative integers"
                         + (f" of length {ndim}" if ndim is not None else ""))
    return tuple(value)


def _names(codecs: Any) -> list[str]:
    if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
        raise ValueError(f"codecs is {str(codecs)[:80]!r}, not a list of codec objects")
    names = [c.get("name") for c in codecs]
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"a codec has the name {name!r}")
    return names


def _itemsize(dtype: Any) -> int:
    """Bytes per element of a zarr v3 data type flyarchive writes (not ``"string"``)."""
    if isinstance(dtype, str) and dtype in _FIXED_DTYPES:
        return np.dtype(dtype).itemsize
    if isinstance(dtype, dict) and dtype.get("name") in _CONFIGURED_DTYPES:
        if dtype["name"] != "fixed_length_utf32":
            return 8
        length = (dtype.get("configuration") or {}).get("length_bytes")
        if type(length) is int and 0 < length <= 1 << 20:
            return length
    raise ValueError(f"data type {str(dtype)[:80]!r} is not one flyarchive writes")


def _pipeline_bound(codecs: Any, shape: tuple[int, ...], dtype: Any) -> ChunkLimits:
    """Check one codec pipeline against the allowlist; bound its encoded size."""
    names = _names(codecs)
    n = math.prod(shape)
    if dtype == "string":
        if names not in (["vlen-utf8"], ["vlen-utf8", "zstd"], ["vlen-utf8", "crc32c"]):
            raise ValueError(f"the string pipeline {names} is not one flyarchive writes "
                             f"({_WRITTEN})")
        if n > MAX_STRINGS:
            raise ValueError(f"a chunk holds {n} strings; flyarchive reads at most {MAX_STRINGS}")
        return ChunkLimits(MAX_STRING_CHUNK_BYTES + 4,
                           MAX_STRING_CHUNK_BYTES if "zstd" in names else None)
    size = n * _itemsize(dtype)
    if names and names[0] == "sharding_indexed":
        if len(names) != 1:
            raise ValueError(f"stages {names[1:]} follow sharding_indexed")
        return _sharding_bound(codecs[0].get("configuration"), shape, dtype)
    if size > MAX_CHUNK_BYTES:
        raise ValueError(f"a chunk of shape {shape} decodes to {size} bytes; flyarchive reads "
                         f"chunks of at most {MAX_CHUNK_BYTES} bytes")
    filters = [x for x in names if x in _FILTERS]
    rest = names[len(filters):]
    compressors = [x for x in rest[1:2] if x in _COMPRESSORS]
    checks = rest[1 + len(compressors):]
    if names[:len(filters)] != filters or not rest or rest[0] not in _SERIALIZERS \
            or any(x != "crc32c" for x in checks):
        raise ValueError(f"the pipeline {names} is not one flyarchive writes ({_WRITTEN})")
    if checks != ["crc32c"]:
        raise ValueError(f"the pipeline {names} does not end in one crc32c stage" + _NO_CHECKSUM)
    encoded = size if rest[0] == "bytes" else 2 * size + (64 << 10)  # pcodec: raw bits + headers
    if compressors:  # blosc: at most its 16-byte header over the raw bytes
        encoded += BLOSC_HEADER
    return ChunkLimits(encoded + 4 * len(checks))


def _sharding_bound(config: Any, shape: tuple[int, ...], dtype: Any) -> ChunkLimits:
    if not isinstance(config, dict):
        raise ValueError("sharding_indexed has no configuration")
    inner = _ints(config.get("chunk_shape"), len(shape), "the inner chunk shape")
    if any(i == 0 or s % i for s, i in zip(shape, inner)):
        raise ValueError(f"the inner chunk shape {inner} does not divide the shard shape {shape}")
    if math.prod(shape) * _itemsize(dtype) > MAX_SHARD_BYTES:
        raise ValueError(f"a shard of shape {shape} decodes to more than {MAX_SHARD_BYTES} bytes")
    if _names(config.get("index_codecs")) != ["bytes", "crc32c"]:
        raise ValueError(f"the shard index codecs {_names(config.get('index_codecs'))} are not "
                         "bytes, crc32c (flyarchive checks every shard index with CRC-32C)")
    if config.get("index_location", "end") not in ("end", "start"):
        raise ValueError(f"index_location is {config.get('index_location')!r}")
    if "sharding_indexed" in _names(config.get("codecs")):
        raise ValueError("shards are nested")
    each = _pipeline_bound(config.get("codecs"), inner, dtype).file_bytes
    count = math.prod(s // i for s, i in zip(shape, inner))
    return ChunkLimits(count * (each + 16) + 4)


def check_array_metadata(meta: Any, where: str, archive: str, *,
                         name: str | None = None) -> ChunkLimits:
    """Check one array's zarr v3 metadata against what flyarchive writes.

    Args:
        meta: The parsed ``zarr.json`` of an array.
        where: Its location, for messages (e.g. ``"/data/run.zarr/qpos/zarr.json"``).
        archive: The archive's URL, for the pointer to ``flyarchive verify``.
        name: The array's name in the archive: a state array (``qpos``, mocap poses, and
            any array of dims ``(world, time, ...)``, such as a derived group's
            ``position``) must have one of the state pipelines flyarchive writes. None:
            any allowed one.

    Returns:
        Bounds on the array's stored objects.

    Raises:
        SchemaError: naming the file and what in it flyarchive does not accept: a codec
            outside the allowlist (pickle, gzip, blosc...), a pipeline of numbers without
            its CRC-32C checksum, a chunk or shard too large to decode in bounded memory,
            too many stored objects, an unknown data type.
    """
    try:
        if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
            raise ValueError("it is not zarr v3 array metadata (flyarchive archives are zarr v3)")
        dtype = meta.get("data_type")
        if dtype != "string":
            _itemsize(dtype)
        shape = _ints(meta.get("shape"), None, "shape")
        grid = meta.get("chunk_grid") or {}
        if grid.get("name") != "regular":
            raise ValueError(f"chunk grid {str(grid)[:80]!r} is not 'regular'")
        chunks = _ints((grid.get("configuration") or {}).get("chunk_shape"), len(shape),
                       "chunk_shape")
        if 0 in chunks:
            raise ValueError(f"chunk_shape {chunks} has a zero")
        objects = math.prod(-(-s // c) for s, c in zip(shape, chunks))
        if objects > MAX_OBJECTS:
            raise ValueError(f"shape {shape} in chunks {chunks} makes {objects} stored objects; "
                             f"flyarchive reads at most {MAX_OBJECTS} per array")
        encoding = meta.get("chunk_key_encoding")
        if encoding != {"name": "default", "configuration": {"separator": "/"}}:
            raise ValueError(f"chunk_key_encoding {str(encoding)[:80]!r} is not the default '/'")
        if meta.get("storage_transformers"):
            raise ValueError("it has storage transformers")
        limits = _pipeline_bound(meta.get("codecs"), chunks, dtype)
        names = meta.get("dimension_names")
        if name in STATE_VARS or (name is not None and isinstance(names, list)
                                  and is_state(names)):
            _check_state_pipeline(meta.get("codecs"), len(shape), dtype)
        elif name in FIXED_NUMBERS:
            if meta.get("codecs") != [_LITTLE, {"name": "crc32c"}]:
                raise ValueError(f"the pipeline {str(meta.get('codecs'))[:160]} is not the one "
                                 f"flyarchive writes for {name!r} (bytes, little-endian, then "
                                 "crc32c)")
        return limits
    except ValueError as err:
        raise refuse(where, str(err), archive) from None


def _check_state_pipeline(codecs: list[dict[str, Any]], ndim: int, dtype: Any) -> None:
    """A state array's chunk pipeline (inside its shards) must be one flyarchive writes, with
    the settings that decide decoding as flyarchive sets them: the transpose that moves time
    last, little-endian bytes, a quantizer of offset 0 and a power-of-two scale in the
    array's own data type."""
    inner = codecs[0].get("configuration", {}).get("codecs") \
        if _names(codecs)[:1] == ["sharding_indexed"] else codecs
    if _names(inner) not in _STATE_PIPELINES:
        raise ValueError(f"the state pipeline {_names(inner)} is not one flyarchive writes "
                         f"({_STATE_WRITTEN})")
    for codec in inner:
        config = codec.get("configuration") or {}
        if codec["name"] == "transpose" and config.get("order") != [0, *range(2, ndim), 1]:
            raise ValueError(f"the transpose order {config.get('order')} is not the one "
                             f"flyarchive writes ({[0, *range(2, ndim), 1]}: time last)")
        if codec["name"] == "bytes" and codec != _LITTLE:
            raise ValueError(f"the bytes stage {codec} is not the one flyarchive writes "
                             "(little-endian)")
        if codec["name"] == "numcodecs.fixedscaleoffset":
            scale, native = config.get("scale"), np.dtype(dtype).str
            whole = isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)
            if config.get("offset") != 0 or not whole or math.frexp(scale)[0] != 0.5 \
                    or config.get("dtype") != native or config.get("astype") != native:
                raise ValueError(f"the quantizer {config} is not one flyarchive writes (offset "
                                 f"0, a power-of-two scale, dtype and astype {native!r})")


def check_arrays(group: zarr.Group, archive: str) -> dict[str, dict[str, Any]]:
    """Check the metadata of every array of an opened archive (any storage): the arrays'
    own, or their consolidated copy when the group was opened with it.

    Returns:
        The metadata checked, by array name, as zarr writes it to ``zarr.json`` (JSON).

    Raises:
        SchemaError: for the first array whose metadata :func:`check_array_metadata`
            refuses (naming the array's own ``zarr.json``, or the root ``zarr.json`` for the
            copy), or whose attributes nest deeper than :data:`MAX_JSON_DEPTH`.
    """
    copied = group.metadata.consolidated_metadata is not None
    checked = {}
    for name, arr in _arrays(group):
        where = (f"{archive.rstrip('/')}/zarr.json (the consolidated metadata of {name!r})"
                 if copied else f"{archive.rstrip('/')}/{name}/zarr.json")
        meta = arr.metadata
        plain = json.loads(json.dumps(meta.to_dict(), default=str)) if meta.zarr_format == 3 \
            else {}
        check_array_metadata(plain, where, archive, name=name)
        depth = json_depth_of(dict(arr.attrs))
        if depth > MAX_JSON_DEPTH:
            raise refuse(where, f"its attributes are nested {depth} deep (at most "
                         f"{MAX_JSON_DEPTH})", archive)
        checked[name] = plain
    return checked


def _arrays(group: zarr.Group) -> list[tuple[str, zarr.Array]]:
    """The group's arrays. On local disk one at a time, so that a refused file leaves no
    fetch pending; elsewhere concurrently (one round trip), one at a time after a failure."""
    if not isinstance(group.store, zarr.storage.LocalStore):
        try:
            return sorted(group.arrays())
        except Exception:
            pass
    from flyarchive.zarr_internals import sync

    async def names() -> list[str]:
        return [name async for name in group.store.list_dir(group.path)]

    found = []
    for name in sorted(sync(names())):
        if name == "zarr.json":
            continue
        try:
            node = group[name]
        except (SchemaError, CorruptArchiveError):
            raise
        except Exception:  # not a node, or metadata zarr cannot parse: reported on open
            continue
        if isinstance(node, zarr.Array):
            found.append((name, node))
    return found


# Strings (with their escapes) removed before counting brackets.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def json_depth(raw: bytes) -> int:
    """Deepest nesting of ``[`` and ``{`` in JSON text, counted without parsing it."""
    codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int64)
    steps -= np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))




def check_json_bytes(raw: bytes, where: str, archive: str) -> None:
    """Refuse a metadata file that is too large or too deeply nested to parse safely.

    Raises:
        SchemaError: naming the file, its size or depth, and the limit.
    """
    if len(raw) > MAX_METADATA_BYTES:
        raise refuse(where, f"it is {len(raw)} bytes; flyarchive reads metadata files of at "
                      f"most {MAX_METADATA_BYTES} bytes (keep per-world data in world variables)",
                      archive)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise refuse(where, f"its JSON is nested {depth} deep; flyarchive reads at most "
                      f"{MAX_JSON_DEPTH} levels", archive)


def zstd_content_size(frame: bytes) -> int | None:
    """The decoded size a zstd frame declares in its header; None if it declares none.

    Raises:
        ValueError: if ``frame`` does not start with a zstd frame header.
    """
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    descriptor = frame[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        return None
    if len(frame) < at + width:
        raise ValueError("truncated zstd frame header")
    size = int.from_bytes(frame[at:at + width], "little")
    return size + 256 if width == 2 else size
