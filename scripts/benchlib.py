"""What every benchmark script shares: tables, ``--json``, host facts, peak memory,
NeuroMechFly states and archives built once.

This module owns the tools, not the measurements: each ``bench_*.py`` decides what it
times and which keys its JSON has. Scripts run as ``python scripts/bench_x.py``, which
puts ``scripts/`` first on ``sys.path``, so ``import benchlib`` finds this file. It
imports nothing heavy at import time (mujoco, flygym, zarr and psutil load on first use).

- :class:`Table`, :class:`Column`: fixed-width text tables, ``-`` for what is missing.
- :func:`add_json_option`, :func:`write_json`: the ``--json PATH`` flag and its file.
- :func:`parse_size`: the ``HEIGHTxWIDTH`` flag type.
- :func:`host_info`: CPU model, cores, memory, GPUs, library versions.
- :func:`pin_threads`: every thread of this process on chosen cores.
- :class:`PeakMemory`: peak RSS or PSS of a process tree, sampled while a block runs.
- :func:`nmf_walk`, :func:`jittered`, :func:`nmf_states`, :func:`replay_states`: states.
- :func:`nmf_world`, :func:`export_nmf`: NeuroMechFly without flygym (a host with only
  flyarchive's wheels): its spec zip and walks exported here, the model compiled there.
- :func:`write_archive`, :func:`cached`, :func:`cached_archive`, :func:`imported_archive`:
  archives, built once (the last through flyarchive's own flygym ``.npz`` import).
"""

from __future__ import annotations

import argparse
import math
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Row = Mapping[str, Any]

#: Frame schedule of every benchmark archive: 25 video frames/s, playback 0.2 (flygym's).
OUTPUT_FPS, PLAYBACK = 25.0, 0.2


# ----------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`.

    Attributes:
        title: Header text.
        width: Characters of the cell (more if the text is longer).
        value: Key of the row, or a function of the row; a missing key or a None value
            prints as ``-``.
        fmt: Format spec of the value, e.g. ``".1f"`` or ``",.0f"``.
        align: ``">"`` (right) or ``"<"`` (left).
    """

    title: str
    width: int
    value: str | Callable[[Row], Any]
    fmt: str = ""
    align: str = ">"

    def cell(self, row: Row) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        text = "-" if value is None else format(value, self.fmt)
        return f"{text:{self.align}{self.width}}"


class Table:
    """Rows printed as fixed-width text: :meth:`print` at once, or :meth:`header` and
    :meth:`line` one row at a time while a benchmark runs."""

    def __init__(self, columns: Iterable[Column], *, indent: str = "") -> None:
        self.columns = tuple(columns)
        self.indent = indent

    def header(self) -> str:
        return self.indent + " ".join(f"{c.title:{c.align}{c.width}}" for c in self.columns)

    def line(self, row: Row) -> str:
        return self.indent + " ".join(c.cell(row) for c in self.columns)

    def print(self, rows: Iterable[Row], *, title: str | None = None) -> None:
        if title is not None:
            print(title)
        print(self.header())
        for row in rows:
            print(self.line(row), flush=True)


# ----------------------------------------------------------------------------- flags, JSON
def add_json_option(parser: argparse.ArgumentParser,
                    help: str = "write the results as JSON to this path") -> None:
    """The ``--json PATH`` flag every benchmark has (checked before the benchmark runs)."""
    parser.add_argument("--json", metavar="PATH", type=json_path, help=help)


def json_path(text: str) -> str:
    """An argparse type for a JSON file to write: its folder must exist and it must not
    be a folder (else a usage error now, not a traceback after the whole run)."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name the file, e.g. "
                                         f"{str(path / 'bench.json')!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist; create it "
                                         "or choose another path")
    return str(path)


def write_json(path: str | None, result: Mapping[str, Any], *, indent: int = 1,
               default: Callable[[Any], Any] | None = None) -> None:
    """Write ``result`` to ``path`` (nothing when ``path`` is None) and say so.

    ``default`` converts what JSON cannot hold (``str`` for dates, paths); None: such a
    value raises ``TypeError``.
    """
    if not path:
        return
    Path(path).write_text(json.dumps(result, indent=indent, default=default))
    print(f"\nwrote {path}")


