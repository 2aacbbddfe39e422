"""An array's metadata is stored twice: its own ``zarr.json`` and the consolidated copy in
the root ``zarr.json`` (:mod:`~flyarchive.store.consolidated`). Readers on remote storage
decode with the copy, local readers, writers and ``verify`` with the array's own; plain
``xarray.open_zarr`` with the copy. So both must be what flyarchive writes (every
pipeline of numbers ends in CRC-32C, state in one of flyarchive's state pipelines:
:func:`~flyarchive.store.allowlist.check_array_metadata`) and agree on everything that
decides how stored bytes decode: data type, chunks and shards, codecs, fill value,
dimension names, and shape (the copy's ``time`` extent may be shorter: it is cut to the
committed frames). Otherwise metadata could switch checksums off or make intact bytes
decode as other values (a transpose order, a scale, an endianness).

Readers compare the two at no extra round trip: a group opened without the copy (local,
``memory://``) re-reads the root document, one small file, and compares every array
(:func:`read_copy`, :func:`check_copies`); a group opened with it (S3) fetches the own
``zarr.json`` of state, ``n_frames``, ``time`` and ``world`` (:data:`OWN_CHECKED`) in its
first round of reads, beside ``n_frames`` and the coordinates (:func:`check_own`,
:func:`read_checked`); for the other arrays it decodes with the copy, whose pipeline must
then be exactly what flyarchive writes. The copy is always read before the arrays' own
metadata, and writers grow an array's own metadata before they rewrite the copy, so a
writer's commit never makes the two disagree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import zarr

from flyarchive.errors import SchemaError
from flyarchive.schema import STATE_VARS
from flyarchive.store.allowlist import check_array_metadata, check_json_bytes
from flyarchive.store.location import sync
from flyarchive.zarr_internals import ArrayV3Metadata, default_buffer_prototype

#: The arrays whose own ``zarr.json`` readers of the consolidated copy fetch and compare:
#: state and the numbers read at open. Each request costs CPU (on loopback S3 about 5 ms
#: on the 2-core VM: ``scripts/bench_open.py``), so the copies of the other arrays are
#: only held to exactly what flyarchive writes (:mod:`~flyarchive.store.allowlist`);
#: ``verify`` and local readers compare them all.
OWN_CHECKED = (*STATE_VARS, "n_frames", "time", "world")
#: The fields of an array's metadata that decide how its stored bytes decode, and their
#: names in messages (the shape is compared apart: ``time`` may be shorter in the copy).
DECODING = {"data_type": "data type", "chunk_grid": "chunks (or shards)",
            "chunk_key_encoding": "chunk key encoding", "codecs": "codecs",
            "fill_value": "fill value", "dimension_names": "dimension names",
            "storage_transformers": "storage transformers"}


def plain(meta: ArrayV3Metadata) -> dict[str, Any]:
    """An array's metadata as zarr writes it to ``zarr.json`` (JSON types only)."""
    return json.loads(json.dumps(meta.to_dict(), default=str))


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _stages(codecs: Any) -> str:
    """``sharding_indexed(numcodecs.pcodec, crc32c)``: the names of a pipeline, nested."""
    if not isinstance(codecs, list):
        return _text(codecs)[:80]
    out = []
    for codec in codecs:
        name = codec.get("name") if isinstance(codec, dict) else codec
        inner = (codec.get("configuration") or {}).get("codecs") if isinstance(codec, dict) \
            else None
        out.append(f"{name}({_stages(inner)})" if isinstance(inner, list) else str(name))
    return ", ".join(out)


def _configured(copy: Any, own: Any) -> tuple[str, str]:
    """The first stage of two pipelines of the same stages that is configured differently:
    ``('bytes {"endian": "big"}', 'bytes {"endian": "little"}')``."""
    pairs = list(zip(copy, own)) if isinstance(copy, list) and isinstance(own, list) else []
    for a, b in pairs:
        if _text(a) == _text(b) or not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        a_conf, b_conf = a.get("configuration") or {}, b.get("configuration") or {}
        if isinstance(a_conf, dict) and isinstance(b_conf, dict) and "codecs" in a_conf:
            for key in ("codecs", "index_codecs"):
                if _text(a_conf.get(key)) != _text(b_conf.get(key)):
                    return _configured(a_conf.get(key), b_conf.get(key))
            a_conf = {k: v for k, v in a_conf.items() if k not in ("codecs", "index_codecs")}
            b_conf = {k: v for k, v in b_conf.items() if k not in ("codecs", "index_codecs")}
        return (f"{a.get('name')} {_text(a_conf)[:120]}", f"{b.get('name')} {_text(b_conf)[:120]}")
    return _text(copy)[:160], _text(own)[:160]


