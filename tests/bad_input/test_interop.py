"""Bad input to npz import/export, the CLI and S3: a clear error, and nothing committed changes.

Each case asserts the error type, a fragment of its message, and that what was
committed before (an archive, files, a bucket) is byte for byte as it was.
"""

import json
import subprocess
import sys
import uuid
from typing import Any

import numpy as np
import pytest

from flyarchive import errors
from flyarchive.errors import (
    ArchiveExistsError,
    LayoutMismatchError,
    NonFiniteStateError,
    NpzFormatError,
    SelectionError,
    StorageError,
)
from flyarchive.interop.flygym_npz import export_npz, import_npz
from flyarchive.testing import reference_frames, slider_model
from flyarchive.testing.fixtures import bucket_snapshot, record, snapshot
from flyarchive.testing.markers import requires_linux_sys

UNWRITABLE = "/sys/flyarchive-test/out"  # EPERM even for root


def write_npz(path, tiny, *, n=12, world_id=0, **override):
    """One flygym RecordedTrajectory file; ``override`` replaces fields."""
    frames = reference_frames(tiny, 1, 4 * (n - 1))
    fields = dict(time=frames["time"], qpos=frames["qpos"][0], output_fps=25.0,
                  playback_speed=0.2, world_id=world_id, mocap_pos=frames["mocap_pos"][0],
                  mocap_quat=frames["mocap_quat"][0])
    fields.update(override)
    np.savez_compressed(path, **fields)
    return path


@pytest.fixture
def npz_dir(tiny, tmp_path):
    folder = tmp_path / "npz"
    folder.mkdir()
    for w in range(2):
        write_npz(folder / f"w{w}.npz", tiny, n=20, world_id=w)
    return folder


@pytest.fixture
def partial(tiny, tmp_path, npz_dir):
    """An import of ``npz_dir`` stopped after its first commit."""
    url = str(tmp_path / "partial.zarr")

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_npz(npz_dir, url, tiny, chunk_frames=5, progress=stop)
    return url


# ----------------------------------------------------------------------------- import: files
def test_a_file_that_is_not_an_npz_is_named_as_such(tiny, tmp_path):
    path = tmp_path / "notes.npz"
    path.write_text("time,qpos\n0,1\n")

    with pytest.raises(NpzFormatError, match="is not an .npz file") as err:
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert "pickled" not in str(err.value)
    assert not (tmp_path / "x.zarr").exists()


