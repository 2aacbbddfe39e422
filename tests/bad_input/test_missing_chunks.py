"""Inside n_frames, missing is damage: a shard deleted, or an inner chunk marked never
written in its shard's index, fails every read of committed frames it holds with a
CorruptArchiveError naming the variable, the worlds, the frames and the file, on every
storage and through every reader (open_archive, the render's StateReader, render,
render_frames, export-npz, plot, read_trajectories), and nothing that looks like data is
written. Frames past n_frames may be missing: tests/query/test_missing_chunks.py.

World variables are stored whole: a chunk of one deleted or cut short fails its reads
(naming the variable, the worlds and the file) and verify, on every storage; one written
before flyarchive marked them reads as it always did."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.errors import CorruptArchiveError
from flyarchive.testing.fixtures import copy_archive, listing_snapshot, snapshot
from flyarchive.testing.holes import delete_object, empty_inner_chunks

pytestmark = pytest.mark.timeout(120)

# The tiny archive (flyarchive.testing.fixtures.record): 2 worlds x 20 frames; a qpos shard
# holds both worlds over 5 frames, an inner chunk one world over 5 frames.
SHARD = "qpos/c/0/1/0"  # frames 5..9


def stored(location):
    """Every object of an archive on its storage: key -> bytes (on S3: what one listing
    says of it, its ETag the MD5 of its bytes)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(location.url, **(location.storage_options or {}))
    if location.url.startswith("s3://"):
        return listing_snapshot(fs, root)
    return {p: fs.cat_file(p) for p in sorted(fs.find(root))}


@pytest.fixture(scope="module")
def sound(recorded):
    """The tiny archive (tests/bad_input/conftest.py), recorded once: tests copy it."""
    return recorded


@pytest.fixture
def copy(sound, tmp_path):
    return copy_archive(sound, tmp_path / "run.zarr")


# ----------------------------------------------------------------------------- open_archive
def test_a_deleted_shard_fails_reads_of_its_committed_frames_on_every_storage(location, sound):
    copy_archive(sound, location.url, location.storage_options)
    delete_object(location.url, SHARD, location.storage_options)
    before = stored(location)
    ds = open_archive(location.url, location.storage_options)

    with pytest.raises(CorruptArchiveError) as err:
        ds.qpos.isel(world=1).values

    message = str(err.value)
    assert "qpos [world 1 (index 1), frames 5..9] (file qpos/c/0/1/0)" in message
    assert "the file is missing, but n_frames says these frames were committed" in message
    assert f"flyarchive verify {location.url}" in message
    assert stored(location) == before


def test_an_index_entry_never_written_fails_reads_of_its_frames_on_every_storage(location, sound):
    copy_archive(sound, location.url, location.storage_options)
    empty_inner_chunks(location.url, "qpos/c/0/2/0", [0], location.storage_options)  # world 0
    ds = open_archive(location.url, location.storage_options)

    with pytest.raises(CorruptArchiveError) as err:
        ds.qpos.values

    assert "qpos [world 0 (index 0), frames 10..14] (file qpos/c/0/2/0)" in str(err.value)
    assert "the shard's index marks the chunk as never written" in str(err.value)
    assert ds.qpos.isel(world=1).values.shape == (20, 13)  # the other world's chunk is there


def test_reads_that_miss_the_hole_still_work(copy):
    delete_object(copy, SHARD)
    ds = open_archive(copy)

    window = ds.qpos.isel(time=slice(10, 20)).values

    assert np.isfinite(window).all()


def test_a_deleted_mocap_shard_names_its_variable(copy):
    delete_object(copy, "mocap_quat/c/0/3/0/0")

    with pytest.raises(CorruptArchiveError, match=r"mocap_quat \[worlds \[0, 1\] \(indices 0, 1\), "
                                                  r"frames 15\.\.19\] \(file mocap_quat/c/0/3/0/0\)"):
        open_archive(copy).mocap_quat.values


