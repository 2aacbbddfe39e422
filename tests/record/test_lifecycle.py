"""Recorders that are never closed still commit their frames (issue 10, item 4).

flygym never closes ``sim.recorder``: buffered frames are committed when the
recorder is garbage-collected or Python exits, with a ResourceWarning.
"""

import gc
import subprocess
import sys
import warnings

import numpy as np
import pytest

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.testing import reference_frames, simulate
from flyarchive.testing.markers import requires_warp

pytestmark = pytest.mark.subprocess

CPU_CHILD = """
import sys
from flyarchive import TrajectoryRecorder
from flyarchive.testing import simulate, tiny_model

model = tiny_model()
recorder = TrajectoryRecorder(sys.argv[1], model, chunk_frames=100)
simulate(model, 2, 24, recorder.record_as_needed)  # 7 frames, all still buffered
print(recorder.committed_frames, recorder.n_frames, flush=True)
"""

WARP_CHILD = """
import sys
from flyarchive.recorders import WarpTrajectoryRecorder
from flyarchive.testing import tiny_model
from flyarchive.testing.warp_states import host_warp_steps

model = tiny_model()
recorder = WarpTrajectoryRecorder(sys.argv[1], model, 2, chunk_frames=100)
host_warp_steps(model, 2, 24, lambda step, d: recorder.record_as_needed(d))
print(recorder.committed_frames, recorder.n_frames, flush=True)  # 7 frames, on the device
"""


def run_child(code, url):
    return subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", code, url],
                          capture_output=True, text=True, timeout=300)


def test_a_collected_recorder_commits_its_buffered_frames(tiny, tmp_path):
    url = str(tmp_path / "collected.zarr")
    expected = reference_frames(tiny, 2, 24)
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=100)
    simulate(tiny, 2, 24, recorder.record_as_needed)

    with pytest.warns(ResourceWarning, match=r"was not closed.*`with` block or call recorder.close"):
        del recorder
        gc.collect()

    ds = open_archive(url)
    assert ds.n_frames.values.tolist() == [7, 7]
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])


def test_a_closed_recorder_gives_no_resource_warning_when_collected(tiny, tmp_path):
    recorder = TrajectoryRecorder(str(tmp_path / "closed.zarr"), tiny)
    simulate(tiny, 1, 8, recorder.record_as_needed)
    recorder.close()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del recorder
        gc.collect()


@pytest.mark.timeout(120)
def test_a_recorder_never_closed_is_committed_when_python_exits(tiny, tmp_path):
    url = str(tmp_path / "exit.zarr")
    expected = reference_frames(tiny, 2, 24)

    child = run_child(CPU_CHILD, url)

    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["0", "7"]  # nothing committed before the exit
    assert "ResourceWarning" in child.stderr and "was not closed" in child.stderr
    assert "failed" not in child.stderr, child.stderr
    np.testing.assert_array_equal(open_archive(url).qpos.values, expected["qpos"])


@requires_warp
@pytest.mark.timeout(300)
def test_a_warp_recorder_never_closed_is_committed_when_python_exits(tiny, tmp_path):
    """The Warp recorder on Warp's CPU device, fed CPU worlds in Warp arrays
    (flyarchive.testing.warp_states: the child imports no mujoco-warp)."""
    from flyarchive.testing.warp_states import host_warp_reference

    url = str(tmp_path / "warp-exit.zarr")
    expected = host_warp_reference(tiny, 2, 24)

    child = run_child(WARP_CHILD, url)

    assert child.returncode == 0, child.stderr
    assert child.stdout.split()[-2:] == ["0", "7"]  # nothing committed before the exit
    assert "was not closed" in child.stderr
    assert "failed" not in child.stderr, child.stderr
    ds = open_archive(url)
    assert ds.n_frames.values.tolist() == [7, 7]
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(ds.sim_time.values, expected["time"])


