"""Bad input to the writer: options refused at construction (nothing is created), and
damaged archives refused before any write (nothing committed changes)."""

import datetime
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder
from flyarchive.clock import Timing
from flyarchive.codecs import CodecSpecError
from flyarchive.errors import ArchiveExistsError, CorruptArchiveError, SchemaError
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter
from flyarchive.testing.fixtures import record, snapshot
from flyarchive.testing.markers import requires_warp


@pytest.fixture
def url(tmp_path):
    return tmp_path / "new.zarr"


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


# ----------------------------------------------------------------------------- construction
CONSTRUCTION = {
    "world id 2**63": (dict(world_ids=[2**63]), SchemaError, r"holds 9223372036854775808; .*2\*\*63 - 1"),
    "negative world id": (dict(world_ids=[-5]), SchemaError, r"world_ids=\[-5\] holds -5"),
    "repeated world id": (dict(world_ids=[3, 3]), SchemaError, r"repeats \[3\]"),
    "world ids not a sequence": (dict(world_ids=7), SchemaError, "non-empty sequence of ints"),
    "fractional chunk_frames": (dict(chunk_frames=2.5), SchemaError,
                                "chunk_frames must be a whole number from 1 to 100,000, got 2.5"),
    "huge chunk_frames": (dict(chunk_frames=10**12), SchemaError, "got 1000000000000"),
    "zero chunk_frames": (dict(chunk_frames=0), SchemaError, "got 0. Pass an int"),
    "lossy codec": (dict(codec="lossy"), CodecSpecError, "Unknown codec 'lossy'"),
    "datetime attribute": (dict(attrs={"when": datetime.datetime(2024, 1, 2)}), SchemaError,
                           r"Attribute 'when' holds a datetime .*\.isoformat\(\)"),
    "array attribute": (dict(attrs={"gains": np.arange(3)}), SchemaError,
                        r"Attribute 'gains' holds a ndarray .*\.tolist\(\)"),
    "deeply nested attribute": (dict(attrs={"deep": nested(200_000)}), SchemaError,
                                "Attribute 'deep' holds a list that JSON cannot store"),
    "reserved attribute": (dict(attrs={"layout": 1}), SchemaError, r"reserved names \['layout'\]"),
    "world variable named like an array": (dict(world_vars={"qpos": np.zeros(2)}, world_ids=[0, 1]),
                                           SchemaError, "World variable name 'qpos' cannot be used"),
    "world variable of the wrong length": (dict(world_vars={"seed": np.zeros(3)}, world_ids=[0, 1]),
                                           SchemaError, r"must be a \(2,\) array of bools, numbers"),
    "world variable of bytes": (dict(world_vars={"name": np.array([b"a", b"b"])}), SchemaError,
                                r"'name' cannot be stored: it has dtype \|S1 \(bytes\)"),
    "world variable of one text": (dict(world_vars={"genotype": "wt"}), SchemaError,
                                   r"'genotype' is the single value 'wt'; give one value per"),
    "world variable of text and None": (dict(world_vars={"g": np.array(["a", None])}),
                                        SchemaError, r"dtype object \(Python objects\)"),
    "float16 storage": (dict(dtype="float16"), SchemaError, "float64 or float32, got 'float16'"),
    "unknown storage dtype": (dict(dtype="nonsense"), SchemaError, "got 'nonsense'"),
    "buffer of 61 GiB": (dict(world_ids=range(4096), chunk_frames=100_000), SchemaError,
                         r"4096 worlds of 20 values needs a 61\.0 GiB buffer per flush"),
}


@pytest.mark.parametrize("case", CONSTRUCTION)
def test_a_recorder_refuses_bad_options_at_construction_and_creates_nothing(tiny, url, case):
    kwargs, error, message = CONSTRUCTION[case]

    with pytest.raises(error, match=message):
        TrajectoryRecorder(str(url), tiny, **kwargs)

    assert not url.exists()


def test_a_model_without_coordinates_is_refused_at_construction(url):
    empty = mujoco.MjModel.from_xml_string("<mujoco><worldbody/></mujoco>")

    with pytest.raises(SchemaError, match=r"no generalized coordinates \(nq=0\)"):
        TrajectoryRecorder(str(url), empty)

    assert not url.exists()


def test_a_model_of_mocap_bodies_alone_is_refused_saying_how_to_record_it(url):
    mocap = mujoco.MjModel.from_xml_string(
        '<mujoco><worldbody><body mocap="true"><geom size="0.1"/></body></worldbody></mujoco>')

    with pytest.raises(SchemaError, match=r"only state is its 1 mocap body \(nq=0\).*needs at "
                                          r"least one joint. Add one that changes nothing"):
        TrajectoryRecorder(str(url), mocap)

    assert not url.exists()


def test_a_spec_with_a_huge_capacity_is_refused(tiny, url):
    layout, timing = ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2)

    with pytest.raises(SchemaError, match="capacity_frames must be a whole number .* got 10"):
        ArchiveSpec(layout, timing, (0, 1), capacity_frames=10**12)

    assert not url.exists()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(codec="lossy"), CodecSpecError, "Unknown codec 'lossy'"),
    (dict(chunk_frames=2.5), SchemaError, "chunk_frames must be a whole number"),
    (dict(attrs={"when": datetime.date(2024, 1, 2)}), SchemaError, "holds a date"),
])
@requires_warp
def test_a_warp_recorder_refuses_bad_options_at_construction(tiny, url, kwargs, error, message):
    from flyarchive.recorders import WarpTrajectoryRecorder

    with pytest.raises(error, match=message):
        WarpTrajectoryRecorder(str(url), tiny, 2, **kwargs)

    assert not url.exists()


