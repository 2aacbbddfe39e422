"""Depth and segmentation maps beside the videos: written in whole chunks, published so that
a final name never holds part of an array, read back as model units and geom ids."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from flyarchive.errors import CorruptArchiveError, OutputExistsError, StorageError, VideoEncodeError
from flyarchive.testing.markers import requires_s3
from flyarchive.video.decode import read_depth, read_map, read_segmentation
from flyarchive.video.maps import MapWriter, depth_attrs, map_url, publish_map, segmentation_attrs

SIZE = (4, 6)


def counts(n: int = 7) -> np.ndarray:
    return (np.arange(n * 24) % 300).reshape(n, *SIZE).astype(np.uint16)


def write_map(path: Path, values: np.ndarray, attrs=None, chunk_frames: int = 3) -> Path:
    with MapWriter(path, SIZE, len(values), attrs or depth_attrs(0.5, 100.0),
                   chunk_frames=chunk_frames) as writer:
        for block in (values[:2], *values[2:3], values[3:]):  # blocks straddling chunks, a frame
            if len(block):
                writer.write(block)
    return path


def test_maps_written_in_blocks_read_back_as_written(tmp_path):
    expected = counts()

    path = write_map(tmp_path / "front.depth.zarr", expected)

    actual, attrs = read_map(path)
    np.testing.assert_array_equal(actual, expected)
    assert (attrs["flyarchive_map"], attrs["scale"], attrs["no_hit"]) == ("depth", 0.5, 0)


def test_chunks_hold_whole_blocks_of_frames(tmp_path):
    import zarr

    path = write_map(tmp_path / "front.depth.zarr", counts(7), chunk_frames=3)

    array = zarr.open_array(str(path))
    assert array.chunks == (3, *SIZE) and array.metadata.dimension_names == ("time", "y", "x")
    assert sorted(p.name for p in (path / "c").iterdir()) == ["0", "1", "2"]


def test_chunks_and_metadata_equal_what_zarr_itself_writes(tmp_path):
    """Chunks are encoded in the writing thread, not through zarr: the files must be the
    ones zarr writes for the same array (an all-zero chunk left out, the edge chunk whole)."""
    import json

    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    values = counts(8)
    values[3:6] = 0  # chunk 1 holds zeros only
    attrs = depth_attrs(0.5, 100.0)
    ours = write_map(tmp_path / "ours.depth.zarr", values, attrs)
    theirs = zarr.create_array(
        store=str(tmp_path / "zarr.depth.zarr"), shape=values.shape, chunks=(3, *SIZE),
        dtype="uint16", fill_value=0, compressors=[ZstdCodec(level=1), Crc32cCodec()],
        dimension_names=("time", "y", "x"), zarr_format=3, attributes=attrs)
    theirs[:] = values
    zarr_dir = tmp_path / "zarr.depth.zarr"

    files = sorted(str(p.relative_to(ours)) for p in ours.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(zarr_dir)) for p in zarr_dir.rglob("*") if p.is_file())
    assert "c/1/0/0" not in files and "c/2/0/0" in files
    for name in files:
        if name == "zarr.json":
            assert json.loads((ours / name).read_text()) == json.loads((zarr_dir / name).read_text())
        else:
            assert (ours / name).read_bytes() == (zarr_dir / name).read_bytes(), name
    np.testing.assert_array_equal(zarr.open_array(str(ours))[:], values)


def test_a_map_folder_that_exists_is_refused_and_kept(tmp_path):
    path = tmp_path / "front.depth.zarr"
    path.mkdir()
    (path / "keep").write_text("x")

    with pytest.raises(OutputExistsError, match="already exists"):
        MapWriter(path, SIZE, 3, depth_attrs(0.5, 100.0))
    assert (path / "keep").read_text() == "x"


def test_depth_reads_as_count_times_scale_and_nan_where_nothing_was_hit(tmp_path):
    values = np.array([[[0, 1, 2, 3, 4, 65535]] * 4] * 3, np.uint16)
    path = write_map(tmp_path / "a.depth.zarr", values, depth_attrs(0.25, 10.0))

    depth = read_depth(path)

    assert depth.dtype == np.float32
    np.testing.assert_array_equal(depth[0, 0], [np.nan, 0.25, 0.5, 0.75, 1.0, 65535 * 0.25])


def test_segmentation_reads_as_geom_ids_and_minus_one_for_background(tmp_path):
    values = np.array([[[0, 1, 2, 3, 4, 9]] * 4] * 3, np.uint16)
    path = write_map(tmp_path / "a.seg.zarr", values, segmentation_attrs())

    ids = read_segmentation(path)

    assert ids.dtype == np.int32 and ids[0, 0].tolist() == [-1, 0, 1, 2, 3, 8]


def test_reading_a_map_as_the_other_kind_is_refused(tmp_path):
    path = write_map(tmp_path / "a.depth.zarr", counts())

    with pytest.raises(StorageError, match="is a depth map; a segmentation map was asked for"):
        read_segmentation(path)


def test_a_missing_map_is_a_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="No map array"):
        read_depth(tmp_path / "nothing.depth.zarr")


def test_a_flipped_bit_in_a_map_is_detected_on_read(tmp_path):
    path = write_map(tmp_path / "a.depth.zarr", counts())
    chunk = path / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 1
    chunk.write_bytes(bytes(data))

    with pytest.raises(CorruptArchiveError, match="does not decode"):
        read_depth(path)


def test_a_map_closed_before_its_last_frame_is_removed(tmp_path):
    path = tmp_path / "short.depth.zarr"
    writer = MapWriter(path, SIZE, 5, depth_attrs(1.0, 1.0))
    writer.write(counts(3))

    with pytest.raises(VideoEncodeError, match="Only 3 of the 5 frames"):
        writer.close()

    assert not path.exists()


def test_a_map_whose_block_raised_is_removed(tmp_path):
    path = tmp_path / "broken.depth.zarr"

    with pytest.raises(RuntimeError), MapWriter(path, SIZE, 5, depth_attrs(1.0, 1.0)) as writer:
        writer.write(counts(2))
        raise RuntimeError("render failed")

    assert not path.exists()


def test_maps_are_named_after_their_video():
    assert map_url("/out/world00003/front.mp4", "depth") == "/out/world00003/front.depth.zarr"
    assert map_url("s3://b/o/world00003/a_b-1.mp4", "segmentation") == "s3://b/o/world00003/a_b-1.seg.zarr"


def test_a_published_map_reads_back_at_its_final_path(tmp_path):
    local = write_map(tmp_path / "local.zarr", counts())
    final = tmp_path / "out" / "world00000" / "front.depth.zarr"

    publish_map(local, str(final), {})

    np.testing.assert_array_equal(read_map(final)[0], counts())
    assert [p.name for p in final.parent.iterdir()] == ["front.depth.zarr"]  # no staging left


def test_publishing_over_an_existing_map_is_refused_and_keeps_it(tmp_path):
    final = tmp_path / "front.depth.zarr"
    publish_map(write_map(tmp_path / "first.zarr", counts()), str(final), {})
    other = write_map(tmp_path / "second.zarr", counts()[::-1].copy())

    with pytest.raises(OutputExistsError, match="A map already exists"):
        publish_map(other, str(final), {})

    np.testing.assert_array_equal(read_map(final)[0], counts())


def test_publishing_with_overwrite_replaces_the_map(tmp_path):
    final = tmp_path / "front.depth.zarr"
    publish_map(write_map(tmp_path / "first.zarr", counts()), str(final), {})
    expected = counts()[::-1].copy()

    publish_map(write_map(tmp_path / "second.zarr", expected), str(final), {}, overwrite=True)

    np.testing.assert_array_equal(read_map(final)[0], expected)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_on_an_object_store_the_metadata_is_uploaded_after_every_chunk(tmp_path, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    uploaded: list[str] = []
    real = MemoryFileSystem.put_file
    monkeypatch.setattr(MemoryFileSystem, "put_file",
                        lambda self, lpath, rpath, **kw: (uploaded.append(rpath),
                                                          real(self, lpath, rpath, **kw))[1])
    url = f"memory://{uuid.uuid4().hex}/front.depth.zarr"

    publish_map(write_map(tmp_path / "local.zarr", counts()), url, {})

    assert uploaded[-1].endswith("/zarr.json") and len(uploaded) == 4  # 3 chunks, then metadata
    np.testing.assert_array_equal(read_map(url)[0], counts())


@requires_s3
def test_a_map_published_to_s3_reads_back_through_storage_options(tmp_path, s3_server):
    url = f"s3://flyarchive-test/{uuid.uuid4().hex}/world00000/front.depth.zarr"
    options = s3_server.storage_options()

    publish_map(write_map(tmp_path / "local.zarr", counts()), url, options)

    np.testing.assert_allclose(read_depth(url, options)[1], counts()[1] * 0.5)


def test_publishing_by_move_renames_the_folder_and_reads_back(tmp_path):
    expected = counts()
    local = write_map(tmp_path / "work" / "front.depth.zarr", expected)
    target = tmp_path / "out" / "front.depth.zarr"

    publish_map(local, str(target), {}, move=True)

    assert not local.exists()  # renamed, not copied
    np.testing.assert_array_equal(read_map(target)[0], expected)
    assert [p.name for p in target.parent.iterdir()] == ["front.depth.zarr"]  # no staging left


def test_publishing_by_move_across_file_systems_copies(tmp_path, monkeypatch):
    import errno

    import flyarchive.video.workspace as workspace

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    expected = counts()
    local = write_map(tmp_path / "work" / "front.depth.zarr", expected)
    target = tmp_path / "out" / "front.depth.zarr"
    real_rename = workspace.os.rename
    monkeypatch.setattr(workspace.os, "rename", cross_device)

    workspace.stage(local, tmp_path / "staged", move=True)

    monkeypatch.setattr(workspace.os, "rename", real_rename)
    assert local.exists()  # copied: the source stays for its owner to remove
    np.testing.assert_array_equal(read_map(tmp_path / "staged")[0], expected)
    assert not target.exists()
