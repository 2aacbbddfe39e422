"""The environment variables flyarchive reads: each one read, checked and documented here only.

Values are read when they are needed (not at import), so a variable set later in the
process, or in a worker's environment, takes effect for the next render. A value that
cannot be used raises :class:`~flyarchive.errors.ConfigError` naming the variable, its
value and what is allowed; unset or empty means the default.

- ``FLYARCHIVE_ENCODERS`` (a whole number >= 0; default 0): x264 encoder threads of
  the Warp render pipeline; 0: one per core this process may use (its CPU affinity; at
  most 64, and at most one per video).
- ``FLYARCHIVE_CPUS`` (a CPU list such as ``0-15`` or ``0,2,4-7``; default: unset): the
  cores of one render worker process; a worker pins itself to them at start. flyarchive
  sets it for each worker of its own GPU cluster (disjoint cores per GPU).
- ``FLYARCHIVE_BATCHES_IN_FLIGHT`` (a whole number >= 2; default 4): host frame buffers
  of the Warp pipeline, one batch each: its host memory bound.
- ``FLYARCHIVE_CUDA_GRAPH`` (a switch; default on): off launches the Warp renderer
  kernel by kernel on CUDA instead of replaying a captured CUDA graph (to compare).
- ``FLYARCHIVE_VERBOSE`` (a switch; default off): on shows Warp's initialization and
  kernel-loading messages (``flyarchive render --verbose`` sets it).
- ``FLYARCHIVE_WORKER`` (a switch; default off): on marks a worker process of
  flyarchive's own LocalCluster, one core each (one Mesa thread, one x264 thread);
  flyarchive sets it for its workers.
- ``FLYARCHIVE_WARP_OPTIMIZATION`` (a whole number from 0 to 3; default: unset, Warp's
  own: ``-O2`` on the CPU, ``-O3`` on CUDA): the compiler optimization level of the Warp
  kernels flyarchive loads, unless the program set ``warp.config.optimization_level``
  itself. 0 compiles mujoco-warp's kernels for Warp's CPU device in about half the time
  and runs them slower: for short runs on a fresh kernel cache (tests, CI).
- ``FLYARCHIVE_CACHE_DIR`` (a folder; default: unset): flyarchive's cache folder (the
  verdicts of the checks of models read from archives, :mod:`flyarchive.models.check`).
  Unset or empty: ``$XDG_CACHE_HOME/flyarchive``, or ``~/.cache/flyarchive`` when
  ``XDG_CACHE_HOME`` is unset, empty or not an absolute path (the XDG base directory
  specification). Tests point it at a temporary folder.
- ``MUJOCO_GL`` (MuJoCo's own: ``egl``, ``osmesa``, ``glfw``...): the OpenGL backend.
  Unset, flyarchive's renderers use ``egl`` on Linux (no display needed), without
  setting the variable (:func:`gl_backend`).
- ``CUDA_VISIBLE_DEVICES`` (CUDA's own): the GPUs backend ``"gpu"`` spreads over (one
  worker process per GPU, :mod:`flyarchive.distribute.gpus`), read without a CUDA
  context: set, its entries are the GPUs (``0,1``: two; empty: none), whatever CUDA
  would find; unset, ``nvidia-smi`` (then the driver's ``/proc`` folder, then Warp)
  lists them. Tests and CI set it to fake a set of GPUs.

A switch is ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any case).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from flyarchive.errors import ConfigError

__all__ = [
    "Knob", "CpuListKnob", "KNOBS", "ENCODERS", "CPUS", "BATCHES_IN_FLIGHT", "CUDA_GRAPH",
    "VERBOSE", "WORKER", "encoders", "usable_cores", "cpus", "parse_cpu_list",
    "format_cpu_list", "batches_in_flight", "cuda_graph", "verbose", "set_verbose",
    "is_worker", "worker_environment", "gl_backend", "check", "CACHE_DIR", "cache_folder",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Knob:
    """One ``FLYARCHIVE_*`` environment variable.

    Attributes:
        name: The variable's name.
        default: Its value when unset or empty.
        minimum: The smallest integer allowed; None: the variable is a switch (bool).
        meaning: What it changes, in a sentence (for the README and errors).
        maximum: The largest integer allowed (None: no bound).
    """

    name: str
    default: int | bool | None
    minimum: int | None
    meaning: str
    maximum: int | None = None

    @property
    def allowed(self) -> str:
        """What the variable may hold, in words."""
        if self.minimum is None:
            return "a switch: 1, true, yes, on or 0, false, no, off"
        if self.maximum is not None:
            return f"a whole number from {self.minimum} to {self.maximum}"
        return f"a whole number >= {self.minimum}"

    def read(self) -> int | bool | None:
        """The variable's value now.

        Raises:
            ConfigError: the value is not allowed (the message names the variable).
        """
        text = os.environ.get(self.name, "").strip()
        if not text:
            return self.default
        if self.minimum is None:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
        else:
            try:
                number = int(text)
            except ValueError:
                number = None
            if number is not None and self.minimum <= number <= (self.maximum or number):
                return number
        raise ConfigError(
            f"The environment variable {self.name}={os.environ[self.name]!r} cannot be used: "
            f"it must be {self.allowed} ({self.meaning}). Set it to such a value, or unset it "
            f"for the default ({self.default!r})."
        )


class CpuListKnob(Knob):
    """A ``FLYARCHIVE_*`` variable that holds a list of CPU numbers (``0-3,8``); unset: None."""

    @property
    def allowed(self) -> str:
        return "a list of CPU numbers and ranges such as 0-15 or 0,2,4-7"

    def read(self) -> tuple[int, ...] | None:  # type: ignore[override]
        """The CPUs, sorted, without duplicates; None when unset or empty.

        Raises:
            ConfigError: the value is not such a list (the message names the variable).
        """
        text = os.environ.get(self.name, "").strip()
        if not text:
            return None
        try:
            return parse_cpu_list(text)
        except ValueError:
            raise ConfigError(
                f"The environment variable {self.name}={os.environ[self.name]!r} cannot be "
                f"used: it must be {self.allowed} ({self.meaning}). Set it to such a value, or "
                "unset it (every core this process may use)."
            ) from None


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> ``(0, 1, 2, 3, 8)`` (the format of ``taskset -c`` and Linux's
    ``cpulist`` files); sorted, without duplicates.

    Raises:
        ValueError: not such a list, or empty.
    """
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError("no CPU")
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"`` (the inverse of :func:`parse_cpu_list`)."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


