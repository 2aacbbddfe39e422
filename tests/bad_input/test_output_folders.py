"""Hostile output folders: what a render reads back from one (manifest.json, depth and
segmentation arrays, videos) and where it writes into one. Each case gets a clear error
(type and message), writes nothing (no video, nothing outside the folder) and leaves the
archive byte for byte as it was. Real links, FIFOs (os.mkfifo) and sparse files; every
test is bounded by a timeout, so a regression that opens a FIFO fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import (
    CorruptArchiveError,
    FrameSizeError,
    ManifestError,
    OptionsError,
    RenderOptionsError,
    UnsafeFileError,
)
from flyarchive.testing.fixtures import snapshot
from flyarchive.testing.hostile_cases import snapshot as lstat_snapshot
from flyarchive.video import read_depth, read_segmentation, read_video, write_output

pytestmark = pytest.mark.timeout(120)

SIZE = (48, 64)


@pytest.fixture
def before(archive: str) -> dict:
    return snapshot(Path(archive))


def render(archive: str, tiny, out: Path, **options) -> None:
    render_videos(archive, tiny, "front", str(out),
                  options=RenderOptions(size=options.pop("size", SIZE), **options), n_workers=0)


def outside_folder(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    return outside


def entry(out: Path, **fields) -> dict:
    return {"world": 0, "camera": "front", "path": str(out / "world00000" / "front.mp4"),
            **fields}


def manifest_with(out: Path, value) -> Path:
    out.mkdir(exist_ok=True)
    path = out / "manifest.json"
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    return path


# --------------------------------------------------------------------------- manifest.json
def _dev_zero(out: Path) -> None:
    os.symlink("/dev/zero", out / "manifest.json")


def _fifo(out: Path) -> None:
    os.mkfifo(out / "manifest.json")


def _sparse(out: Path) -> None:
    with open(out / "manifest.json", "wb") as f:
        f.truncate(300 << 20)  # 300 MiB of zeros, no disk used


@pytest.mark.parametrize("make, fragment", [
    (_dev_zero, "manifest.json leads out of the output folder"),
    (_fifo, "manifest.json is a FIFO (named pipe), not a regular file"),
    (_sparse, "manifest.json is 314572800 bytes, more than the 268435456 bytes"),
], ids=["link to /dev/zero", "FIFO", "300 MiB"])
def test_an_unsafe_manifest_is_refused_before_rendering(archive, before, tmp_path, tiny, make,
                                                          fragment):
    out = tmp_path / "out"
    out.mkdir()
    make(out)
    kept = lstat_snapshot(out)

    with pytest.raises(UnsafeFileError, match="The output folder was damaged or tampered with") as err:
        render(archive, tiny, out)

    assert fragment in str(err.value)
    assert lstat_snapshot(out) == kept  # nothing rendered, the file not replaced
    assert snapshot(Path(archive)) == before


@pytest.mark.parametrize("value, fragment", [
    ("{not json", "it is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "its JSON is nested more than 64 deep"),
    ({"videos": [{"a": json.loads("[" * 70 + "]" * 70)}]}, "its JSON is nested more than 64 deep"),
    ([1, 2], "it holds list, not a JSON object"),
    ({"videos": {"0": 1}}, "'videos' is {'0': 1}, not a list"),
    ({"videos": ["front.mp4"]}, "video entry 0 is 'front.mp4', not an object"),
    ({"my": "precious notes"}, "it is not a flyarchive manifest (its manifest_version is None"),
    ({}, "it is not a flyarchive manifest"),
    ({"manifest_version": 99, "videos": []}, "its manifest_version is 99; flyarchive writes 1"),
], ids=["not JSON", "nested 100000 deep", "nested 73 deep", "a list", "videos not a list",
        "an entry not an object", "a user's JSON", "an empty object", "a later version"])
def test_a_manifest_that_is_not_a_manifest_is_refused_naming_the_problem(
        archive, before, tmp_path, tiny, value, fragment):
    out = tmp_path / "out"
    path = manifest_with(out, value)
    text = path.read_bytes()

    with pytest.raises(ManifestError, match="Move it away") as err:
        render(archive, tiny, out)

    assert fragment in str(err.value) and str(path) in str(err.value)
    assert path.read_bytes() == text and sorted(p.name for p in out.iterdir()) == ["manifest.json"]
    assert snapshot(Path(archive)) == before


@pytest.mark.parametrize("resume", [False, True], ids=["overwrite", "resume"])
def test_manifest_entries_naming_files_outside_the_folder_are_not_carried(
        archive, tmp_path, tiny, resume):
    out, outside = tmp_path / "out", outside_folder(tmp_path)
    render(archive, tiny, out)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    mine = outside / "front.mp4"
    mine.write_bytes(b"not the render's")
    listed = manifest["videos"][0]
    assert len(manifest["videos"]) >= 2
    if resume:  # a video left to render: the resumed render writes the manifest
        manifest["videos"].pop()
    manifest["videos"] += [{**listed, "path": str(mine)},
                           {**listed, "path": f"{out}/../{outside.name}/front.mp4"},
                           {**listed, "path": f"{out}/world00001/x.mp4",
                            "outputs": {"depth": str(outside / "depth")}}]
    path.write_text(json.dumps(manifest))

    render_videos(archive, tiny, "front", str(out), n_workers=0, resume=resume,
                  options=RenderOptions(size=SIZE, overwrite=not resume))

    paths = [v["path"] for v in json.loads(path.read_text())["videos"]]
    assert paths and all(p.startswith(f"{out}/") and "/../" not in p for p in paths)
    assert f"{out}/world00001/x.mp4" not in paths
    assert mine.read_bytes() == b"not the render's"


@pytest.mark.parametrize("change, fragment", [
    ({"camera": None}, "has camera=None, not text"),
    ({"world": "0"}, "has world='0', not an integer"),
    ({"world": None}, "has world=null without a 'mosaic' object"),
    ({"size": [48]}, "has size=[48], not [height, width], two integers"),
    ({"frames": -3}, "has frames=-3, not a whole number >= 0"),
    ({"fps": "25"}, "has fps='25', not a number"),
    ({"outputs": {"rgb": 3}}, "has outputs={'rgb': 3}, not an object of output names and paths"),
    ({"overlays": "time"}, "has overlays='time', not a list of texts"),
    ({"world": None, "mosaic": {"worlds": ["0"]}}, "has mosaic worlds=['0'], not a list of integers"),
], ids=lambda v: str(v)[:30] if isinstance(v, dict) else None)
def test_a_manifest_entry_of_the_wrong_types_is_refused_naming_the_entry_and_field(
        archive, before, tmp_path, tiny, change, fragment):
    out = tmp_path / "out"
    path = manifest_with(out, {"videos": [entry(out, **change)]})
    text = path.read_bytes()

    with pytest.raises(ManifestError) as err:
        render(archive, tiny, out)

    assert f"video entry 0 ('{out}/world00000/front.mp4') {fragment}" in str(err.value)
    assert path.read_bytes() == text
    assert snapshot(Path(archive)) == before


def test_a_manifest_entry_without_a_camera_is_a_manifest_error_not_a_key_error(
        archive, before, tmp_path, tiny):
    out = tmp_path / "out"
    value = entry(out)
    del value["camera"]
    manifest_with(out, {"videos": [value]})

    with pytest.raises(ManifestError, match=r"video entry 0 \('.*front.mp4'\) has no 'camera'"):
        render(archive, tiny, out)

    assert not (out / "world00000").exists()


@pytest.mark.parametrize("make, fragment", [
    (_fifo, "manifest.json is a FIFO (named pipe)"),
    (lambda out: manifest_with(out, {"videos": [{"world": 0, "path": "x"}]}), "has no 'camera'"),
], ids=["FIFO", "no camera"])
@pytest.mark.subprocess
def test_cli_render_into_a_hostile_manifest_exits_2_with_one_line(archive, before, tmp_path,
                                                                 cli, model_xml, make, fragment):
    out = tmp_path / "out"
    out.mkdir()
    make(out)

    code, _, err = cli("render", archive, "--model", model_xml, "--camera", "front", "--size",
                       "48x64", "--out", out, "--workers", "0", "--quiet")

    assert code == 2
    assert err.startswith("flyarchive render: error: ") and err.count("\n") == 1
    assert fragment in err
    assert not (out / "world00000").exists()
    assert snapshot(Path(archive)) == before


# --------------------------------------------------------------------------- linked folders
@pytest.mark.parametrize("name, options", [
    ("world00000", {}),
    ("mosaic000", {"mosaic": (1, 2)}),
], ids=["world folder", "mosaic folder"])
def test_a_folder_linked_out_of_the_output_folder_is_refused_before_anything_is_written(
        archive, before, tmp_path, tiny, name, options):
    out, outside = tmp_path / "out", outside_folder(tmp_path)
    out.mkdir()
    os.symlink(outside, out / name)

    with pytest.raises(UnsafeFileError, match=f"{name} leads out of the output folder"):
        render(archive, tiny, out, **options)

    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == [name]  # no parts folder, no manifest
    assert snapshot(Path(archive)) == before


def test_a_dangling_folder_link_leading_out_is_refused(archive, before, tmp_path, tiny):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(tmp_path / "nowhere" / "videos", out / "world00001")

    with pytest.raises(UnsafeFileError, match="world00001 leads out of the output folder"):
        render(archive, tiny, out)

    assert not (tmp_path / "nowhere").exists()
    assert snapshot(Path(archive)) == before


def test_a_dangling_link_where_a_video_goes_is_an_existing_output(archive, before, tmp_path,
                                                                   tiny):
    from flyarchive.errors import OutputExistsError

    out = tmp_path / "out"
    (out / "world00000").mkdir(parents=True)
    os.symlink(out / "gone.mp4", out / "world00000" / "front.mp4")  # inside, dangling

    with pytest.raises(OutputExistsError, match=r"1 video\(s\) already exist.*--resume"):
        render(archive, tiny, out)

    assert sorted(p.name for p in out.rglob("*")) == ["front.mp4", "world00000"]
    assert snapshot(Path(archive)) == before


def test_a_map_folder_linked_out_is_refused_even_with_overwrite(archive, before, tmp_path, tiny):
    out, outside = tmp_path / "out", outside_folder(tmp_path)
    (out / "world00000").mkdir(parents=True)
    os.symlink(outside, out / "world00000" / "front.depth.zarr")

    with pytest.raises(UnsafeFileError, match="front.depth.zarr leads out of the output folder"):
        render(archive, tiny, out, outputs=("rgb", "depth"), overwrite=True)

    assert list(outside.iterdir()) == [] and not (out / "world00000" / "front.mp4").exists()
    assert snapshot(Path(archive)) == before


def test_publishing_through_a_folder_linked_out_is_refused(tmp_path):
    out, outside = tmp_path / "out", outside_folder(tmp_path)
    out.mkdir()
    os.symlink(outside, out / "world00003")
    local = tmp_path / "done.mp4"
    local.write_bytes(b"finished video")

    with pytest.raises(UnsafeFileError, match="world00003 leads out of the output folder"):
        write_output(local, str(out / "world00003" / "front.mp4"), root=str(out))

    assert list(outside.iterdir()) == [] and local.read_bytes() == b"finished video"


# --------------------------------------------------------------------------- maps
@pytest.fixture(scope="module")
def rendered(tmp_path_factory, tiny_module, recorded) -> Path:
    """An output folder with a video, a depth map and a segmentation map of world 0."""
    base = tmp_path_factory.mktemp("rendered")
    render_videos(recorded, tiny_module, "front", str(base / "out"), worlds=[0],
                  options=RenderOptions(size=SIZE, outputs=("rgb", "depth", "segmentation")),
                  n_workers=0)
    return base / "out"


@pytest.fixture(scope="module")
def tiny_module():
    from flyarchive.testing import tiny_model

    return tiny_model()


@pytest.fixture
def out(rendered, tmp_path) -> Path:
    """A copy of the rendered folder to damage."""
    copy = tmp_path / "out"
    shutil.copytree(rendered, copy, symlinks=True)
    return copy


def first_chunk(out: Path, name: str) -> Path:
    chunk = out / "world00000" / name / "c" / "0" / "0" / "0"  # 20 frames: one chunk
    assert chunk.is_file()
    return chunk


def replace_with(path: Path, make) -> None:
    path.unlink()
    make(path)


def _metadata(out: Path, name: str, **change) -> None:
    path = out / "world00000" / name / "zarr.json"
    meta = json.loads(path.read_text())
    meta.update(change)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("damage, error, fragment", [
    (lambda p: replace_with(first_chunk(p, "front.depth.zarr"), lambda c: os.symlink("/dev/zero", c)),
     UnsafeFileError, "c/0/0/0 leads out of the map (to /dev/zero)"),
    (lambda p: replace_with(first_chunk(p, "front.depth.zarr"), os.mkfifo),
     UnsafeFileError, "is a FIFO (named pipe), not a regular file"),
    (lambda p: replace_with(p / "world00000" / "front.depth.zarr" / "zarr.json",
                            lambda c: os.symlink("/dev/zero", c)),
     UnsafeFileError, "zarr.json leads out of the map"),
    (lambda p: replace_with(p / "world00000" / "front.depth.zarr" / "zarr.json", os.mkfifo),
     UnsafeFileError, "zarr.json is a FIFO (named pipe)"),
    (lambda p: os.truncate(first_chunk(p, "front.depth.zarr"), 1 << 30),
     UnsafeFileError, "is 1073741824 bytes, more than the"),
    (lambda p: _metadata(p, "front.depth.zarr", codecs=[{"name": "bytes"}, {"name": "gzip"}]),
     CorruptArchiveError, "not uint16 through bytes (little-endian), zstd, crc32c"),
    (lambda p: _metadata(p, "front.depth.zarr", shape=[10 ** 12, 48, 64]),
     CorruptArchiveError, "is more than flyarchive reads"),
    (lambda p: _metadata(p, "front.depth.zarr", data_type="float64"),
     CorruptArchiveError, "it holds 'float64'"),
    (lambda p: (p / "world00000" / "front.depth.zarr" / "zarr.json").write_text("{" * 10),
     CorruptArchiveError, "it is not JSON"),
    (lambda p: first_chunk(p, "front.depth.zarr").write_bytes(_zstd_bomb()),
     UnsafeFileError, "is zstd data that declares 4294967295 decoded bytes"),
], ids=["chunk -> /dev/zero", "chunk FIFO", "zarr.json -> /dev/zero", "zarr.json FIFO",
        "chunk of 1 GiB", "gzip codec", "10**12 frames", "float64", "not JSON", "zstd bomb"])
def test_read_depth_refuses_a_damaged_map(out, damage, error, fragment):
    damage(out)

    with pytest.raises(error) as err:
        read_depth(out / "world00000" / "front.depth.zarr")

    assert fragment in str(err.value)


def _zstd_bomb() -> bytes:
    """A zstd frame header declaring 4 GiB - 1 decoded bytes (single segment, 4-byte size)."""
    return b"\x28\xb5\x2f\xfd" + bytes([0b10100000]) + (0xFFFFFFFF).to_bytes(4, "little") + b"\0" * 8


def test_read_segmentation_refuses_a_chunk_linked_to_dev_zero(out):
    replace_with(first_chunk(out, "front.seg.zarr"), lambda c: os.symlink("/dev/zero", c))

    with pytest.raises(UnsafeFileError, match="leads out of the map \\(to /dev/zero\\)"):
        read_segmentation(out / "world00000" / "front.seg.zarr")


def test_read_segmentation_refuses_a_fifo_chunk(out):
    replace_with(first_chunk(out, "front.seg.zarr"), os.mkfifo)

    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        read_segmentation(out / "world00000" / "front.seg.zarr")


def link_out(out: Path, name: str, tmp_path: Path) -> Path:
    """Move ``world00000/name`` out of the output folder, leaving a link to it in its place."""
    moved = tmp_path / f"elsewhere-{name}"
    shutil.move(out / "world00000" / name, moved)
    os.symlink(moved, out / "world00000" / name)
    return out / "world00000" / name


def test_a_map_folder_linked_out_of_the_output_folder_is_refused_when_read_inside_it(out, tmp_path):
    link_out(out, "front.depth.zarr", tmp_path)

    with pytest.raises(UnsafeFileError, match="leads out of the output folder"):
        read_depth(out / "world00000" / "front.depth.zarr", root=out)

    assert read_depth(out / "world00000" / "front.depth.zarr").shape[0] == 20  # no root: read


def test_reading_a_missing_map_says_so(out):
    with pytest.raises(FileNotFoundError, match="No map array at .*world00009/front.depth.zarr"):
        read_depth(out / "world00009" / "front.depth.zarr")


# --------------------------------------------------------------------------- videos
@pytest.mark.parametrize("make, fragment", [
    (os.mkfifo, "is a FIFO (named pipe), not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "is a character device, not a regular file"),
    (os.mkdir, "is a folder, not a regular file"),
], ids=["FIFO", "link to /dev/zero", "folder"])
def test_read_video_refuses_what_is_not_a_regular_file(tmp_path, make, fragment):
    path = tmp_path / "front.mp4"
    make(path)

    with pytest.raises(UnsafeFileError, match="never opens it") as err:
        read_video(path)

    assert fragment in str(err.value)


def test_read_video_of_a_missing_file_says_so_without_an_ffmpeg_traceback(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        read_video(tmp_path / "world00000" / "front.mp4")

    assert str(err.value).startswith(f"No video at '{tmp_path}/world00000/front.mp4'.")
    assert "ffmpeg" not in str(err.value)


def test_read_video_of_a_file_that_is_not_a_video_is_a_clear_error(tmp_path):
    path = tmp_path / "front.mp4"
    path.write_text("not a video")

    with pytest.raises(CorruptArchiveError, match="does not decode .*render it again"):
        read_video(path)


def test_read_video_refuses_a_link_leading_out_of_root(out, tmp_path):
    link_out(out, "front.mp4", tmp_path)

    with pytest.raises(UnsafeFileError, match="leads out of the output folder"):
        read_video(out / "world00000" / "front.mp4", root=out)


def test_read_video_stops_at_max_bytes(out):
    with pytest.raises(OptionsError, match="decodes to more than max_bytes=10000 bytes"):
        read_video(out / "world00000" / "front.mp4", max_bytes=10_000)


# --------------------------------------------------------------------------- options
def test_an_empty_output_folder_is_refused(archive, before, tiny):
    with pytest.raises(RenderOptionsError, match="The output folder is ''"):
        render_videos(archive, tiny, "front", "", options=RenderOptions(size=SIZE), n_workers=0)

    assert snapshot(Path(archive)) == before


def test_cli_out_empty_exits_2_naming_the_flag(archive, before, tmp_path, cli, model_xml,
                                               monkeypatch):
    monkeypatch.chdir(tmp_path)

    code, _, err = cli("render", archive, "--model", model_xml, "--camera", "front", "--out", "",
                       "--workers", "0", "--quiet")

    assert code == 2 and "The output folder is ''" in err and "--out videos" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr", "tiny.xml"]  # nothing new
    assert snapshot(Path(archive)) == before


def test_resume_with_overwrite_is_refused(archive, before, tmp_path, tiny):
    with pytest.raises(RenderOptionsError, match="choose one"):
        render_videos(archive, tiny, "front", str(tmp_path / "out"), resume=True,
                      options=RenderOptions(size=SIZE, overwrite=True), n_workers=0)

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_cli_resume_with_overwrite_exits_2(archive, tmp_path, cli, model_xml):
    code, _, err = cli("render", archive, "--model", model_xml, "--camera", "front", "--out",
                       tmp_path / "out", "--workers", "0", "--quiet", "--resume", "--overwrite")

    assert code == 2 and "--resume" in err and "--overwrite" in err
    assert not (tmp_path / "out").exists()


def test_a_mosaic_beyond_h264s_frame_size_is_refused(archive, before, tmp_path, tiny):
    with pytest.raises(RenderOptionsError, match="8192x8192 pixels: 262144 macroblocks"):
        render(archive, tiny, tmp_path / "out", size=(4096, 4096), mosaic=(2, 2))

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_a_frame_beyond_h264s_frame_size_is_refused(archive, before, tmp_path, tiny):
    with pytest.raises(FrameSizeError, match="more than the 139264 an H.264 frame holds"):
        render(archive, tiny, tmp_path / "out", size=(8192, 8192), backend="warp-cpu")

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_maps_of_a_frame_beyond_h264s_size_are_not_refused_for_it():
    options = RenderOptions(size=(8192, 8192), backend="warp-cpu", outputs=("depth",))

    assert options.size == (8192, 8192)



def test_an_output_inside_an_archives_array_names_the_archive_and_a_place_beside_it(tmp_path):
    from flyarchive.errors import OutputLocationError
    from flyarchive.store.local_files import refuse_inside_archive

    archive = tmp_path / "my run.zarr"
    for folder in (archive, archive / "qpos"):
        folder.mkdir()
        (folder / "zarr.json").write_text("{}")

    for out, beside in [(archive / "qpos", "my run-qpos"), (archive / "qpos" / "c" / "0", "my run-0")]:
        with pytest.raises(OutputLocationError) as err:
            refuse_inside_archive(out, "--out")
        assert f"inside the archive (or zarr group) at '{archive}'" in str(err.value)
        assert f"e.g. '{tmp_path / beside}'" in str(err.value)
