"""GPU placement: the GPUs this machine shows, and one render worker per GPU with its own
share of the cores.

Found without a CUDA context in this process (a process that initialized CUDA could
not fork workers that use it, and a client whose workers render needs none), in this
order:

1. ``CUDA_VISIBLE_DEVICES`` when it is set: its entries (indices or ``GPU-``/``MIG-``
   UUIDs), up to the first that is not one, as CUDA reads it; empty: no GPU;
2. ``nvidia-smi --query-gpu=index,uuid,pci.bus_id``;
3. the folders of ``/proc/driver/nvidia/gpus/`` (the NVIDIA driver's, one per GPU, by
   PCI bus id);
4. Warp's count of CUDA devices (this one initializes CUDA).

Each worker gets ``CUDA_VISIBLE_DEVICES`` of its GPU (a UUID when known: unambiguous
whatever ``CUDA_DEVICE_ORDER`` says), the resource ``GPU=1``, and a disjoint block of the
cores this process may use: cores near the GPU (its NUMA node, from
``/sys/bus/pci/devices/<bus id>/local_cpulist``) when the GPUs' node sets allow it, with
the hyperthreads of one physical core kept in one block; its x264 encoders, one per core
of the block (``FLYARCHIVE_ENCODERS``), and its render thread run there
(``FLYARCHIVE_CPUS``; see :func:`pin_process`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flyarchive import config
from flyarchive.errors import RenderBackendError, RenderOptionsError

_NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader")
_PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_SYS_PCI = Path("/sys/bus/pci/devices")
_SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Gpu:
    """One GPU this process may use.

    Attributes:
        ordinal: Its CUDA device number in this process (``cuda:{ordinal}``).
        visible: What ``CUDA_VISIBLE_DEVICES`` holds to show a process this GPU alone: a
            UUID when known, else the index as this process's ``CUDA_VISIBLE_DEVICES``
            or the driver names it.
        bus_id: Its PCI bus id (``0000:17:00.0``), None when unknown.
    """

    ordinal: int
    visible: str
    bus_id: str | None = None


@dataclass(frozen=True)
class GpuWorker:
    """The worker process of one GPU: its name, environment, resources and cores.

    Attributes:
        gpu: The GPU.
        cpus: Its cores (disjoint from the other workers' unless there are fewer cores
            than GPUs).
        extra_env: More environment variables (e.g. ``MUJOCO_GL``).
    """

    gpu: Gpu
    cpus: tuple[int, ...]
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``gpu{ordinal}``: the Dask worker name."""
        return f"gpu{self.gpu.ordinal}"

    @property
    def resources(self) -> dict[str, float]:
        """Dask worker resources: ``{"GPU": 1}``."""
        return {"GPU": 1}

    @property
    def env(self) -> dict[str, str]:
        """The worker process's environment: its GPU alone, its cores, one x264 encoder
        per core, one OpenMP thread."""
        return {
            **self.extra_env,
            "CUDA_VISIBLE_DEVICES": self.gpu.visible,
            config.CPUS.name: config.format_cpu_list(self.cpus),
            config.ENCODERS.name: str(len(self.cpus)),
            "OMP_NUM_THREADS": "1",
        }


# ----------------------------------------------------------------------------- finding GPUs
def visible_gpus(*, environ: dict[str, str] | None = None,
                 nvidia_smi: Callable[[], str | None] | None = None,
                 proc_gpus: Path = _PROC_GPUS,
                 warp_count: Callable[[], int] | None = None) -> list[Gpu]:
    """The GPUs this process may use, in CUDA device order (see the module doc).

    The keyword arguments replace where each answer comes from (for tests); by default
    ``os.environ``, the ``nvidia-smi`` command, the driver's folder and Warp.
    """
    environ = os.environ if environ is None else environ
    smi = _smi_gpus((nvidia_smi or _run_nvidia_smi)())
    if "CUDA_VISIBLE_DEVICES" in environ:
        return _from_visible_devices(environ["CUDA_VISIBLE_DEVICES"], smi)
    if smi:
        return [Gpu(i, uuid or str(index), bus) for i, (index, uuid, bus) in enumerate(smi)]
    if proc_gpus.is_dir():
        buses = sorted(p.name.lower() for p in proc_gpus.iterdir())
        if buses:
            return [Gpu(i, str(i), bus) for i, bus in enumerate(buses)]
    count = (warp_count or _warp_count)()
    return [Gpu(i, str(i)) for i in range(count)]


