"""Bad input: each case fails with a clear error and leaves committed data as it was."""

import json
import logging
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    CameraNotFoundError,
    CorruptArchiveError,
    FlyarchiveError,
    FrameSizeError,
    LayoutMismatchError,
    NonFiniteStateError,
    NpzFormatError,
    OutputExistsError,
    SchemaError,
    SchemaVersionError,
    SelectionError,
    StorageError,
)
from flyarchive.store import ArchiveWriter, FrameBlock
from flyarchive.testing import TINY_XML, flip_bits, reference_frames, shard_file, simulate
from flyarchive.testing.fixtures import snapshot

SMALL = RenderOptions(size=(48, 64), segment_frames=8)


# ----------------------------------------------------------------------------- recording
def test_append_with_another_model_layout_is_refused_and_keeps_the_archive(archive):
    other = mujoco.MjModel.from_xml_string(TINY_XML.replace('type="ball"', 'type="hinge"'))
    before = snapshot(archive)

    recorder = TrajectoryRecorder(archive, other, chunk_frames=5, mode="a")
    with pytest.raises(LayoutMismatchError, match=r"nq=13.*nq=10") as err:
        simulate(other, 2, 8, recorder.record_as_needed)

    assert "wrist" in str(err.value)
    assert snapshot(archive) == before


def test_append_with_another_frame_rate_is_refused_and_keeps_the_archive(tiny, archive):
    before = snapshot(archive)

    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a", output_fps=50)
    with pytest.raises(SchemaError, match="output_fps=25.*output_fps=50"):
        simulate(tiny, 2, 8, recorder.record_as_needed)

    assert snapshot(archive) == before


def test_append_with_more_worlds_than_the_archive_is_refused(tiny, archive):
    before = snapshot(archive)

    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a")
    with pytest.raises(ValueError, match="has 2 worlds; 3 MjData were passed"):
        simulate(tiny, 3, 8, recorder.record_as_needed)

    assert snapshot(archive) == before


def test_creating_where_an_archive_exists_is_refused_and_keeps_it(tiny, archive):
    before = snapshot(archive)

    with pytest.raises(ArchiveExistsError, match="mode='a' to append"):
        TrajectoryRecorder(archive, tiny)

    assert snapshot(archive) == before


