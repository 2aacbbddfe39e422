"""flygym RecordedTrajectory .npz import and export."""

from pathlib import Path

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.errors import LayoutMismatchError, NpzFormatError, OutputExistsError, SelectionError
from flyarchive.interop.flygym_npz import export_npz, import_npz
from flyarchive.testing import reference_frames, slider_model
from flyarchive.testing.markers import requires_flygym_files


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


@requires_flygym_files
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
        given = tmp_path / "in" / f"traj{original.world_id - 5}.npz"
        with np.load(path) as written, np.load(given) as read:
            assert written["output_fps"].dtype.kind == read["output_fps"].dtype.kind  # 25, not 25.0


@requires_flygym_files
def test_import_keeps_world_ids_and_source(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path)
    url = str(tmp_path / "a.zarr")

    import_npz(sorted(tmp_path.glob("*.npz")), url, tiny)

    ds = open_archive(url)
    assert list(ds.world.values) == [5, 6]
    assert ds.attrs["source"] == "flygym-npz"
    assert ds.attrs["timestep"] == tiny.opt.timestep


@requires_flygym_files
def test_worlds_of_different_lengths_keep_their_own_n_frames(tiny, tmp_path):
    originals = write_flygym_npz(tiny, tmp_path / "in", lengths=(7, 23))
    url = str(tmp_path / "b.zarr")

    import_npz(tmp_path / "in", url, tiny, chunk_frames=5)

    ds = open_archive(url)
    assert list(ds.n_frames.values) == [7, 23]
    np.testing.assert_array_equal(ds.qpos.values[0, :7], originals[0].qpos)
    assert np.isnan(ds.qpos.values[0, 7:]).all()


@requires_flygym_files
def test_export_refuses_to_overwrite_files(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "c.zarr")
    import_npz(tmp_path / "in", url, tiny)
    export_npz(url, tmp_path / "out")
    before = (tmp_path / "out" / "world00005.npz").read_bytes()

    with pytest.raises(OutputExistsError, match="overwrite=True"):
        export_npz(url, tmp_path / "out")
    assert (tmp_path / "out" / "world00005.npz").read_bytes() == before


@requires_flygym_files
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


@requires_flygym_files
def test_npz_for_another_model_is_refused(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path)

    with pytest.raises(LayoutMismatchError, match="nq=13, nmocap=1; the model has nq=1"):
        import_npz(tmp_path, str(tmp_path / "x.zarr"), slider_model())


def test_empty_folder_is_refused(tiny, tmp_path):
    with pytest.raises(SelectionError, match="holds no .npz files"):
        import_npz(tmp_path, str(tmp_path / "x.zarr"), tiny)


# ----------------------------------------------------------------------------- issue 10
def write_cpu_flygym_npz(tiny, folder, n_files=3, n=12):
    """Files as flygym's CPU Simulation saves them: every one has world_id=0."""
    from flygym.recording import RecordedTrajectory

    folder.mkdir(parents=True, exist_ok=True)
    frames = reference_frames(tiny, n_files, 4 * (n - 1))
    for w in range(n_files):
        RecordedTrajectory(
            time=frames["time"], qpos=frames["qpos"][w], output_fps=25, playback_speed=0.2,
            world_id=0, mocap_pos=frames["mocap_pos"][w], mocap_quat=frames["mocap_quat"][w],
        ).save(folder / f"fly{w}.npz")
    return frames


def interrupt_after(blocks):
    """A progress callback that stops an import after ``blocks`` commits, as Ctrl-C would."""
    def progress(done, total):
        progress.calls += 1
        if progress.calls == blocks:
            raise KeyboardInterrupt

    progress.calls = 0
    return progress


@requires_flygym_files
def test_renumber_numbers_worlds_by_file_order_and_keeps_the_files_ids(tiny, tmp_path):
    frames = write_cpu_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "cpu.zarr")

    import_npz(tmp_path / "in", url, tiny, renumber=True)

    ds = open_archive(url)
    assert ds.world.values.tolist() == [0, 1, 2]
    assert ds.original_world_id.values.tolist() == [0, 0, 0]
    np.testing.assert_array_equal(ds.qpos.values, frames["qpos"])


