"""Metadata that would switch checksums off, or make intact bytes decode as other values.

Used by ``tests/bad_input/test_checksums.py`` and ``scripts/reliability_report.py``. Each
:class:`Variant` edits one array's metadata in a copy of a small sound archive: in the
consolidated copy (the root ``zarr.json``, which readers on S3 decode with), in the
array's own ``zarr.json`` (which local readers decode with), or in both alike. The copy
also gets a flipped byte in a ``qpos`` shard, so that a reader that decodes without the
checksum returns damaged values as data. :func:`read_with` runs one read path on it
(``open_archive``, ``open_header``, the Warp :class:`~flyarchive.store.StateReader`,
``flyarchive info``'s summary, ``verify``) and says whether it was accepted.
Every variant must be refused by every path, local and on S3.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Variant", "VARIANTS", "READERS", "Outcome", "make_sound", "make_variant",
           "upload", "read_with", "names", "variants_table"]

#: The read paths :func:`read_with` knows.
READERS = ("open_archive", "open_header", "StateReader", "info", "verify")


@dataclass(frozen=True)
class Variant:
    """One edit of an array's metadata.

    Attributes:
        array: The array whose metadata is edited.
        where: ``"copy"`` (the consolidated copy in the root ``zarr.json``), ``"own"``
            (the array's own ``zarr.json``) or ``"both"``.
        edit: Edits the array's metadata (a parsed ``zarr.json`` of an array) in place.
        codec: The sound archive's codec (``"lossless"``, ``"portable"``, ``"abs:1e-6"``).
        expected: A fragment of the message every reader refuses it with.
    """

    array: str
    where: str
    edit: Callable[[dict[str, Any]], None]
    codec: str = "lossless"
    expected: str = "crc32c"


def _inner(meta: dict[str, Any]) -> dict[str, Any]:
    return meta["codecs"][0]["configuration"]


def _drop_crc(meta: dict[str, Any]) -> None:
    """The last stage (crc32c) of the chunk pipeline, inside the shards when sharded."""
    codecs = _inner(meta)["codecs"] if meta["codecs"][0]["name"] == "sharding_indexed" \
        else meta["codecs"]
    assert codecs[-1]["name"] == "crc32c"
    codecs.pop()


def _drop_index_crc(meta: dict[str, Any]) -> None:
    _inner(meta)["index_codecs"].pop()


def _unsharded(meta: dict[str, Any]) -> None:
    """The shards' inner pipeline, without its checksum, as the whole pipeline."""
    meta["codecs"] = _inner(meta)["codecs"][:-1]


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(meta: dict[str, Any]) -> None:
        node = meta
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _inner_stage(index: int, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(meta: dict[str, Any]) -> None:
        _inner(meta)["codecs"][index]["configuration"][key] = value

    return edit


_DIFFERS = "disagrees with itself"
_NOT_OURS = "is not the one flyarchive writes"
#: Every variant tried, by name.
VARIANTS: dict[str, Variant] = {
    "copy: qpos chunks without crc32c": Variant("qpos", "copy", _drop_crc),
    "copy: qpos shard index without crc32c": Variant("qpos", "copy", _drop_index_crc),
    "copy: qpos unsharded pcodec, no crc32c": Variant("qpos", "copy", _unsharded),
    "copy: mocap_pos without crc32c": Variant("mocap_pos", "copy", _drop_crc),
    "copy: mocap_quat without crc32c": Variant("mocap_quat", "copy", _drop_crc),
    "copy: n_frames without crc32c": Variant("n_frames", "copy", _drop_crc),
    "copy: time without crc32c": Variant("time", "copy", _drop_crc),
    "copy: world without crc32c": Variant("world", "copy", _drop_crc),
    "own: qpos chunks without crc32c": Variant("qpos", "own", _drop_crc),
    "own: qpos shard index without crc32c": Variant("qpos", "own", _drop_index_crc),
    "own: n_frames without crc32c": Variant("n_frames", "own", _drop_crc),
    "both: qpos chunks without crc32c": Variant("qpos", "both", _drop_crc),
    "both: n_frames without crc32c": Variant("n_frames", "both", _drop_crc),
    "copy: qpos float32": Variant("qpos", "copy", _set(("data_type",), "float32"),
                                  expected=_DIFFERS),
    "copy: qpos inner chunks of 2 worlds": Variant(
        "qpos", "copy", _set(("codecs", 0, "configuration", "chunk_shape"), [2, 5, 13]),
        expected=_DIFFERS),
    "copy: qpos fill value 0": Variant("qpos", "copy", _set(("fill_value",), 0.0),
                                       expected=_DIFFERS),
    "copy: qpos dims (time, world, dof)": Variant(
        "qpos", "copy", _set(("dimension_names",), ["time", "world", "dof"]), expected=_DIFFERS),
    "copy: world big-endian": Variant(
        "world", "copy", _set(("codecs", 0, "configuration", "endian"), "big"),
        expected=_NOT_OURS),
    "copy: sim_time big-endian": Variant(
        "sim_time", "copy", _set(("codecs", 0, "configuration", "endian"), "big"),
        expected=_NOT_OURS),
    "copy: frame without crc32c": Variant("frame", "copy", _drop_crc),
    "own: time without crc32c": Variant("time", "own", _drop_crc),
    "copy: portable qpos transpose (0, 1, 2)": Variant(
        "qpos", "copy", _inner_stage(0, "order", [0, 1, 2]), codec="portable",
        expected=_NOT_OURS),
    "copy: portable qpos big-endian": Variant(
        "qpos", "copy", _inner_stage(1, "endian", "big"), codec="portable",
        expected=_NOT_OURS),
    "copy: portable qpos without crc32c": Variant("qpos", "copy", _drop_crc, codec="portable"),
    "own: portable qpos without crc32c": Variant("qpos", "own", _drop_crc, codec="portable"),
    "copy: abs:1e-6 qpos scale doubled": Variant(
        "qpos", "copy", _inner_stage(0, "scale", 2.0 ** 20), codec="abs:1e-6",
        expected=_DIFFERS),
}


def make_sound(folder: Path, codec: str = "lossless") -> str:
    """Record a small sound archive of ``codec`` in ``folder``: 2 worlds of the tiny model,
    20 frames, chunks of 5 (one shard of both worlds per 5 frames)."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model

    url = str(folder / f"sound-{codec.replace(':', '-')}.zarr")
    if not Path(url).exists():
        model = tiny_model()
        with TrajectoryRecorder(url, model, chunk_frames=5, codec=codec) as recorder:
            simulate(model, 2, 76, recorder.record_as_needed)
    return url


def _edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def make_variant(sound: str, name: str, target: Path) -> str:
    """Copy the sound archive to ``target``, apply variant ``name`` and flip a byte in
    the middle of ``qpos``'s first shard; returns the copy's path."""
    from flyarchive.testing import flip_bits, shard_file

    variant = VARIANTS[name]
    shutil.copytree(sound, target)
    if variant.where in ("copy", "both"):
        _edit_json(target / "zarr.json", lambda root: variant.edit(
            root["consolidated_metadata"]["metadata"][variant.array]))
    if variant.where in ("own", "both"):
        _edit_json(target / variant.array / "zarr.json", variant.edit)
    flip_bits(shard_file(str(target), "qpos"))
    return str(target)


def upload(local: str, url: str, storage_options: Mapping[str, Any]) -> str:
    """Copy a local archive to ``url`` (e.g. ``s3://bucket/key.zarr``), file by file."""
    from flyarchive.testing.fixtures import copy_archive

    return copy_archive(local, url, dict(storage_options))


@dataclass(frozen=True)
class Outcome:
    """What one read path did: ``accepted`` when it returned without an error (for
    ``verify``: reported no problem); ``error`` is ``"Type: message"`` otherwise."""

    accepted: bool
    error: str = ""


def read_with(reader: str, url: str, storage_options: Mapping[str, Any] | None = None
              ) -> Outcome:
    """Run one read path of :data:`READERS` on ``url`` the way a user would: state read
    (``open_archive``: all of ``qpos``; ``StateReader``: both worlds' frames), the header
    and summary built.

    Raises:
        ValueError: for an unknown reader.
    """
    from flyarchive.errors import FlyarchiveError

    try:
        if reader == "open_archive":
            from flyarchive import open_archive

            open_archive(url, storage_options).qpos.values
        elif reader == "open_header":
            from flyarchive.store.dataset import open_header

            open_header(url, storage_options).n_frames.values
        elif reader == "StateReader":
            from flyarchive.store import StateReader

            StateReader(url, storage_options).read_boxes([(0, 2, 0, 10)])
        elif reader == "info":
            from flyarchive.summary import summarize

            summarize(url, storage_options)
        elif reader == "verify":
            from flyarchive.store.integrity import verify

            report = verify(url, storage_options)
            return Outcome(report.ok, " | ".join(report.problems))
        else:
            raise ValueError(f"Unknown reader {reader!r}; known: {READERS}.")
    except FlyarchiveError as err:
        return Outcome(False, f"{type(err).__name__}: {err}")
    return Outcome(True)


def variants_table(workdir: Path, s3: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every variant through every read path, locally and (with ``s3``: a bucket URL
    prefix and storage options, ``{"prefix": "s3://b/x", "storage_options": {...}}``)
    on S3. Returns ``{"variants", "tries", "accepted": [names], "not_named": [names]}``:
    ``not_named`` lists refusals whose message lacks the variant's expected fragment."""
    out: dict[str, Any] = {"variants": len(VARIANTS), "tries": 0, "accepted": [],
                           "not_named": []}
    for i, (name, variant) in enumerate(VARIANTS.items()):
        local = make_variant(make_sound(workdir, variant.codec), name, workdir / f"v{i}.zarr")
        places = [(local, None)]
        if s3 is not None:
            places.append((upload(local, f"{s3['prefix']}/v{i}.zarr", s3["storage_options"]),
                           s3["storage_options"]))
        for url, options in places:
            for reader in READERS:
                outcome = read_with(reader, url, options)
                out["tries"] += 1
                label = f"{name} / {reader} / {'s3' if options else 'local'}"
                if outcome.accepted:
                    out["accepted"].append(label)
                elif not names(variant, outcome.error):
                    out["not_named"].append(label)
    return out


def names(variant: Variant, message: str) -> bool:
    """Whether an error message names the variant's array (by name, or its own
    ``zarr.json``) and holds its expected fragment."""
    return variant.expected in message and (
        repr(variant.array) in message or f"/{variant.array}/zarr.json" in message)