def test_nan_in_qpos_is_refused_and_earlier_frames_are_committed(tiny, tmp_path):
    url = str(tmp_path / "diverged.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)

    def on_step(datas):
        if round(datas[0].time / 0.002) == 28:  # the step of frame 7; MuJoCo resets it after
            datas[1].qpos[7] = np.nan
        recorder.record_as_needed(datas)

    with pytest.raises(NonFiniteStateError, match=r"world\(s\) \[1\].*NaN or infinity"):
        simulate(tiny, 2, 100, on_step)
    recorder.close()

    ds = open_archive(url)
    assert ds.n_frames.values.tolist() == [7, 7]  # frames at t = 0 .. 0.048 s
    np.testing.assert_array_equal(ds.qpos.values, reference_frames(tiny, 2, 24)["qpos"])


def test_infinite_mocap_pose_is_refused_and_commits_no_frame(tiny, tmp_path):
    url = str(tmp_path / "inf.zarr")
    recorder = TrajectoryRecorder(url, tiny)
    data = mujoco.MjData(tiny)
    data.mocap_quat[0, 0] = np.inf

    with pytest.raises(NonFiniteStateError, match="Reduce the timestep or fix the controller"):
        recorder.record_as_needed(data)
    recorder.close()

    assert open_archive(url).n_frames.values.tolist() == [0]


def test_integer_storage_dtype_is_refused_and_creates_nothing(tiny, tmp_path):
    url = tmp_path / "int.zarr"

    with pytest.raises(ValueError, match="float64 or float32, got 'int32'"):
        TrajectoryRecorder(str(url), tiny, dtype="int32")

    assert not url.exists()


def test_unknown_codec_is_refused_and_creates_nothing(tiny, tmp_path):
    url = tmp_path / "zfp.zarr"

    with pytest.raises(FlyarchiveError, match="Unknown codec 'zfp'.*'lossless'"):
        TrajectoryRecorder(str(url), tiny, codec="zfp")

    assert not url.exists()


def test_a_block_of_the_wrong_shape_is_refused_and_commits_nothing(tiny, archive):
    from flyarchive.layout import ModelLayout

    writer = ArchiveWriter.append(archive, ModelLayout.from_model(tiny))
    before = snapshot(archive)
    block = FrameBlock(np.array([1.0]), np.zeros((2, 1, 12)), np.zeros((2, 1, 1, 3)),
                       np.zeros((2, 1, 1, 4)))

    with pytest.raises(ValueError, match=r"qpos has shape \(2, 1, 12\).*needs \(2, 1, 13\)"):
        writer.write(block)

    assert snapshot(archive) == before


def test_invalid_mode_is_refused_and_creates_nothing(tiny, tmp_path):
    url = tmp_path / "m.zarr"

    with pytest.raises(ValueError, match=r"mode must be one of \('w-', 'w', 'a'\), got 'x'"):
        TrajectoryRecorder(str(url), tiny, mode="x")

    assert not url.exists()


# ----------------------------------------------------------------------------- locations
@pytest.mark.parametrize("where", ["/proc/flyarchive-test.zarr", "{tmp}/a-file/run.zarr"])
def test_recording_to_an_unwritable_location_is_a_storage_error(tiny, tmp_path, where):
    (tmp_path / "a-file").write_text("not a folder")
    url = where.format(tmp=tmp_path)
    recorder = TrajectoryRecorder(url, tiny)

    with pytest.raises(StorageError) as err:
        recorder.record_as_needed(mujoco.MjData(tiny))

    assert repr(url) in str(err.value)
    assert not Path(url).exists()
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_unknown_url_protocol_names_the_protocol_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a URL mistaken for a local path would land here

    with pytest.raises(StorageError, match="protocol 'nosuch', which fsspec does not know"):
        open_archive("nosuch://bucket/run.zarr")

    assert list(tmp_path.iterdir()) == []


def test_storage_options_for_a_local_path_are_refused(archive):
    before = snapshot(archive)

    with pytest.raises(StorageError, match="storage_options were given for the local path"):
        open_archive(archive, {"anon": True})

    assert snapshot(archive) == before


def test_bad_s3_credentials_give_a_storage_error_that_hides_the_secret(
        forbidding_s3, caplog, capsys):
    from flyarchive.testing.s3 import s3_storage_options

    options = s3_storage_options(forbidding_s3.endpoint_url, key="AKIAWRONGKEY", secret="wrong-secret-value")
    caplog.set_level(logging.DEBUG)

    with pytest.raises(StorageError, match="credentials") as err:
        open_archive("s3://flies/run.zarr", options)

    assert "s3://flies/run.zarr" in str(err.value)
    for text in (str(err.value), repr(err.value), caplog.text, *capsys.readouterr()):
        assert "wrong-secret-value" not in text
    assert "AKIAWRONGKEY" not in str(err.value)
    assert forbidding_s3.methods and forbidding_s3.writes == []  # it asked; it wrote nothing


# ----------------------------------------------------------------------------- damaged archives
def test_missing_root_zarr_json_is_archive_not_found(archive):
    (Path(archive) / "zarr.json").unlink()
    before = snapshot(archive)

    with pytest.raises(ArchiveNotFoundError, match="there is no zarr.json there"):
        open_archive(archive)

    assert snapshot(archive) == before


def test_truncated_root_zarr_json_is_a_schema_error(archive):
    path = Path(archive) / "zarr.json"
    path.write_bytes(path.read_bytes()[:60])
    before = snapshot(archive)

    with pytest.raises(SchemaError, match="metadata at .* is unreadable"):
        open_archive(archive)

    assert snapshot(archive) == before


def test_truncated_array_zarr_json_is_a_schema_error_naming_the_array(archive):
    path = Path(archive) / "qpos" / "zarr.json"
    path.write_bytes(path.read_bytes()[:60])
    before = snapshot(archive)

    with pytest.raises(SchemaError, match="qpos"):
        open_archive(archive)

    assert snapshot(archive) == before


def test_missing_array_zarr_json_is_a_schema_error_naming_the_array(archive):
    (Path(archive) / "qpos" / "zarr.json").unlink()
    before = snapshot(archive)

    with pytest.raises(SchemaError, match="no variable 'qpos'"):
        open_archive(archive)

    assert snapshot(archive) == before


def test_another_schema_version_is_refused(archive):
    zarr.open_group(archive, mode="r+").attrs["flyarchive_schema_version"] = 2
    before = snapshot(archive)

    with pytest.raises(SchemaVersionError, match="version 2; this flyarchive reads version 1"):
        open_archive(archive)

    assert snapshot(archive) == before


def test_a_plain_zarr_group_is_not_an_archive(tmp_path):
    url = str(tmp_path / "plain.zarr")
    zarr.open_group(url, mode="w").create_array("x", shape=(3,), dtype="f8")
    before = snapshot(url)

    with pytest.raises(SchemaError, match="not a flyarchive archive.*xarray.open_zarr"):
        open_archive(url)

    assert snapshot(url) == before


def test_rendering_a_chunk_with_flipped_bits_is_a_corrupt_archive_error(tiny, archive, tmp_path):
    flip_bits(shard_file(archive, "qpos"))  # mid-file: world 1's chunk
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError, match="verify") as err:
        render_videos(archive, tiny, "front", str(tmp_path / "v"), worlds=[1], options=SMALL,
                      n_workers=0)

    assert "qpos" in str(err.value)
    assert snapshot(archive) == before
    assert not list((tmp_path / "v").rglob("*.mp4"))