def parse_size(text: str) -> tuple[int, int]:
    """``"240x320"`` -> ``(240, 320)``: an argparse type for HEIGHTxWIDTH pixels."""
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        height = width = 0
    if height < 1 or width < 1:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is not HEIGHTxWIDTH in pixels (both >= 1), e.g. 240x320")
    return height, width


def require_device(parser: argparse.ArgumentParser, device: str | None) -> None:
    """A usage error for ``--device cuda[:N]`` where Warp sees no such CUDA device (a raw
    'Invalid device identifier' traceback from inside the run otherwise)."""
    if not device or not device.startswith("cuda"):
        return
    import warp as wp

    wp.config.quiet = True
    wp.init()
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    count = wp.get_cuda_device_count()
    if index >= count:
        parser.error(f"--device {device}: Warp sees {count} CUDA device(s) on this machine; "
                     "run on a GPU host, or pass --device cpu")


def listed(*allowed: str) -> Callable[[str], str]:
    """An argparse type for a comma-separated list of names from ``allowed``; returns the
    text as given (scripts split it)."""
    def check(text: str) -> str:
        names = [v.strip() for v in text.split(",") if v.strip()]
        unknown = [v for v in names if v not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(repr, unknown)) or 'nothing'} given; choose from "
                f"{', '.join(allowed)} (comma-separated)")
        return text
    return check


def numbers(minimum: float, *, whole: bool = False, above: bool = False) -> Callable[[str], str]:
    """An argparse type for comma-separated numbers each >= ``minimum`` (> with
    ``above``; whole numbers with ``whole``); returns the text as given."""
    def check(text: str) -> str:
        values = [v.strip() for v in text.split(",") if v.strip()]
        try:
            parsed = [int(v) if whole else float(v) for v in values]
        except ValueError:
            parsed = []
        ok = bool(parsed) and all(math.isfinite(v) and (v > minimum if above else v >= minimum)
                                  for v in parsed)
        if not ok:
            kind = "whole numbers" if whole else "numbers"
            raise argparse.ArgumentTypeError(
                f"must be {kind} {'>' if above else '>='} {minimum:g}, comma-separated; "
                f"got {text!r}")
        return text
    return check


def positive_float(text: str) -> float:
    """An argparse type for a finite number > 0 (an error bound...)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An argparse type for a whole number >= 0 (0: none, e.g. no worker processes)."""
    return _whole_at_least(text, 0)


def positive_int(text: str) -> int:
    """An argparse type for a whole number >= 1 (a count of rounds, workers...)."""
    return _whole_at_least(text, 1)


def _whole_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {least}, got {text!r}")
    return value


# ----------------------------------------------------------------------------- host
#: Libraries whose versions :func:`host_info` reports (``"missing"`` when not installed).
PACKAGES = ("flyarchive", "numpy", "mujoco", "mujoco-warp", "warp-lang", "flygym", "zarr",
            "numcodecs", "xarray", "dask", "distributed", "s3fs", "imageio-ffmpeg", "psutil")


def host_info(packages: Iterable[str] = PACKAGES) -> dict[str, Any]:
    """Facts about this machine, for a benchmark's JSON.

    Returns:
        ``host`` (node name), ``platform``, ``python``, ``cpu_model``, ``cpus`` (cores
        this process may use), ``cpus_total`` (``os.cpu_count()``), ``memory_gib``
        (physical), ``gpus`` (``[{"name", "memory_mib", "driver"}]`` from ``nvidia-smi``,
        or CUDA devices Warp sees when Warp is imported already; ``[]`` for none),
        ``loadavg`` (1, 5, 15 min) and ``versions`` (``{package: version}``).
    """
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in packages:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "missing"
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "host": platform.node(), "platform": platform.platform(),
        "python": platform.python_version(), "cpu_model": _cpu_model(),
        "cpus": len(os.sched_getaffinity(0)), "cpus_total": os.cpu_count(),
        "memory_gib": round(pages / 2**30, 1), "gpus": _gpus(),
        "loadavg": [round(x, 2) for x in os.getloadavg()], "versions": versions,
    }


def gpu_bench_host_keys() -> dict[str, Any]:
    """The host keys the GPU benchmarks' JSON has always had (``host``, ``mujoco``,
    ``warp``: node name and versions), and :func:`host_info` under ``host_info``."""
    info = host_info()
    return {"host": info["host"], "mujoco": info["versions"]["mujoco"],
            "warp": info["versions"]["warp-lang"], "host_info": info}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[dict[str, Any]]:
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    gpus = []
    for line in out.strip().splitlines():
        name, memory, driver = (v.strip() for v in line.split(","))
        gpus.append({"name": name, "memory_mib": int(float(memory)), "driver": driver})
    if not gpus and "warp" in sys.modules:  # no nvidia-smi: ask Warp, if it is loaded
        wp = sys.modules["warp"]
        gpus = [{"name": d.name, "memory_mib": None, "driver": None}
                for d in wp.get_cuda_devices()]
    return gpus


