"""Archive -> mp4 and lazy frames, in this process (Dask runs are in tests/distribute/test_render_dask.py).

What every backend does with an archive (frame k shows state k, NaN frames black) is in
the replay conformance suite (tests/replay/test_opengl.py::TestOpenGLReplay).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from flyarchive.clock import Timing
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import (
    CameraNotFoundError,
    FrameSizeError,
    LayoutMismatchError,
    OutputExistsError,
    SelectionError,
)
from flyarchive.layout import ModelLayout
from flyarchive.replay.opengl_frames import OpenGLRenderer
from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
from flyarchive.testing import slider_model
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import requires_warp
from flyarchive.video import read_video

SMALL = RenderOptions(size=(48, 64), segment_frames=4)


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory):
    """Worlds 3 and 7 of the tiny model, 11 frames each, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    url = str(tmp_path_factory.mktemp("render") / "tiny.zarr")
    return record(tiny_model(), url, world_ids=[3, 7], n_steps=40)


def test_one_video_per_world_and_camera_with_manifest(tiny, tiny_archive, tmp_path):
    out = tmp_path / "videos"

    result = render_videos(tiny_archive, tiny, ["front", "top"], str(out), options=SMALL, n_workers=0)

    paths = sorted(v["path"] for v in result.videos)
    assert paths == sorted(str(out / f"world{w:05d}" / f"{c}.mp4") for w in (3, 7) for c in ("front", "top"))
    for video in result.videos:
        assert read_video(video["path"]).shape == (11, 48, 64, 3)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["worlds"] == [3, 7] and manifest["cameras"] == ["front", "top"]
    assert manifest["archive"] == tiny_archive
    assert [v["fps"] for v in manifest["videos"]] == [25] * 4
    assert not list(out.glob(".parts-*"))


@pytest.fixture(scope="module")
def windowed(tiny_archive, tmp_path_factory):
    """A render of world 7 from 0.016 s to 0.04 s (frames 2..5), done once: tests only read it."""
    from flyarchive.testing import tiny_model

    return render_videos(tiny_archive, tiny_model(), "front",
                         str(tmp_path_factory.mktemp("windowed") / "v"), worlds=[7],
                         time=(0.016, 0.04), options=SMALL, n_workers=0)


def test_time_window_and_world_subset(windowed):
    (video,) = windowed.videos
    assert video["world"] == 7
    assert video["first_frame"] == 2 and video["frames"] == 4
    assert read_video(video["path"]).shape[0] == 4


def test_render_frames_is_lazy_and_equals_direct_rendering(tiny, tiny_archive):
    from flyarchive import open_archive

    frames = render_frames(tiny_archive, tiny, "front", size=(48, 64), block_frames=4)
    assert frames.dims == ("world", "time", "y", "x", "channel")
    assert frames.shape == (2, 11, 48, 64, 3) and frames.dtype == np.uint8

    actual = frames.sel(world=7).isel(time=slice(5, 7)).values

    ds = open_archive(tiny_archive).sel(world=7).isel(time=slice(5, 7))
    with OpenGLRenderer(tiny, "front", (48, 64)) as renderer:
        expected = renderer.render(ds.qpos.values, ds.mocap_pos.values, ds.mocap_quat.values)[:, 0]
    np.testing.assert_array_equal(actual, expected)


def test_render_frames_of_two_models_computed_together_keep_their_own_model(tiny, tiny_archive):
    import hashlib

    import dask

    from flyarchive.models import model_bytes
    from flyarchive.testing import tiny_model

    blue = tiny_model()
    blue.geom_rgba[1] = [0.2, 0.2, 0.8, 1.0]  # the torso, red in tiny: the same layout
    frames = [render_frames(tiny_archive, m, "front", size=(48, 64), block_frames=4)
              for m in (tiny, blue)]
    alone = [f.isel(time=slice(0, 2)).values for f in frames]

    together = dask.compute(*[f.isel(time=slice(0, 2)).data for f in frames])

    assert not np.array_equal(*alone)
    for actual, expected in zip(together, alone):
        np.testing.assert_array_equal(actual, expected)
    keys = [k for k in dict(frames[0].data.__dask_graph__()) if str(k).startswith("flyarchive-model")]
    assert keys == [f"flyarchive-model-bytes-{hashlib.sha256(model_bytes(tiny)).hexdigest()}"]


