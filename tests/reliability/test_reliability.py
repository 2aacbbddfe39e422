"""Reliability: killed writers, corruption that verify must catch, parallel renderers, no pickle."""

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder
from flyarchive.cli import main
from flyarchive.store.integrity import verify
from flyarchive.testing import flip_bits, shard_file, simulate
from flyarchive.testing.fixtures import record
from flyarchive.testing.kills import KillConfig, kill_trial
from flyarchive.testing.markers import requires_warp

PACKAGE = Path(__file__).resolve().parents[2] / "flyarchive"


# ----------------------------------------------------------------------------- kills
@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.sweep) for s in (1, 2, 3, 4))])
def test_sigkill_at_a_random_point_keeps_committed_frames_and_resumes(tmp_path, seed):
    config = KillConfig(backend="cpu", seed=seed, chunk_frames=5, max_wait_frames=30)

    result = kill_trial(str(tmp_path / "killed.zarr"), config)

    assert result.killed
    assert result.problems == []
    assert result.committed >= result.reported_committed
    assert 0 <= result.frames_lost <= config.chunk_frames


@requires_warp
@pytest.mark.subprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("host_states", [
    pytest.param(True, id="cpu-worlds-in-warp-arrays"),
    # the same recorder fed by mujoco-warp's own step: ~5 s more CPU per process (its
    # import and kernels), and its kernels to compile on an empty cache
    pytest.param(False, id="mujoco-warp-step", marks=pytest.mark.sweep),
])
def test_sigkill_of_a_mujoco_warp_recording_keeps_committed_frames_and_resumes(tmp_path,
                                                                                host_states):
    """WarpTrajectoryRecorder on Warp's CPU device, its device buffer and both host
    buffers, killed mid-recording. By default the worlds are CPU MuJoCo's in Warp arrays
    (what the recorder reads of a mujoco_warp.Data): the recorder is under test here, not
    mujoco-warp's physics (tests/record/test_warp.py records mujoco-warp's steps)."""
    config = KillConfig(backend="warp", seed=1, chunk_frames=5, max_wait_frames=30,
                        host_states=host_states)

    result = kill_trial(str(tmp_path / "killed-warp.zarr"), config)

    assert result.killed
    assert result.problems == []
    assert 0 <= result.frames_lost <= 3 * config.chunk_frames


def test_resume_after_a_kill_during_creation_records_from_frame_zero(tiny, tmp_path):
    import shutil

    from flyarchive import open_archive
    from flyarchive.testing import reference_frames

    url = tmp_path / "half-created.zarr"
    record(tiny, str(url), n_steps=0)
    for folder in [p for p in url.iterdir() if p.is_dir()]:
        shutil.rmtree(folder)  # as if killed after the root zarr.json, before the arrays
    expected = reference_frames(tiny, 2, 36)

    with TrajectoryRecorder(str(url), tiny, chunk_frames=5, mode="a") as recorder:
        simulate(tiny, 2, 36, recorder.record_as_needed)

    ds = open_archive(str(url))
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(ds.sim_time.values, expected["time"])


# ----------------------------------------------------------------------------- verify
def test_verify_passes_a_sound_archive(tiny, tmp_path, capsys):
    url = str(tmp_path / "sound.zarr")
    record(tiny, url)

    report = verify(url)
    code = main(["verify", url])

    assert report.ok, report.problems
    assert report.frames_checked == 2 * 20
    assert code == 0
    assert "OK" in capsys.readouterr().out


def test_verify_detects_flipped_bits_in_a_chunk(tiny, tmp_path, capsys):
    url = str(tmp_path / "flipped.zarr")
    record(tiny, url)
    flip_bits(shard_file(url, "qpos", 0, 1), at=1 / 3, mask=0b0001_0000)

    report = verify(url)
    code = main(["verify", url])

    assert not report.ok
    assert any("qpos" in p and "frames 5..9" in p for p in report.problems), report.problems
    assert code == 1
    assert "qpos" in capsys.readouterr().err