def test_a_read_through_zarr_asks_the_storage_once_a_committed_frame_reads_as_nan(copy):
    from flyarchive.store.dataset import CommittedFrames

    empty_inner_chunks(copy, SHARD, [1])
    ds = open_archive(copy)
    getter = next(arg.value for layer in ds.qpos.data.dask.layers.values()
                  for task in layer.values() for arg in getattr(task, "args", ())
                  if isinstance(getattr(arg, "value", None), CommittedFrames))
    getter.reader = None  # every read through zarr, as for arrays the shard reader does not take

    with pytest.raises(CorruptArchiveError, match=r"qpos \[world 1 \(index 1\), frames 5\.\.9\] "
                                                  r"\(file qpos/c/0/1/0\)"):
        getter[np.array([1]), 0:20]
    assert np.isfinite(getter[np.array([0]), 0:20]).all()


def test_a_selection_of_dofs_by_index_reads_the_box_and_refuses_the_hole(copy):
    import zarr

    delete_object(copy, "qpos/c/0/3/0")
    ds = open_archive(copy)

    picked = ds.qpos.isel(time=slice(0, 15), dof=[1, 4, 2]).values

    expected = zarr.open_array(f"{copy}/qpos", mode="r").oindex[:, 0:15, [1, 4, 2]]
    assert np.array_equal(picked, expected)
    with pytest.raises(CorruptArchiveError, match="frames 15..19"):
        ds.qpos.isel(dof=[1, 4]).values


# ----------------------------------------------------------------------------- other readers
@pytest.mark.parametrize("storage", ["local", "s3"])
def test_the_warp_render_state_reader_refuses_missing_committed_frames(storage, sound, tmp_path,
                                                                       request):
    from flyarchive.store import StateReader
    from flyarchive.testing.fixtures import Location

    location = (request.getfixturevalue("s3_location") if storage == "s3"
                else Location(str(tmp_path / "run.zarr")))
    copy_archive(sound, location.url, location.storage_options)
    empty_inner_chunks(location.url, SHARD, [1], location.storage_options)
    reader = StateReader(location.url, location.storage_options)

    qpos = reader.read_boxes([(0, 1, 0, 20)])["qpos"]  # world 0 is whole
    with pytest.raises(CorruptArchiveError) as err:
        reader.read_boxes([(0, 1, 0, 4), (1, 2, 3, 12)])

    assert np.isfinite(qpos).all()
    assert "qpos [world 1 (index 1), frames 5..9] (file qpos/c/0/1/0)" in str(err.value)


def test_read_trajectories_refuses_missing_committed_frames(copy):
    pytest.importorskip("flygym")
    from flyarchive import read_trajectories

    delete_object(copy, SHARD)

    with pytest.raises(CorruptArchiveError, match=r"qpos \[.*frames 5\.\.9\] \(file qpos/c/0/1/0\)"):
        read_trajectories(copy, worlds=[1])


def test_render_frames_refuses_missing_committed_frames(copy, tiny):
    from flyarchive import render_frames

    delete_object(copy, SHARD)
    frames = render_frames(copy, tiny, "front", worlds=[0], size=(48, 64), block_frames=5)

    with pytest.raises(CorruptArchiveError, match=r"world 0 \(index 0\), frames 5\.\.9\] "
                                                  r"\(file qpos/c/0/1/0\)"):
        frames.isel(time=slice(4, 8)).values
    assert frames.isel(time=slice(0, 5)).values.any()  # the frames before the hole render


# ----------------------------------------------------------------------------- the CLI
def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_export_npz_exits_2_and_writes_no_file_for_a_damaged_world(copy, cli, tmp_path):
    delete_object(copy, SHARD)
    before = snapshot(copy)

    code, _, err = cli("export-npz", copy, "--to", tmp_path / "npz", "--worlds", "0")

    assert code == 2
    assert "qpos [world 0 (index 0), frames 5..9] (file qpos/c/0/1/0)" in _one_line(err)
    assert not (tmp_path / "npz").exists()  # not even an empty folder
    assert snapshot(copy) == before