def _shown(field: str, copy: Any, own: Any) -> tuple[str, str]:
    if field == "codecs":
        stages = (_stages(copy)[:200], _stages(own)[:200])
        return stages if stages[0] != stages[1] else _configured(copy, own)
    return _text(copy)[:160], _text(own)[:160]


def _shape_agrees(own: Mapping[str, Any], copy: Mapping[str, Any]) -> bool:
    """The copy's shape is the array's own, but for a ``time`` extent that may be shorter."""
    own_shape, copy_shape = list(own.get("shape") or ()), copy.get("shape")
    if not isinstance(copy_shape, (list, tuple)) or len(copy_shape) != len(own_shape):
        return False
    dims = list(own.get("dimension_names") or ()) + [None] * len(own_shape)
    return all(type(c) is int and (c == o or (d == "time" and 0 <= c < o))
               for c, o, d in zip(copy_shape, own_shape, dims))


def _decoding(meta: Mapping[str, Any]) -> str:
    return _text({field: meta.get(field) for field in DECODING})


def _agree(own: Mapping[str, Any], copy: Mapping[str, Any]) -> bool:
    """True when nothing that decides decoding differs (compared as JSON text)."""
    return _shape_agrees(own, copy) and _decoding(own) == _decoding(copy)


def differences(own: Mapping[str, Any], copy: Mapping[str, Any]) -> list[str]:
    """What differs between an array's own metadata and its consolidated copy that changes
    how its bytes decode, one phrase each (empty when they agree).

    Args:
        own: The array's own ``zarr.json``, as :func:`plain` gives it.
        copy: Its consolidated copy, the same way.
    """
    found = []
    if not _shape_agrees(own, copy):
        found.append(f"shape ({tuple(copy.get('shape') or ())} in the copy, "
                     f"{tuple(own.get('shape') or ())} in its own)")
    for field, label in DECODING.items():
        if _text(copy.get(field)) == _text(own.get(field)):
            continue
        shown = _shown(field, copy.get(field), own.get(field))
        found.append(f"{label} ({shown[0]} in the copy, {shown[1]} in its own)")
    return found


def _compare(name: str, checked: Mapping[str, Any], stored: Any, archive: str, *,
             stored_is_copy: bool) -> None:
    """Compare the metadata a group reads an array with (``checked``: already checked
    against what flyarchive writes) with its other copy as stored (``stored``, JSON).

    Raises:
        SchemaError: the stored copy is not what flyarchive writes, or decodes otherwise.
    """
    own, copy = (checked, stored) if stored_is_copy else (stored, checked)
    if isinstance(stored, dict) and _agree(own, copy):
        return  # the same pipeline as the one checked, so nothing more to check
    where = copy_where(archive, name) if stored_is_copy else own_where(archive, name)
    parsed = _parsed(stored, where, archive, name)
    found = differences(*((checked, parsed) if stored_is_copy else (parsed, checked)))
    if found:
        raise disagreement(name, found, archive)


def copy_where(archive: str, name: str) -> str:
    """Where an array's consolidated copy is, for messages."""
    return f"{archive.rstrip('/')}/zarr.json (the consolidated metadata of {name!r})"


def own_where(archive: str, name: str) -> str:
    """Where an array's own metadata is, for messages."""
    return f"{archive.rstrip('/')}/{name}/zarr.json"


def disagreement(name: str, found: list[str], archive: str) -> SchemaError:
    """The error for an array whose consolidated copy disagrees with its own metadata."""
    return SchemaError(
        f"The metadata of {name!r} disagrees with itself: its consolidated copy in "
        f"{archive.rstrip('/')}/zarr.json and its own {own_where(archive, name)} differ in "
        f"{'; '.join(found)}. flyarchive reads only what it writes, so it returned nothing. The "
        f"archive was damaged or tampered with; run `flyarchive verify {archive}` to list "
        "every problem, and restore both files from a backup."
    )