@requires_warp
@pytest.mark.timeout(300)
def test_a_collected_warp_recorder_commits_its_frames(tiny, tmp_path):
    from flyarchive.recorders import WarpTrajectoryRecorder
    from flyarchive.testing.warp_states import host_warp_reference, host_warp_steps

    url = str(tmp_path / "warp-gc.zarr")
    recorder = WarpTrajectoryRecorder(url, tiny, 2, chunk_frames=100)
    host_warp_steps(tiny, 2, 24, lambda step, d: recorder.record_as_needed(d))
    assert recorder.committed_frames == 0  # 7 frames, all still in the device buffer

    with pytest.warns(ResourceWarning, match="was not closed"):
        del recorder
        gc.collect()

    ds = open_archive(url)
    assert ds.n_frames.values.tolist() == [7, 7]
    np.testing.assert_array_equal(ds.qpos.values, host_warp_reference(tiny, 2, 24)["qpos"])


def _storage_gone(*args, **kwargs):
    import botocore.exceptions

    raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9")


def test_a_failing_block_keeps_its_own_error_when_closing_the_recorder_fails_too(
        tiny, tmp_path, monkeypatch):
    from flyarchive.store import writer

    with pytest.raises(RuntimeError, match="the simulation broke") as caught:
        with TrajectoryRecorder(str(tmp_path / "run.zarr"), tiny, chunk_frames=5) as recorder:
            simulate(tiny, 2, 20, recorder.record_as_needed)
            monkeypatch.setattr(writer, "release", _storage_gone)  # the storage went away
            raise RuntimeError("the simulation broke")

    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "Closing the recorder failed too: StorageError: Cannot reach the storage" in notes


def test_a_claim_that_cannot_be_released_on_s3_is_a_storage_error(tiny, s3_location, monkeypatch):
    from flyarchive.errors import StorageError
    from flyarchive.store import writer

    recorder = TrajectoryRecorder(s3_location.url, tiny, chunk_frames=5,
                                  storage_options=s3_location.storage_options)
    simulate(tiny, 2, 20, recorder.record_as_needed)
    monkeypatch.setattr(writer, "release", _storage_gone)

    with pytest.raises(StorageError, match=r"Cannot reach the storage of 's3://"):
        recorder.close()