def test_plot_exits_2_and_writes_no_image(copy, cli, tmp_path):
    empty_inner_chunks(copy, "qpos/c/0/2/0", [0, 1])

    code, _, err = cli("plot", copy, "--world", "1", "--out", tmp_path / "traces.png")

    assert code == 2
    assert "qpos [world 1 (index 1), frames 10..14] (file qpos/c/0/2/0)" in _one_line(err)
    assert not (tmp_path / "traces.png").exists()


@pytest.mark.parametrize("backend", ["opengl", "warp-cpu"])
def test_render_exits_2_and_writes_no_video_of_the_damaged_world(copy, cli, model_xml, tmp_path,
                                                                 backend):
    if backend == "warp-cpu":
        pytest.importorskip("mujoco_warp")
    delete_object(copy, SHARD)
    out = tmp_path / "videos"

    code, _, err = cli("render", copy, "--model", model_xml, "--camera", "front", "--size",
                       "48x64", "--worlds", "1", "--backend", backend, "--workers", "0",
                       "--out", out, "--quiet")

    assert code == 2
    assert "qpos [world 1 (index 1), frames 5..9] (file qpos/c/0/1/0)" in _one_line(err)
    assert files_under(out) == []


# ----------------------------------------------------------------------------- world variables
def _strip_whole_marker(url: str, name: str) -> None:
    """Make a world variable look written before flyarchive stored them whole: its own
    metadata and the consolidated copy lose the marker."""
    import json

    from flyarchive.schema import WHOLE_ATTR

    for path, inner in ((Path(url, name, "zarr.json"), None),
                        (Path(url, "zarr.json"), ("consolidated_metadata", "metadata", name))):
        doc = json.loads(path.read_text())
        meta = doc
        for key in inner or ():
            meta = meta.get(key, {}) if isinstance(meta, dict) else {}
        if isinstance(meta, dict):
            meta.get("attributes", {}).pop(WHOLE_ATTR, None)
        path.write_text(json.dumps(doc))


def test_a_deleted_world_variable_chunk_fails_its_reads_and_verify_on_every_storage(location,
                                                                                   sound):
    from flyarchive import add_world_vars, verify

    copy_archive(sound, location.url, location.storage_options)
    add_world_vars(location.url, {"success": np.array([0, 0]), "reward": np.array([0.5, 0.0])},
                   storage_options=location.storage_options)
    delete_object(location.url, "success/c/0", location.storage_options)
    before = stored(location)

    with pytest.raises(CorruptArchiveError) as err:
        open_archive(location.url, location.storage_options).success.values
    report = verify(location.url, location.storage_options)

    message = str(err.value)
    assert "world variable 'success' [worlds 0..1 (file success/c/0)]" in message
    assert "its file is missing, but world variables are stored whole" in message
    assert f"flyarchive set-world-var {location.url} success=V1,V2,... --overwrite" in message
    assert open_archive(location.url, location.storage_options).reward.values.tolist() == [0.5, 0.0]
    assert [p for p in report.problems if "'success'" in p and "file success/c/0" in p]
    assert not report.ok
    assert stored(location) == before


def test_a_world_variable_of_fill_values_only_is_stored_with_its_chunk(copy):
    from flyarchive import add_world_vars

    add_world_vars(copy, {"flag": np.array([False, False]), "genotype": ["", ""]})

    assert Path(copy, "flag", "c", "0").is_file() and Path(copy, "genotype", "c", "0").is_file()
    assert open_archive(copy).flag.values.tolist() == [False, False]


