"""What is fixed when an archive is created (:class:`ArchiveSpec`), checked before anything
is written, how it is created (:func:`parse_mode`), and a block of frames to commit
(:class:`FrameBlock`), and where (:func:`as_url`): what the recorders hand the store
(both import it; the store never imports the record stage).

Every check here runs when a spec is built, so a recorder refuses bad options in
its constructor, before the first frame and before it touches storage: nothing
half-made is ever left behind by options that could not work.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flyarchive import codecs
from flyarchive.clock import Timing
from flyarchive.errors import OptionsError, SchemaError
from flyarchive.layout import ModelLayout
from flyarchive.models import PortableModel, check_mjb
from flyarchive.schema import MAX_STRING_CHUNK_BYTES, MAX_STRINGS, RESERVED_ATTRS

#: Largest ``chunk_frames``: a chunk is also the recorder's host buffer.
MAX_CHUNK_FRAMES = 100_000
#: Largest ``capacity_frames`` (its time coordinate is written at creation).
MAX_CAPACITY_FRAMES = 10_000_000
#: Largest host buffer of one flush (all worlds x chunk_frames frames), bytes.
MAX_BUFFER_BYTES = 4 * 2**30
#: Largest world id: the ``world`` coordinate is int64.
MAX_WORLD_ID = 2**63 - 1
#: Names the archive uses for its own arrays and groups; world variables may not.
RESERVED_NAMES = frozenset({"qpos", "mocap_pos", "mocap_quat", "n_frames", "time", "world", "dof",
                            "mocap", "xyz", "wxyz", "claims", "models", "derived", "zarr.json"})

#: The creation modes of an archive: fail if one exists, replace it, or append to it.
MODES = ("w-", "w", "a")


def _whole(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``, or a SchemaError naming ``name``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or not low <= number <= high:
        raise SchemaError(
            f"{name} must be a whole number from {low} to {high:,}, got {value!r}. "
            f"Pass an int, e.g. {name}={max(low, min(100, high))}."
        )
    return number


def _world_ids(world_ids: Any) -> tuple[int, ...]:
    try:
        ids = list(world_ids)
    except TypeError:
        ids = None
    if not ids:
        raise SchemaError(f"world_ids must be a non-empty sequence of ints, got {world_ids!r}.")
    out = []
    for w in ids:
        try:
            if isinstance(w, bool):
                raise TypeError
            out.append(operator.index(w))
        except TypeError:
            out.append(None)
        if out[-1] is None or not 0 <= out[-1] <= MAX_WORLD_ID:
            raise SchemaError(
                f"world_ids={ids!r} holds {w!r}; a world id is a whole number from 0 to 2**63 - 1 "
                "(the index of the world in the simulation). Pass non-negative ints."
            )
    if len(set(out)) != len(out):
        repeated = sorted({w for w in out if out.count(w) > 1})
        raise SchemaError(f"world_ids={ids!r} repeats {repeated}; each world id must appear once.")
    return tuple(out)


def _check_attrs(attrs: Mapping[str, Any]) -> None:
    if not isinstance(attrs, Mapping):
        raise SchemaError(f"attrs must be a dict of JSON values, got {type(attrs).__name__}.")
    clash = RESERVED_ATTRS.intersection(attrs)
    if clash:
        raise SchemaError(
            f"User attributes may not use the reserved names {sorted(clash)}; rename them."
        )
    for key, value in attrs.items():
        if not isinstance(key, str):
            raise SchemaError(f"Attribute names must be strings, got {key!r}.")
        try:
            json.dumps(value)
        except (TypeError, ValueError, RecursionError) as err:
            raise SchemaError(
                f"Attribute {key!r} holds a {type(value).__name__} that JSON cannot store "
                f"({type(err).__name__}: {str(err)[:120]}). Attributes are JSON: convert it first "
                "(a datetime with .isoformat(), an array with .tolist()), or pass "
                "per-world arrays as world_vars."
            ) from None


def is_text(dtype: Any) -> bool:
    """True for a dtype of text (numpy ``str_`` or ``StringDType``): a text world variable."""
    return np.dtype(dtype).kind in "UT"


def world_var_array(values: Any) -> np.ndarray:
    """``values`` as the array a world variable stores: bools, whole numbers, floats (NaN
    and infinities included: NaN marks a missing value, as in xarray) or text (``str``,
    one per world; an object array of ``str`` becomes text).

    Returns:
        A native-byte-order array; text as numpy ``str_``.

    Raises:
        ValueError: saying what the values hold instead (objects that are not all
            ``str``, bytes, complex numbers, dates...), or text that a reader would refuse
            (not UTF-8 encodable, more than :data:`~flyarchive.schema.MAX_STRINGS`
            values or :data:`~flyarchive.schema.MAX_STRING_CHUNK_BYTES` bytes).
    """
    array = np.asarray(values)
    if array.dtype.kind == "O" and array.size and all(isinstance(v, str) for v in array.flat):
        array = array.astype(str)
    if array.dtype.kind in "biuf":
        return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
    if not is_text(array.dtype):
        kinds = {"O": "Python objects", "S": "bytes", "c": "complex numbers", "M": "dates",
                 "m": "durations", "V": "records"}
        raise ValueError(f"it has dtype {array.dtype} "
                         f"({kinds.get(array.dtype.kind, array.dtype.kind)})")
    if not isinstance(values, np.ndarray):  # numpy makes ["wt", 1] text: refuse the mix
        others = [v for v in values if not isinstance(v, str)]
        if others:
            raise ValueError(f"it mixes text with {others[0]!r} ({type(others[0]).__name__}); "
                             "give text for every world, or numbers for every world")
    try:
        size = 4 + sum(4 + len(str(v).encode("utf-8")) for v in array.flat)
    except UnicodeEncodeError as err:
        raise ValueError(f"it holds text that is not valid Unicode ({err.reason})") from None
    if array.size > MAX_STRINGS or size > MAX_STRING_CHUNK_BYTES:
        raise ValueError(
            f"its text is {size:,} bytes in {array.size:,} values; readers take at most "
            f"{MAX_STRING_CHUNK_BYTES:,} bytes and {MAX_STRINGS:,} values per text variable")
    return np.asarray(array, dtype=str)


def world_var_dtype(values: np.ndarray) -> Any:
    """The dtype to create a world variable's zarr array with: ``str`` (zarr's variable-length
    UTF-8 ``string``) for text, else the values' own."""
    return str if is_text(values.dtype) else values.dtype


