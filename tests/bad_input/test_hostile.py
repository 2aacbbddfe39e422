"""Hostile archives and outputs that are safe to try in this process: each gets a clear
error, and nothing committed changes.

Cases that could exhaust memory or hang on a regression run in a child process, in
tests/reliability/test_hostile.py. Legal inputs met on the way (labels that look like
mathtext, plots into folders) are tested with their stage: tests/cli/test_plot.py,
tests/base/test_layout.py.
"""

import json
import re
import shutil
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.errors import CorruptArchiveError, SchemaError, StorageError
from flyarchive.layout import ModelLayout
from flyarchive.plot import plot_traces
from flyarchive.store.integrity import verify
from flyarchive.testing import TWO_HINGES_XML, simulate
from flyarchive.testing.fixtures import memory_snapshot, record, to_memory
from flyarchive.testing.hostile_cases import (
    make_case,
    make_sound,
    pcodec_bomb,
    rewrite_shard,
    snapshot,
    unpickled_marker,
)

pytestmark = pytest.mark.timeout(30)



@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    return make_sound(str(tmp_path_factory.mktemp("sound") / "run.zarr"))


@pytest.fixture
def copy_of(sound, tmp_path):
    def copy(name):
        shutil.copytree(sound, tmp_path / name)
        return str(tmp_path / name)

    return copy


@pytest.fixture
def hostile(sound, tmp_path):
    def build(case):
        return make_case(sound, case, tmp_path / "hostile.zarr")

    return build


# ----------------------------------------------------------------------------- attributes
@pytest.mark.parametrize("command", ["info", "plot", "export-npz"])
def test_attributes_nested_200000_deep_are_refused_by_every_command(
        hostile, tmp_path, cli, command):
    url = hostile("attributes nested 200,000 deep")
    before = snapshot(Path(url))
    extra = {"plot": ["--world", "0", "--out", str(tmp_path / "p.png")],
             "export-npz": ["--to", str(tmp_path / "npz")]}.get(command, [])

    code, _, err = cli(command, url, *extra)

    assert code == 2
    assert "zarr.json: its JSON is nested 200002 deep; flyarchive reads at most 64" in err
    assert snapshot(Path(url)) == before


def test_attributes_nested_200000_deep_fail_verify_with_the_reason(hostile, cli):
    url = hostile("attributes nested 200,000 deep")
    before = snapshot(Path(url))

    code, _, err = cli("verify", url)

    assert code == 1
    assert "nested 200002 deep" in err
    assert snapshot(Path(url)) == before


def test_attributes_nested_200000_deep_in_memory_storage_are_a_schema_error(hostile):
    url = to_memory(hostile("attributes nested 200,000 deep"))
    before = memory_snapshot(url)

    with pytest.raises(SchemaError, match="nested too deeply"):
        open_archive(url)

    assert memory_snapshot(url) == before


@pytest.mark.parametrize("command", ["info", "verify"])
@pytest.mark.parametrize(("case", "fragment"), [
    ("codec attribute a string", "Attribute 'codec' is 'lossless' (str); it must be an object"),
    ("layout attribute a string", "Attribute 'layout' is 'joints' (str); it must be an object"),
])
def test_reserved_attributes_of_the_wrong_type_are_schema_errors(
        hostile, cli, command, case, fragment):
    url = hostile(case)
    before = snapshot(Path(url))

    code, _, err = cli(command, url)

    assert code == (2 if command == "info" else 1)
    assert fragment in err
    assert snapshot(Path(url)) == before


# ----------------------------------------------------------------------------- codecs
def test_a_pickle_codec_is_refused_without_unpickling_anything(hostile):
    url = hostile("qpos codec numcodecs.pickle")
    before = snapshot(Path(url))

    with pytest.raises(SchemaError, match=r"'numcodecs.pickle'.*is not one flyarchive writes"):
        open_archive(url).load()

    assert not unpickled_marker(url).exists()
    assert snapshot(Path(url)) == before


def test_a_zarr_v2_pickle_compressor_is_refused_without_unpickling_anything(hostile, cli):
    url = hostile("zarr v2 archive, qpos compressor pickle")
    before = snapshot(Path(url))

    code, _, err = cli("verify", url)

    assert code == 1
    assert "is a zarr v2 store, not a flyarchive archive" in err, err
    assert not unpickled_marker(url).exists()
    assert snapshot(Path(url)) == before


