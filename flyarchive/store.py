"""The only code that touches zarr and fsspec: create, append, commit, open.

Commit protocol (one writer per block of worlds):
  1. grow the arrays' time extent (metadata only; new frames read as NaN);
  2. write the frames' chunks (whole shards when the block is chunk-aligned);
  3. write their simulation times;
  4. write ``n_frames`` for the block's worlds: the commit marker.
A crash between steps leaves frames past ``n_frames``, which readers mask. On local
disk zarr writes each object through a temporary file and a rename, and S3 PUTs
are atomic, so a rewritten shard is either the old or the new one: committed
frames are never lost.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import zarr
import zarr.storage

from flyarchive import codecs, hardening
from flyarchive.clock import Timing
from flyarchive.errors import (
    ArchiveExistsError,
    FlyarchiveError,
    ArchiveNotFoundError,
    SchemaError,
    StorageBackendMissingError,
    StorageError,
)
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.localstore import GuardedLocalStore
from flyarchive.schema import RESERVED_ATTRS, SCHEMA_NAME, SCHEMA_VERSION, validate_attrs

__all__ = [
    "ArchiveSpec", "ArchiveWriter", "FrameBlock", "open_store", "archive_exists", "open_group",
    "refuse_existing",
]

_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}
_MODES = ("w-", "w", "a")


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> Path:
    return Path(url[len("file://"):] if url.startswith("file://") else url).expanduser()


def _check_protocol(url: str) -> None:
    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as err:
        extra = _EXTRAS.get(protocol)
        hint = f"pip install 'flyarchive[{extra}]'" if extra else f"install the fsspec backend for {protocol!r}"
        raise StorageBackendMissingError(
            f"URL {url!r} uses protocol {protocol!r}, whose package is not installed ({err}). "
            f"Install it with: {hint}"
        ) from None
    except ValueError:
        known = ", ".join(sorted(p for p in fsspec.available_protocols() if len(p) < 8)[:20])
        raise StorageError(
            f"URL {url!r} uses protocol {protocol!r}, which fsspec does not know. "
            f"Use a local path, file://, memory://, s3://, or another fsspec protocol ({known}...)."
        ) from None


def open_store(
    url: str, storage_options: Mapping[str, Any] | None = None, *, read_only: bool = False
) -> zarr.abc.store.Store:
    """Open a zarr store at any fsspec URL (a local path, ``file://``, ``memory://``, ``s3://``...).

    Local paths get a :class:`~flyarchive.localstore.GuardedLocalStore` (regular files
    inside the archive only); every store reads pcodec with bounded decoding.

    Raises:
        StorageBackendMissingError: if the protocol's package is not installed.
        StorageError: for an unknown protocol, or storage options of the wrong type.
    """
    url = str(url)
    hardening.install_bounded_decoders()
    if _is_local(url):
        if storage_options:
            raise StorageError(f"storage_options were given for the local path {url!r}; drop them.")
        path = _local_path(url)
        if read_only and not path.exists():
            raise ArchiveNotFoundError(f"Nothing at {url!r}. Check the path.")
        return GuardedLocalStore(path, read_only=read_only)
    _check_protocol(url)
    hardening.check_storage_options(url, storage_options)
    return zarr.storage.FsspecStore.from_url(
        url, storage_options=dict(storage_options or {}), read_only=read_only
    )


def archive_exists(store: zarr.abc.store.Store) -> bool:
    """True if anything (an archive or other objects) is at the store's location."""
    return _sync(_store_nonempty(store))


async def _store_nonempty(store: zarr.abc.store.Store) -> bool:
    if await store.exists("zarr.json"):
        return True
    async for _ in store.list():
        return True
    return False


def _exists_error(url: str) -> ArchiveExistsError:
    return ArchiveExistsError(
        f"Something is already at {url!r}; flyarchive never overwrites without being "
        "asked. Pass mode='a' to append to that archive, mode='w' to replace it "
        "(its data is deleted), or choose another URL."
    )


def access_denied(url: str, err: BaseException) -> StorageError:
    """The error for storage that refuses access (HTTP 403, file permissions)."""
    return StorageError(
        f"Access to {url!r} was refused ({type(err).__name__}: {err}). Check the credentials "
        "(key and secret, profile, or environment) and the permissions of the location."
    )


def unavailable(url: str, err: BaseException) -> StorageError:
    """The error for storage that failed to answer (after the client's retries)."""
    return StorageError(
        f"Reading {url!r} failed ({type(err).__name__}: {err}); the storage did not answer "
        "after retries. Nothing was changed; retry later."
    )


def refuse_existing(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ArchiveExistsError` if anything is at ``url``."""
    if archive_exists(open_store(url, storage_options)):
        raise _exists_error(url)


def _never_completed(store: zarr.abc.store.Store) -> bool:
    """True for a flyarchive group whose creation was interrupted (no ``n_frames`` array:
    it is created last, so nothing was ever committed)."""
    try:
        group = zarr.open_group(store, mode="r")
        return group.attrs.get("flyarchive_schema") == SCHEMA_NAME and "n_frames" not in group
    except Exception:
        return False


def _sync(coro: Any) -> Any:
    from zarr.core.sync import sync

    return sync(coro)


def open_group(url: str, storage_options: Mapping[str, Any] | None = None, *, mode: str = "r") -> zarr.Group:
    """Open an existing archive's zarr group and check its schema attributes.

    Raises:
        ArchiveNotFoundError: if no archive is at ``url``.
        SchemaError / SchemaVersionError: if it is not a readable flyarchive archive.
    """
    store = open_store(url, storage_options, read_only=(mode == "r"))
    try:
        group = zarr.open_group(store, mode="r" if mode == "r" else "r+")
    except PermissionError as err:
        raise access_denied(url, err) from None
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError):
        raise ArchiveNotFoundError(
            f"No archive at {url!r}: there is no zarr.json there. Check the URL, or record "
            "one with flyarchive.TrajectoryRecorder."
        ) from None
    except OSError as err:
        raise unavailable(url, err) from None
    except (ValueError, TypeError) as err:
        raise SchemaError(f"The zarr metadata at {url!r} is unreadable ({err}).") from None
    validate_attrs(group.attrs.asdict())
    return group


@dataclass(frozen=True)
class ArchiveSpec:
    """Everything fixed when an archive is created.

    Attributes:
        layout: The model's state layout.
        timing: Timestep and frame schedule.
        world_ids: World index in the simulation, one per archived world.
        dtype: State dtype: float64 (CPU) or float32 (GPU), as recorded.
        source: What produced it: ``"mujoco"``, ``"mujoco-warp"``, ``"flygym-npz"``...
        chunk_frames: Frames per chunk along time; also the flush size.
        shard_worlds: Worlds per shard; a writer's world block is a multiple of it.
        codec: ``"lossless"`` or ``"abs:<bound>"`` (see :mod:`flyarchive.codecs`).
        attrs: User metadata for the archive's attributes (JSON-serializable).
        world_vars: Per-world user variables, each ``(n_worlds,)``.
        capacity_frames: For archives written by several processes (one per block of
            worlds): the time extent, fixed at creation, with the time coordinate
            filled from the frame schedule. None: the extent grows with each commit.
    """

    layout: ModelLayout
    timing: Timing
    world_ids: tuple[int, ...]
    dtype: str = "float64"
    source: str = "mujoco"
    chunk_frames: int = 100
    shard_worlds: int = 64
    codec: str = "lossless"
    attrs: Mapping[str, Any] = field(default_factory=dict)
    world_vars: Mapping[str, np.ndarray] = field(default_factory=dict)
    capacity_frames: int | None = None

    def __post_init__(self) -> None:
        if np.dtype(self.dtype) not in (np.dtype("float64"), np.dtype("float32")):
            raise ValueError(f"dtype must be float64 or float32, got {self.dtype!r}.")
        if not self.world_ids or len(set(self.world_ids)) != len(self.world_ids):
            raise ValueError(f"world_ids must be non-empty and unique, got {self.world_ids!r}.")
        if self.chunk_frames < 1 or self.shard_worlds < 1:
            raise ValueError("chunk_frames and shard_worlds must be at least 1.")
        clash = RESERVED_ATTRS.intersection(self.attrs)
        if clash:
            raise ValueError(f"User attributes may not use the reserved names {sorted(clash)}.")
        for name, values in self.world_vars.items():
            if np.shape(values) != (len(self.world_ids),) or np.asarray(values).dtype == object:
                raise ValueError(
                    f"World variable {name!r} must be a ({len(self.world_ids)},) numeric array."
                )
        codecs.parse_codec(self.codec)

    @property
    def n_worlds(self) -> int:
        return len(self.world_ids)


@dataclass(frozen=True)
class FrameBlock:
    """Frames of a block of worlds, host arrays.

    Attributes:
        time: ``(n,)`` float64 simulation time of each frame, seconds.
        qpos: ``(worlds, n, nq)`` generalized coordinates.
        mocap_pos: ``(worlds, n, nmocap, 3)`` or None when the model has no mocap body.
        mocap_quat: ``(worlds, n, nmocap, 4)`` (w, x, y, z) or None.
    """

    time: np.ndarray
    qpos: np.ndarray
    mocap_pos: np.ndarray | None = None
    mocap_quat: np.ndarray | None = None


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("flyarchive", "mujoco", "mujoco-warp", "zarr", "numpy", "xarray", "flygym"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _root_attrs(spec: ArchiveSpec) -> dict[str, Any]:
    return {
        "flyarchive_schema": SCHEMA_NAME,
        "flyarchive_schema_version": SCHEMA_VERSION,
        "timestep": spec.timing.timestep,
        "output_fps": spec.timing.output_fps,
        "playback_speed": spec.timing.playback_speed,
        "source": spec.source,
        "versions": package_versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "layout": spec.layout.to_attrs(),
        "codec": codecs.describe(spec.codec),
        **dict(spec.attrs),
    }


def _create_arrays(group: zarr.Group, spec: ArchiveSpec) -> None:
    nw, nq, nm, ct = spec.n_worlds, spec.layout.nq, spec.layout.nmocap, spec.chunk_frames
    sw = min(spec.shard_worlds, nw)
    nt = spec.capacity_frames or 0
    state = codecs.array_codecs(spec.codec, np.dtype(spec.dtype))

    def state_array(name: str, tail: tuple[int, ...], dims: list[str]) -> None:
        group.create_array(
            name, shape=(nw, nt, *tail), dtype=spec.dtype, chunks=(1, ct, *tail),
            shards=(sw, ct, *tail), fill_value=np.nan, dimension_names=dims, **state,
        )

    state_array("qpos", (nq,), ["world", "time", "dof"])
    if nm:
        state_array("mocap_pos", (nm, 3), ["world", "time", "mocap", "xyz"])
        state_array("mocap_quat", (nm, 4), ["world", "time", "mocap", "wxyz"])
        _label_array(group, "mocap", spec.layout.mocap_names)
        _label_array(group, "xyz", ("x", "y", "z"))
        _label_array(group, "wxyz", ("w", "x", "y", "z"))
    _label_array(group, "dof", spec.layout.dof_labels)
    crc = {"compressors": [zarr.codecs.Crc32cCodec()]}
    time = group.create_array("time", shape=(nt,), dtype="float64", chunks=(ct,), fill_value=np.nan,
                              dimension_names=["time"], attributes={"description": "simulation time, s"},
                              **crc)
    if nt:  # several writers: the schedule's times, written once, never resized
        time[:] = np.array([spec.timing.frame_step(k) for k in range(nt)]) * spec.timing.timestep
        zarr.open_group(group.store_path / "claims", mode="w",
                        attributes={"description": "world blocks claimed by writers"})
    group.create_array("world", shape=(nw,), dtype="int64", chunks=(nw,), fill_value=-1,
                       dimension_names=["world"], **crc)[:] = np.asarray(spec.world_ids, dtype=np.int64)
    group.create_array("n_frames", shape=(nw,), dtype="int64", chunks=(sw,), fill_value=0,
                       dimension_names=["world"],
                       attributes={"description": "committed frames per world"}, **crc)
    for name, values in spec.world_vars.items():
        values = np.asarray(values)
        group.create_array(name, shape=values.shape, dtype=values.dtype, chunks=values.shape,
                           dimension_names=["world"], **crc)[:] = values


def _label_array(group: zarr.Group, name: str, labels: Sequence[str]) -> None:
    arr = group.create_array(name, shape=(len(labels),), dtype=str, chunks=(max(len(labels), 1),),
                             dimension_names=[name])
    if labels:
        arr[:] = np.array(labels, dtype=str)


class ArchiveWriter:
    """Appends and commits frames to an archive. One writer per block of worlds.

    Use :meth:`create` for a new archive or :meth:`append` to resume one.
    """

    def __init__(
        self, group: zarr.Group, url: str, layout: ModelLayout,
        block: tuple[int, int] | None = None,
    ) -> None:
        self._group = group
        self.url = url
        self.layout = layout
        self._state = [n for n in ("qpos", "mocap_pos", "mocap_quat") if n in group]
        qpos = group["qpos"]
        self.chunk_frames: int = int(qpos.chunks[1])
        self.dtype = qpos.dtype
        self.block = block
        self._worlds = slice(*block) if block else slice(None)
        self.world_ids: tuple[int, ...] = tuple(int(w) for w in group["world"][self._worlds])
        frames = np.asarray(group["n_frames"][self._worlds])
        # Frames past the smallest commit are redone: a resumed simulation continues
        # from the same step for all its worlds.
        self.n_frames: int = int(frames.min()) if frames.size else 0
        # After an interrupted commit the arrays may have grown to different extents;
        # the next commit grows them all to one extent again.
        self._extent = max(
            [int(group[n].shape[1]) for n in self._state] + [int(group["time"].shape[0])]
        )
        self.attrs = group.attrs.asdict()

    @classmethod
    def create(
        cls, url: str, spec: ArchiveSpec, *, mode: str = "w-",
        storage_options: Mapping[str, Any] | None = None,
    ) -> "ArchiveWriter":
        """Create a new archive, or resume one when ``mode="a"``.

        Args:
            url: Where: a local path or any fsspec URL.
            spec: The archive's fixed properties.
            mode: ``"w-"`` create, refuse if anything is there (default); ``"w"`` replace
                what is there; ``"a"`` append to the archive there (creating it if absent).
            storage_options: Passed to fsspec (e.g. S3 credentials, ``endpoint_url``).

        Raises:
            ArchiveExistsError: with ``mode="w-"`` when something is at ``url``.
            LayoutMismatchError: with ``mode="a"`` when the archive's layout differs.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
        url = str(url)
        try:
            return cls._create(url, spec, mode, storage_options)
        except PermissionError as err:
            raise access_denied(url, err) from None
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, OSError) as err:
            if isinstance(err, FlyarchiveError):
                raise
            raise StorageError(
                f"Cannot create an archive at {url!r} ({type(err).__name__}: {err}). "
                "Choose a location that is writable and whose parent is a folder."
            ) from None

    @classmethod
    def _create(
        cls, url: str, spec: ArchiveSpec, mode: str, storage_options: Mapping[str, Any] | None
    ) -> "ArchiveWriter":
        store = open_store(url, storage_options)
        if archive_exists(store) and _never_completed(store):
            # A writer died while creating it: no frame was ever committed there.
            _sync(store.delete_dir(""))
        if archive_exists(store):
            if mode == "a":
                return cls.append(url, spec.layout, storage_options=storage_options, timing=spec.timing)
            if mode == "w-":
                raise _exists_error(url)
            _sync(store.delete_dir(""))
        group = zarr.open_group(store, mode="w", attributes=_root_attrs(spec))
        _create_arrays(group, spec)
        return cls(group, url, spec.layout)

    @classmethod
    def append(
        cls, url: str, layout: ModelLayout, *,
        storage_options: Mapping[str, Any] | None = None, timing: Timing | None = None,
        world_block: tuple[int, int] | None = None, takeover: bool = False,
    ) -> "ArchiveWriter":
        """Open an existing archive to add frames after its last committed one.

        Args:
            world_block: ``(start, stop)`` world indices this writer owns, for archives
                created with ``capacity_frames`` and written by several processes; the
                block must follow shard boundaries and not overlap another writer's.
            takeover: Take over this exact block's claim (resuming a crashed writer).

        Raises:
            ArchiveNotFoundError: if no archive is at ``url``.
            LayoutMismatchError: if ``layout`` differs from the archive's.
            SchemaError: if ``timing`` differs from the archive's.
            WorldBlockConflictError: if the block overlaps another writer's.
        """
        group = open_group(url, storage_options, mode="r+")
        stored = ModelLayout.from_attrs(group.attrs["layout"])
        check_compatible(stored, layout)
        if timing is not None:
            have = Timing(*(group.attrs[k] for k in ("timestep", "output_fps", "playback_speed")))
            if have != timing:
                raise SchemaError(
                    f"The archive at {url!r} was recorded with {have}; appending with {timing} "
                    "would mix frame schedules. Use the same timestep, output_fps and playback_speed."
                )
        if world_block is None:
            return cls(group, url, stored)
        if "claims" not in group:
            raise ValueError(
                f"The archive at {url!r} was created for one writer. To write it from several "
                "processes, create it with ArchiveSpec(capacity_frames=...)."
            )
        from flyarchive.claims import claim_block

        qpos = group["qpos"]
        start, stop = (int(v) for v in world_block)
        claim_block(group.store, start, stop, int((qpos.shards or qpos.chunks)[0]),
                    int(qpos.shape[0]), takeover=takeover)
        return cls(group, url, stored, (start, stop))

    @property
    def n_worlds(self) -> int:
        return len(self.world_ids)

    def write(self, block: FrameBlock, *, n_frames: np.ndarray | None = None) -> None:
        """Append ``block`` (all worlds) after the last committed frame and commit it.

        Args:
            block: The frames, all worlds.
            n_frames: ``(worlds,)`` committed frames of each world after this block
                (default: all of them); for worlds whose recording ended earlier.

        Raises:
            ValueError: if the block's shapes do not fit the archive.
            StorageError: if the storage fails; frames committed before stay committed.
        """
        n = self._check_block(block)
        if n == 0:
            return
        t0, t1 = self.n_frames, self.n_frames + n
        if self.block is not None and t1 > self._group["time"].shape[0]:
            raise ValueError(
                f"Frames {t0}..{t1 - 1} do not fit the archive's capacity of "
                f"{self._group['time'].shape[0]} frames (fixed for several writers). "
                "Create it with a larger capacity_frames."
            )
        try:
            extent = max(t1, self._extent)
            for name in self._state + ["time"]:
                arr, axis = self._group[name], 0 if name == "time" else 1
                if arr.shape[axis] < extent:  # only ever grows: shrinking would delete chunks
                    arr.resize(tuple(extent if i == axis else d for i, d in enumerate(arr.shape)))
            self._extent = extent
            for name in self._state:
                self._group[name][self._worlds, t0:t1] = getattr(block, name)
            if self.block is None:  # several writers share the time written at creation
                self._group["time"][t0:t1] = block.time
            committed = np.full(self.n_worlds, t1) if n_frames is None else np.asarray(n_frames)
            self._group["n_frames"][self._worlds] = committed.astype(np.int64)
        except (OSError, RuntimeError, TimeoutError) as err:
            raise StorageError(
                f"Writing frames {t0}..{t1 - 1} to {self.url!r} failed ({err!r}). "
                f"The archive still holds its {t0} committed frames; retry or resume with mode='a'."
            ) from err
        self.n_frames = t1

    def _check_block(self, block: FrameBlock) -> int:
        n = len(block.time)
        want = {"qpos": (self.n_worlds, n, self.layout.nq)}
        if self.layout.nmocap:
            want["mocap_pos"] = (self.n_worlds, n, self.layout.nmocap, 3)
            want["mocap_quat"] = (self.n_worlds, n, self.layout.nmocap, 4)
        for name, shape in want.items():
            got = getattr(block, name)
            if got is None or np.shape(got) != shape:
                raise ValueError(f"{name} has shape {np.shape(got)}; the archive needs {shape}.")
        return n
