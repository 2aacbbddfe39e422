"""verify beside a writer: it reads one consistent state, says "being written" instead of
damage while a live writer holds a claim, never advises restoring or deleting metadata
then, and still reports damage that no writer makes."""

import uuid

import numpy as np
import pytest
import zarr

from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveWriter
from flyarchive.store.integrity import verify
from flyarchive.testing import flip_bits, shard_file, tiny_model
from flyarchive.testing.concurrency import RecorderPool
from flyarchive.testing.synthetic import TIMING, write_random
from flyarchive.testing.verify_beside import METADATA_ADVICE, verify_trial

pytestmark = pytest.mark.subprocess

BUCKET = "flyarchive-test"  # created by the s3_server fixture


@pytest.fixture(scope="module")
def pool():
    with RecorderPool(1) as pool:
        yield pool


# ----------------------------------------------------------------------------- real writers
# Each run of verify starts as the writer starts a commit, and the writer commits only while
# verify reads (flyarchive.testing.concurrency.CommitGate), then stops.
@pytest.mark.timeout(600)
def test_verify_runs_beside_an_appending_writer_give_no_false_alarm(pool, tmp_path, run_sweeps):
    n_runs = 12 if run_sweeps else 4  # scripts/reliability_report.py --verify-runs N: N runs
    # up to 6 commits a run, jobs of 50 frames: the work is bounded however fast the writer is
    result = verify_trial(pool, str(tmp_path / "run.zarr"), n_runs=n_runs, first_steps=8,
                          more_steps=200, commits_per_run=6)

    assert result.writer == "ok"
    assert result.runs == n_runs
    assert result.runs_with_writer >= n_runs // 2  # the writer held its claim while they read
    assert result.runs_mid_commit >= n_runs // 2  # and committed while they read
    assert result.commits_seen > (3 if run_sweeps else 1)
    assert result.false_alarms == []
    assert result.metadata_advice == []


@pytest.mark.timeout(600)
def test_verify_runs_beside_a_writer_on_s3_give_no_false_alarm(pool, s3_server, run_sweeps):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr"
    n_runs = 4 if run_sweeps else 2

    # 3 commits a run (each a dozen requests to moto), jobs of 25 frames
    result = verify_trial(pool, url, n_runs=n_runs, first_steps=4, more_steps=100,
                          commits_per_run=3, storage_options=s3_server.storage_options())

    assert result.writer == "ok"
    assert result.runs == n_runs
    assert result.runs_mid_commit >= 1
    assert result.false_alarms == []
    assert result.metadata_advice == []


@pytest.mark.timeout(600)
def test_a_damaged_shard_beside_an_appending_writer_is_still_reported_as_damage(pool, tmp_path):
    result = verify_trial(pool, str(tmp_path / "run.zarr"), n_runs=3, damaged=True,
                          first_steps=8, commits_per_run=2)  # each run reads the damaged archive 3 times

    assert result.writer == "ok"
    assert result.runs_with_writer >= 1
    assert result.damage_reported == result.runs == 3
    assert result.false_alarms == []
    assert result.metadata_advice == []


# ----------------------------------------------------------------------------- a claim held
@pytest.fixture
def held(tmp_path):
    """An archive of 2 worlds x 20 frames, and a writer of this process holding it."""
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2, n_frames=20, shard_worlds=2, chunk_frames=5)
    writer = ArchiveWriter.append(url, ModelLayout.from_model(tiny_model()), timing=TIMING)
    yield url
    writer.close()


def test_verify_of_a_sound_archive_names_the_writer_holding_it(held):
    report = verify(held)

    assert report.ok
    assert "this process" in report.writer
    assert report.being_written == []


def test_a_copy_ahead_of_n_frames_while_a_writer_holds_the_archive_is_being_written(held):
    zarr.open_array(f"{held}/n_frames", mode="r+")[:] = [10, 12]  # as between two steps

    report = verify(held)

    assert report.ok
    assert report.passes == 3  # read again while the writer held its claim
    assert report.being_written == [
        "The consolidated metadata gives 'time' 20 frames, more than the 12 committed "
        "(n_frames): it is ahead of the commit markers. A commit in progress explains it; "
        "run verify again once the writer is closed."]
    assert not any(a in t for t in report.being_written for a in METADATA_ADVICE)


def test_the_same_state_without_a_writer_is_damage_with_its_fix(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2, n_frames=20, shard_worlds=2, chunk_frames=5)
    zarr.open_array(f"{url}/n_frames", mode="r+")[:] = [10, 12]

    report = verify(url)

    assert not report.ok
    assert report.writer is None and report.passes == 1
    assert any("ahead of the commit markers" in p and "restore the root zarr.json" in p
               for p in report.problems), report.problems


def test_flipped_bits_while_a_writer_holds_the_archive_are_damage(held):
    flip_bits(shard_file(held, "qpos", 0, 1))  # committed frames 5..9

    report = verify(held)

    assert not report.ok
    assert len(report.problems) == 1
    assert "qpos[worlds 0..1, frames 5..9] (file qpos/c/0/1/0) is unreadable" in report.problems[0]
    assert report.being_written == []


# ----------------------------------------------------------------------------- the CLI
def test_flyarchive_verify_says_ok_and_being_written_while_a_writer_holds_it(held, cli):
    zarr.open_array(f"{held}/n_frames", mode="r+")[:] = [10, 12]

    code, out, err = cli("verify", held)

    assert code == 0
    assert out.startswith(f"OK: {held}: 2 worlds, ")
    assert "It is being written by this process" in out
    assert "  - being written: The consolidated metadata gives 'time' 20 frames" in out
    assert "restore" not in out + err and "delete" not in out + err


def test_flyarchive_verify_reports_damage_beside_a_writer_and_to_stop_it_first(held, cli):
    flip_bits(shard_file(held, "qpos", 0, 1))
    before = np.asarray(zarr.open_array(f"{held}/n_frames", mode="r")[:])

    code, out, err = cli("verify", held)

    assert code == 1
    assert err.startswith(f"FAILED: {held}:")
    assert "(file qpos/c/0/1/0) is unreadable" in err
    assert "No writer makes the damage above; stop it before restoring anything." in err
    assert np.array_equal(zarr.open_array(f"{held}/n_frames", mode="r")[:], before)