@requires_flygym_files
def test_cli_import_success_line_counts_files_not_paths(tiny, tmp_path, capsys):
    from flyarchive.cli import main
    from flyarchive.testing import TINY_XML

    write_cpu_flygym_npz(tiny, tmp_path / "in")
    (tmp_path / "tiny.xml").write_text(TINY_XML)

    code = main(["import-npz", str(tmp_path / "in"), "--to", str(tmp_path / "a.zarr"),
                 "--model", str(tmp_path / "tiny.xml"), "--renumber"])

    assert code == 0
    assert capsys.readouterr().out.startswith("imported 3 file(s) into ")


@requires_flygym_files
def test_import_writes_with_the_codec_asked_for(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "lossy.zarr")

    import_npz(tmp_path / "in", url, tiny, codec="abs:1e-6")

    assert open_archive(url).attrs["codec"]["spec"] == "abs:1e-6"


@requires_flygym_files
def test_an_interrupted_import_is_reported_partial_by_info_and_verify(tiny, tmp_path):
    from flyarchive.store.integrity import verify
    from flyarchive.summary import summarize

    write_flygym_npz(tiny, tmp_path / "in", lengths=(20, 20))
    url = str(tmp_path / "partial.zarr")
    with pytest.raises(KeyboardInterrupt):
        import_npz(tmp_path / "in", url, tiny, chunk_frames=5, progress=interrupt_after(2))

    info = summarize(url)
    report = verify(url)

    assert info["frames_max"] == 10
    assert info["import"].startswith("PARTIAL: an import of 2 .npz file(s) (20 frames)")
    assert not report.ok
    assert any("--resume" in p for p in report.problems)


@requires_flygym_files
def test_a_complete_import_is_reported_complete(tiny, tmp_path):
    from flyarchive.store.integrity import verify
    from flyarchive.summary import summarize

    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "done.zarr")

    import_npz(tmp_path / "in", url, tiny, chunk_frames=5)

    assert summarize(url)["import"] == "complete"
    assert verify(url).ok


@requires_flygym_files
@pytest.mark.subprocess
def test_resume_finishes_an_interrupted_import_equal_to_an_uninterrupted_one(tiny, tmp_path):
    from flyarchive.testing.interop_kills import datasets_equal

    write_flygym_npz(tiny, tmp_path / "in", lengths=(7, 23))
    whole, url = str(tmp_path / "whole.zarr"), str(tmp_path / "resumed.zarr")
    import_npz(tmp_path / "in", whole, tiny, chunk_frames=5)
    with pytest.raises(KeyboardInterrupt):
        import_npz(tmp_path / "in", url, tiny, chunk_frames=5, progress=interrupt_after(3))

    import_npz(tmp_path / "in", url, tiny, chunk_frames=5, resume=True)

    assert datasets_equal(open_archive(url), open_archive(whole)) == []


@requires_flygym_files
def test_resume_writes_only_the_frames_not_yet_committed(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in", lengths=(20, 20))
    url = str(tmp_path / "resumed.zarr")
    with pytest.raises(KeyboardInterrupt):
        import_npz(tmp_path / "in", url, tiny, chunk_frames=5, progress=interrupt_after(2))
    done = []

    import_npz(tmp_path / "in", url, tiny, chunk_frames=5, resume=True,
               progress=lambda n, total: done.append(n))

    assert done == [15, 20]


@requires_flygym_files
def test_resume_of_a_complete_import_changes_nothing(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in")
    url = tmp_path / "done.zarr"
    import_npz(tmp_path / "in", str(url), tiny, chunk_frames=5)
    before = {p: p.read_bytes() for p in url.rglob("*") if p.is_file()}

    import_npz(tmp_path / "in", str(url), tiny, chunk_frames=5, resume=True)

    assert {p: p.read_bytes() for p in url.rglob("*") if p.is_file()} == before


@requires_flygym_files
def test_cli_resume_finishes_an_interrupted_import(tiny, tmp_path, capsys):
    from flyarchive.cli import main
    from flyarchive.testing import TINY_XML

    write_flygym_npz(tiny, tmp_path / "in", lengths=(20, 20))
    (tmp_path / "tiny.xml").write_text(TINY_XML)
    url = str(tmp_path / "cli.zarr")
    with pytest.raises(KeyboardInterrupt):
        import_npz(tmp_path / "in", url, tiny, chunk_frames=5, progress=interrupt_after(1))

    code = main(["import-npz", str(tmp_path / "in"), "--to", url, "--model",
                 str(tmp_path / "tiny.xml"), "--resume"])

    assert code == 0
    assert open_archive(url).n_frames.values.tolist() == [20, 20]


def partly_recorded(tiny, url):
    """An archive whose world 1 has no committed frame (world 0 has 5)."""
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock

    frames = reference_frames(tiny, 2, 16)
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2), (0, 1),
                       chunk_frames=5)
    writer = ArchiveWriter.create(url, spec)
    writer.write(FrameBlock(frames["time"], frames["qpos"], frames["mocap_pos"],
                            frames["mocap_quat"]), n_frames=np.array([5, 0]))
    return url


