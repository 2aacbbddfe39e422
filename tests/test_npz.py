"""flygym RecordedTrajectory .npz import and export."""

from pathlib import Path

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.errors import LayoutMismatchError, NpzFormatError, OutputExistsError, SelectionError
from flyarchive.interop.flygym_npz import export_npz, import_npz
from flyarchive.testing import reference_frames, slider_model


def write_flygym_npz(tiny, folder, lengths=(20, 20)):
    """Files as flygym's RecordedTrajectory.save writes them, one per world."""
    from flygym.recording import RecordedTrajectory

    frames = reference_frames(tiny, len(lengths), 4 * max(lengths))
    trajs = []
    for w, n in enumerate(lengths):
        traj = RecordedTrajectory(
            time=frames["time"][:n], qpos=frames["qpos"][w, :n], output_fps=25,
            playback_speed=0.2, world_id=w + 5, mocap_pos=frames["mocap_pos"][w, :n],
            mocap_quat=frames["mocap_quat"][w, :n],
        )
        traj.save(folder / f"traj{w}.npz")
        trajs.append(traj)
    return trajs


def test_import_export_round_trip_is_bit_exact_and_flygym_loads_it(tiny, tmp_path):
    from flygym.recording import RecordedTrajectory

    originals = write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "imported.zarr")

    import_npz(tmp_path / "in", url, tiny)
    paths = export_npz(url, tmp_path / "out").files

    assert [Path(p).name for p in paths] == ["world00005.npz", "world00006.npz"]
    for original, path in zip(originals, paths):
        loaded = RecordedTrajectory.from_file(path)
        for key in ("time", "qpos", "mocap_pos", "mocap_quat"):
            np.testing.assert_array_equal(getattr(loaded, key), getattr(original, key))
        assert (loaded.output_fps, loaded.playback_speed, loaded.world_id) == (
            original.output_fps, original.playback_speed, original.world_id)


def test_import_keeps_world_ids_and_source(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path)
    url = str(tmp_path / "a.zarr")

    import_npz(sorted(tmp_path.glob("*.npz")), url, tiny)

    ds = open_archive(url)
    assert list(ds.world.values) == [5, 6]
    assert ds.attrs["source"] == "flygym-npz"
    assert ds.attrs["timestep"] == tiny.opt.timestep


def test_worlds_of_different_lengths_keep_their_own_n_frames(tiny, tmp_path):
    originals = write_flygym_npz(tiny, tmp_path / "in", lengths=(7, 23))
    url = str(tmp_path / "b.zarr")

    import_npz(tmp_path / "in", url, tiny, chunk_frames=5)

    ds = open_archive(url)
    assert list(ds.n_frames.values) == [7, 23]
    np.testing.assert_array_equal(ds.qpos.values[0, :7], originals[0].qpos)
    assert np.isnan(ds.qpos.values[0, 7:]).all()


def test_export_refuses_to_overwrite_files(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "c.zarr")
    import_npz(tmp_path / "in", url, tiny)
    export_npz(url, tmp_path / "out")
    before = (tmp_path / "out" / "world00005.npz").read_bytes()

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        export_npz(url, tmp_path / "out")
    assert (tmp_path / "out" / "world00005.npz").read_bytes() == before


def test_export_of_unknown_world_lists_the_worlds(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "d.zarr")
    import_npz(tmp_path / "in", url, tiny)

    with pytest.raises(SelectionError, match=r"it has worlds \[5, 6\]"):
        export_npz(url, tmp_path / "out", worlds=[99])


def test_npz_with_missing_fields_is_refused(tiny, tmp_path):
    np.savez(tmp_path / "bad.npz", time=np.arange(3.0), qpos=np.zeros((3, tiny.nq)))

    with pytest.raises(NpzFormatError, match=r"fields \['output_fps', 'playback_speed', 'world_id'\]"):
        import_npz(tmp_path / "bad.npz", str(tmp_path / "x.zarr"), tiny)


def test_npz_with_pickled_objects_is_refused(tiny, tmp_path):
    objects = np.array([{"evil": 1}], dtype=object)
    np.savez(tmp_path / "pickled.npz", time=objects, qpos=objects, output_fps=25,
             playback_speed=0.2, world_id=0)

    with pytest.raises(NpzFormatError, match="pickled Python objects"):
        import_npz(tmp_path / "pickled.npz", str(tmp_path / "x.zarr"), tiny)
    assert not (tmp_path / "x.zarr").exists()


def test_npz_for_another_model_is_refused(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path)

    with pytest.raises(LayoutMismatchError, match="nq=13, nmocap=1; the model has nq=1"):
        import_npz(tmp_path, str(tmp_path / "x.zarr"), slider_model())


def test_empty_folder_is_refused(tiny, tmp_path):
    with pytest.raises(SelectionError, match="holds no .npz files"):
        import_npz(tmp_path, str(tmp_path / "x.zarr"), tiny)