def test_verify_detects_a_missing_chunk_inside_n_frames(tiny, tmp_path, capsys):
    url = str(tmp_path / "holed.zarr")
    record(tiny, url)
    shard_file(url, "mocap_pos", 0, 2).unlink()

    report = verify(url)
    code = main(["verify", url])

    assert not report.ok
    assert any("mocap_pos" in p and "missing" in p for p in report.problems), report.problems
    assert code == 1
    assert "mocap_pos" in capsys.readouterr().err


def test_verify_detects_a_missing_time_chunk(tiny, tmp_path):
    url = str(tmp_path / "no-time.zarr")
    record(tiny, url)
    (Path(url) / "time" / "c" / "1").unlink()

    report = verify(url)

    assert not report.ok
    assert any(p.startswith("time") for p in report.problems), report.problems


def test_verify_detects_n_frames_beyond_the_time_extent(tiny, tmp_path, capsys):
    url = str(tmp_path / "overcommitted.zarr")
    record(tiny, url)
    zarr.open_group(url, mode="r+")["n_frames"][:] = np.array([20, 25])

    report = verify(url)
    code = main(["verify", url])

    assert not report.ok
    assert any("n_frames [20, 25]" in p and "0..20" in p for p in report.problems), report.problems
    assert code == 1
    assert "n_frames" in capsys.readouterr().err


# ----------------------------------------------------------------------------- renderers
RENDER_WORKER = """
import sys
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.testing import tiny_model
result = render_videos(sys.argv[1], tiny_model(), ["front", "top"], sys.argv[2], n_workers=0,
                       options=RenderOptions(size=(48, 64), segment_frames=8))
print(len(result.videos))
"""


@pytest.mark.subprocess
@pytest.mark.timeout(400)
def test_four_cpu_render_processes_at_once_all_finish(tiny, tmp_path):
    from flyarchive.video import read_video

    url = str(tmp_path / "shared.zarr")
    record(tiny, url, n_worlds=1, n_steps=40)  # 11 frames
    env = {"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    outs = [tmp_path / f"out{i}" for i in range(4)]

    procs = [subprocess.Popen([sys.executable, "-c", RENDER_WORKER, url, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for out in outs]
    results = [proc.communicate(timeout=300) for proc in procs]

    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, stderr[-2000:]
        assert stdout.strip() == "2"
    for out in outs:
        assert read_video(out / "world00000" / "front.mp4").shape == (11, 48, 64, 3)
        assert read_video(out / "world00000" / "top.mp4").shape == (11, 48, 64, 3)


# ----------------------------------------------------------------------------- security
def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            yield node, owner, name


@pytest.fixture(scope="module")
def package_trees():
    """Every module of the package, parsed: (path, tree)."""
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


def test_no_module_imports_a_pickle_library(package_trees):
    banned = {"pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
    offenders = []

    for path, tree in package_trees:
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names if n in banned]

    assert offenders == []


def test_every_np_load_refuses_pickles(package_trees):
    offenders = []

    for path, tree in package_trees:
        for node, owner, name in _calls(tree):
            if owner in {"np", "numpy"} and name == "load":
                pickle_kw = [k for k in node.keywords if k.arg == "allow_pickle"]
                safe = pickle_kw and isinstance(pickle_kw[0].value, ast.Constant) \
                    and pickle_kw[0].value.value is False
                if not safe:
                    offenders.append(f"{path.name}:{node.lineno}")

    assert offenders == []


def test_no_module_creates_object_arrays(package_trees):
    offenders = []

    for path, tree in package_trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "dtype":
                value = node.value
                if (isinstance(value, ast.Name) and value.id == "object") or (
                        isinstance(value, ast.Constant) and value.value in ("object", "O")):
                    offenders.append(f"{path.name}:{value.lineno}")

    assert offenders == []


@pytest.mark.parametrize("camera", ["../../escape", "/etc/passwd", "..", ".hidden", "a/../../b",
                                    "C:\\evil", "x\x00y", ""])
def test_video_paths_from_camera_names_stay_in_the_output_folder(tmp_path, camera):
    from flyarchive.video import safe_video_path

    out = tmp_path / "videos"

    path = Path(safe_video_path(str(out), 7, camera))

    assert path.parent == out / "world00007"
    assert path.resolve().is_relative_to(out.resolve())
    assert path.name.endswith(".mp4") and not path.name.startswith(".")
