"""The package's internals: environment variables (flyarchive.config), the Warp pipeline's
profiler, the OpenGL backend chosen without import side effects, one home for errors and
install hints, and docstrings that match the code."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import flyarchive
from flyarchive import config
from flyarchive.errors import ConfigError, MissingDependencyError, StorageBackendMissingError

ROOT = Path(__file__).resolve().parents[2]
requires_warp = pytest.mark.skipif(
    importlib.util.find_spec("mujoco_warp") is None, reason="needs mujoco-warp (flyarchive[gpu])"
)
SIZE = (32, 48)  # (height, width)


def record_tiny(url: str, n_worlds: int = 2, n_steps: int = 20) -> None:
    """A CPU recording of the tiny model: 6 frames per world (every 4 steps)."""
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    with flyarchive.TrajectoryRecorder(url, model, output_fps=25, playback_speed=0.2,
                                       chunk_frames=8) as rec:
        simulate(model, n_worlds, n_steps, rec.record_as_needed)


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("tiny") / "run.zarr")
    record_tiny(url)
    return url


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path``, by relative name."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- config
BAD_VALUES = [
    ("FLYARCHIVE_ENCODERS", "many", "whole number >= 0"),
    ("FLYARCHIVE_ENCODERS", "-1", "whole number >= 0"),
    ("FLYARCHIVE_BATCHES_IN_FLIGHT", "1", "whole number >= 2"),
    ("FLYARCHIVE_BATCHES_IN_FLIGHT", "4.5", "whole number >= 2"),
    ("FLYARCHIVE_CUDA_GRAPH", "sometimes", "a switch"),
    ("FLYARCHIVE_VERBOSE", "2", "a switch"),
    ("FLYARCHIVE_WORKER", "yes please", "a switch"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_VALUES)
def test_a_bad_value_is_refused_naming_the_variable_its_value_and_what_is_allowed(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, allowed: str) -> None:
    monkeypatch.setenv(name, value)

    with pytest.raises(ConfigError) as caught:
        config.KNOBS[name].read()

    assert f"{name}={value!r}" in str(caught.value) and allowed in str(caught.value)


def test_config_errors_are_value_errors() -> None:
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, flyarchive.FlyarchiveError)


def test_unset_or_empty_variables_take_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in config.KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYARCHIVE_BATCHES_IN_FLIGHT", "  ")

    actual = (config.encoders(), config.batches_in_flight(), config.cuda_graph(),
              config.verbose(), config.is_worker())

    assert actual == (os.cpu_count() or 1, 4, True, False, False)


@pytest.mark.parametrize(("text", "expected"), [
    ("1", True), ("TRUE", True), ("yes", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_switches_take_the_documented_spellings(monkeypatch: pytest.MonkeyPatch, text: str,
                                                expected: bool) -> None:
    monkeypatch.setenv("FLYARCHIVE_WORKER", text)

    assert config.is_worker() is expected


def test_worker_zero_means_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYARCHIVE_WORKER", "0")

    assert config.is_worker() is False


def test_set_verbose_is_read_back_by_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYARCHIVE_VERBOSE", raising=False)

    config.set_verbose(True)
    on = config.verbose()
    config.set_verbose(False)

    assert (on, config.verbose()) == (True, False)


def test_no_module_reads_a_flyarchive_variable_around_config() -> None:
    readers = []
    for path in sorted((ROOT / "flyarchive").rglob("*.py")):
        if path.name == "config.py" or "testing" in path.parts:
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?[\[(]\s*[\"']FLYARCHIVE_", text) or \
                re.search(r"getenv\(\s*[\"']FLYARCHIVE_", text):
            readers.append(str(path.relative_to(ROOT)))

    assert readers == []


def test_the_readme_lists_every_variable() -> None:
    readme = (ROOT / "README.md").read_text()

    missing = [name for name in [*config.KNOBS, "MUJOCO_GL"] if f"`{name}`" not in readme]

    assert missing == []


def test_a_bad_variable_fails_a_render_before_any_work(
        monkeypatch: pytest.MonkeyPatch, tiny_archive: str, tmp_path: Path) -> None:
    from flyarchive.testing import tiny_model

    before = snapshot(Path(tiny_archive))
    monkeypatch.setenv("FLYARCHIVE_ENCODERS", "many")
    out = tmp_path / "videos"

    with pytest.raises(ConfigError, match="FLYARCHIVE_ENCODERS='many'"):
        flyarchive.render_videos(tiny_archive, tiny_model(), "front", str(out), n_workers=0,
                                 options=flyarchive.RenderOptions(size=SIZE))

    assert not out.exists()
    assert snapshot(Path(tiny_archive)) == before


def test_the_cli_reports_a_bad_variable_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_archive: str,
        tmp_path: Path) -> None:
    from flyarchive.cli import main
    from flyarchive.testing import tiny_model

    model = flyarchive.save_mjb(tiny_model(), tmp_path / "tiny.mjb")
    monkeypatch.setenv("FLYARCHIVE_BATCHES_IN_FLIGHT", "1")
    out = tmp_path / "videos"

    code = main(["render", tiny_archive, "--model", str(model), "--camera", "front",
                 "--size", "32x48", "--workers", "0", "--out", str(out), "--quiet"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("flyarchive render: error: The environment variable "
                          "FLYARCHIVE_BATCHES_IN_FLIGHT='1'") and err.count("\n") == 1
    assert not out.exists()


def test_the_cli_reports_an_option_error_in_one_line(
        capsys: pytest.CaptureFixture[str], tiny_archive: str, tmp_path: Path) -> None:
    from flyarchive.cli import main
    from flyarchive.testing import tiny_model

    model = flyarchive.save_mjb(tiny_model(), tmp_path / "tiny.mjb")
    out = tmp_path / "videos"

    code = main(["render", tiny_archive, "--model", str(model), "--camera", "front",
                 "--size", "32x48", "--workers", "-2", "--out", str(out)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("flyarchive render: error: n_workers must be") and err.count("\n") == 1
    assert not out.exists()


# ----------------------------------------------------------------------------- profiler
def render_warp_cpu(url: str, out: Path, worlds: list[int], time: tuple[float, float]) -> None:
    from flyarchive.testing import tiny_model

    options = flyarchive.RenderOptions(size=SIZE, backend="warp-cpu", batch_worlds=4)
    flyarchive.render_videos(url, tiny_model(), "front", str(out), worlds=worlds, time=time,
                             options=options, n_workers=0)


@requires_warp
def test_a_profile_of_a_warp_cpu_render_has_every_stage(tiny_archive: str, tmp_path: Path) -> None:
    from flyarchive.render.diagnostics import COUNTS, STAGES

    with flyarchive.PipelineProfile() as profile:
        render_warp_cpu(tiny_archive, tmp_path / "v", worlds=[0, 1], time=(0.0, 0.04))

    results = profile.results
    assert sorted(results) == sorted(STAGES + COUNTS)
    assert all(value >= 0 for value in results.values())
    assert (results["frames"], results["videos"]) == (12, 2)  # 2 worlds x 6 frames
    assert results["encode_s"] > 0 and results["batches"] == 3  # 12 states, 4 per batch


@requires_warp
def test_a_render_outside_the_block_adds_nothing(tiny_archive: str, tmp_path: Path) -> None:
    with flyarchive.PipelineProfile() as profile:
        pass
    render_warp_cpu(tiny_archive, tmp_path / "v", worlds=[0], time=(0.0, 0.04))

    assert set(profile.results.values()) == {0.0}


@requires_warp
def test_two_concurrent_renders_do_not_mix_their_profiles(tiny_archive: str,
                                                          tmp_path: Path) -> None:
    jobs = {"one": ([0], (0.0, 0.016)), "two": ([0, 1], (0.0, 0.04))}  # 3 and 12 states
    results: dict[str, list[dict[str, float]]] = {name: [] for name in jobs}
    errors: list[BaseException] = []

    def render(name: str, k: int) -> None:
        try:
            with flyarchive.PipelineProfile() as profile:
                render_warp_cpu(tiny_archive, tmp_path / f"{name}{k}", *jobs[name])
            results[name].append(profile.results)
        except BaseException as err:
            errors.append(err)

    for k in range(3):
        threads = [threading.Thread(target=render, args=(name, k)) for name in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert errors == []
    assert [(r["frames"], r["videos"]) for r in results["one"]] == [(3, 1)] * 3
    assert [(r["frames"], r["videos"]) for r in results["two"]] == [(12, 2)] * 3


def test_nested_profiles_see_their_own_blocks() -> None:
    from flyarchive.render.diagnostics import StageTimer

    with flyarchive.PipelineProfile() as outer:
        StageTimer().add("frames", 2)
        with flyarchive.PipelineProfile() as inner:
            StageTimer().add("frames", 3)

    assert (outer.results["frames"], inner.results["frames"]) == (5, 3)


def test_the_warp_pipeline_keeps_no_module_level_stats() -> None:
    import flyarchive.render.warp as pipeline

    assert not hasattr(pipeline, "STATS")


# ----------------------------------------------------------------------------- OpenGL backend
def run_python(code: str, **env_changes: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM",
                                                            "DISPLAY", "WAYLAND_DISPLAY")}
    env.update({k: v for k, v in env_changes.items() if v is not None})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_importing_the_renderers_sets_no_environment_variable() -> None:
    code = ("import os, flyarchive.replay.opengl, flyarchive.distribute.api\n"
            "print(os.environ.get('MUJOCO_GL'))\n")

    result = run_python(code)

    assert result.stdout.strip() == "None", result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="EGL is the Linux default")
def test_a_renderer_uses_egl_when_mujoco_gl_is_unset_and_leaves_mujocos_choice() -> None:
    code = (
        "import os\n"
        "from flyarchive.replay.opengl import OpenGLRenderer\n"  # before mujoco's GL is chosen
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


# ----------------------------------------------------------------------------- errors
def product_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(flyarchive.__path__, "flyarchive."):
        if info.name.startswith("flyarchive.testing") or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_every_exception_class_lives_in_errors() -> None:
    elsewhere = []
    for name in product_modules():
        if name == "flyarchive.errors":
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) \
                    and value.__module__ == name:
                elsewhere.append(f"{name}.{value.__name__}")

    assert elsewhere == []


def string_constants(path: Path) -> list[tuple[int, str]]:
    """Non-docstring string literals of a module, with their line numbers."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_install_hints_are_written_only_by_missing_dependency() -> None:
    # codecs.reader_needs tells what *another* reader needs; it is not a missing package.
    allowed = {"flyarchive/errors.py", "flyarchive/codecs.py"}
    by_hand = []
    for path in sorted((ROOT / "flyarchive").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where in allowed or "testing" in path.parts:
            continue
        by_hand += [f"{where}:{line}" for line, text in string_constants(path)
                    if "pip install" in text]

    assert by_hand == []


def test_a_missing_storage_backend_names_its_package_and_extra() -> None:
    s3 = flyarchive.errors.missing_storage_backend("s3://lab/run.zarr", ImportError("no s3fs"))
    gs = flyarchive.errors.missing_storage_backend("gs://lab/run.zarr")

    assert isinstance(s3, StorageBackendMissingError) and isinstance(s3, MissingDependencyError)
    assert "'s3fs'" in str(s3) and "pip install 'flyarchive[s3]'" in str(s3)
    assert "'gcsfs'" in str(gs) and str(gs).endswith("pip install gcsfs")


def bad_mode() -> None:
    from flyarchive.store import parse_mode

    parse_mode("x")


def misaligned_world_block() -> None:
    from flyarchive.store.claims import shards_of_block

    shards_of_block(0, 3, 2, 8)  # shards of 2 worlds: a block cannot end at 3


def impossible_crf() -> None:
    from flyarchive.video import VideoOptions

    VideoOptions(crf=99)


@pytest.mark.parametrize("call", [bad_mode, misaligned_world_block, impossible_crf])
def test_bad_options_raise_flyarchive_errors(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(flyarchive.OptionsError):
        call()


# ----------------------------------------------------------------------------- finite frames
def test_finite_frames_marks_a_frame_with_nan_in_any_array() -> None:
    from flyarchive.schema import finite_frames

    qpos = np.zeros((2, 4, 3))
    mocap = np.zeros((2, 4, 1, 3))
    qpos[0, 1, 2] = np.nan
    mocap[1, 3, 0, 0] = np.inf

    actual = finite_frames(qpos, mocap, None, frame_dims=2)

    assert actual.tolist() == [[True, False, True, True], [True, True, True, False]]


def test_render_frames_blacks_a_frame_whose_mocap_pose_is_not_finite(tmp_path: Path) -> None:
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import tiny_model

    model = tiny_model()
    url = str(tmp_path / "nan.zarr")
    qpos = np.tile(model.qpos0, (1, 3, 1))
    mocap_pos = np.tile(model.body_pos[model.body_mocapid >= 0], (1, 3, 1, 1))
    mocap_quat = np.tile([1.0, 0.0, 0.0, 0.0], (1, 3, 1, 1))
    mocap_pos[0, 1, 0, 0] = np.nan
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(0.002, 25.0, 0.2), (0,))
    writer = ArchiveWriter.create(url, spec)
    writer.write(FrameBlock(np.arange(3) * 0.008, qpos, mocap_pos, mocap_quat))
    writer.close()

    frames = flyarchive.render_frames(url, model, "front", size=SIZE).values[0]

    assert (frames[1] == 0).all() and (frames[0] > 0).any() and (frames[2] > 0).any()


# ----------------------------------------------------------------------------- docstrings
def test_render_videos_names_files_as_its_docstring_says() -> None:
    from flyarchive.video import safe_video_path

    doc = flyarchive.render_videos.__doc__ or ""

    assert safe_video_path("{out}", 3, "nmf/trackcam") == "{out}/world00003/nmf_trackcam-1b3fdcea.mp4"
    assert "``{out}/world00003/nmf_trackcam-1b3fdcea.mp4``" in doc
    assert safe_video_path("out", 3, "front") == "out/world00003/front.mp4"


@pytest.mark.parametrize(("backend", "n_videos", "where", "expected"), [
    ("gpu", 8, {"visible": "0"}, True),             # one GPU: in this process
    ("gpu", 8, {"visible": "01"}, False),           # two: a local cluster, one worker each
    ("gpu", 8, {"visible": "01", "gpus": [1]}, True),
    ("gpu", 1, {"visible": "01"}, True),            # one video: one GPU
    ("gpu", 8, {"scheduler": "tcp://x:8786"}, False),
    ("warp-cpu", 8, {"n_workers": 1}, True),
    ("warp-cpu", 8, {"n_workers": 0}, True),
    ("warp-cpu", 1, {"n_workers": 4}, True),        # one video
    ("warp-cpu", 8, {"n_workers": 4}, False),       # a local cluster
    ("warp-cpu", 8, {"n_workers": 4, "in_process": True}, True),
])
def test_where_warp_renders_run_is_what_render_videos_documents(
        backend: str, n_videos: int, where: dict, expected: bool) -> None:
    from flyarchive.distribute.placement import runs_here
    from flyarchive.distribute.gpus import Gpu

    if "visible" in where:  # a fake set of GPUs: "01" is two
        where = {**where, "visible": [Gpu(int(i), i) for i in where["visible"]]}

    assert runs_here(backend, n_videos, **where) is expected


def test_every_name_in_all_resolves() -> None:
    missing = [name for name in flyarchive.__all__ if not hasattr(flyarchive, name)]

    assert missing == []


def test_every_flyarchive_name_the_readme_uses_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    dotted = set(re.findall(r"\bflyarchive(?:\.[A-Za-z_]\w*)+", readme))
    imported = re.findall(r"from (flyarchive[\w.]*) import ([\w, ]+)", readme)
    missing = []

    for chain in sorted(dotted):
        if not _resolves(chain):
            missing.append(chain)
    for module, names in imported:
        missing += [f"{module}.{n.strip()}" for n in names.split(",")
                    if not _resolves(f"{module}.{n.strip()}")]

    assert missing == []


def _resolves(chain: str) -> bool:
    """``a.b.c`` names a module, or an attribute of the longest importable prefix."""
    parts = chain.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True
    return False
