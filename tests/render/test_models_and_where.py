"""Rendering with the model kept beside the archive (no model given), and query-then-render:
``where=`` masks that choose worlds, or windows of frames, each window its own video."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flyarchive import add_world_vars, open_archive
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.testing import block_columns, slider_columns, slider_model
from flyarchive.testing.fixtures import copy_archive, record, slider_archive
from flyarchive.testing.markers import WARP_BACKEND, requires_warp
from flyarchive.video import read_video

SMALL = RenderOptions(size=(48, 64), segment_frames=8)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("kept") / "run.zarr"), n_steps=28)


def test_render_frames_without_a_model_uses_the_kept_one(tiny, archive):
    expected = render_frames(archive, tiny, "front", size=(48, 64)).values

    actual = render_frames(archive, None, "front", size=(48, 64)).values

    np.testing.assert_array_equal(actual, expected)


def test_render_videos_without_a_model_uses_the_kept_one(tiny, archive, tmp_path):
    given = render_videos(archive, tiny, "front", str(tmp_path / "given"), worlds=[1],
                          options=SMALL, n_workers=0)

    kept = render_videos(archive, cameras="front", out=str(tmp_path / "kept"), worlds=[1],
                         options=SMALL, n_workers=0)

    np.testing.assert_array_equal(read_video(kept.videos[0]["path"]),
                                  read_video(given.videos[0]["path"]))


def test_render_from_s3_uses_the_model_kept_there(tiny, s3_location, tmp_path):
    record(tiny, s3_location.url, storage_options=s3_location.storage_options, n_steps=12)

    result = render_videos(s3_location.url, None, "front", str(tmp_path / "v"), options=SMALL,
                           storage_options=s3_location.storage_options, n_workers=0)

    assert [len(read_video(v["path"])) for v in result.videos] == [4, 4]


# ----------------------------------------------------------------------------- where
#: World 0 is beyond 0.5 at frames 3..5 and 20..22; world 1 never; world 2 from frame 10 on.
QPOS = np.zeros((3, 30, 1))
QPOS[0, 3:6] = QPOS[0, 20:23] = 1.0
QPOS[0, :, 0] += np.linspace(-0.4, 0.4, 30)  # moves, so each frame is told apart
QPOS[2, 10:] = 1.0


@pytest.fixture(scope="module")
def slider(tmp_path_factory: pytest.TempPathFactory) -> str:
    return slider_archive(str(tmp_path_factory.mktemp("where") / "slider.zarr"), QPOS)


def test_each_window_of_a_world_is_a_video_named_by_its_frames(slider, tmp_path):
    ds = open_archive(slider)

    result = render_videos(slider, slider_model(), "front", str(tmp_path), options=SMALL,
                           where=ds.qpos.sel(dof="x") > 0.5, pad=0.01, n_workers=0)

    assert sorted(v["path"][len(str(tmp_path)):] for v in result.videos) == [
        "/world00000/front.frames000002-000007.mp4", "/world00000/front.frames000019-000024.mp4",
        "/world00002/front.frames000009-000030.mp4"]


def test_a_window_video_shows_the_frames_of_its_window(slider, tmp_path):
    ds = open_archive(slider)

    result = render_videos(slider, slider_model(), "front", str(tmp_path), worlds=[0],
                           options=RenderOptions(size=(96, 128)),
                           where=ds.qpos.sel(dof="x") > 0.5, n_workers=0)

    second = next(v for v in result.videos if v["window"] == 1)
    columns = block_columns(read_video(second["path"]))
    np.testing.assert_allclose(columns, slider_columns(QPOS[0, 20:23, 0], (96, 128)), atol=1.5)


def test_the_manifest_says_which_window_each_video_covers(slider, tmp_path):
    ds = open_archive(slider)

    render_videos(slider, slider_model(), "front", str(tmp_path), worlds=[0], options=SMALL,
                  where=ds.qpos.sel(dof="x") > 0.5, n_workers=0)

    videos = json.loads((tmp_path / "manifest.json").read_text())["videos"]
    assert sorted((v["window"], v["frame_range"], v["start_time"], v["end_time"])
                  for v in videos) == [(0, [3, 6], 0.03, 0.05), (1, [20, 23], 0.2, 0.22)]


def test_a_world_variable_mask_renders_only_those_worlds(slider, tmp_path):
    url = copy_archive(slider, tmp_path / "slider.zarr")
    add_world_vars(url, {"success": [True, False, True]})
    ds = open_archive(url)

    result = render_videos(url, slider_model(), "front", str(tmp_path / "v"), options=SMALL,
                           where=ds.success, n_workers=0)

    assert sorted(Path(v["path"]).parent.name for v in result.videos) == ["world00000",
                                                                           "world00002"]


@requires_warp
def test_the_warp_backends_write_each_window_to_its_own_video(slider, tmp_path):
    ds = open_archive(slider)
    options = RenderOptions(backend=WARP_BACKEND, size=(48, 64), batch_worlds=4)

    result = render_videos(slider, slider_model(), "front", str(tmp_path), worlds=[0],
                           options=options, where=ds.qpos.sel(dof="x") > 0.5, n_workers=0)

    assert sorted((Path(v["path"]).name, len(read_video(v["path"]))) for v in result.videos) == [
        ("front.frames000003-000006.mp4", 3), ("front.frames000020-000023.mp4", 3)]


def test_windows_render_on_a_dask_cluster_with_the_kept_model(tiny, tmp_path, dask_client):
    url = record(tiny, str(tmp_path / "run.zarr"), n_worlds=1, n_steps=76)
    add_world_vars(url, {"success": [True]})
    ds = open_archive(url)
    where = (ds.success == 1) & ds.time.isin(ds.time.values[[2, 3, 10, 11, 12]])
    result = render_videos(url, None, "front", str(tmp_path / "v"), where=where,
                           options=RenderOptions(size=(48, 64), segment_frames=2),
                           client=dask_client)

    assert sorted((Path(v["path"]).name, len(read_video(v["path"]))) for v in result.videos) == [
        ("front.frames000002-000004.mp4", 2), ("front.frames000010-000013.mp4", 3)]
