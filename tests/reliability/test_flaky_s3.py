"""Flaky S3: record, open and render through a fault-injecting proxy on loopback.

Either the result equals the fault-free run, or the operation fails with a clear
flyarchive error and the archive holds exactly its last commit. Never a silent hole.
One seeded fault plan per operation; more seeds are ``sweep`` cases (``--run-sweeps``), and
``scripts/reliability_report.py --s3-trials N`` runs N of each.
"""

import logging
import traceback
import uuid

import numpy as np
import pytest

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.errors import StorageError
from flyarchive.store.integrity import verify
from flyarchive.testing import reference_frames, simulate, tiny_model
from flyarchive.testing.faultproxy import FaultPlan, FaultProxy
from flyarchive.testing.flaky_s3 import s3_read_trial, s3_record_trial, s3_render_trial

pytestmark = pytest.mark.timeout(300)
BUCKET = "flyarchive-test"  # created by the s3_server fixture


def moderate(seed):
    """About one request in six gets a fault: dropped, 500, 503 or delayed."""
    return FaultPlan(drop=0.04, error500=0.04, error503=0.04, delay=0.04, delay_s=0.05, seed=seed)


def new_url():
    return f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr"


def clean(server):
    return server.storage_options(skip_instance_cache=True)


@pytest.fixture(scope="module")
def s3_archive(s3_server):
    """15 frames of 2 tiny worlds, recorded without faults."""
    url = new_url()
    model = tiny_model()
    with TrajectoryRecorder(url, model, chunk_frames=5, storage_options=clean(s3_server)) as rec:
        simulate(model, 2, 56, rec.record_as_needed)
    return url


# ----------------------------------------------------------------------------- record
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.sweep)])
def test_recording_through_faults_is_complete_or_stops_at_its_last_commit(s3_server, seed):
    # 10 frames, 2 commits of 5: ~70 requests, 5 of them faulted with seed 0
    result = s3_record_trial(s3_server, moderate(seed), new_url(), n_frames=10, chunk_frames=5)

    assert result.faults["faults"] > 0
    assert result.outcome in ("equal", "clean-failure"), result


def test_a_failed_write_after_commits_keeps_them_and_resume_completes(s3_server, tiny):
    url = new_url()
    expected = reference_frames(tiny, 2, 56)  # 15 frames: 2 commits, the third fails
    with FaultProxy(s3_server.endpoint_url) as proxy:
        recorder = TrajectoryRecorder(url, tiny, chunk_frames=5,
                                      storage_options=proxy.storage_options())

        def on_step(datas):
            if recorder.committed_frames == 10:
                proxy.plan = FaultPlan(error503=1.0, methods={"PUT"})
            recorder.record_as_needed(datas)

        with pytest.raises(StorageError, match="still holds its 10 committed frames") as err:
            simulate(tiny, 2, 56, on_step)

    ds = open_archive(url, clean(s3_server))
    assert url in str(err.value)
    assert ds.n_frames.values.tolist() == [10, 10]
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"][:, :10])
    assert verify(url, clean(s3_server)).ok

    with TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a",
                            storage_options=clean(s3_server)) as recorder:
        simulate(tiny, 2, 56, recorder.record_as_needed)
    ds = open_archive(url, clean(s3_server))
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(ds.mocap_quat.values, expected["mocap_quat"])


def test_creating_an_archive_when_every_put_fails_is_a_storage_error(s3_server, tiny):
    url = new_url()
    with FaultProxy(s3_server.endpoint_url, FaultPlan(error500=1.0, methods={"PUT"})) as proxy:
        recorder = TrajectoryRecorder(url, tiny, storage_options=proxy.storage_options())

        with pytest.raises(StorageError) as err:
            simulate(tiny, 1, 4, recorder.record_as_needed)

    assert repr(url) in str(err.value)


# ----------------------------------------------------------------------------- read, render
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.sweep)])  # a read makes ~25 requests; seed 0's first fault is the 26th
def test_reading_through_faults_equals_the_clean_read_or_fails_clearly(s3_server, s3_archive, seed):
    result = s3_read_trial(s3_server, moderate(seed), s3_archive)

    assert result.faults["faults"] > 0
    assert result.outcome in ("equal", "clean-failure"), result


def test_opening_when_every_get_fails_is_a_storage_error(s3_server, s3_archive):
    with FaultProxy(s3_server.endpoint_url, FaultPlan(error503=1.0, methods={"GET"})) as proxy:
        with pytest.raises(StorageError) as err:
            open_archive(s3_archive, proxy.storage_options())

    assert repr(s3_archive) in str(err.value)


def test_rendering_through_faults_equals_the_clean_render_or_fails_clearly(s3_server, s3_archive):
    result = s3_render_trial(s3_server, moderate(3), s3_archive, size=(48, 64))

    assert result.faults["requests"] > 0
    assert result.outcome in ("equal", "clean-failure"), result