# ----------------------------------------------------------------------------- cores
def pin_threads(cpus: set[int]) -> None:
    """Pin every thread of this process (those there now) to ``cpus``; Python's and the
    libraries' threads started later inherit it from the thread that starts them.

    Raises:
        SystemExit: (a usage error) none of ``cpus`` is a core this process may run on.
    """
    allowed = os.sched_getaffinity(0)
    if not set(cpus) & allowed:
        sys.exit(f"error: core(s) {sorted(cpus)} are not among this machine's cores "
                 f"{sorted(allowed)}; choose one of them")
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that just ended


# ----------------------------------------------------------------------------- memory
def tree_memory(pid: int | None = None, kind: str = "rss") -> int:
    """Bytes of memory of process ``pid`` (None: this one) and all its descendants.

    ``kind`` is ``"rss"`` (resident set size: a page shared by two processes counts
    twice) or ``"pss"`` (proportional set size: shared pages are split, so a forked
    worker counts once; reading it walks ``/proc/PID/smaps``, about 11 ms of CPU for a
    rendering process, and holds its memory-map lock). A process that ends while it is
    read counts 0.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss if kind == "pss" else proc.memory_info().rss
        except psutil.Error:
            pass
    return int(total)


class PeakMemory:
    """Peak memory of a process tree, sampled by a thread while the ``with`` block runs.

    Example::

        with PeakMemory(interval_s=0.02) as memory:
            run()
        memory.results["peak_mib"]

    Args:
        pid: Root of the sampled tree (it and all its descendants); None: this process.
        interval_s: Seconds between samples, the first at entry and one more at exit.
            Sampling PSS is not free (see :func:`tree_memory`): sample it slowly.
        kind: ``"rss"`` or ``"pss"``.
    """

    def __init__(self, pid: int | None = None, *, interval_s: float = 0.02,
                 kind: str = "rss") -> None:
        if kind not in ("rss", "pss"):
            raise ValueError(f"kind must be 'rss' or 'pss', got {kind!r}.")
        self.pid, self.interval_s, self.kind = pid, interval_s, kind
        self._peak = 0
        self._samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._sample()

    @property
    def results(self) -> dict[str, Any]:
        """``kind``, ``interval_s``, ``samples``, ``peak_bytes`` and ``peak_mib`` (so far,
        while the block runs)."""
        return {"kind": self.kind, "interval_s": self.interval_s, "samples": self._samples,
                "peak_bytes": self._peak, "peak_mib": round(self._peak / 2**20, 1)}

    def _sample(self) -> None:
        self._peak = max(self._peak, tree_memory(self.pid, self.kind))
        self._samples += 1

    def _run(self) -> None:
        while True:
            self._sample()
            if self._done.wait(self.interval_s):
                return


# ----------------------------------------------------------------------------- states
@dataclass(frozen=True)
class Jitter:
    """How each world's copy of one walk differs from it (see :func:`jittered`).

    Attributes:
        start_margin: Frames the walk has beyond ``n_frames``; each world starts at a
            random frame among the first ``start_margin + 1``. 0: every world starts at 0.
        xy_mm: Standard deviation of a per-world x/y offset of the fly, mm.
        angle_bias_rad: Standard deviation of a per-world, per-joint constant added to
            the hinge angles, radians.
        angle_noise_rad: Standard deviation of noise added to each hinge angle of each
            frame, radians.
    """

    start_margin: int = 200
    xy_mm: float = 5.0
    angle_bias_rad: float = 0.01
    angle_noise_rad: float = 0.0


def nmf_walk(n_frames: int, *, world: Any, seed: int = 0, cache: Path | None = None) -> np.ndarray:
    """One simulated NeuroMechFly walk (``flyarchive.interop.nmf.walk_qpos``, 25 fps,
    playback 0.2), ``(n_frames, 73)`` float64; kept as ``walk-<n_frames>[-seed<s>].npy``
    under ``cache`` (None: not kept)."""
    from flyarchive.interop.nmf import walk_qpos

    name = f"walk-{n_frames}.npy" if seed == 0 else f"walk-{n_frames}-seed{seed}.npy"
    path = None if cache is None else Path(cache) / name
    if path is not None and path.exists():
        return np.load(path)
    print(f"simulating a {n_frames}-frame NeuroMechFly walk (seed {seed})...", flush=True)
    walk = walk_qpos(n_frames, OUTPUT_FPS, PLAYBACK, seed=seed, world=world)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, walk)
    return walk


def jittered(base: np.ndarray, n_worlds: int, n_frames: int, jitter: Jitter,
             seed: int = 0) -> np.ndarray:
    """``(n_worlds, n_frames, nq)`` float64 copies of ``base`` (``(>= n_frames, nq)``, a
    free joint first) with per-world jitter; world ``w`` draws from
    ``default_rng([seed, w])``, so a world's copy does not depend on ``n_worlds``."""
    nq = base.shape[1]
    out = np.empty((n_worlds, n_frames, nq))
    for w in range(n_worlds):
        rng = np.random.default_rng([seed, w])
        start = int(rng.integers(0, len(base) - n_frames + 1))
        out[w] = base[start:start + n_frames]
        out[w, :, :2] += rng.normal(0.0, jitter.xy_mm, 2)  # the fly's x, y (mm)
        out[w, :, 7:] += rng.normal(0.0, jitter.angle_bias_rad, nq - 7)  # hinge angles (rad)
        if jitter.angle_noise_rad:
            out[w, :, 7:] += rng.normal(0.0, jitter.angle_noise_rad, (n_frames, nq - 7))
    return out