def test_export_skips_worlds_without_committed_frames(tiny, tmp_path):
    url = partly_recorded(tiny, str(tmp_path / "part.zarr"))

    done = export_npz(url, tmp_path / "out")

    assert [Path(p).name for p in done.files] == ["world00000.npz"]
    assert done.skipped == [1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["world00000.npz"]


def test_cli_export_says_which_worlds_were_skipped(tiny, tmp_path, capsys):
    from flyarchive.cli import main

    url = partly_recorded(tiny, str(tmp_path / "part.zarr"))

    assert main(["export-npz", url, "--to", str(tmp_path / "out")]) == 0

    assert "skipped 1 world(s) with no committed frames: [1]" in capsys.readouterr().out


@requires_flygym_files
def test_export_leaves_no_temporary_file_beside_the_files(tiny, tmp_path):
    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "a.zarr")
    import_npz(tmp_path / "in", url, tiny)

    export_npz(url, tmp_path / "out")

    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "world00005.npz", "world00006.npz"]


@requires_flygym_files
@pytest.mark.subprocess
def test_export_removes_temporary_files_a_killed_export_left(tiny, tmp_path):
    import subprocess
    import sys

    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "a.zarr")
    import_npz(tmp_path / "in", url, tiny)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "out").mkdir()
    leftover = tmp_path / "out" / f".world00005.npz.k2j3h4.{dead}.tmp"
    leftover.write_bytes(b"half a file")

    export_npz(url, tmp_path / "out")

    assert not leftover.exists()


@requires_flygym_files
def test_export_expands_the_home_folder(tiny, tmp_path, monkeypatch):
    write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "a.zarr")
    import_npz(tmp_path / "in", url, tiny)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    export_npz(url, "~/npz")

    assert (tmp_path / "home" / "npz" / "world00005.npz").is_file()
    assert not (tmp_path / "~").exists()


@requires_flygym_files
def test_export_to_an_s3_url_writes_files_flygym_loads(tiny, tmp_path, s3_location):
    import fsspec
    from flygym.recording import RecordedTrajectory

    originals = write_flygym_npz(tiny, tmp_path / "in")
    url = str(tmp_path / "a.zarr")
    import_npz(tmp_path / "in", url, tiny)
    out = s3_location.url.replace(".zarr", "-npz")

    done = export_npz(url, out, out_storage_options=s3_location.storage_options)

    fs, _ = fsspec.core.url_to_fs(out, **s3_location.storage_options)
    assert done.files == [f"{out}/world00005.npz", f"{out}/world00006.npz"]
    for original, file in zip(originals, done.files):
        local = tmp_path / Path(file).name
        local.write_bytes(fs.cat_file(file))
        loaded = RecordedTrajectory.from_file(local)
        np.testing.assert_array_equal(loaded.qpos, original.qpos)
    assert not (Path.cwd() / "s3:").exists()


@pytest.mark.parametrize("umask", [0o022, 0o007])
def test_exported_files_are_made_as_the_user_s_umask_says(tiny, tmp_path, umask):
    import os

    from flyarchive.testing.fixtures import record

    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=12)
    before = os.umask(umask)
    try:
        files = export_npz(url, tmp_path / "out").files
    finally:
        os.umask(before)

    assert files and all(os.stat(f).st_mode & 0o777 == 0o666 & ~umask for f in files)