def test_a_gzip_pipeline_in_memory_storage_is_refused_before_decoding(copy_of):
    root = Path(copy_of("gzip.zarr"))
    path = root / "n_frames" / "zarr.json"
    meta = json.loads(path.read_text())
    meta["codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}},
                      {"name": "gzip", "configuration": {"level": 1}}]
    path.write_text(json.dumps(meta))
    url = to_memory(root)
    before = memory_snapshot(url)

    with pytest.raises(SchemaError, match=r"n_frames/zarr.json: the pipeline \['bytes', 'gzip'\]"):
        open_archive(url)

    assert memory_snapshot(url) == before


def test_a_pcodec_bomb_in_memory_storage_is_not_decoded_past_the_chunk(copy_of):
    root = Path(copy_of("bomb.zarr"))
    rewrite_shard(root / "qpos" / "c" / "0" / "1" / "0", 2, {0: pcodec_bomb(256 << 20)})
    url = to_memory(root)
    before = memory_snapshot(url)

    with pytest.raises(CorruptArchiveError, match="pcodec chunk holds more or fewer values"):
        open_archive(url).qpos.load()

    assert memory_snapshot(url) == before


# ----------------------------------------------------------------------------- flipped bits
def test_flipped_bits_in_qpos_then_plot_name_the_chunk_and_point_at_verify(hostile, tmp_path):
    url = hostile("flipped bits in a qpos shard")
    before = snapshot(Path(url))

    with pytest.raises(CorruptArchiveError) as err:
        plot_traces(url, 1, tmp_path / "p.png")  # world 1: the damaged chunk (at mid-file)

    assert "qpos [world 1 (index 1), frames 5..9] (file qpos/c/0/1/0)" in str(err.value)
    assert f"flyarchive verify {url}" in str(err.value)
    assert not (tmp_path / "p.png").exists()
    assert snapshot(Path(url)) == before


def test_flipped_bits_in_a_time_chunk_then_info_name_the_chunk_not_zarr_json(hostile, cli):
    url = hostile("flipped bits in a time chunk")
    before = snapshot(Path(url))

    code, _, err = cli("info", url)

    assert code == 2
    assert "time [frames 5..9] (file time/c/1)" in err
    assert "zarr.json" not in err
    assert snapshot(Path(url)) == before


# ----------------------------------------------------------------------------- links
def test_appending_through_a_folder_linked_out_of_the_archive_is_refused(copy_of, tmp_path, tiny):
    url = copy_of("run.zarr")
    outside = tmp_path / "outside"
    outside.mkdir()
    (Path(url) / "qpos" / "c").rename(outside / "c")
    (Path(url) / "qpos" / "c").symlink_to(outside / "c")
    before, before_outside = snapshot(Path(url)), snapshot(outside)

    with pytest.raises(CorruptArchiveError, match=r"qpos/c leads out of the archive.*never reads"):
        with TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a") as recorder:
            simulate(tiny, 2, 160, recorder.record_as_needed)

    assert snapshot(outside) == before_outside
    assert snapshot(Path(url)) == before


def test_appending_through_a_deeper_link_writes_nothing_outside(copy_of, tmp_path, tiny):
    url = copy_of("run.zarr")
    outside = tmp_path / "outside"
    outside.mkdir()
    (Path(url) / "qpos" / "c" / "0" / "5").symlink_to(outside)
    committed = np.asarray(zarr.open_group(url)["qpos"][:, :20])

    with pytest.raises(CorruptArchiveError, match=r"qpos/c/0/5/0 leads out of the archive"):
        with TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a") as recorder:
            simulate(tiny, 2, 160, recorder.record_as_needed)

    assert list(outside.iterdir()) == []
    assert np.array_equal(np.asarray(zarr.open_group(url)["qpos"][:, :20]), committed)


# ----------------------------------------------------------------------------- dof labels
@pytest.fixture
def duplicate_labels(tmp_path):
    """An archive as flyarchive 69c2104 recorded a model with an unnamed joint beside one
    named joint0: both labelled 'joint0'."""
    model = mujoco.MjModel.from_xml_string(TWO_HINGES_XML.format(name="joint0"))
    url = record(model, str(tmp_path / "dup.zarr"), n_worlds=1)
    group = zarr.open_group(url, mode="r+")
    group.attrs["layout"] = ModelLayout(("joint0", "joint0"), ("hinge", "hinge"), ()).to_attrs()
    group["dof"][:] = np.array(["joint0", "joint0"])
    return url