def test_a_truncated_world_variable_chunk_fails_its_reads_and_verify(copy):
    from flyarchive import add_world_vars, verify

    add_world_vars(copy, {"reward": np.array([0.5, 1.5])})
    chunk = Path(copy, "reward", "c", "0")
    chunk.write_bytes(chunk.read_bytes()[:-3])

    with pytest.raises(CorruptArchiveError, match=r"world variable 'reward' \[worlds 0\.\.1 "
                                                  r"\(file reward/c/0\)\]"):
        open_archive(copy).reward.values
    assert any("reward" in p and "reward/c/0" in p for p in verify(copy).problems)


def test_a_world_variable_given_at_recording_is_stored_whole(tmp_path, tiny):
    from flyarchive.testing.fixtures import record

    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8, world_vars={"seed": [0, 0]})
    delete_object(url, "seed/c/0")

    with pytest.raises(CorruptArchiveError, match=r"world variable 'seed' \[worlds 0\.\.1"):
        open_archive(url).seed.values


def test_a_selection_of_worlds_by_a_damaged_world_variable_is_refused(copy, cli, tmp_path):
    from flyarchive import add_world_vars

    add_world_vars(copy, {"distance": np.array([0.0, 0.0])})
    delete_object(copy, "distance/c/0")

    code, _, err = cli("render", copy, "--camera", "front", "--where-world-var", "distance>1",
                       "--workers", "0", "--out", tmp_path / "videos")

    assert code == 2
    assert "world variable 'distance' [worlds 0..1 (file distance/c/0)]" in _one_line(err)
    assert not (tmp_path / "videos").exists()


def test_verify_exits_1_naming_a_missing_world_variable_chunk(copy, cli):
    from flyarchive import add_world_vars

    add_world_vars(copy, {"distance": np.array([0.0, 2.0])})
    delete_object(copy, "distance/c/0")

    code, out, err = cli("verify", copy)

    assert code == 1
    assert "world variable 'distance' [world indices 0..1] (file distance/c/0)" in out + err


def test_an_archive_from_before_reads_a_missing_world_variable_chunk_as_before(copy):
    from flyarchive import add_world_vars, verify

    add_world_vars(copy, {"success": np.array([0, 0])})
    _strip_whole_marker(copy, "success")
    delete_object(copy, "success/c/0")  # as an older writer left a variable of zeros

    values = open_archive(copy).success.values
    report = verify(copy)
    add_world_vars(copy, {"success": np.array([0, 0])}, overwrite=True)  # protects it
    delete_object(copy, "success/c/0")

    assert values.tolist() == [0, 0]
    assert report.ok
    assert any("'success'" in note and "written before" in note for note in report.notes)
    with pytest.raises(CorruptArchiveError, match="world variable 'success'"):
        open_archive(copy).success.values


# ----------------------------------------------------------------------------- commit markers
def test_a_lost_n_frames_file_is_damage_that_reads_verify_and_writers_name(location, sound, tiny):
    """Frames were committed, then n_frames' one file went missing: it read as 0 frames
    committed (the archive looked empty, `positions` 'repaired' its kept values to none,
    and an appending writer would have written over the recorded frames)."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.store.integrity import verify
    from flyarchive.testing import simulate

    copy_archive(sound, location.url, location.storage_options)
    delete_object(location.url, "n_frames/c/0", location.storage_options)
    before = stored(location)

    with pytest.raises(CorruptArchiveError, match=r"commit markers' file n_frames/c/0 \(worlds "
                                                  r"at indices 0..1\) is missing"):
        open_archive(location.url, location.storage_options)
    report = verify(location.url, location.storage_options)
    assert not report.ok and any("n_frames/c/0" in p for p in report.problems)
    recorder = TrajectoryRecorder(location.url, tiny, mode="a", chunk_frames=5,
                                  storage_options=location.storage_options)
    with pytest.raises(CorruptArchiveError, match="n_frames/c/0 is missing.*written again over"):
        simulate(tiny, 2, 76, recorder.record_as_needed)

    assert stored(location) == before
