"""Skip markers for optional parts, defined once for the whole suite (needs pytest).

``@requires_warp`` instead of ``if`` branches in tests, as in ``xarray/tests/__init__.py``.
The Warp device the tests use is chosen here too: Warp's CPU device by default (CI has
no GPU); ``FLYARCHIVE_TEST_WARP_DEVICE=cuda`` runs the same Warp tests on a GPU
(recording on it, the replay conformance suite on it, and ``backend="gpu"`` renders).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from pathlib import Path

import pytest

__all__ = [
    "has_module", "has_cuda", "WARP_DEVICE", "WARP_BACKEND", "requires_warp", "requires_cuda",
    "requires_no_cuda", "requires_flygym", "requires_flygym_files", "requires_distributed",
    "requires_s3", "requires_linux_sys", "OTHER_PYTHON", "requires_other_mujoco",
    "requires_movement", "requires_nwb", "requires_nwbinspector", "opengl_vendor", "CHROMIUM",
    "CHROMIUM_ARGS", "requires_chromium", "requires_view",
]


def has_module(name: str) -> bool:
    """Whether ``name`` can be imported (without importing it)."""
    return importlib.util.find_spec(name) is not None


@functools.cache
def has_cuda() -> bool:
    """Whether this machine shows an NVIDIA GPU and its CUDA driver library.

    Asked of the file system and the dynamic loader only: CUDA is not initialised in
    the pytest process, whose forked children could not use it afterwards.
    """
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@functools.cache
def opengl_vendor() -> str:
    """The ``GL_VENDOR`` of the OpenGL that ``mujoco.Renderer`` uses in this process
    (``"Mesa"``, ``"NVIDIA Corporation"``...; ``""`` if it cannot be asked).

    MuJoCo's OpenGL depth differs by driver: through NVIDIA's EGL driver it came out
    1.2 % shorter than through Mesa's and than Warp's (README, depth maps).
    """
    import mujoco

    renderer = mujoco.Renderer(mujoco.MjModel.from_xml_string("<mujoco/>"), 8, 8)
    try:  # the renderer's context is current in this thread
        for name in ("libOpenGL.so.0", "libGL.so.1"):
            try:
                gl = ctypes.CDLL(name)
            except OSError:
                continue
            gl.glGetString.restype = ctypes.c_char_p
            vendor = gl.glGetString(0x1F00)  # GL_VENDOR
            if vendor:
                return vendor.decode(errors="replace")
    finally:
        renderer.close()
    return ""


#: Warp device of the Warp tests: ``"cpu"`` unless ``FLYARCHIVE_TEST_WARP_DEVICE`` says
#: otherwise (``"cuda"``, ``"cuda:1"``).
WARP_DEVICE = os.environ.get("FLYARCHIVE_TEST_WARP_DEVICE", "cpu")
#: The render backend on that device: ``"warp-cpu"``, or ``"gpu"`` on CUDA.
WARP_BACKEND = os.environ.get(
    "FLYARCHIVE_TEST_WARP_BACKEND", "gpu" if WARP_DEVICE.startswith("cuda") else "warp-cpu"
)

requires_warp = pytest.mark.skipif(
    not has_module("mujoco_warp"), reason="needs mujoco-warp: pip install 'flyarchive[gpu]'"
)
requires_cuda = pytest.mark.skipif(
    not has_cuda(), reason="needs a CUDA device (CI has none; run it on a GPU machine)"
)
requires_no_cuda = pytest.mark.skipif(has_cuda(), reason="this machine has a CUDA device")
requires_flygym = pytest.mark.skipif(
    not has_module("flygym"), reason="needs flygym 2.1: pip install 'flyarchive[flygym]'"
)
#: flygym's ``RecordedTrajectory`` (its ``.npz`` files, its trajectories) and nothing else of
#: flygym: a cheap import that keeps a test in the fast tier, where ``requires_flygym`` (which
#: builds NeuroMechFly or runs flygym) puts it in the ``flygym`` tier. Environments without
#: flygym (MuJoCo 4: flygym 2.1 pins MuJoCo < 3.17) skip both.
requires_flygym_files = pytest.mark.skipif(
    not has_module("flygym"),
    reason="needs flygym 2.1 (its RecordedTrajectory files): pip install 'flyarchive[flygym]'",
)
requires_distributed = pytest.mark.skipif(
    not has_module("distributed"), reason="needs dask.distributed: pip install 'flyarchive[dask]'"
)
requires_s3 = pytest.mark.skipif(
    not (has_module("s3fs") and has_module("moto")),
    reason="needs s3fs and moto[server]: pip install 'flyarchive[s3,test]'",
)
requires_movement = pytest.mark.skipif(
    not (has_module("movement") and has_module("h5netcdf")),
    reason="needs movement: pip install 'flyarchive[movement]'",
)
requires_nwb = pytest.mark.skipif(
    not (has_module("pynwb") and has_module("ndx_pose") and has_module("yaml")),
    reason="needs pynwb, ndx-pose and PyYAML: pip install 'flyarchive[nwb]'",
)
requires_nwbinspector = pytest.mark.skipif(
    not has_module("nwbinspector"), reason="needs nwbinspector: pip install 'flyarchive[nwb]'",
)
#: The interpreter of an environment with the other MuJoCo line than this one (3.16 or 4.x),
#: from ``FLYARCHIVE_TEST_OTHER_PYTHON`` (``bash scripts/dev.sh test`` makes both
#: environments and sets it); ``""`` when unset.
OTHER_PYTHON = os.environ.get("FLYARCHIVE_TEST_OTHER_PYTHON", "")
#: Skips without that interpreter, except in CI (``CI`` set), which makes both environments:
#: there the test runs and fails, naming what is missing.
requires_other_mujoco = pytest.mark.skipif(
    not (OTHER_PYTHON and os.access(OTHER_PYTHON, os.X_OK)) and not os.environ.get("CI"),
    reason="needs an environment with the other MuJoCo line: bash scripts/dev.sh test makes "
           "both (or set FLYARCHIVE_TEST_OTHER_PYTHON to its python)",
)
requires_linux_sys = pytest.mark.skipif(
    not Path("/sys/kernel").is_dir(), reason="needs Linux /sys (a folder nobody may write in)"
)

#: Debian's Chromium (``apt-get install chromium``), driven by Playwright through
#: ``executable_path`` (Playwright's own browser download cannot reach its servers here).
CHROMIUM = os.environ.get("FLYARCHIVE_TEST_CHROMIUM", "/usr/bin/chromium")
#: Its flags: no sandbox (root in CI), no GPU (WebGL on SwiftShader), nothing fetched.
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync")
requires_chromium = pytest.mark.skipif(
    not (Path(CHROMIUM).is_file() and has_module("playwright") and has_module("aiohttp")),
    reason="needs Chromium (apt-get install chromium), playwright and aiohttp: "
           "pip install 'flyarchive[view,test]'",
)
requires_view = pytest.mark.skipif(
    not has_module("aiohttp"), reason="needs aiohttp: pip install 'flyarchive[view]'"
)