def test_a_single_array_npy_file_is_refused_as_not_npz(tiny, tmp_path):
    path = tmp_path / "qpos.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros((3, 13)))

    with pytest.raises(NpzFormatError, match="single-array .npy file, not an .npz file"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_a_truncated_npz_is_refused_as_damaged(tiny, tmp_path):
    whole = write_npz(tmp_path / "whole.npz", tiny).read_bytes()
    path = tmp_path / "cut.npz"
    path.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(NpzFormatError, match="damaged .npz file"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_nan_in_qpos_is_refused_at_import_with_the_file_and_frame(tiny, tmp_path):
    qpos = reference_frames(tiny, 1, 44)["qpos"][0]
    qpos[3, 7] = np.nan
    path = write_npz(tmp_path / "diverged.npz", tiny, qpos=qpos)

    with pytest.raises(NonFiniteStateError, match=r"diverged.npz': qpos holds NaN or infinity at "
                                                  r"frame 3"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_infinite_mocap_quat_is_refused_at_import(tiny, tmp_path):
    quat = reference_frames(tiny, 1, 44)["mocap_quat"][0]
    quat[1, 0, 0] = np.inf
    path = write_npz(tmp_path / "inf.npz", tiny, mocap_quat=quat)

    with pytest.raises(NonFiniteStateError, match=r"mocap_quat holds NaN or infinity at frame 1 "
                                                  r"\(t=0\.008 s\)"):  # not t=np.float64(...)
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_time_that_goes_back_is_refused_at_import(tiny, tmp_path):
    time = reference_frames(tiny, 1, 44)["time"]
    time[4] = time[2]
    path = write_npz(tmp_path / "spliced.npz", tiny, time=time)

    with pytest.raises(NpzFormatError, match="time is not strictly increasing at frame 4"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_nan_time_is_refused_at_import(tiny, tmp_path):
    time = reference_frames(tiny, 1, 44)["time"]
    time[5] = np.nan
    path = write_npz(tmp_path / "nantime.npz", tiny, time=time)

    with pytest.raises(NpzFormatError, match="time holds NaN or infinity at frame 5"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_files_with_the_same_world_id_point_to_renumber(tiny, tmp_path):
    for name in ("a", "b"):
        write_npz(tmp_path / f"{name}.npz", tiny, world_id=0)

    with pytest.raises(NpzFormatError, match=r"pass renumber=True \(--renumber\)"):
        import_npz([tmp_path / "a.npz", tmp_path / "b.npz"], str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.parametrize("world_id", [np.int64(-5), np.uint64(2**63)])
def test_a_world_id_outside_0_to_2_63_is_refused(tiny, tmp_path, world_id):
    path = write_npz(tmp_path / "bad-id.npz", tiny, world_id=world_id)

    with pytest.raises(NpzFormatError, match="world_id must be a whole number from 0 to 2"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


def test_a_zero_output_fps_is_refused(tiny, tmp_path):
    path = write_npz(tmp_path / "fps.npz", tiny, output_fps=0.0)

    with pytest.raises(NpzFormatError, match="output_fps must be a positive number"):
        import_npz(path, str(tmp_path / "x.zarr"), tiny)

    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.parametrize("twice", ["same", "folder", "link"])
def test_a_file_given_twice_is_refused_not_read_as_two_worlds(tiny, tmp_path, twice):
    folder = tmp_path / "npz"
    folder.mkdir()
    path = write_npz(folder / "a.npz", tiny)
    if twice == "link":
        (tmp_path / "b.npz").symlink_to(path)
    other = {"same": path, "folder": folder, "link": tmp_path / "b.npz"}[twice]

    with pytest.raises(SelectionError, match="is given twice .*Give each file once"):
        import_npz([path, other], str(tmp_path / "x.zarr"), tiny, renumber=True)

    assert not (tmp_path / "x.zarr").exists()


# ----------------------------------------------------------------------------- import: targets
def test_import_onto_an_archive_names_overwrite_and_keeps_it(tiny, npz_dir, archive):
    before = snapshot(archive)

    with pytest.raises(ArchiveExistsError, match=r"mode='w' \(--overwrite\)"):
        import_npz(npz_dir, archive, tiny)

    assert snapshot(archive) == before


def test_import_onto_an_interrupted_import_points_to_resume(tiny, npz_dir, partial):
    before = snapshot(partial)

    with pytest.raises(ArchiveExistsError, match=r"holds an import that did not finish. Pass "
                                                 r"resume=True \(--resume\)"):
        import_npz(npz_dir, partial, tiny)

    assert snapshot(partial) == before


def test_resume_with_other_files_is_refused_and_keeps_the_partial_import(tiny, tmp_path, partial):
    other = tmp_path / "other"
    other.mkdir()
    write_npz(other / "x.npz", tiny, n=20, world_id=0)
    before = snapshot(partial)

    with pytest.raises(errors.ImportMismatchError, match="was started with other files"):
        import_npz(other, partial, tiny, resume=True)

    assert snapshot(partial) == before


def test_resume_into_an_archive_no_import_made_is_refused(tiny, npz_dir, archive):
    before = snapshot(archive)

    with pytest.raises(errors.ImportMismatchError, match="was not made by import_npz"):
        import_npz(npz_dir, archive, tiny, resume=True)

    assert snapshot(archive) == before


def test_resume_with_another_model_is_refused_and_keeps_the_partial_import(npz_dir, partial):
    before = snapshot(partial)

    with pytest.raises(LayoutMismatchError, match="nq=13, nmocap=1; the model has nq=1"):
        import_npz(npz_dir, partial, slider_model(), resume=True)

    assert snapshot(partial) == before


def test_cli_resume_with_overwrite_is_refused(npz_dir, partial, model_xml, cli):
    before = snapshot(partial)

    code, _, err = cli("import-npz", npz_dir, "--to", partial, "--model", model_xml,
                       "--resume", "--overwrite")

    assert code == 2
    assert "--resume finishes an import and --overwrite replaces it" in err
    assert snapshot(partial) == before


# ----------------------------------------------------------------------------- export
def test_export_to_an_existing_file_says_it_is_not_a_folder(archive, tmp_path):
    target = tmp_path / "npz"
    target.write_bytes(b"a file")
    before = snapshot(archive)

    with pytest.raises(errors.OutputLocationError, match="is a file, not a folder"):
        export_npz(archive, target)

    assert target.read_bytes() == b"a file"
    assert snapshot(archive) == before


@requires_linux_sys
def test_export_to_an_unwritable_folder_is_a_storage_error(archive):
    before = snapshot(archive)

    with pytest.raises(StorageError, match="Cannot create the folder '/sys/flyarchive-test/out'"):
        export_npz(archive, UNWRITABLE)

    assert snapshot(archive) == before


@requires_linux_sys
def test_cli_export_to_an_unwritable_folder_is_one_line_exit_2(archive, cli):
    before = snapshot(archive)

    code, _, err = cli("export-npz", archive, "--to", UNWRITABLE)

    assert code == 2
    assert err.startswith("flyarchive export-npz: error: Cannot create the folder")
    assert err.count("\n") == 1
    assert snapshot(archive) == before


@pytest.mark.subprocess
def test_export_when_the_disk_refuses_a_write_leaves_no_half_file(archive, tmp_path):
    out = tmp_path / "out"  # each world's file holds 20 frames: over 1500 bytes
    child = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500)); "
             "from flyarchive.cli import main; sys.exit(main(sys.argv[1:]))")

    proc = subprocess.run([sys.executable, "-c", child, "export-npz", archive, "--to", str(out)],
                          capture_output=True, text=True, timeout=120)

    assert proc.returncode == 2
    assert proc.stderr.startswith("flyarchive export-npz: error: Cannot write")
    assert "File too large" in proc.stderr and proc.stderr.count("\n") == 1
    assert list(out.iterdir()) == []


def test_export_of_worlds_without_frames_writes_nothing(tiny, tmp_path):
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter

    url = str(tmp_path / "empty.zarr")
    ArchiveWriter.create(url, ArchiveSpec(ModelLayout.from_model(tiny),
                                          Timing(tiny.opt.timestep, 25, 0.2), (0, 1)))
    before = snapshot(url)

    with pytest.raises(SelectionError, match=r"World\(s\) \[0, 1\] .* have no committed frames"):
        export_npz(url, tmp_path / "out")

    assert not (tmp_path / "out").exists()
    assert snapshot(url) == before


@pytest.mark.parametrize(("worlds", "fragment"), [
    ("0-2000000", "names 2,000,001 worlds; at most 1,000,000"),
    ("5-3", "'5-3' in '5-3' ends before it starts"),
])
def test_cli_export_refuses_a_world_selection_it_cannot_take(archive, tmp_path, cli,
                                                             worlds, fragment):
    before = snapshot(archive)

    code, _, err = cli("export-npz", archive, "--to", tmp_path / "out", "--worlds", worlds)

    assert code == 2
    assert fragment in err
    assert not (tmp_path / "out").exists()
    assert snapshot(archive) == before


# ----------------------------------------------------------------------------- S3
def fresh_bucket(s3_server: Any) -> str:
    """A new empty bucket of its own (a snapshot of the shared one reads every test's data)."""
    name = f"bad-input-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


def test_recording_to_an_unreachable_endpoint_is_a_storage_error(tiny, s3_server, unreachable):
    bucket = fresh_bucket(s3_server)
    url = f"s3://{bucket}/{uuid.uuid4().hex}.zarr"
    before = bucket_snapshot(s3_server.filesystem(), bucket)

    with pytest.raises(StorageError, match="Cannot reach the storage of .* nothing answered at "
                                           "http://127.0.0.1:") as err:
        record(tiny, url, storage_options=unreachable)

    assert url in str(err.value)
    assert "unreachable-secret-value" not in str(err.value)
    assert bucket_snapshot(s3_server.filesystem(), bucket) == before


def test_cli_info_of_an_unreachable_endpoint_is_one_line_exit_2(unreachable, cli, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)  # a URL mistaken for a local path would land here

    code, _, err = cli("info", "s3://flyarchive-test/run.zarr", "--storage-options",
                       json.dumps(unreachable))

    assert code == 2
    assert err.startswith("flyarchive info: error: Cannot reach the storage of 's3://")
    assert err.count("\n") == 1 and "unreachable-secret-value" not in err
    assert list(tmp_path.iterdir()) == []


def test_recording_without_credentials_is_a_storage_error(tiny, s3_server, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = s3_server.storage_options(skip_instance_cache=True)
    del options["key"], options["secret"]
    bucket = fresh_bucket(s3_server)
    before = bucket_snapshot(s3_server.filesystem(), bucket)

    with pytest.raises(StorageError, match="No usable credentials were found for 's3://"):
        record(tiny, f"s3://{bucket}/{uuid.uuid4().hex}.zarr", storage_options=options)

    assert bucket_snapshot(s3_server.filesystem(), bucket) == before


def test_recording_with_refused_credentials_hides_key_and_secret(tiny, forbidding_s3, tmp_path,
                                                                monkeypatch):
    from flyarchive.testing.s3 import s3_storage_options

    monkeypatch.chdir(tmp_path)  # a URL mistaken for a local path would land here
    options = s3_storage_options(forbidding_s3.endpoint_url, key="AKIAWRONGKEY",
                                 secret="wrong-secret-value")

    with pytest.raises(StorageError, match=r"Access to 's3://flies/run.zarr' was refused") as err:
        record(tiny, "s3://flies/run.zarr", storage_options=options)

    assert "wrong-secret-value" not in str(err.value)
    assert "AKIAWRONGKEY" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_recording_into_a_missing_bucket_names_the_bucket_and_url(tiny, s3_server):
    url = "s3://no-such-bucket-here/run.zarr"

    with pytest.raises(StorageError, match="The bucket 'no-such-bucket-here' of "
                                           "'s3://no-such-bucket-here/run.zarr' does not exist"):
        record(tiny, url, storage_options=s3_server.storage_options())

    assert not s3_server.filesystem().exists("no-such-bucket-here")


def test_cli_info_with_a_non_url_endpoint_names_the_option(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a URL mistaken for a local path would land here
    options = json.dumps({"endpoint_url": 5, "secret": "never-printed-secret"})

    code, _, err = cli("info", "s3://flyarchive-test/run.zarr", "--storage-options", options)

    assert code == 2
    assert "The storage option 'endpoint_url' for 's3://flyarchive-test/run.zarr' must be a URL" \
        in err
    assert "never-printed-secret" not in err
    assert list(tmp_path.iterdir()) == []


def test_export_to_a_missing_bucket_is_refused_and_writes_no_local_folder(
        archive, s3_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = snapshot(archive)

    with pytest.raises(StorageError, match="The bucket 'no-such-lab' of 's3://no-such-lab/npz'"):
        export_npz(archive, "s3://no-such-lab/npz", out_storage_options=s3_server.storage_options())

    assert not (tmp_path / "s3:").exists()
    assert snapshot(archive) == before


# ----------------------------------------------------------------------------- CLI
@requires_linux_sys
def test_cli_turns_any_os_error_into_one_line_exit_2(archive, cli):
    before = snapshot(archive)

    code, _, err = cli("plot", archive, "--world", "0", "--out", UNWRITABLE + "/p.png")

    assert code == 2
    assert err.startswith("flyarchive plot: error: ") and err.count("\n") == 1
    assert snapshot(archive) == before
