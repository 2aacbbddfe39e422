"""Warp kernels compile once per machine: processes that need the same module at the same
time wait for the one that compiles it, then load it from the kernel cache
(:mod:`flyarchive.warp_log`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
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

#: A process that imports Warp and the module above, says ``ready``, and loads the module on
#: Warp's CPU device once a line comes on its stdin.
CHILD = textwrap.dedent('''
    import sys
    folder = sys.argv[1]
    from flyarchive.warp_log import import_warp
    wp = import_warp("the kernel lock test")
    sys.path.insert(0, folder)
    import lock_kernel
    print("ready", flush=True)
    sys.stdin.readline()
    wp.load_module(lock_kernel, device="cpu")
''')


def load_in_two_processes(folder: Path, cache: Path) -> list[str]:
    """Start two processes that load one new module at the same moment; their output."""
    (folder / "lock_kernel.py").write_text(KERNEL)
    env = {**os.environ, "WARP_CACHE_PATH": str(cache), "FLYARCHIVE_VERBOSE": "1"}
    children = [  # cwd: not the checkout, whose flyarchive `-c` would put first on sys.path
        subprocess.Popen([sys.executable, "-c", CHILD, str(folder)], env=env, cwd=folder,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
        for _ in range(2)
    ]
    before = [_until_ready(child) for child in children]  # both have imported Warp
    for child in children:  # then both load at once
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [out + child.communicate(timeout=240)[0] for out, child in zip(before, children)]
    assert [c.returncode for c in children] == [0, 0], outputs
    return outputs


def _until_ready(child: subprocess.Popen[str]) -> str:
    """What the child printed up to its ``ready`` line (all it printed, if it ended first)."""
    lines = []
    for line in child.stdout:
        if line == "ready\n":
            break
        lines.append(line)
    return "".join(lines)


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