@pytest.mark.parametrize("then", ["deleted", "moved", "replaced"])
def test_a_recorder_whose_archive_goes_stops_and_writes_nothing_more_there(tiny, tmp_path, then):
    """It wrote on: into a fragment where the archive was, or into the archive another
    recording made there meanwhile (two runs spliced, the other's metadata overwritten)."""
    import shutil

    from flyarchive import verify
    from flyarchive.errors import ArchiveReplacedError
    from flyarchive.testing.fixtures import record, snapshot

    url = str(tmp_path / "run.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)
    steps, kept = [0], []

    def on_step(datas):
        steps[0] += 1
        if steps[0] == 60:  # after some commits
            if then == "moved":
                shutil.move(url, tmp_path / "moved.zarr")
            else:
                shutil.rmtree(url)
            if then == "replaced":  # another recording, closed: its claim gone too
                record(tiny, url, n_worlds=2, n_steps=12)
                kept.append(snapshot(url))
        recorder.record_as_needed(datas)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # closing says nothing more
        with pytest.raises(ArchiveReplacedError, match="no longer the one this writer records "
                                                       "into") as raised:
            with recorder:
                simulate(tiny, 2, 400, on_step)

    assert "is gone: the archive was deleted or moved away" in str(raised.value)
    assert not getattr(raised.value, "__notes__", None)  # said once: closing adds nothing
    if then == "replaced":  # the other recording as it closed it
        assert snapshot(url) == kept[0] and verify(url).ok
    else:
        assert not (tmp_path / "run.zarr").exists()  # no fragment where it was
    if then == "moved":
        moved = open_archive(str(tmp_path / "moved.zarr"))
        assert verify(str(tmp_path / "moved.zarr")).ok and int(moved.n_frames.min()) > 0


def test_a_recorder_whose_archive_another_recording_took_writes_nothing_into_it(tiny, tmp_path):
    import shutil

    from flyarchive import verify
    from flyarchive.errors import ArchiveReplacedError

    url = str(tmp_path / "run.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)
    steps, other = [0], []

    def on_step(datas):
        steps[0] += 1
        if steps[0] == 60:  # deleted, and another recording starts there at once
            shutil.rmtree(url)
            other.append(TrajectoryRecorder(url, tiny, chunk_frames=5))
            simulate(tiny, 2, 40, other[0].record_as_needed)
        recorder.record_as_needed(datas)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # closing says nothing more
        with pytest.raises(ArchiveReplacedError, match="names another writer: the archive was "
                                                       "replaced"):
            with recorder:
                simulate(tiny, 2, 400, on_step)
    other[0].close()

    expected = reference_frames(tiny, 2, 40)
    ds = open_archive(url)
    assert verify(url).ok
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"][:, :ds.sizes["time"]])


def test_ctrl_c_after_a_commit_wrote_its_frames_never_commits_them_again(tiny, tmp_path,
                                                                        monkeypatch):
    """Ctrl-C in a commit's last step (the consolidated metadata) left the frames in the
    buffer, and closing committed them again after themselves: time went back, and the
    archive could be neither read nor resumed."""
    import flyarchive.store.writer as writer
    from flyarchive import verify

    real, calls = writer.write_consolidated, [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:  # the second commit's step 5 (the first is the creation's)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "write_consolidated", interrupted)
    url = str(tmp_path / "run.zarr")
    with pytest.raises(KeyboardInterrupt):
        with TrajectoryRecorder(url, tiny, chunk_frames=5) as recorder:
            simulate(tiny, 2, 400, recorder.record_as_needed)

    ds = open_archive(url)
    n = int(ds.n_frames.max())
    assert verify(url).ok and n >= 10
    np.testing.assert_array_equal(ds.qpos.values, reference_frames(tiny, 2, 4 * n)["qpos"][:, :n])


def test_a_recorder_of_a_relative_path_records_there_after_the_current_folder_changes(
        tiny, tmp_path, monkeypatch):
    """It stopped with "the archive was deleted or moved away": its store followed the
    current folder."""
    from flyarchive import verify

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    recorder = TrajectoryRecorder("run.zarr", tiny, chunk_frames=5)
    steps = [0]

    def on_step(datas):
        steps[0] += 1
        if steps[0] == 40:
            monkeypatch.chdir(tmp_path / "elsewhere")
        recorder.record_as_needed(datas)

    with recorder:
        simulate(tiny, 2, 200, on_step)

    url = str(tmp_path / "run.zarr")
    assert verify(url).ok and not (tmp_path / "elsewhere" / "run.zarr").exists()
    np.testing.assert_array_equal(open_archive(url).qpos.values,
                                  reference_frames(tiny, 2, 200)["qpos"])


def test_an_archive_deleted_during_a_commit_is_said_gone_not_retryable(tiny, tmp_path,
                                                                       monkeypatch):
    """A file missing mid-commit (the folder deleted as the chunks went) said "retry or
    resume with mode='a'" of an archive that was gone."""
    import shutil

    import flyarchive.store.writer as writer
    from flyarchive.errors import ArchiveReplacedError

    url = str(tmp_path / "run.zarr")
    real, calls = writer.ArchiveWriter._time_writes, [0]

    def deleting(self, block, t0, t1):
        calls[0] += 1
        if calls[0] == 2:  # the second commit: the folder goes as its chunks are written
            shutil.rmtree(url)
            raise FileNotFoundError(2, "No such file or directory", f"{url}/time/c/1")
        return real(self, block, t0, t1)

    monkeypatch.setattr(writer.ArchiveWriter, "_time_writes", deleting)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ArchiveReplacedError, match="is gone: the archive was deleted"):
            with TrajectoryRecorder(url, tiny, chunk_frames=5) as recorder:
                simulate(tiny, 2, 200, recorder.record_as_needed)
