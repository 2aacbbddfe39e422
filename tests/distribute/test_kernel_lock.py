"""Warp kernels compile once per machine: processes that need the same module at the same
time wait for the one that compiles it, then load it from the kernel cache
(:mod:`flyarchive.warp_log`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flyarchive.testing.markers import requires_warp

pytestmark = [pytest.mark.subprocess, requires_warp, pytest.mark.timeout(300)]

KERNEL = textwrap.dedent('''
    import warp as wp

    @wp.kernel
    def lock_test_kernel(out: wp.array(dtype=float), n: int):
        i = wp.tid()
        s = float(0.0)
        for k in range(n):
            s = s + wp.sin(float(k + i))
        out[i] = s
''')

#: A process that loads the module above on Warp's CPU device once the file ``go`` exists.
CHILD = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    folder = Path(sys.argv[1])
    from flyarchive.warp_log import import_warp
    wp = import_warp("the kernel lock test")
    sys.path.insert(0, str(folder))
    import lock_kernel
    (folder / f"ready-{sys.argv[2]}").touch()
    while not (folder / "go").exists():
        time.sleep(0.005)
    wp.load_module(lock_kernel, device="cpu")
''')


def load_in_two_processes(folder: Path, cache: Path) -> list[str]:
    """Start two processes that load one new module at the same moment; their output."""
    (folder / "lock_kernel.py").write_text(KERNEL)
    env = {**os.environ, "WARP_CACHE_PATH": str(cache), "FLYARCHIVE_VERBOSE": "1"}
    children = [  # cwd: not the checkout, whose flyarchive `-c` would put first on sys.path
        subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(i)], env=env, cwd=folder,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    while not all((folder / f"ready-{i}").exists() for i in range(2)):
        assert all(c.poll() is None for c in children), [c.communicate()[0] for c in children]
        time.sleep(0.01)
    (folder / "go").touch()
    outputs = [c.communicate(timeout=240)[0] for c in children]
    assert [c.returncode for c in children] == [0, 0], outputs
    return outputs


def test_two_processes_compile_a_new_module_once(tmp_path):
    cache = tmp_path / "kernel-cache"

    outputs = load_in_two_processes(tmp_path, cache)

    loads = [line for out in outputs for line in out.splitlines()
             if "Module lock_kernel" in line and "load on device 'cpu'" in line]
    assert len(loads) == 2, outputs
    assert sorted("(compiled)" in line for line in loads) == [False, True], loads
    assert sorted("(cached)" in line for line in loads) == [False, True], loads
    module_folders = [p.name for p in cache.rglob("wp_lock_kernel*") if p.is_dir()]
    assert len(module_folders) == 1, module_folders  # no build folder of a second compiler left
    assert list(cache.rglob("flyarchive-locks/wp_lock_kernel*.lock"))


def test_configuring_warp_twice_wraps_compilation_once():
    from flyarchive.warp_log import configure_warp, import_warp

    wp = import_warp("the kernel lock test")
    wrapped = wp._src.context.Module._compile

    configure_warp(wp)

    assert wp._src.context.Module._compile is wrapped
    assert wrapped._flyarchive_locked
