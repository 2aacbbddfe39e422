"""Writers started at the same instant in real processes, and a reader polling a writer.

Each race starts 3 recorder processes within microseconds of each other (they wait
on their stdin with everything imported, see :mod:`flyarchive.testing.concurrency`)
and is repeated, so that a check-then-act race would show: once in a plain run, 3 to 6
times with ``--run-sweeps`` (``scripts/reliability_report.py --races N`` repeats each N times).
"""

import uuid

import pytest

from flyarchive.testing.concurrency import RecorderPool, appenders_trial, creators_trial
from flyarchive.testing.verify_beside import reader_trial

pytestmark = pytest.mark.subprocess

N_PROCESSES = 3


def repeats(run_sweeps, full):
    """How many times a race is run: once, or ``full`` times with ``--run-sweeps`` (the
    repeats are sweep cases: each kind of race is met once by default)."""
    return full if run_sweeps else 1


@pytest.fixture(scope="module")
def pool():
    with RecorderPool(N_PROCESSES) as pool:
        yield pool


def summary(results):
    return [(r.winners, r.refused, r.unexpected, r.problems) for r in results]


@pytest.mark.timeout(180)
def test_recorders_creating_one_url_at_once_one_wins_and_the_others_are_refused(pool, tmp_path,
                                                                              run_sweeps):
    urls = [str(tmp_path / f"created-{i}.zarr") for i in range(repeats(run_sweeps, 6))]

    results = [creators_trial(pool, url, mode="w-") for url in urls]

    assert [r.clean for r in results] == [True] * len(urls), summary(results)
    assert [r.refused for r in results] == [N_PROCESSES - 1] * len(urls)


@pytest.mark.timeout(180)
def test_recorders_replacing_one_archive_at_once_leave_exactly_one_recording(pool, tmp_path,
                                                                           run_sweeps):
    urls = [str(tmp_path / f"replaced-{i}.zarr") for i in range(repeats(run_sweeps, 4))]
    for url in urls:
        creators_trial(pool, url, mode="w-")

    results = [creators_trial(pool, url, mode="w") for url in urls]

    assert [r.clean for r in results] == [True] * len(urls), summary(results)
    assert [r.refused for r in results] == [N_PROCESSES - 1] * len(urls)


@pytest.mark.timeout(180)
def test_recorders_appending_to_one_archive_at_once_let_only_one_write(pool, tmp_path,
                                                                     run_sweeps):
    urls = [str(tmp_path / f"appended-{i}.zarr") for i in range(repeats(run_sweeps, 4))]

    results = [appenders_trial(pool, url) for url in urls]

    assert [r.clean for r in results] == [True] * len(urls), summary(results)
    assert [r.refused for r in results] == [N_PROCESSES - 1] * len(urls)


@pytest.mark.timeout(180)
def test_recorders_creating_one_s3_url_at_once_one_wins(pool, s3_server, run_sweeps):
    options = s3_server.storage_options()
    urls = [f"s3://flyarchive-test/race-{uuid.uuid4().hex}.zarr"
            for _ in range(repeats(run_sweeps, 3))]

    results = [creators_trial(pool, url, mode="w-", n_steps=8, storage_options=options)
               for url in urls]  # 3 frames each: the race is the creation

    assert [r.clean for r in results] == [True] * len(urls), summary(results)


@pytest.mark.timeout(180)
def test_a_reader_polling_while_a_writer_appends_sees_no_damage_and_no_wrong_frame(pool, tmp_path,
                                                                                  run_sweeps):
    n_reads = 40 if run_sweeps else 12  # 2 a commit waited for; then the writer stops

    result = reader_trial(pool, str(tmp_path / "polled.zarr"), n_steps=1200, max_opens=n_reads)

    assert result.writer == "ok"
    assert result.damaged == 0, result.errors[:3]
    # reads two groups apart always see different commits: 6 groups, at least 3 states
    assert result.opens == n_reads and result.commits_seen >= n_reads // 4
    assert result.reads_mid_commit > 0
    assert result.frames_differing == 0


def test_opening_for_writing_while_another_writer_deletes_folders_is_not_a_storage_error(
        tmp_path, monkeypatch):
    """The race above, made certain: a losing recorder's store walks the archive's
    folders for links while the winner's ``mode="w"`` deletes them. A folder that vanished
    between its listing and its walk is skipped (it holds no link) instead of ending the
    losing recorder's attempt in a StorageError instead of ArchiveInUseError."""
    import os
    import shutil

    from flyarchive.store import localstore

    url = tmp_path / "walked.zarr"
    (url / "frame" / "c").mkdir(parents=True)
    (url / "qpos" / "c").mkdir(parents=True)
    real_scandir = os.scandir
    vanished = []

    def scandir_racing_a_clear(folder):
        if str(folder).endswith(os.path.join("frame", "c")):
            shutil.rmtree(folder)  # the winner's clear, between the listing and the walk
            vanished.append(folder)
        return real_scandir(folder)

    monkeypatch.setattr(localstore.os, "scandir", scandir_racing_a_clear)
    store = localstore.GuardedLocalStore(url)

    assert vanished and store.root == url