# ----------------------------------------------------------------------------- rendering
def test_render_with_another_model_layout_is_refused(archive, tmp_path):
    other = mujoco.MjModel.from_xml_string(TINY_XML.replace('type="ball"', 'type="hinge"'))
    before = snapshot(archive)

    with pytest.raises(LayoutMismatchError, match="first differing qpos label"):
        render_videos(archive, other, "front", str(tmp_path / "v"), options=SMALL, n_workers=0)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_render_unknown_camera_lists_the_cameras(tiny, archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(CameraNotFoundError, match="No camera 'side'.*'front', 'top'"):
        render_videos(archive, tiny, "side", str(tmp_path / "v"), options=SMALL, n_workers=0)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_render_world_not_in_the_archive_lists_its_worlds(tiny, archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"World\(s\) \[7\] are not in the archive.*\[0, 1\]"):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), worlds=[7], options=SMALL,
                      n_workers=0)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_render_empty_world_selection_is_refused(tiny, archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match="holds no world"):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), worlds=[], options=SMALL,
                      n_workers=0)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_render_reversed_time_window_is_refused(tiny, archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match="ends before it starts"):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), time=(0.1, 0.05),
                      options=SMALL, n_workers=0)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_render_time_window_outside_the_recording_names_its_span(tiny, archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"spans 0\.\.0\.152 s. Widen or move the window"):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), time=(3.0, 4.0),
                      options=SMALL, n_workers=0)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(("size", "fragment"), [
    ((47, 64), r"odd side.*\(48, 64\) or \(46, 64\)"),
    ((0, 64), "two positive integers"),
    ((40000, 64), "1..16384"),
])
def test_impossible_frame_sizes_are_refused(tiny, archive, tmp_path, size, fragment):
    out = tmp_path / "v"
    before = snapshot(archive)

    with pytest.raises(FrameSizeError, match=fragment):
        render_videos(archive, tiny, "front", str(out), options=RenderOptions(size=size),
                      n_workers=0)

    assert not out.exists()
    assert snapshot(archive) == before