def nmf_states(n_worlds: int, n_frames: int, *, world: Any = None, jitter: Jitter | None = None,
               dtype: Any = np.float64, cache: Path | None = None) -> np.ndarray:
    """NeuroMechFly qpos of ``n_worlds`` worlds, ``(n_worlds, n_frames, 73)`` ``dtype``.

    Args:
        world: From ``flyarchive.interop.nmf.build_world()``; built if None.
        jitter: Jittered copies of one walk of ``n_frames + jitter.start_margin``
            frames (one simulation). None: an independent walk per world, seeds
            ``0 .. n_worlds - 1`` (one simulation each).
        cache: Folder where walks are kept between runs (see :func:`nmf_walk`).
    """
    if world is None:
        from flyarchive.interop.nmf import build_world

        world = build_world()
    if jitter is None:
        walks = [nmf_walk(n_frames, world=world, seed=s, cache=cache) for s in range(n_worlds)]
        return np.stack(walks).astype(dtype)
    base = nmf_walk(n_frames + jitter.start_margin, world=world, cache=cache)
    return jittered(base, n_worlds, n_frames, jitter).astype(dtype)


@dataclass(frozen=True)
class ReplayStates:
    """A model and states to render: ``qpos`` ``(worlds, frames, nq)`` float32, and
    ``mocap`` ``(pos (worlds, frames, nmocap, 3), quat (..., 4))`` float32 or None."""

    model: Any
    camera: str
    qpos: np.ndarray
    mocap: tuple[np.ndarray, np.ndarray] | None


#: The GPU replay benchmarks' copies: one walk, worlds offset and shaken frame by frame.
REPLAY_JITTER = Jitter(start_margin=0, xy_mm=2.0, angle_bias_rad=0.0, angle_noise_rad=0.02)


def replay_states(which: str, n_worlds: int, n_frames: int, *,
                  cache: Path | None = None, model_file: str | Path | None = None
                  ) -> ReplayStates:
    """States for the replay benchmarks: ``"nmf"`` (NeuroMechFly, :data:`REPLAY_JITTER`
    copies of one walk, camera ``nmf/trackcam``; with ``model_file``, compiled from it,
    no flygym: :func:`nmf_world`) or ``"tiny"`` (``flyarchive.testing.tiny_model``,
    random shoulder and slider, camera ``front``)."""
    import mujoco

    if which == "nmf":
        world = nmf_world(model_file)
        qpos = nmf_states(n_worlds, n_frames, world=world, jitter=REPLAY_JITTER,
                          dtype=np.float32, cache=cache)
        return ReplayStates(world.model, world.cameras[0], qpos, None)
    from flyarchive.testing import tiny_model

    model = tiny_model()
    rng = np.random.default_rng(0)
    qpos = np.tile(model.qpos0, (n_worlds, n_frames, 1))
    qpos[..., 7] = rng.uniform(-1.0, 1.0, (n_worlds, n_frames))  # shoulder
    qpos[..., 12] = rng.uniform(-0.1, 0.1, (n_worlds, n_frames))  # slider
    data = mujoco.MjData(model)
    mocap = tuple(np.broadcast_to(v, (n_worlds, n_frames, *v.shape)).astype(np.float32)
                  for v in (data.mocap_pos, data.mocap_quat))
    return ReplayStates(model, "front", qpos.astype(np.float32), mocap)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- NeuroMechFly