def test_unknown_camera_lists_the_cameras(tiny, tiny_archive, tmp_path):
    with pytest.raises(CameraNotFoundError, match="Cameras: 'front', 'top'"):
        render_videos(tiny_archive, tiny, "side", str(tmp_path / "v"), options=SMALL, n_workers=0)


def test_model_that_does_not_fit_is_refused(tiny_archive, tmp_path):
    with pytest.raises(LayoutMismatchError, match="archive has nq=13"):
        render_videos(tiny_archive, slider_model(), "front", str(tmp_path / "v"), n_workers=0)


def test_unknown_world_is_refused(tiny, tiny_archive, tmp_path):
    with pytest.raises(SelectionError, match=r"World\(s\) \[4\] are not in the archive. It has \[3, 7\]"):
        render_videos(tiny_archive, tiny, "front", str(tmp_path / "v"), worlds=[4], n_workers=0)


def test_time_window_outside_recording_is_refused(tiny, tiny_archive, tmp_path):
    with pytest.raises(SelectionError, match="the recording spans 0..0.08 s"):
        render_videos(tiny_archive, tiny, "front", str(tmp_path / "v"), time=(5.0, 6.0), n_workers=0)


def test_reversed_time_window_is_refused(tiny, tiny_archive, tmp_path):
    with pytest.raises(SelectionError, match="ends before it starts"):
        render_videos(tiny_archive, tiny, "front", str(tmp_path / "v"), time=(0.2, 0.1), n_workers=0)


def test_odd_frame_size_is_refused_before_rendering(tiny, tiny_archive, tmp_path):
    with pytest.raises(FrameSizeError, match="even"):
        render_videos(tiny_archive, tiny, "front", str(tmp_path / "v"),
                      options=RenderOptions(size=(47, 64)), n_workers=0)
    assert not (tmp_path / "v").exists()


def test_existing_video_is_not_overwritten(tiny, tiny_archive, tmp_path):
    out = tmp_path / "v"
    render_videos(tiny_archive, tiny, "front", str(out), worlds=[3], options=SMALL, n_workers=0)
    before = (out / "world00003" / "front.mp4").read_bytes()

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        render_videos(tiny_archive, tiny, "front", str(out), worlds=[3], time=(0, 0.02),
                      options=SMALL, n_workers=0)

    assert (out / "world00003" / "front.mp4").read_bytes() == before


def test_overwrite_replaces_the_video(tiny, tiny_archive, tmp_path):
    out = tmp_path / "v"
    render_videos(tiny_archive, tiny, "front", str(out), worlds=[3], options=SMALL, n_workers=0)
    again = RenderOptions(size=(48, 64), overwrite=True)

    render_videos(tiny_archive, tiny, "front", str(out), worlds=[3], time=(0, 0.008), options=again,
                  n_workers=0)

    assert read_video(out / "world00003" / "front.mp4").shape[0] == 2


def test_manifest_keeps_videos_of_an_earlier_run_into_the_same_folder(tiny, tiny_archive, tmp_path):
    out = tmp_path / "v"
    render_videos(tiny_archive, tiny, "front", str(out), worlds=[3], options=SMALL, n_workers=0)

    render_videos(tiny_archive, tiny, "top", str(out), worlds=[7], options=SMALL, n_workers=0)

    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted((v["world"], v["camera"]) for v in manifest["videos"]) == [(3, "front"), (7, "top")]
    assert manifest["worlds"] == [3, 7]


def test_encoder_defaults_follow_the_backend():
    from flyarchive.distribute.api import RenderOptions
    from flyarchive.video import VideoOptions

    assert RenderOptions().video == VideoOptions(preset="veryfast", crf=18)
    assert RenderOptions(backend="warp-cpu").video.preset == "veryfast"
    assert RenderOptions(backend="gpu").video == VideoOptions(preset="ultrafast", crf=18)
    chosen = VideoOptions(preset="slow", crf=30)
    assert RenderOptions(backend="gpu", video=chosen).video is chosen
    with pytest.raises(TypeError, match="VideoOptions or None"):
        RenderOptions(video={"preset": "slow"})