def test_render_videos_through_faults_writes_the_clean_videos_or_fails_clearly(
        s3_server, s3_archive, tmp_path):
    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.video import read_video

    options = RenderOptions(size=(48, 64), segment_frames=8)
    render_videos(s3_archive, tiny_model(), "front", str(tmp_path / "clean"), worlds=[1],
                  options=options, n_workers=0, storage_options=clean(s3_server))
    flaky = tmp_path / "flaky" / "world00001" / "front.mp4"
    plan = FaultPlan(error503=0.1, delay=0.1, delay_s=0.05, seed=5)

    with FaultProxy(s3_server.endpoint_url, plan) as proxy:
        try:
            render_videos(s3_archive, tiny_model(), "front", str(tmp_path / "flaky"), worlds=[1],
                          options=options, n_workers=0, storage_options=proxy.storage_options())
        except StorageError as err:  # allowed: a clear error, and no video
            assert repr(s3_archive) in str(err)
            assert not flaky.exists()
        else:
            expected = read_video(tmp_path / "clean" / "world00001" / "front.mp4")
            assert expected.shape == (15, 48, 64, 3)
            np.testing.assert_array_equal(read_video(flaky), expected)
        assert proxy.stats()["faults"] > 0


# ----------------------------------------------------------------------------- credentials
def test_credentials_never_appear_in_errors_or_logs_of_a_failing_s3_operation(
        s3_server, s3_archive, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    with FaultProxy(s3_server.endpoint_url, FaultPlan(error503=1.0)) as proxy:
        options = proxy.storage_options()
        secret = options["secret"]
        with pytest.raises(Exception) as err:
            open_archive(s3_archive, options).load()

    texts = [str(err.value), repr(err.value), "".join(traceback.format_exception(err.value)),
             caplog.text, *capsys.readouterr()]
    assert caplog.text  # botocore logged the failing requests
    for text in texts:
        assert secret not in text


# ----------------------------------------------------------------------------- stalls
def test_s3_client_defaults_fill_only_what_the_storage_options_leave_out():
    from flyarchive.store.storage_errors import S3_CLIENT_DEFAULTS, client_options

    given = {"key": "k", "config_kwargs": {"read_timeout": 300}}
    options = client_options("s3://lab/run.zarr", given)

    assert options["config_kwargs"] == {**S3_CLIENT_DEFAULTS, "read_timeout": 300}
    assert given == {"key": "k", "config_kwargs": {"read_timeout": 300}}  # not changed
    assert client_options("memory://run.zarr", {"a": 1}) == {"a": 1}
    assert client_options("/data/run.zarr", None) == {}


@pytest.fixture
def short_timeouts(s3_server, monkeypatch):
    """``(proxy, options)``: a fault proxy before the S3 server, and storage options that
    set no timeout, so that flyarchive's client defaults apply, here shrunk to 1 s without
    a byte and one attempt."""
    from flyarchive.store import storage_errors

    monkeypatch.setattr(storage_errors, "S3_CLIENT_DEFAULTS",
                        {"connect_timeout": 2, "read_timeout": 1,
                         "retries": {"total_max_attempts": 1, "mode": "standard"}})
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = proxy.storage_options(skip_instance_cache=True)
        for name in ("read_timeout", "connect_timeout", "retries"):
            del options["config_kwargs"][name]  # the user set none of them
        yield proxy, options


def test_a_server_that_stops_answering_mid_read_fails_the_read_in_bounded_time(
        short_timeouts, s3_archive):
    """The archive opens; then every GET waits for ever. botocore's own defaults (60 s
    without a byte, 5 attempts) times s3fs's 5 kept such a read waiting for 25 minutes;
    flyarchive's defaults bound it (here shrunk to 1 s and one attempt)."""
    import time

    proxy, options = short_timeouts
    ds = open_archive(s3_archive, options)
    proxy.plan = FaultPlan(delay=1.0, delay_s=600, methods={"GET"})
    start = time.monotonic()

    with pytest.raises(StorageError, match=s3_archive):
        ds.qpos.values

    assert time.monotonic() - start < 30  # 2 x 2 s3fs tries of 1 s, not 25 of 60 s x 5


@pytest.mark.timeout(120)
def test_a_server_that_stops_answering_mid_write_fails_the_write_in_bounded_time(
        short_timeouts, tiny):
    """Every upload asked for "100 Continue" first, and aiohttp counts the read timeout only
    once a body is sent: a recorder's commit waited for ever (more than 15 minutes) on a
    server that took the connection and stopped answering."""
    import time

    proxy, options = short_timeouts
    recorder = TrajectoryRecorder(new_url(), tiny, storage_options=options, chunk_frames=5)
    frames, stalled = [], []

    def step(datas):
        frames.extend([1] * recorder.record_as_needed(datas))
        if len(frames) == 7 and not stalled:  # one block of 5 committed
            proxy.plan = FaultPlan(silent=1.0, delay_s=600, methods={"PUT"})
            stalled.append(time.monotonic())

    with pytest.raises(StorageError, match="Writing frames 5..9"):
        simulate(tiny, 2, 60, step)

    assert time.monotonic() - stalled[0] < 30  # 2 s3fs tries of 1 s per step, not for ever
    proxy.plan = FaultPlan()
    recorder.close()


def test_verify_of_a_server_that_stops_answering_is_one_storage_error(short_timeouts,
                                                                     s3_archive, monkeypatch):
    """It was botocore's ReadTimeoutError, naming a URL of the listing and no fix."""
    from flyarchive.store import integrity

    proxy, options = short_timeouts
    real = integrity._verify_derived

    def stalled_after_opening(*args, **kwargs):  # the archive read, then silence
        proxy.plan = FaultPlan(silent=1.0, delay_s=600)
        return real(*args, **kwargs)

    monkeypatch.setattr(integrity, "_verify_derived", stalled_after_opening)

    with pytest.raises(StorageError, match=rf"{s3_archive}.*(nothing answered|did not answer)"):
        verify(s3_archive, options)