def _parsed(raw: Any, where: str, archive: str, name: str) -> dict[str, Any]:
    """One array's metadata, checked against what flyarchive writes, as :func:`plain` gives it."""
    check_array_metadata(raw, where, archive, name=name)
    try:
        return plain(ArrayV3Metadata.from_dict(dict(raw)))
    except Exception as err:  # zarr refuses what it cannot parse in many ways
        raise SchemaError(
            f"{where}: zarr cannot parse it ({type(err).__name__}: {str(err)[:200]}). Run "
            f"`flyarchive verify {archive}`; restore the file from a backup.") from None


def read_copy(group: zarr.Group, archive: str) -> dict[str, Any]:
    """The consolidated copy in the root ``zarr.json`` of ``group``'s store, as stored:
    array name -> its metadata as JSON (empty without one). Read it before the arrays'
    own metadata (see the module's text).

    Raises:
        SchemaError: the root ``zarr.json`` is too large or nested too deeply.
    """
    raw = sync((group.store_path / "zarr.json").get(prototype=default_buffer_prototype()))
    if raw is None:
        return {}  # the group is gone: what reads it next reports that
    data = raw.to_bytes()
    check_json_bytes(data, f"{archive.rstrip('/')}/zarr.json", archive)
    try:
        document = json.loads(data)
    except ValueError:
        return {}  # zarr parsed it a moment ago: a writer replaced it; the next read says so
    copy = document.get("consolidated_metadata") if isinstance(document, dict) else None
    listed = copy.get("metadata") if isinstance(copy, dict) else None
    return listed if isinstance(listed, dict) else {}


def check_copies(listed: Mapping[str, Any], checked: Mapping[str, Mapping[str, Any]],
                 archive: str) -> None:
    """Check the consolidated copy of every array of a group opened without it.

    Args:
        listed: The copy (:func:`read_copy`), read before the arrays' own metadata.
        checked: The arrays' own metadata, as
            :func:`~flyarchive.store.allowlist.check_arrays` checked it.
        archive: The archive's URL, for messages.

    Raises:
        SchemaError: naming the array, the file and what differs: a copy whose pipeline
            flyarchive does not write (no CRC-32C...), or that decodes otherwise.
    """
    for name, own in sorted(checked.items()):
        copied = listed.get(name)
        if not isinstance(copied, dict) or copied.get("node_type") != "array":
            continue  # a copy without the array: readers that use it do not see it
        _compare(name, own, copied, archive, stored_is_copy=True)


async def check_own(group: zarr.Group, archive: str) -> None:
    """Check the own ``zarr.json`` of the arrays of :data:`OWN_CHECKED` of ``group``, opened
    with the consolidated copy, against it; fetched concurrently (one round of requests).
    Nothing to do for a group opened without the copy.

    Raises:
        SchemaError: naming the array, the file and what differs (or that it is missing).
    """
    copy = group.metadata.consolidated_metadata
    if copy is None:
        return
    names = sorted(name for name in OWN_CHECKED
                   if isinstance(copy.metadata.get(name), ArrayV3Metadata))
    proto = default_buffer_prototype()
    found = await asyncio.gather(*((group.store_path / name / "zarr.json").get(prototype=proto)
                                   for name in names))
    for name, raw in zip(names, found):
        where = own_where(archive, name)
        if raw is None:
            raise SchemaError(
                f"{where} is missing, though the consolidated metadata in "
                f"{archive.rstrip('/')}/zarr.json lists the array {name!r}. flyarchive reads "
                f"only what it writes, so nothing was read. Run `flyarchive verify {archive}`; "
                "restore the file from a backup.")
        data = raw.to_bytes()
        check_json_bytes(data, where, archive)
        try:
            own = json.loads(data)
        except ValueError as err:
            raise SchemaError(f"{where}: it is not JSON ({err}). Run `flyarchive verify "
                              f"{archive}`; restore the file from a backup.") from None
        _compare(name, plain(copy.metadata[name]), own, archive, stored_is_copy=False)


async def read_checked(group: zarr.Group, archive: str, reads: Sequence[Awaitable[Any]]
                       ) -> list[Any]:
    """``reads`` awaited beside :func:`check_own`, in one round of requests.

    Returns:
        What each read returned, in order.

    Raises:
        SchemaError: from :func:`check_own`, before any read's error (metadata that does
            not agree explains a read that failed).
        Exception: the first read's error, when the metadata agrees.
    """
    checked, *results = await asyncio.gather(check_own(group, archive), *reads,
                                             return_exceptions=True)
    for outcome in (checked, *results):
        if isinstance(outcome, BaseException):
            raise outcome
    return results