def test_verify_refuses_an_archive_with_duplicate_dof_labels(duplicate_labels):
    before = snapshot(Path(duplicate_labels))

    report = verify(duplicate_labels)

    assert not report.ok
    assert "dof labels are not unique: ['joint0']" in report.problems[0]
    assert snapshot(Path(duplicate_labels)) == before


def test_open_archive_refuses_an_archive_with_duplicate_dof_labels(duplicate_labels):
    before = snapshot(Path(duplicate_labels))

    with pytest.raises(SchemaError, match=r"not unique: \['joint0'\].*select dofs by position"):
        open_archive(duplicate_labels)

    assert snapshot(Path(duplicate_labels)) == before


# ----------------------------------------------------------------------------- plot output
def test_plot_to_a_suffix_matplotlib_cannot_write_is_refused(sound, tmp_path, cli):
    before = snapshot(Path(sound))

    code, _, err = cli("plot", sound, "--world", "0", "--out", str(tmp_path / "t.xyz"))

    assert code == 2
    assert "Cannot write a plot to" in err and "png" in err
    assert list(tmp_path.iterdir()) == []
    assert snapshot(Path(sound)) == before


# ----------------------------------------------------------------------------- storage options
def test_an_endpoint_url_that_is_not_a_string_is_a_storage_options_error(
        tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)

    code, _, err = cli("info", "s3://flies/run.zarr",
                       "--storage-options", json.dumps({"endpoint_url": 5}))

    assert code == 2
    assert "storage option 'endpoint_url' for 's3://flies/run.zarr' must be a URL" in err
    assert "got 5" in err
    assert list(tmp_path.iterdir()) == []


def test_a_secret_option_of_the_wrong_type_is_named_without_its_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a URL mistaken for a local path would land here
    options = {"key": 12345678, "secret": "s3cr3t", "endpoint_url": "http://127.0.0.1:9"}

    with pytest.raises(StorageError, match="'key' for 's3://flies/run.zarr' must be a string, got int") as err:
        open_archive("s3://flies/run.zarr", options)

    assert "12345678" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_blosc_chunk_declaring_more_bytes_than_its_shape_is_refused_before_decoding(
        tiny, tmp_path):
    import google_crc32c

    url = str(tmp_path / "portable.zarr")
    with TrajectoryRecorder(url, tiny, chunk_frames=5, codec="portable") as recorder:
        simulate(tiny, 2, 40, recorder.record_as_needed)
    shard = sorted((Path(url) / "qpos" / "c").rglob("*"))[-1]
    data = bytearray(shard.read_bytes())
    index_bytes = 2 * 1 * 1 * 16 + 4  # (worlds, frames, dofs) inner chunks x (offset, n) + crc
    index = np.frombuffer(bytes(data[-index_bytes:-4]), "<u8").reshape(-1, 2)
    offset, size = (int(v) for v in index[0])
    chunk = bytearray(data[offset:offset + size - 4])
    chunk[4:8] = np.uint32(1 << 31).tobytes()  # declares 2 GiB, checksum made to match
    data[offset:offset + size] = bytes(chunk) + google_crc32c.value(bytes(chunk)).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    before = shard.read_bytes()

    with pytest.raises(CorruptArchiveError, match="blosc chunk declares 2147483648 bytes"):
        open_archive(url).qpos.values

    assert shard.read_bytes() == before


@pytest.mark.parametrize("member", ["qpos", "models", "claims"])
@pytest.mark.parametrize("garbage", [b"{{{", b"\xff\xfe not utf-8"], ids=["not-json", "not-utf8"])
def test_a_member_zarr_json_that_is_not_json_is_a_verify_finding_naming_it(
        copy_of, cli, member, garbage):
    url = copy_of("run.zarr")
    path = Path(url) / member / "zarr.json"
    assert path.is_file()
    path.write_bytes(garbage)

    code, out, err = cli("verify", url)

    said = out + err
    assert code == 1 and "Traceback" not in said
    assert f"Metadata unreadable: {member}/zarr.json (" in said
    assert "Restore the file from a backup" in said
