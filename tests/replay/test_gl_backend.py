"""The OpenGL backend: chosen without import side effects, EGL when MUJOCO_GL is unset,
MUJOCO_GL followed when set, and handed to local workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flyarchive import config

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env_changes: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM",
                                                            "DISPLAY", "WAYLAND_DISPLAY")}
    env.update({k: v for k, v in env_changes.items() if v is not None})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.subprocess
def test_importing_the_renderers_sets_no_environment_variable() -> None:
    code = ("import os, flyarchive.replay.opengl_frames, flyarchive.distribute.api\n"
            "print(os.environ.get('MUJOCO_GL'))\n")

    result = run_python(code)

    assert result.stdout.strip() == "None", result.stderr


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="EGL is the Linux default")
def test_a_renderer_uses_egl_when_mujoco_gl_is_unset_and_leaves_mujocos_choice() -> None:
    code = (
        "import os\n"
        "from flyarchive.replay.opengl_frames import OpenGLRenderer\n"  # before mujoco's GL is chosen
        "from flyarchive.testing import tiny_model\n"
        "from mujoco.rendering.classic import gl_context\n"
        "model = tiny_model()\n"
        "with OpenGLRenderer(model, 'front', (32, 32)) as renderer:\n"
        "    frame = renderer.render(model.qpos0[None])\n"
        "print(frame.mean() > 0, os.environ.get('MUJOCO_GL'), gl_context.GLContext.__module__)\n"
    )

    result = run_python(code)

    assert result.stdout.strip() == "True None mujoco.glfw", result.stderr


def test_gl_backend_follows_mujoco_gl_when_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", " OSMesa ")

    assert config.gl_backend() == "osmesa"


def test_local_workers_get_this_process_gl_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", "osmesa")

    env = config.worker_environment()

    assert (env["MUJOCO_GL"], env["FLYARCHIVE_WORKER"], env["LP_NUM_THREADS"]) == ("osmesa", "1", "1")
