"""Hostile archives and outputs that are safe to try in this process: each gets a clear
error (or works, where the input is legal), and nothing committed changes.

Cases that could exhaust memory or hang on a regression run in a child process, in
tests/test_hostile.py.
"""

import json
import re
import shutil
import uuid
from pathlib import Path

import fsspec
import mujoco
import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.cli import main
from flyarchive.errors import CorruptArchiveError, SchemaError, StorageError
from flyarchive.testing.hostile import (
    make_case, make_sound, pcodec_bomb, rewrite_shard, snapshot, unpickled_marker,
)
from flyarchive.store.integrity import verify
from flyarchive.layout import ModelLayout
from flyarchive.plot import plot_traces
from flyarchive.testing import simulate

pytestmark = pytest.mark.timeout(30)

TWO_HINGES = """
<mujoco>
  <worldbody>
    <body><joint type="hinge" axis="0 1 0"/><geom size="0.1" mass="1"/></body>
    <body pos="1 0 0">
      <joint name="{name}" type="hinge" axis="0 1 0"/><geom size="0.1" mass="1"/>
    </body>
  </worldbody>
</mujoco>
"""


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


def record(model, url, n_steps=76):
    with TrajectoryRecorder(url, model, chunk_frames=5) as recorder:
        simulate(model, 1, n_steps, recorder.record_as_needed)
    return url


def to_memory(url):
    """A copy of a local archive in fsspec's memory filesystem (no file-system checks)."""
    target = f"memory://{uuid.uuid4().hex}.zarr"
    fs = fsspec.filesystem("memory")
    for path in Path(url).rglob("*"):
        if path.is_file():
            fs.pipe(f"{target}/{path.relative_to(url).as_posix()}", path.read_bytes())
    return target


def memory_snapshot(url):
    fs = fsspec.filesystem("memory")
    return {p: fs.cat(p) for p in sorted(fs.find(url))}


def cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------- attributes
@pytest.mark.parametrize("command", ["info", "plot", "export-npz"])
def test_attributes_nested_200000_deep_are_refused_by_every_command(
        hostile, tmp_path, capsys, command):
    url = hostile("attributes nested 200,000 deep")
    before = snapshot(Path(url))
    extra = {"plot": ["--world", "0", "--out", str(tmp_path / "p.png")],
             "export-npz": ["--to", str(tmp_path / "npz")]}.get(command, [])

    code, _, err = cli(capsys, command, url, *extra)

    assert code == 2
    assert "zarr.json: its JSON is nested 200002 deep; flyarchive reads at most 64" in err
    assert snapshot(Path(url)) == before


def test_attributes_nested_200000_deep_fail_verify_with_the_reason(hostile, capsys):
    url = hostile("attributes nested 200,000 deep")
    before = snapshot(Path(url))

    code, _, err = cli(capsys, "verify", url)

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
        hostile, capsys, command, case, fragment):
    url = hostile(case)
    before = snapshot(Path(url))

    code, _, err = cli(capsys, command, url)

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


def test_a_zarr_v2_pickle_compressor_is_refused_without_unpickling_anything(hostile, capsys):
    url = hostile("zarr v2 archive, qpos compressor pickle")
    before = snapshot(Path(url))

    code, _, err = cli(capsys, "verify", url)

    assert code == 1
    assert re.search(r"\.z(group|attrs|array|metadata): it is zarr v2 metadata; flyarchive "
                     "archives are zarr v3", err), err  # zarr probes the v2 files in any order
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

    assert "qpos [worlds 0..1, frames 5..9] (file qpos/c/0/1/0)" in str(err.value)
    assert f"flyarchive verify {url}" in str(err.value)
    assert not (tmp_path / "p.png").exists()
    assert snapshot(Path(url)) == before


def test_flipped_bits_in_a_time_chunk_then_info_name_the_chunk_not_zarr_json(hostile, capsys):
    url = hostile("flipped bits in a time chunk")
    before = snapshot(Path(url))

    code, _, err = cli(capsys, "info", url)

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


# ----------------------------------------------------------------------------- labels
def test_plot_draws_a_mathtext_like_dof_label_as_plain_text(tmp_path):
    name = r"$\notacommand{$"
    model = mujoco.MjModel.from_xml_string(TWO_HINGES.format(name=name))
    url = record(model, str(tmp_path / "math.zarr"))

    written = plot_traces(url, 0, tmp_path / "p.png", dofs=[name])

    assert written == tmp_path / "p.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unnamed_joint_beside_one_named_joint0_gets_its_own_label():
    model = mujoco.MjModel.from_xml_string(TWO_HINGES.format(name="joint0"))

    labels = ModelLayout.from_model(model).dof_labels

    assert labels == ("joint0_unnamed", "joint0")


def test_layouts_of_models_without_a_name_collision_keep_their_hash(tiny):
    expected = "30188fcf72d2369f58ace2940db51a375dcc1c67884c55e04c5f47c2ef2beec5"  # 69c2104

    actual = ModelLayout.from_model(tiny).hash

    assert actual == expected


@pytest.fixture
def duplicate_labels(tmp_path):
    """An archive as flyarchive 69c2104 recorded a model with an unnamed joint beside one
    named joint0: both labelled 'joint0'."""
    model = mujoco.MjModel.from_xml_string(TWO_HINGES.format(name="joint0"))
    url = record(model, str(tmp_path / "dup.zarr"))
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
    with pytest.raises(SchemaError, match=r"not unique: \['joint0'\].*select dofs by position"):
        open_archive(duplicate_labels)


# ----------------------------------------------------------------------------- plot output
def test_plot_into_a_folder_writes_inside_it_and_reports_that_path(sound, tmp_path, capsys):
    folder = tmp_path / "work"
    folder.mkdir()

    code, out, _ = cli(capsys, "plot", sound, "--world", "1", "--out", str(folder))

    assert code == 0
    assert out.strip() == f"wrote {folder / 'world00001.png'}"
    assert (folder / "world00001.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_to_a_name_without_suffix_reports_the_png_it_wrote(sound, tmp_path, capsys):
    code, out, _ = cli(capsys, "plot", sound, "--world", "0", "--out", str(tmp_path / "traces"))

    assert code == 0
    assert out.strip() == f"wrote {tmp_path / 'traces.png'}"
    assert (tmp_path / "traces.png").exists()


def test_plot_to_a_suffix_matplotlib_cannot_write_is_refused(sound, tmp_path, capsys):
    code, _, err = cli(capsys, "plot", sound, "--world", "0", "--out", str(tmp_path / "t.xyz"))

    assert code == 2
    assert "Cannot write a plot to" in err and "png" in err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- storage options
def test_an_endpoint_url_that_is_not_a_string_is_a_storage_options_error(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)

    code, _, err = cli(capsys, "info", "s3://flies/run.zarr",
                       "--storage-options", json.dumps({"endpoint_url": 5}))

    assert code == 2
    assert "storage option 'endpoint_url' for 's3://flies/run.zarr' must be a URL" in err
    assert "got 5" in err
    assert list(tmp_path.iterdir()) == []


def test_a_secret_option_of_the_wrong_type_is_named_without_its_value():
    options = {"key": 12345678, "secret": "s3cr3t", "endpoint_url": "http://127.0.0.1:9"}

    with pytest.raises(StorageError, match="'key' for 's3://flies/run.zarr' must be a string, got int") as err:
        open_archive("s3://flies/run.zarr", options)

    assert "12345678" not in str(err.value)


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
