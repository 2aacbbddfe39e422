"""Bad input to rendering: each case fails with a clear error before anything is rendered,
and leaves the archive and the videos already in the output folder as they were."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import mujoco
import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import (
    CameraNotFoundError,
    FrameSizeError,
    LayoutMismatchError,
    OutputExistsError,
    RenderOptionsError,
    SelectionError,
    StorageError,
)
from flyarchive.testing import TINY_XML
from flyarchive.testing.fixtures import record, snapshot

SMALL = RenderOptions(size=(48, 64), segment_frames=8)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """An archive (worlds 0 and 1) and a folder holding an earlier render of world 0."""
    from flyarchive.testing import tiny_model

    folder = tmp_path_factory.mktemp("bad-render")
    url = str(folder / "run.zarr")
    record(tiny_model(), url, n_steps=40)
    out = folder / "videos"
    render_videos(url, tiny_model(), "front", str(out), worlds=[0], time=(0, 0.016),
                  options=SMALL, n_workers=0)
    return url, out


@pytest.fixture
def state(rendered: tuple[str, Path], tmp_path: Path) -> Any:
    """This test's copy of the archive and of the earlier videos, with their snapshot."""
    url, out = rendered
    archive, videos = tmp_path / "run.zarr", tmp_path / "videos"
    shutil.copytree(url, archive)
    shutil.copytree(out, videos)

    class State:
        def __init__(self) -> None:
            self.url, self.out = str(archive), videos
            self.before = (snapshot(archive), snapshot(videos))

        def unchanged(self) -> bool:
            return (snapshot(archive), snapshot(videos)) == self.before

    return State()


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts OpenGL renderers made in this process: none means nothing was rendered."""
    from flyarchive.replay import opengl_frames as cpu

    made: list[int] = []
    real = cpu.OpenGLRenderer.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(cpu.OpenGLRenderer, "__init__", counting)
    return made


def render(state: Any, tiny: mujoco.MjModel, out: Any = None, **kwargs: Any) -> Any:
    options = kwargs.pop("options", SMALL)
    cameras = kwargs.pop("cameras", "front")
    return render_videos(state.url, tiny, cameras, str(out if out is not None else state.out),
                         options=options, n_workers=0, **kwargs)


# ----------------------------------------------------------------------------- selection
def test_unknown_camera_lists_the_models_cameras(state, tiny):
    with pytest.raises(CameraNotFoundError, match="No camera 'side' in the model. Cameras: 'front', 'top'"):
        render(state, tiny, cameras="side")

    assert state.unchanged()


def test_unknown_camera_in_render_frames_lists_the_models_cameras(state, tiny):
    with pytest.raises(CameraNotFoundError, match="No camera 'side'"):
        render_frames(state.url, tiny, "side", size=(48, 64))

    assert state.unchanged()


def test_unknown_world_lists_the_archives_worlds(state, tiny):
    with pytest.raises(SelectionError, match=r"World\(s\) \[9\] are not in the archive. It has \[0, 1\]"):
        render(state, tiny, worlds=[9])

    assert state.unchanged()


def test_world_without_committed_frames_is_named(ragged, tiny, tmp_path):
    before = snapshot(ragged)

    with pytest.raises(SelectionError, match=r"World\(s\) \[2\] have no committed frames.*Worlds with frames: \[0, 1\]"):
        render_videos(ragged, tiny, "front", str(tmp_path / "v"), worlds=[1, 2], options=SMALL,
                      n_workers=0)

    assert snapshot(ragged) == before
    assert not (tmp_path / "v").exists()


def test_world_without_committed_frames_in_render_frames_is_named(ragged, tiny):
    before = snapshot(ragged)

    with pytest.raises(SelectionError, match=r"World\(s\) \[2\] have no committed frames"):
        render_frames(ragged, tiny, "front", worlds=[2], size=(48, 64))

    assert snapshot(ragged) == before


def test_empty_world_selection_is_refused(state, tiny):
    with pytest.raises(SelectionError, match="holds no world"):
        render(state, tiny, worlds=[])

    assert state.unchanged()


def test_time_window_outside_the_recording_names_its_span(state, tiny):
    with pytest.raises(SelectionError, match=r"the recording spans 0\.\.0\.08 s\. Widen or move the window"):
        render(state, tiny, time=(5.0, 6.0))

    assert state.unchanged()


def test_reversed_time_window_is_refused(state, tiny):
    with pytest.raises(SelectionError, match="The time window 0.06:0.02 ends before it starts"):
        render(state, tiny, time=(0.06, 0.02))

    assert state.unchanged()


def test_model_of_another_layout_is_refused_by_render_frames(state):
    other = mujoco.MjModel.from_xml_string(TINY_XML.replace('type="ball"', 'type="hinge"'))

    with pytest.raises(LayoutMismatchError, match="nq=13"):
        render_frames(state.url, other, "front", size=(48, 64))

    assert state.unchanged()


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize(("size", "fragment"), [
    ((47, 64), r"odd side.*Render at \(48, 64\) or \(46, 64\)"),
    ((1, 1), r"odd side.*Render at \(2, 2\) instead"),  # not "(2, 2) or (2, 2)"
    ((0, 64), "two positive integers"),
])
def test_impossible_frame_size_is_refused(state, tiny, renders, size, fragment):
    with pytest.raises(FrameSizeError, match=fragment):
        render(state, tiny, worlds=[1], options=RenderOptions(size=size))

    assert renders == []
    assert state.unchanged()


def test_unknown_backend_lists_the_backends(state, tiny):
    with pytest.raises(RenderOptionsError, match="Unknown backend 'vulkan'. Backends: 'opengl', 'gpu', 'warp-cpu'"):
        render(state, tiny, worlds=[1], options=RenderOptions(backend="vulkan"))

    assert state.unchanged()


@pytest.mark.parametrize("value", [0, -3, 2.5])
def test_segment_of_no_frames_is_refused(state, tiny, value):
    with pytest.raises(RenderOptionsError, match=f"segment_frames must be an integer of at least 1, got {value}"):
        render(state, tiny, worlds=[1], options=RenderOptions(segment_frames=value))

    assert state.unchanged()


# ----------------------------------------------------------------------------- outputs
def test_existing_video_is_kept_without_overwrite(state, tiny, renders):
    with pytest.raises(OutputExistsError, match=r"1 video\(s\) already exist.*overwrite=True"):
        render(state, tiny, worlds=[0, 1])

    assert renders == []
    assert state.unchanged()


def test_a_folder_where_a_video_goes_is_refused_even_with_overwrite(state, tiny, renders):
    (state.out / "world00001" / "front.mp4" / "keep").mkdir(parents=True)
    state.before = (state.before[0], snapshot(state.out))

    with pytest.raises(OutputExistsError, match="video or manifest path\\(s\\) are folders"):
        render(state, tiny, worlds=[1], options=RenderOptions(size=(48, 64), overwrite=True))

    assert renders == []
    assert state.unchanged() and (state.out / "world00001" / "front.mp4" / "keep").is_dir()


def test_a_folder_where_the_manifest_goes_is_refused_before_rendering(tiny, renders, tmp_path):
    """It failed at the very end, a video published and unlisted."""
    out = tmp_path / "videos"
    (out / "manifest.json").mkdir(parents=True)

    with pytest.raises(OutputExistsError, match="manifest path\\(s\\) are folders, e.g. "
                                                ".*manifest.json"):
        render_videos(record(tiny, str(tmp_path / "run.zarr"), n_steps=12), tiny, "front",
                      str(out), options=SMALL, n_workers=0)

    assert renders == [] and sorted(p.name for p in out.rglob("*")) == ["manifest.json"]


def test_output_folder_that_is_a_file_is_refused_before_rendering(state, tiny, renders, tmp_path):
    out = tmp_path / "videos.mp4"
    out.write_bytes(b"not a folder")

    with pytest.raises(StorageError, match=f"The output folder '{out}' is a file"):
        render(state, tiny, out, worlds=[1])

    assert renders == []
    assert out.read_bytes() == b"not a folder" and state.unchanged()


def test_output_folder_under_a_file_is_refused_before_rendering(state, tiny, renders, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    out = tmp_path / "a-file" / "videos"

    with pytest.raises(StorageError, match=f"Cannot write to the output folder '{out}'.*Nothing was rendered"):
        render(state, tiny, out, worlds=[1])

    assert renders == []
    assert (tmp_path / "a-file").read_text() == "not a folder" and state.unchanged()


def test_unwritable_output_folder_is_refused_before_rendering(state, tiny, renders):
    out = f"/sys/flyarchive-{uuid.uuid4().hex}"  # sysfs: nobody may make a folder there

    with pytest.raises(StorageError, match=f"Cannot write to the output folder '{out}'.*PermissionError"):
        render(state, tiny, out, worlds=[1])

    assert renders == []
    assert not Path(out).exists() and state.unchanged()


def test_relative_output_folder_under_a_file_names_the_absolute_path(state, tiny, renders, tmp_path,
                                                                   monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.chdir(tmp_path)

    with pytest.raises(StorageError, match=f"'{tmp_path}/a-file/videos'"):
        render(state, tiny, "a-file/videos", worlds=[1])

    assert renders == []
    assert state.unchanged()


def test_unknown_output_protocol_is_a_storage_error(state, tiny, renders):
    with pytest.raises(StorageError, match="Cannot use 'nosuchproto://videos'"):
        render(state, tiny, "nosuchproto://videos", worlds=[1])

    assert renders == []
    assert state.unchanged()


def test_s3_output_in_a_missing_bucket_is_refused_before_rendering(state, tiny, renders, s3_server):
    out = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/videos"
    bucket = out.split("/")[2]

    with pytest.raises(StorageError, match=f"bucket \\(or container\\) '{bucket}' exists.*Nothing was rendered"):
        render(state, tiny, out, worlds=[1], out_storage_options=s3_server.storage_options())

    assert renders == []
    assert not s3_server.filesystem().exists(bucket) and state.unchanged()


def test_existing_s3_video_is_kept_without_overwrite(state, tiny, renders, s3_server):
    out = f"s3://flyarchive-test/{uuid.uuid4().hex}/videos"
    fs = s3_server.filesystem()
    fs.pipe_file(f"{out}/world00001/front.mp4", b"earlier video")

    with pytest.raises(OutputExistsError, match="already exist"):
        render(state, tiny, out, worlds=[1], out_storage_options=s3_server.storage_options())

    assert renders == []
    assert fs.cat_file(f"{out}/world00001/front.mp4") == b"earlier video"
    assert fs.find(out) == [f"{out}/world00001/front.mp4".removeprefix("s3://")]


# ----------------------------------------------------------------------------- CLI
RENDER = ("render", "--camera", "front", "--size", "48x64", "--workers", "0", "--quiet")


def test_cli_render_into_a_file_is_one_line_and_exit_2(state, model_xml, tmp_path, cli):
    out = tmp_path / "videos.mp4"
    out.write_bytes(b"not a folder")

    code, _, err = cli(*RENDER, state.url, "--model", model_xml, "--worlds", "1", "--out", out)

    assert code == 2
    assert err.startswith("flyarchive render: error: The output folder") and err.count("\n") == 1
    assert out.read_bytes() == b"not a folder" and state.unchanged()


def test_cli_render_of_a_world_without_frames_is_one_line_and_exit_2(ragged, model_xml, tmp_path,
                                                                      cli):
    before = snapshot(ragged)

    code, _, err = cli(*RENDER, ragged, "--model", model_xml, "--worlds", "2",
                       "--out", tmp_path / "v")

    assert code == 2
    assert err.startswith("flyarchive render: error: World(s) [2] have no committed frames")
    assert err.count("\n") == 1 and snapshot(ragged) == before
    assert not (tmp_path / "v").exists()


def test_cli_render_over_existing_videos_is_one_line_and_exit_2(state, model_xml, cli):
    code, _, err = cli(*RENDER, state.url, "--model", model_xml, "--worlds", "0",
                       "--out", state.out)

    assert code == 2
    assert err.startswith("flyarchive render: error: 1 video(s) already exist")
    assert state.unchanged()


# ----------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"cameras": 0}, "cameras must be a camera's name or a list of names, e.g. 'nmf/trackcam', got 0"),
    ({"cameras": ["front", 3]}, "cameras must be a camera's name or a list of names"),
    ({"options": {"size": (48, 64)}}, "options must be a flyarchive.RenderOptions"),
    ({"model": 42}, "model must be a mujoco.MjModel, the path of a model file"),
], ids=["camera number", "camera list", "options dict", "model number"])
def test_arguments_of_the_wrong_type_are_named(state, tiny, renders, kwargs, fragment):
    model = kwargs.pop("model", tiny)
    out = state.out.parent / "new-videos"

    with pytest.raises(RenderOptionsError, match=re.escape(fragment)):
        render(state, model, out, **kwargs)

    assert state.unchanged() and renders == [] and not out.exists()


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
def test_a_model_files_path_renders_as_the_model_itself(state, tiny, tmp_path, as_path):
    from flyarchive.models import save_mjb

    mjb = tmp_path / "tiny.mjb"
    save_mjb(tiny, mjb)

    result = render_videos(state.url, as_path(mjb), "front", str(tmp_path / "by-path"),
                           worlds=[1], time=(0, 0.016), options=SMALL, n_workers=0)
    again = render_videos(state.url, tiny, "front", str(tmp_path / "by-model"),
                          worlds=[1], time=(0, 0.016), options=SMALL, n_workers=0)

    assert len(result.videos) == 1
    assert Path(result.videos[0]["path"]).read_bytes() == Path(again.videos[0]["path"]).read_bytes()


def test_a_folder_holding_another_archives_render_is_refused_unless_overwrite(state, tiny,
                                                                              tmp_path):
    other = tmp_path / "other.zarr"
    record(tiny, str(other), n_steps=40)  # another recording: another archive_id
    out = tmp_path / "shared"
    render_videos(state.url, tiny, "front", str(out), worlds=[0], time=(0, 0.016),
                  options=SMALL, n_workers=0)
    listed = (out / "manifest.json").read_bytes()

    with pytest.raises(OutputExistsError, match="holds the videos of a render of another archive"):
        render_videos(str(other), tiny, "front", str(out), worlds=[1], time=(0, 0.016),
                      options=SMALL, n_workers=0)
    assert (out / "manifest.json").read_bytes() == listed

    again = render_videos(str(other), tiny, "front", str(out), worlds=[1], time=(0, 0.016),
                          options=RenderOptions(size=(48, 64), segment_frames=8, overwrite=True),
                          n_workers=0)
    assert [v["world"] for v in again.videos] == [1]


@pytest.mark.parametrize("block_frames", [0, -1, 2.5, True, "4"])
def test_render_frames_refuses_a_block_that_is_not_a_whole_number_of_frames(state, tiny,
                                                                            block_frames):
    with pytest.raises(RenderOptionsError, match="block_frames must be an integer of at least 1"):
        render_frames(state.url, tiny, "front", worlds=[0], block_frames=block_frames)