def _run_nvidia_smi() -> str | None:
    try:
        done = subprocess.run(_NVIDIA_SMI, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _smi_gpus(text: str | None) -> list[tuple[int, str, str | None]]:
    """``(index, uuid, bus id)`` of each line of ``nvidia-smi --query-gpu=index,uuid,pci.bus_id``."""
    gpus = []
    for line in (text or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        gpus.append((int(parts[0]), parts[1], _normal_bus_id(parts[2])))
    return gpus


def _normal_bus_id(text: str) -> str | None:
    """nvidia-smi's ``00000000:17:00.0`` as Linux names it: ``0000:17:00.0``."""
    match = re.fullmatch(r"(?:[0-9a-fA-F]*?)([0-9a-fA-F]{4}):([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)",
                         text.strip())
    return f"{match[1]}:{match[2]}".lower() if match else None


def _from_visible_devices(text: str, smi: list[tuple[int, str, str | None]]) -> list[Gpu]:
    """GPUs of a ``CUDA_VISIBLE_DEVICES`` value: entries up to the first invalid one."""
    by_index = {index: (uuid, bus) for index, uuid, bus in smi}
    by_uuid = {uuid: bus for _, uuid, bus in smi}
    gpus: list[Gpu] = []
    for entry in (e.strip() for e in text.split(",")):
        if entry.isdigit():
            uuid, bus = by_index.get(int(entry), (None, None))
            gpus.append(Gpu(len(gpus), uuid or entry, bus))
        elif entry.startswith(("GPU-", "MIG-")):
            gpus.append(Gpu(len(gpus), entry, by_uuid.get(entry)))
        else:  # CUDA stops at the first entry it cannot read ("", "-1", "NoDevFiles")
            break
    return gpus


def _warp_count() -> int:
    from flyarchive.warp_log import import_warp

    wp = import_warp("Counting CUDA devices")
    wp.init()
    return int(wp.get_cuda_device_count())


def choose_gpus(gpus: Sequence[int] | None, visible: Sequence[Gpu]) -> list[Gpu]:
    """The GPUs a render uses: every visible one (``gpus=None``), or those numbered.

    Args:
        gpus: CUDA device numbers as this process counts them (``0`` is ``cuda:0``),
            each at most once; None: all.
        visible: :func:`visible_gpus`.

    Raises:
        RenderBackendError: no GPU is visible.
        RenderOptionsError: ``gpus`` is empty, repeats a number, or names a GPU that is
            not there (the message lists the GPUs that are).
    """
    if not visible:
        raise RenderBackendError(
            "backend='gpu' needs a CUDA device, and none is visible to this process "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}; nvidia-smi "
            "lists none). Pass backend='warp-cpu' (the same renderer on the CPU) or "
            "backend='opengl', or a client/scheduler whose workers hold GPUs."
        )
    if gpus is None:
        return list(visible)
    numbers = list(gpus)
    shown = ", ".join(f"{g.ordinal} ({g.visible})" for g in visible)
    bad = [n for n in numbers if not isinstance(n, int) or isinstance(n, bool)
           or not 0 <= n < len(visible)]
    if not numbers or bad or len(set(numbers)) != len(numbers):
        what = (f"GPU(s) {bad!r}" if bad else "no GPU" if not numbers else
                f"GPU(s) {sorted({n for n in numbers if numbers.count(n) > 1})!r} twice")
        raise RenderOptionsError(
            f"gpus={list(gpus)!r} asks for {what}; this process sees {len(visible)} GPU(s): "
            f"{shown}. Pass distinct numbers from 0 to {len(visible) - 1} (e.g. --gpus 0,1), "
            "or leave gpus out to use every GPU."
        )
    return [visible[n] for n in numbers]


def check_gpus(gpus: Sequence[int] | None, backend: str, *, on_cluster: bool,
               visible: Sequence[Gpu] | None = None) -> None:
    """Refuse a ``gpus=`` request that cannot be met, before anything is read or written.

    Args:
        gpus: What the caller passed to ``render_videos(gpus=...)``; None: nothing to check.
        backend: The render backend.
        on_cluster: A client or scheduler was given (its workers hold the GPUs).
        visible: The GPUs of this machine (default: :func:`visible_gpus`).

    Raises:
        RenderOptionsError: ``gpus`` is not a list of whole numbers, is given with a
            backend other than ``"gpu"`` or with a cluster, or names a GPU that is not
            there (see :func:`choose_gpus`).
        RenderBackendError: no GPU is visible.
    """
    if gpus is None:
        return
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise RenderOptionsError(
            f"gpus must be a list of CUDA device numbers such as [0, 1], got {gpus!r}. "
            "Leave it out to use every GPU."
        )
    if backend != "gpu":
        raise RenderOptionsError(
            f"gpus={list(gpus)!r} picks the GPUs of backend 'gpu', but backend={backend!r} "
            "renders on the CPU. Pass backend='gpu' (--backend gpu), or leave gpus out."
        )
    if on_cluster:
        raise RenderOptionsError(
            f"gpus={list(gpus)!r} picks GPUs of this machine, but a client or scheduler was "
            "given: its workers hold the GPUs. Start one `dask worker SCHEDULER --nthreads 1 "
            "--resources GPU=1` per GPU (with CUDA_VISIBLE_DEVICES set to it), and leave "
            "gpus out."
        )
    choose_gpus(gpus, visible_gpus() if visible is None else visible)


# ----------------------------------------------------------------------------- cores
def usable_cpus() -> tuple[int, ...]:
    """The cores this process may run on (its affinity), sorted."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def _core_key(cpu: int, sys_cpu: Path) -> tuple[int, int, int]:
    """``(package, core, cpu)``: hyperthreads of one physical core sort next to each other."""
    topology = sys_cpu / f"cpu{cpu}" / "topology"
    try:
        package = int((topology / "physical_package_id").read_text())
        core = int((topology / "core_id").read_text())
    except (OSError, ValueError):
        return (0, cpu, cpu)
    return (package, core, cpu)


def split_cpus(cpus: Sequence[int], n: int, *, sys_cpu: Path = _SYS_CPU) -> list[tuple[int, ...]]:
    """``cpus`` in ``n`` disjoint blocks of sizes differing by at most one, hyperthreads
    of a physical core in one block; with fewer cores than ``n``, blocks share cores
    (each gets one, round-robin)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n!r}")
    ordered = sorted(cpus, key=lambda c: _core_key(c, sys_cpu))
    if len(ordered) < n:
        return [(ordered[i % len(ordered)],) for i in range(n)] if ordered else [()] * n
    # Whole physical cores per block where possible: cut at core boundaries.
    cores: list[list[int]] = []
    for cpu in ordered:
        key = _core_key(cpu, sys_cpu)[:2]
        if cores and _core_key(cores[-1][0], sys_cpu)[:2] == key:
            cores[-1].append(cpu)
        else:
            cores.append([cpu])
    units = cores if len(cores) >= n else [[c] for c in ordered]
    blocks = []
    start = 0
    for i in range(n):
        stop = start + len(units) // n + (1 if i < len(units) % n else 0)
        blocks.append(tuple(sorted(c for unit in units[start:stop] for c in unit)))
        start = stop
    return blocks