def _check_world_vars(world_vars: Mapping[str, Any], n_worlds: int) -> dict[str, np.ndarray]:
    """The world variables as arrays (:func:`world_var_array`), each checked."""
    checked = {}
    for name, values in world_vars.items():
        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") \
                or name in RESERVED_NAMES:
            raise SchemaError(
                f"World variable name {name!r} cannot be used: names are non-empty strings "
                f"without '/' or a leading '.', other than {sorted(RESERVED_NAMES)}. Rename it."
            )
        if isinstance(values, (str, bytes)):
            raise SchemaError(
                f"World variable {name!r} is the single value {values!r}; give one value per "
                f"world ({n_worlds}), e.g. [{values!r}] * {n_worlds}.")
        try:
            array = world_var_array(values)
        except ValueError as err:
            raise SchemaError(
                f"World variable {name!r} cannot be stored: {err}. World variables hold "
                f"({n_worlds},) bools, numbers or text, one value per world."
            ) from None
        if array.shape != (n_worlds,):
            raise SchemaError(
                f"World variable {name!r} must be a ({n_worlds},) array of bools, numbers or "
                f"text (one value per world), got shape {array.shape} of dtype {array.dtype}."
            )
        checked[name] = array
    return checked


@dataclass(frozen=True)
class ArchiveSpec:
    """Everything fixed when an archive is created; checked when it is built.

    Attributes:
        layout: The model's state layout (at least one generalized coordinate).
        timing: Timestep and frame schedule.
        world_ids: World index in the simulation, one per archived world: unique ints
            in ``[0, 2**63)``.
        dtype: State dtype: float64 (CPU) or float32 (GPU), as recorded.
        source: What produced it: ``"mujoco"``, ``"mujoco-warp"``, ``"flygym-npz"``...
        chunk_frames: Frames per chunk along time; also the flush size. 1 to 100,000.
        shard_worlds: Worlds per shard; a writer's world block is a multiple of it.
        codec: ``"lossless"`` or ``"abs:<bound>"`` (see :mod:`flyarchive.codecs`).
        attrs: User metadata for the archive's attributes (JSON values).
        world_vars: Per-world user variables, each ``(n_worlds,)``: bools, numbers or
            text (:func:`world_var_array`).
        capacity_frames: For archives written by several processes (one per block of
            worlds): the time extent, fixed at creation, with the time coordinate
            filled from the frame schedule. None: the extent grows with each commit.
        model: The compiled model as MJB bytes (:func:`flyarchive.models.model_bytes`),
            kept beside the archive as ``models/<sha256>.mjb``
            (:mod:`flyarchive.models.kept`): exact, and bound to this MuJoCo release;
            None: no MJB is kept.
        portable: The model's portable form (:func:`flyarchive.models.portable_model`),
            kept beside the archive as ``models/<sha256>.mjz``: any MuJoCo release compiles
            it; None: none is kept (with neither, replay needs a model).

    Raises:
        SchemaError: naming the first option that cannot work, and how to fix it.
        CodecSpecError: for an unknown codec.
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
    model: bytes | None = field(default=None, repr=False, compare=False)
    portable: PortableModel | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.layout, ModelLayout) or not isinstance(self.timing, Timing):
            raise SchemaError("ArchiveSpec needs a ModelLayout and a Timing.")
        if self.layout.nq < 1 and self.layout.nmocap:
            raise SchemaError(
                f"The model's only state is its {self.layout.nmocap} mocap "
                f"bod{'y' if self.layout.nmocap == 1 else 'ies'} (nq=0): flyarchive records "
                "qpos, with mocap poses beside it, and needs at least one joint. Add one that "
                "changes nothing, e.g. <body><joint type=\"slide\"/><geom size=\"0.001\" "
                "contype=\"0\" conaffinity=\"0\"/></body> in the worldbody."
            )
        if self.layout.nq < 1:
            raise SchemaError(
                "The model has no generalized coordinates (nq=0): there is no state to record. "
                "Record a model with at least one joint (e.g. a free joint on a body)."
            )
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            dtype = None
        if dtype is None or dtype not in (np.dtype("float64"), np.dtype("float32")):
            raise SchemaError(f"dtype must be float64 or float32, got {self.dtype!r}.")
        set_ = object.__setattr__  # frozen: store the checked, normalized values
        set_(self, "world_ids", _world_ids(self.world_ids))
        set_(self, "chunk_frames", _whole("chunk_frames", self.chunk_frames, 1, MAX_CHUNK_FRAMES))
        set_(self, "shard_worlds", _whole("shard_worlds", self.shard_worlds, 1, MAX_CHUNK_FRAMES))
        if self.capacity_frames is not None:
            set_(self, "capacity_frames",
                 _whole("capacity_frames", self.capacity_frames, 1, MAX_CAPACITY_FRAMES))
        if not isinstance(self.source, str):
            raise SchemaError(f"source must be a string, got {self.source!r}.")
        _check_attrs(self.attrs)
        set_(self, "world_vars", _check_world_vars(self.world_vars, len(self.world_ids)))
        codecs.parse_codec(self.codec)
        if self.model is not None:
            if not isinstance(self.model, bytes):
                raise SchemaError(f"model must be MJB bytes or None, got {type(self.model).__name__}.")
            check_mjb(self.model, "The model to keep beside the archive")
        if self.portable is not None and not isinstance(self.portable, PortableModel):
            raise SchemaError(f"portable must be a flyarchive.models.PortableModel or None, got "
                              f"{type(self.portable).__name__}.")
        per_frame = self.layout.nq + 7 * self.layout.nmocap
        need = len(self.world_ids) * self.chunk_frames * per_frame * dtype.itemsize
        if need > MAX_BUFFER_BYTES:
            raise SchemaError(
                f"chunk_frames={self.chunk_frames} for {len(self.world_ids)} worlds of "
                f"{per_frame} values needs a {need / 2**30:.1f} GiB buffer per flush (limit "
                f"{MAX_BUFFER_BYTES / 2**30:.0f} GiB). Lower chunk_frames or record fewer "
                "worlds per archive."
            )

    @property
    def n_worlds(self) -> int:
        return len(self.world_ids)


@dataclass(frozen=True)
class FrameBlock:
    """Frames of a block of worlds, host arrays.

    Attributes:
        time: ``(n,)`` float64 time of each frame, seconds: the scheduled time when
            ``frame`` is given, else the simulation time.
        qpos: ``(worlds, n, nq)`` generalized coordinates.
        mocap_pos: ``(worlds, n, nmocap, 3)`` or None when the model has no mocap body.
        mocap_quat: ``(worlds, n, nmocap, 4)`` (w, x, y, z) or None.
        sim_time: ``(n,)`` float64 simulation time at which each frame was recorded,
            seconds; None: the same as ``time``.
        frame: ``(n,)`` int64 index of each frame on the frame schedule; None: unknown
            (stored as -1).
    """

    time: np.ndarray
    qpos: np.ndarray
    mocap_pos: np.ndarray | None = None
    mocap_quat: np.ndarray | None = None
    sim_time: np.ndarray | None = None
    frame: np.ndarray | None = None


def parse_mode(mode: str) -> str:
    """Check a creation mode (:data:`MODES`): ``"w-"``, ``"w"`` or ``"a"``.

    Raises:
        OptionsError: for anything else (a ValueError).
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise OptionsError(f"mode must be one of {MODES}, got {mode!r}.")
    return mode