def ragged_archive(tmp_path, n_frames):
    """Worlds 0 and 1 of the tiny model with ``n_frames`` committed frames each."""
    from flyarchive.testing import reference_frames, tiny_model

    model = tiny_model()
    frames = reference_frames(model, 2, 40)
    url = str(tmp_path / "ragged.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(0.002, 25, 0.2), (0, 1), chunk_frames=4)
    block = FrameBlock(frames["time"][:8], frames["qpos"][:, :8], frames["mocap_pos"][:, :8],
                       frames["mocap_quat"][:, :8])
    ArchiveWriter.create(url, spec).write(block, n_frames=np.asarray(n_frames))
    return url, frames


def test_render_frames_are_black_past_a_worlds_committed_frames(tiny, tmp_path):
    url, frames = ragged_archive(tmp_path, [8, 5])
    lazy = render_frames(url, tiny, "front", size=(48, 64), block_frames=3)

    actual = lazy.values

    assert actual.shape == (2, 8, 48, 64, 3)
    assert not actual[1, 5:].any()  # past world 1's 5 frames: black
    with OpenGLRenderer(tiny, "front", (48, 64)) as renderer:
        expected = renderer.render(frames["qpos"][1, :5], frames["mocap_pos"][1, :5],
                                   frames["mocap_quat"][1, :5])[:, 0]
    np.testing.assert_array_equal(actual[1, :5], expected)
    assert actual[0].reshape(8, -1).any(axis=1).all()  # world 0: every frame rendered


def test_manifest_entry_names_its_frame_range_and_simulated_times(windowed):
    (entry,) = json.loads(Path(windowed.manifest).read_text())["videos"]

    assert entry["frame_range"] == [2, 6] and entry["frames"] == 4
    assert entry["start_time"] == pytest.approx(0.016) and entry["end_time"] == pytest.approx(0.04)


@requires_warp
def test_manifest_keeps_each_renders_own_size_backend_and_encoder(tiny, tiny_archive, tmp_path):
    from flyarchive.video import VideoOptions

    out = str(tmp_path / "v")
    first = RenderOptions(size=(48, 64), video=VideoOptions(crf=30))
    second = RenderOptions(size=(32, 48), backend="warp-cpu", batch_worlds=4)
    render_videos(tiny_archive, tiny, "front", out, worlds=[3], options=first, n_workers=0)

    render_videos(tiny_archive, tiny, "front", out, worlds=[7], options=second, n_workers=0)

    manifest = json.loads((Path(out) / "manifest.json").read_text())
    by_world = {v["world"]: v for v in manifest["videos"]}
    assert (by_world[3]["size"], by_world[3]["backend"], by_world[3]["video"]["crf"]) == ([48, 64], "opengl", 30)
    assert (by_world[7]["size"], by_world[7]["backend"], by_world[7]["video"]["crf"]) == ([32, 48], "warp-cpu", 18)
    assert read_video(by_world[3]["path"]).shape[1:3] == (48, 64)
    assert read_video(by_world[7]["path"]).shape[1:3] == (32, 48)


def test_manifest_top_level_holds_only_what_every_video_shares(tiny, tiny_archive, tmp_path):
    result = render_videos(tiny_archive, tiny, "front", str(tmp_path / "v"), worlds=[3],
                           options=SMALL, n_workers=0)

    manifest = json.loads(Path(result.manifest).read_text())

    assert set(manifest) == {"manifest_version", "archive", "archive_id", "layout_hash",
                             "versions", "worlds", "cameras", "videos"}
    assert manifest["manifest_version"] == 2


def test_render_frames_still_compute_after_an_in_process_render(tiny, tiny_archive, tmp_path):
    lazy = render_frames(tiny_archive, tiny, "front", size=(48, 64), block_frames=4)
    pool = {"scheduler": "threads", "num_workers": 1}  # one dask thread, reused: its renderer too
    expected = lazy.isel(time=slice(0, 4)).compute(**pool).values
    render_videos(tiny_archive, tiny, "front", str(tmp_path / "v"), worlds=[3], options=SMALL,
                  n_workers=0)

    actual = lazy.isel(time=slice(0, 4)).compute(**pool).values

    np.testing.assert_array_equal(actual, expected)