# ----------------------------------------------------------------------------- damaged archives
def test_n_frames_outside_the_time_extent_is_refused_before_an_append(tiny, archive):
    zarr.open_group(archive, mode="r+")["n_frames"][:] = np.array([-5, 10**18])
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError, match=r"n_frames \[-5, 1000000000000000000\], outside "
                       r"0\.\.20 .*flyarchive verify"):
        record(tiny, archive, n_steps=120, mode="a")

    assert snapshot(archive) == before


def test_committed_times_that_go_back_are_refused_before_an_append(tiny, archive):
    zarr.open_group(archive, mode="r+")["time"][7] = 0.0
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError, match="not increasing .*Nothing was written"):
        record(tiny, archive, n_steps=120, mode="a")

    assert snapshot(archive) == before


def test_a_missing_n_frames_is_refused_by_an_append_and_deletes_nothing(tiny, archive):
    (Path(archive) / "n_frames" / "zarr.json").unlink()
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError, match="holds recorded frames but no 'n_frames' .*verify"):
        record(tiny, archive, n_steps=120, mode="a")

    assert snapshot(archive) == before


def test_a_missing_n_frames_is_refused_by_a_new_archive_and_deletes_nothing(tiny, archive):
    (Path(archive) / "n_frames" / "zarr.json").unlink()
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2), (0, 1))
    before = snapshot(archive)

    with pytest.raises(ArchiveExistsError, match="never overwrites"):
        ArchiveWriter.create(archive, spec)

    assert snapshot(archive) == before


def test_a_missing_root_zarr_json_is_refused_by_an_append_and_deletes_nothing(tiny, archive):
    (Path(archive) / "zarr.json").unlink()
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError, match="holds recorded frames"):
        record(tiny, archive, n_steps=120, mode="a")

    assert snapshot(archive) == before


def test_import_npz_into_an_archive_missing_n_frames_is_refused(tiny, archive, tmp_path, model_xml,
                                                                 cli):
    from flyarchive.interop.flygym_npz import export_npz

    paths = export_npz(archive, tmp_path / "npz")
    (Path(archive) / "n_frames" / "zarr.json").unlink()
    before = snapshot(archive)

    code, _, err = cli("import-npz", *paths.files, "--to", archive, "--model", model_xml)

    assert code == 2
    assert "flyarchive import-npz: error: Something is already at" in err
    assert snapshot(archive) == before


def test_a_malformed_writer_claim_is_refused_before_an_append(tiny, archive):
    (Path(archive) / "claims" / "writer.json").write_bytes(b"\xff\xfe not json")
    before = snapshot(archive)

    with pytest.raises(SchemaError, match="writer claim 'claims/writer.json' .* is damaged"):
        record(tiny, archive, n_steps=120, mode="a")

    assert snapshot(archive) == before


@pytest.mark.parametrize("inner", ["inner.zarr", "qpos/inner.zarr", "derived/inner.zarr"])
def test_an_archive_inside_another_archives_folder_is_refused(tiny, tmp_path, inner):
    """It was recorded there, unknown to the outer archive's verify, and deleted with it by
    mode='w'."""
    from flyarchive.errors import OutputLocationError

    outer = record(tiny, str(tmp_path / "outer.zarr"), n_worlds=1)
    before = snapshot(outer)

    with pytest.raises(OutputLocationError, match=r"is inside the archive \(or zarr group\) at "
                                                  r".*outer\.zarr'.*Record beside it"):
        TrajectoryRecorder(str(tmp_path / "outer.zarr" / inner), tiny)

    assert snapshot(outer) == before


def test_replacing_an_archive_that_holds_files_of_yours_is_refused_and_changes_nothing(tiny,
                                                                                      tmp_path):
    """mode='w' deleted everything in the archive's folder: a user's notes, and archives
    recorded inside it."""
    url = record(tiny, str(tmp_path / "run.zarr"), n_worlds=1)
    (tmp_path / "run.zarr" / "notes.txt").write_text("my lab notes")
    before = snapshot(url)

    with pytest.raises(ArchiveExistsError, match=r"holds 'notes\.txt', which it did not write.*"
                                                 r"Nothing was changed"):
        record(tiny, url, n_worlds=2, mode="w")

    assert snapshot(url) == before
    (tmp_path / "run.zarr" / "notes.txt").unlink()
    record(tiny, url, n_worlds=2, mode="w")  # its own nodes alone: replaced
    assert len(zarr.open_group(url, mode="r")["world"][:]) == 2


def test_a_file_named_zarr_json_that_is_no_zarr_node_does_not_stop_a_recording_below(tiny,
                                                                                    tmp_path):
    (tmp_path / "zarr.json").write_text('{"my": "config"}')  # a program's, not zarr's

    url = record(tiny, str(tmp_path / "runs" / "run.zarr"), n_worlds=1)

    assert zarr.open_group(url, mode="r")["world"][:].tolist() == [0]