ENCODERS = Knob("FLYARCHIVE_ENCODERS", 0, 0,
                "x264 encoder threads of the Warp render pipeline; 0: one per core")
CPUS = CpuListKnob("FLYARCHIVE_CPUS", None, None,  # type: ignore[arg-type]
                   "the cores a render worker process pins itself to")
BATCHES_IN_FLIGHT = Knob("FLYARCHIVE_BATCHES_IN_FLIGHT", 4, 2,
                         "host frame buffers of the Warp render pipeline, one batch each")
CUDA_GRAPH = Knob("FLYARCHIVE_CUDA_GRAPH", True, None,
                  "0: the Warp renderer launches kernel by kernel on CUDA, no CUDA graph")
VERBOSE = Knob("FLYARCHIVE_VERBOSE", False, None,
               "1: show Warp's initialization and kernel-loading messages")
WORKER = Knob("FLYARCHIVE_WORKER", False, None,
              "1: a worker process of flyarchive's LocalCluster, one core each")
WARP_OPTIMIZATION = Knob("FLYARCHIVE_WARP_OPTIMIZATION", None, 0,
                         "the compiler optimization level of flyarchive's Warp kernels", 3)
#: The name of the variable that moves flyarchive's cache folder (:func:`cache_folder`).
CACHE_DIR = "FLYARCHIVE_CACHE_DIR"
#: Every variable, by name.
KNOBS: dict[str, Knob] = {k.name: k for k in (ENCODERS, BATCHES_IN_FLIGHT, CUDA_GRAPH, VERBOSE,
                                               WORKER, CPUS, WARP_OPTIMIZATION)}


