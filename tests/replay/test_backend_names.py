"""The OpenGL backend is called ``"opengl"``; its old name ``"cpu"`` (and ``CpuRenderer``)
still works everywhere, with a DeprecationWarning (on the command line, a note), and means
the same render."""

from __future__ import annotations

import pytest

import flyarchive
from flyarchive.render.options import RenderOptions
from flyarchive.replay.opengl_frames import OpenGLRenderer


def test_the_default_backend_is_opengl():
    assert RenderOptions().backend == "opengl"


def test_backend_cpu_is_opengl_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="'opengl'"):
        options = RenderOptions(backend="cpu", size=(48, 64))

    assert options == RenderOptions(backend="opengl", size=(48, 64))


def test_cpu_renderer_is_the_opengl_renderer_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="OpenGLRenderer"):
        old = flyarchive.CpuRenderer

    assert old is OpenGLRenderer is flyarchive.OpenGLRenderer


def test_render_frames_takes_backend_cpu_as_opengl(tiny, tmp_path):
    from flyarchive.testing.fixtures import record

    archive = record(tiny, str(tmp_path / "run.zarr"), n_steps=12)
    with pytest.warns(DeprecationWarning, match="'opengl'"):
        old = flyarchive.render_frames(archive, tiny, "front", size=(48, 64), backend="cpu")
    new = flyarchive.render_frames(archive, tiny, "front", size=(48, 64), backend="opengl")

    assert (old.isel(time=slice(0, 2)).values == new.isel(time=slice(0, 2)).values).all()


def test_the_command_line_notes_the_old_name_and_renders_with_opengl(cli, monkeypatch):
    from flyarchive.cli import commands as cli_module

    seen = []
    monkeypatch.setattr(cli_module, "_render", lambda args, client: seen.append(args.backend) or 0)

    code, _, err = cli("render", "run.zarr", "--camera", "front", "--backend", "cpu",
                       "--workers", "0")

    assert code == 0 and seen == ["opengl"]
    assert "--backend cpu is called --backend opengl now" in err


def test_an_unknown_backend_names_opengl_among_the_backends():
    from flyarchive.errors import RenderOptionsError

    with pytest.raises(RenderOptionsError, match="'opengl'"):
        RenderOptions(backend="vulkan")