#: The tracking camera of NeuroMechFly worlds (:func:`flyarchive.interop.nmf.build_world`).
NMF_CAMERA = "nmf/trackcam"


def load_bench_model(path: str | Path) -> Any:
    """A compiled model from a file: MuJoCo's spec zip (``.zip``, from :func:`export_nmf`:
    compiles on any MuJoCo release that reads it), else ``.mjb`` / ``.xml`` as
    ``flyarchive.models.load_model_file`` reads them."""
    path = Path(path)
    if path.suffix.lower() == ".zip":
        import mujoco

        return mujoco.MjSpec.from_zip(str(path)).compile()
    from flyarchive.models import load_model_file

    return load_model_file(path)


def nmf_world(model_file: str | Path | None = None) -> Any:
    """NeuroMechFly: ``build_world()`` (needs flygym), or, given ``model_file``, an object
    with the model compiled from that file and ``cameras`` (no flygym: walks must be in
    the cache folder already, see :func:`export_nmf`)."""
    if model_file is None:
        from flyarchive.interop.nmf import build_world

        return build_world()
    from types import SimpleNamespace

    return SimpleNamespace(model=load_bench_model(model_file), cameras=(NMF_CAMERA,))


def export_nmf(folder: Path, walk_frames: Iterable[int]) -> dict[str, str]:
    """For a host without flygym: ``folder/nmf.zip`` (NeuroMechFly's portable form, a spec
    zip with its meshes inside, :func:`flyarchive.models.portable_model`; compiles on 3.16
    and 4.0.1 alike, on a host without flygym's files) and the walks of
    ``walk_frames`` frames under ``folder/walks`` (:func:`nmf_walk`, simulated here)."""
    import flygym.compose as compose

    from flyarchive.interop.nmf import build_world

    specs: list[Any] = []
    compile_world = compose.FlatGroundWorld.compile

    def keep_spec(world: Any) -> Any:  # build_world compiles the arena's MjSpec once
        specs.append(world.mjcf_root.copy())
        return compile_world(world)

    compose.FlatGroundWorld.compile = keep_spec  # type: ignore[method-assign]
    try:
        world = build_world()
    finally:
        compose.FlatGroundWorld.compile = compile_world  # type: ignore[method-assign]
    from flyarchive.models import portable_model

    folder.mkdir(parents=True, exist_ok=True)
    # MjSpec.to_zip keeps the meshes' absolute paths (flygym's files), not the meshes.
    (folder / "nmf.zip").write_bytes(portable_model(specs[0], model=world.model).blob)
    walks = [nmf_walk(n, world=world, cache=folder / "walks") for n in walk_frames]
    return {"model": str(folder / "nmf.zip"),
            "walks": ", ".join(f"{len(w)} frames" for w in walks)}


# ----------------------------------------------------------------------------- archives
def frame_times(model: Any, n_frames: int) -> np.ndarray:
    """``(n_frames,)`` float64 seconds: frame ``k`` at the first step of the 25 fps,
    playback 0.2 schedule at or after ``k`` frame intervals, as a recorder samples it."""
    from flyarchive.clock import Timing

    timing = Timing(float(model.opt.timestep), OUTPUT_FPS, PLAYBACK)
    return np.array([timing.frame_step(k) * timing.timestep for k in range(n_frames)])