def encoders() -> int:
    """Encoder threads the Warp pipeline starts: ``FLYARCHIVE_ENCODERS``, or one per core
    this process may use (its CPU affinity, e.g. a worker's share of a GPU host).

    Raises:
        ConfigError: the variable is not a whole number >= 0.
    """
    return int(ENCODERS.read()) or usable_cores()


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity where the system says (Linux),
    else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def cpus() -> tuple[int, ...] | None:
    """The cores of this render worker (``FLYARCHIVE_CPUS``), None when unset.

    Raises:
        ConfigError: the variable is not a CPU list.
    """
    return CPUS.read()


def batches_in_flight() -> int:
    """Host frame buffers of the Warp pipeline (``FLYARCHIVE_BATCHES_IN_FLIGHT``, default 4).

    At least 2: batch k + 1 is submitted before batch k is handed to the encoders.

    Raises:
        ConfigError: the variable is not a whole number >= 2.
    """
    return int(BATCHES_IN_FLIGHT.read())


def cuda_graph() -> bool:
    """Whether the Warp renderer replays a captured CUDA graph (``FLYARCHIVE_CUDA_GRAPH``)."""
    return bool(CUDA_GRAPH.read())


def verbose() -> bool:
    """Whether Warp's console messages are shown (``FLYARCHIVE_VERBOSE``)."""
    return bool(VERBOSE.read())


def set_verbose(on: bool) -> None:
    """Show (True) or hide (False) Warp's messages, in this process and processes it starts."""
    os.environ[VERBOSE.name] = "1" if on else "0"


def warp_optimization() -> int | None:
    """The optimization level for Warp's kernel compiler (``FLYARCHIVE_WARP_OPTIMIZATION``,
    0 to 3), None when unset (Warp's default).

    Raises:
        ConfigError: the variable is not a whole number from 0 to 3.
    """
    level = WARP_OPTIMIZATION.read()
    return None if level is None else int(level)


def is_worker() -> bool:
    """Whether this process is a worker of flyarchive's own LocalCluster (``FLYARCHIVE_WORKER``)."""
    return bool(WORKER.read())


def worker_environment() -> dict[str, str]:
    """The environment of the worker processes of flyarchive's own LocalCluster.

    One core each: one Mesa rasterizer thread, one OpenMP thread, one encoder thread on
    the Warp backends, single-threaded x264 (``FLYARCHIVE_WORKER``); and this process's
    OpenGL backend (:func:`gl_backend`).
    """
    env = {"LP_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", ENCODERS.name: "1", WORKER.name: "1"}
    backend = gl_backend()
    if backend:
        env["MUJOCO_GL"] = backend
    return env


def cache_folder() -> Path:
    """flyarchive's cache folder (which may not exist yet): ``FLYARCHIVE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/flyarchive``, else ``~/.cache/flyarchive``; ``~`` expanded, made
    absolute."""
    given = os.environ.get(CACHE_DIR, "").strip()
    if given:
        return Path(given).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path("~/.cache").expanduser()
    return base / "flyarchive"


def gl_backend() -> str:
    """The OpenGL backend flyarchive's renderers use: ``MUJOCO_GL`` when it is set, else
    ``"egl"`` on Linux (headless: no display needed; Mesa without a GPU), else ``""``
    (MuJoCo's own choice: CGL on macOS, GLFW elsewhere).

    Nothing is written to ``os.environ``: MuJoCo's own choice for other code stays as it
    was (see :func:`flyarchive.replay.opengl_frames.headless_renderer`).
    """
    value = os.environ.get("MUJOCO_GL", "").strip().lower()
    if value:
        return value
    return "egl" if sys.platform.startswith("linux") else ""


def check() -> None:
    """Read every ``FLYARCHIVE_*`` variable, so that a bad value fails before any work.

    Raises:
        ConfigError: the first variable whose value is not allowed.
    """
    for knob in KNOBS.values():
        knob.read()