def _near_cpus(gpu: Gpu, cpus: Sequence[int], sys_pci: Path) -> frozenset[int]:
    """The cores of ``cpus`` on the GPU's NUMA node (all of ``cpus`` when unknown)."""
    if gpu.bus_id is not None:
        try:
            near = set(config.parse_cpu_list((sys_pci / gpu.bus_id / "local_cpulist").read_text()))
        except (OSError, ValueError):
            near = set()
        if near & set(cpus):
            return frozenset(near & set(cpus))
    return frozenset(cpus)


def gpu_workers(gpus: Sequence[Gpu], *, cpus: Sequence[int] | None = None,
                extra_env: dict[str, str] | None = None, sys_pci: Path = _SYS_PCI,
                sys_cpu: Path = _SYS_CPU) -> list[GpuWorker]:
    """One worker per GPU, each with a disjoint block of ``cpus`` (default: this
    process's cores).

    GPUs whose NUMA nodes hold the same cores split those cores between them; when the
    GPUs' node sets overlap without being equal, or leave cores to nobody, all cores
    are split in GPU order.
    """
    cpus = tuple(usable_cpus() if cpus is None else cpus)
    near = [_near_cpus(g, cpus, sys_pci) for g in gpus]
    sets = list(dict.fromkeys(near))
    by_node = (all(a == b or not a & b for a in sets for b in sets)
               and frozenset().union(*sets) == frozenset(cpus))
    blocks: dict[int, tuple[int, ...]] = {}
    if by_node:
        for node in sets:
            members = [i for i, s in enumerate(near) if s == node]
            for i, block in zip(members, split_cpus(sorted(node), len(members), sys_cpu=sys_cpu)):
                blocks[i] = block
    else:
        for i, block in enumerate(split_cpus(cpus, len(gpus), sys_cpu=sys_cpu)):
            blocks[i] = block
    env = dict(extra_env or {})
    return [GpuWorker(g, blocks[i], env) for i, g in enumerate(gpus)]


def share_of(cpus: Sequence[int], index: int, count: int) -> tuple[int, ...]:
    """Block ``index`` of ``count`` (:func:`split_cpus`): one worker's share of a host whose
    ``count`` GPU workers run without cores of their own."""
    return split_cpus(cpus, count)[index]


def pin_process(cpus: Sequence[int]) -> None:
    """Run every thread of this process, and the threads and processes it starts later,
    on ``cpus`` only (Linux; elsewhere nothing). Threads that end meanwhile are skipped."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    wanted = set(cpus)
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except (ProcessLookupError, PermissionError):
            continue
        except OSError as err:  # e.g. cores outside this container's cpuset
            raise RenderOptionsError(
                f"Cannot run on CPUs {config.format_cpu_list(list(wanted))!r} ({err}). Set "
                f"{config.CPUS.name} to cores of {config.format_cpu_list(list(usable_cpus()))!r}."
            ) from None