def as_url(url: str | os.PathLike[str]) -> str:
    """An archive's location as the string every function takes: a local path given as a
    :class:`pathlib.Path` (any ``os.PathLike``) becomes its text; a string is kept.

    Raises:
        OptionsError: ``url`` is not a string or path (``None``...), or is empty (which
            would be the current folder: with ``mode="w"``, everything in it replaced).
    """
    text = os.fspath(url) if isinstance(url, os.PathLike) else url
    if not isinstance(text, str):
        raise OptionsError(
            f"An archive's location must be a path or URL (a str or pathlib.Path), got "
            f"{type(url).__name__} {url!r}; e.g. 'run.zarr' or 's3://bucket/run.zarr'.")
    if not text.strip():
        raise OptionsError(
            f"An archive's location is empty ({text!r}); name a folder that will hold only "
            "the archive, e.g. 'run.zarr' or 's3://bucket/run.zarr'.")
    return text


def absolute_url(url: str | os.PathLike[str]) -> str:
    """``url`` as it means the same in every process and folder, to send to workers.

    A local path (plain, ``file://`` or ``local://``) gets ``~`` expanded and becomes
    absolute against this process's working folder; a Dask worker started elsewhere
    would read it against its own. Other URLs (``s3://``, ``memory://``, chained
    ``a::b``) are returned as they are. Symbolic links are kept, not resolved.
    """
    text = os.fspath(url)
    if "::" in text:
        return text
    protocol, sep, rest = text.partition("://")
    if not sep:
        return os.path.abspath(os.path.expanduser(text))
    if protocol in ("file", "local"):
        return f"{protocol}://{os.path.abspath(os.path.expanduser(rest))}"
    return text