def write_archive(url: str, model: Any, qpos: np.ndarray, *,
                  mocap: tuple[np.ndarray, np.ndarray] | None = None, chunk_frames: int = 100,
                  shard_worlds: int = 64, codec: str = "lossless", source: str = "mujoco",
                  keep_model: bool = False) -> str:
    """Write states as a flyarchive archive with the project's own ``ArchiveWriter``.

    Args:
        url: Where (a new archive).
        qpos: ``(worlds, frames, nq)``; its dtype is the archive's. World ids ``0 .. W-1``,
            times from :func:`frame_times`.
        mocap: ``(pos, quat)`` per world and frame, or None.
        chunk_frames, shard_worlds, codec, source: As ``flyarchive.store.ArchiveSpec``.
            Frames are committed ``chunk_frames`` at a time.
        keep_model: Keep the model beside the archive (replay then needs none).

    Returns:
        ``url``.
    """
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock

    n_worlds, n_frames, _ = qpos.shape
    timing = Timing(float(model.opt.timestep), OUTPUT_FPS, PLAYBACK)
    from flyarchive.models import model_bytes

    spec = ArchiveSpec(ModelLayout.from_model(model), timing, tuple(range(n_worlds)),
                       dtype=str(qpos.dtype), source=source, chunk_frames=chunk_frames,
                       shard_worlds=shard_worlds, codec=codec,
                       model=model_bytes(model) if keep_model else None)
    times = frame_times(model, n_frames)
    writer = ArchiveWriter.create(url, spec)
    for t0 in range(0, n_frames, chunk_frames):
        t1 = min(t0 + chunk_frames, n_frames)
        pos, quat = (None, None) if mocap is None else (m[:, t0:t1] for m in mocap)
        writer.write(FrameBlock(times[t0:t1], qpos[:, t0:t1], pos, quat))
    return url


def cached(path: Path, build: Callable[[Path], Any], *, stamp: str | None = None) -> Path:
    """Build ``path`` once: ``build(path)`` unless the marker ``path.with_suffix(".done")``
    says an earlier build finished (what an interrupted build left is removed first) —
    with the same ``stamp`` when one is given (default: :func:`writer_stamp`, so data
    written by other flyarchive code, e.g. before a format change, is built again)."""
    stamp = writer_stamp() if stamp is None else stamp
    done = path.with_suffix(".done")
    if done.exists():
        if f"stamp {stamp}" in done.read_text().split("\n"):
            return path
        print(f"{path}: built by other flyarchive code; building it again", flush=True)
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    build(path)
    done.write_text(f"{time.perf_counter() - start:.1f} s\nstamp {stamp}\n")
    return path


@functools.cache
def writer_stamp() -> str:
    """A fingerprint of the flyarchive code that decides what an archive holds (the
    schema, the codecs, the store package): 12 hex digits of SHA-256 over their source."""
    import hashlib

    import flyarchive

    package = Path(flyarchive.__file__).parent
    digest = hashlib.sha256()
    for file in [package / "schema.py", package / "codecs.py",
                 *sorted((package / "store").glob("*.py"))]:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:12]


def cached_archive(folder: Path, name: str, model: Any, states: Callable[[], np.ndarray],
                   **options: Any) -> str:
    """``folder/<name>.zarr``, written by :func:`write_archive` from ``states()`` (called
    only when the archive is not there yet) with ``options``, once (see :func:`cached`).
    ``name`` must say everything the states and options depend on."""
    path = Path(folder) / f"{name}.zarr"

    def build(p: Path) -> None:
        print(f"building {p}...", flush=True)
        write_archive(str(p), model, states(), **options)

    return str(cached(path, build))


def imported_archive(folder: Path, name: str, model: Any, qpos: Callable[[], np.ndarray]) -> str:
    """``folder/<name>.zarr`` imported through flyarchive's own flygym ``.npz`` import
    (``import_npz``: one ``.npz`` per world as flygym 2.1 writes them, float64 as given,
    chunks of 100 frames in shards of 64 worlds, the model kept beside the archive), from
    ``qpos()`` ``(worlds, frames, nq)`` (called only when the archive is not there yet),
    once (see :func:`cached`); the ``.npz`` files go once imported."""
    import tempfile

    path = Path(folder) / f"{name}.zarr"

    def build(p: Path) -> None:
        from flyarchive.interop.flygym_npz import import_npz

        values = qpos()
        times = frame_times(model, values.shape[1])
        print(f"importing {values.shape[0]} .npz files into {p}...", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-npz-", dir=folder) as files:
            for w, world in enumerate(values):
                np.savez(Path(files) / f"world{w:05d}.npz", time=times, qpos=world,
                         output_fps=OUTPUT_FPS, playback_speed=PLAYBACK, world_id=w)
            import_npz(files, str(p), model, chunk_frames=100)

    return str(cached(path, build))