def test_render_into_an_unwritable_output_folder_is_a_storage_error(tiny, archive, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    out = str(tmp_path / "a-file" / "videos")
    before = snapshot(archive)

    with pytest.raises(StorageError, match=out):
        render_videos(archive, tiny, "front", out, worlds=[0], time=(0, 0.016), options=SMALL,
                      n_workers=0)

    assert snapshot(archive) == before
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_existing_videos_are_not_overwritten(tiny, archive, tmp_path):
    out = tmp_path / "v"
    render_videos(archive, tiny, "front", str(out), worlds=[0], time=(0, 0.016), options=SMALL,
                  n_workers=0)
    video = out / "world00000" / "front.mp4"
    before, archive_before = video.read_bytes(), snapshot(archive)

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        render_videos(archive, tiny, "front", str(out), worlds=[0], options=SMALL, n_workers=0)

    assert video.read_bytes() == before
    assert snapshot(archive) == archive_before


# ----------------------------------------------------------------------------- npz
def test_npz_with_pickled_objects_is_refused(tiny, tmp_path):
    from flyarchive.interop.flygym_npz import import_npz

    path = tmp_path / "evil.npz"
    np.savez(path, time=np.zeros(2), qpos=np.zeros((2, 13)), output_fps=25.0,
             playback_speed=0.2, world_id=0, payload=np.array([{"run": "code"}], dtype=object))

    with pytest.raises(NpzFormatError, match="pickled Python objects, which flyarchive never"):
        import_npz(path, str(tmp_path / "npz.zarr"), tiny)

    assert not (tmp_path / "npz.zarr").exists()


def test_npz_without_qpos_names_the_missing_field(tiny, tmp_path):
    from flyarchive.interop.flygym_npz import import_npz

    path = tmp_path / "partial.npz"
    np.savez(path, time=np.zeros(2), output_fps=25.0, playback_speed=0.2, world_id=0)

    with pytest.raises(NpzFormatError, match=r"fields \['qpos'\] are missing"):
        import_npz(path, str(tmp_path / "npz.zarr"), tiny)

    assert not (tmp_path / "npz.zarr").exists()


def test_export_npz_does_not_overwrite_files(archive, tmp_path):
    from flyarchive.interop.flygym_npz import export_npz

    out = tmp_path / "npz"
    out.mkdir()
    (out / "world00000.npz").write_bytes(b"keep me")

    before = snapshot(archive)

    with pytest.raises(OutputExistsError, match=r"world00000.npz'\] already exists; pass overwrite=True"):
        export_npz(archive, out)

    assert (out / "world00000.npz").read_bytes() == b"keep me"
    assert snapshot(archive) == before


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize(("extra", "fragment"), [
    (["--time", "soon"], "Cannot read time window 'soon'; write START:END"),
    (["--worlds", "a-b"], "Cannot read worlds 'a-b'"),
    (["--size", "big"], "Cannot read size 'big'; write HEIGHTxWIDTH"),
    (["--storage-options", "{not json"], "--storage-options must be a JSON object"),
])
def test_cli_render_with_unreadable_arguments_exits_2_with_the_reason(
        archive, model_xml, tmp_path, cli, extra, fragment):
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--model", model_xml, "--camera", "front",
                       "--out", tmp_path / "v", "--quiet", "--workers", "0", *extra)

    assert code == 2
    assert fragment in err
    assert snapshot(archive) == before and not (tmp_path / "v").exists()


def test_cli_render_with_a_missing_model_file_exits_2(archive, tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the default output folder would go
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--model", tmp_path / "nope.xml", "--camera", "front",
                       "--workers", "0")

    assert code == 2
    assert "flyarchive render: error: No model file at" in err
    assert snapshot(archive) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr"]


def test_cli_verify_of_a_missing_archive_exits_2_and_creates_nothing(tmp_path, cli):
    url = tmp_path / "nothing.zarr"

    code, _, err = cli("verify", url)

    assert code == 2
    assert "flyarchive verify: error:" in err and repr(str(url)) in err
    assert not url.exists()


def test_cli_info_of_a_damaged_archive_exits_2_and_changes_nothing(archive, cli):
    meta = Path(archive) / "n_frames" / "zarr.json"
    meta.write_text(json.dumps({"zarr_format": 3}))
    before = snapshot(archive)

    code, _, err = cli("info", archive)

    assert code == 2
    assert "flyarchive info: error:" in err
    assert snapshot(archive) == before
