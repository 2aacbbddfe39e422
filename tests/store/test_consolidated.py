"""Consolidated metadata: written at every commit after n_frames and never ahead of it,
so plain xarray opens an archive without warnings and open_archive opens one on S3
with one metadata request; verify checks it against the arrays' own metadata."""

import json
import logging
import re
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.store.integrity import verify
from flyarchive.testing import simulate
from flyarchive.testing.concurrency import RecorderPool
from flyarchive.testing.faultproxy import FaultProxy
from flyarchive.testing.kills import KillConfig, kill_trial
from flyarchive.testing.synthetic import write_random
from flyarchive.testing.verify_beside import reader_trial

BUCKET = "flyarchive-test"  # created by the s3_server fixture


def consolidated_shapes(url):
    root = json.loads((Path(url) / "zarr.json").read_text())
    listed = root["consolidated_metadata"]["metadata"]
    return {name: tuple(meta["shape"]) for name, meta in listed.items() if "shape" in meta}


def edit_root(url, edit):
    path = Path(url) / "zarr.json"
    root = json.loads(path.read_text())
    edit(root)
    path.write_text(json.dumps(root))


# ----------------------------------------------------------------------------- plain xarray
def test_plain_xarray_opens_a_recorded_archive_without_arguments_or_warnings(tiny, tmp_path):
    url = str(tmp_path / "run.zarr")
    with TrajectoryRecorder(url, tiny, chunk_frames=5) as recorder:
        simulate(tiny, 2, 76, recorder.record_as_needed)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(url)

    assert ds.sizes["time"] == 20
    assert np.array_equal(ds.qpos.values, open_archive(url).qpos.values)


def test_the_consolidated_time_extent_is_the_largest_n_frames(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=4, n_frames=40, shard_worlds=2, committed=np.array([30, 25, 0, 9]))

    shapes = consolidated_shapes(url)

    assert zarr.open_array(f"{url}/qpos", mode="r").shape == (4, 40, 13)  # written: 40
    assert shapes["qpos"] == (4, 30, 13)
    assert shapes["time"] == shapes["sim_time"] == shapes["frame"] == (30,)
    assert shapes["mocap_quat"] == (4, 30, 1, 4)


def test_a_commit_that_died_after_growing_the_arrays_leaves_the_copy_at_the_last_commit(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2, n_frames=20, shard_worlds=2)
    group = zarr.open_group(url, mode="r+", use_consolidated=False)
    for name in ("qpos", "mocap_pos", "mocap_quat"):  # step 1 of the next commit, then death
        group[name].resize((2, 40, *group[name].shape[2:]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = xr.open_zarr(url)

    assert plain.sizes["time"] == 20
    assert consolidated_shapes(url)["qpos"] == (2, 20, 13)
    assert verify(url).ok


def test_a_failed_consolidation_keeps_the_commit_and_the_next_commit_writes_it(tmp_path,
                                                                              monkeypatch):
    import flyarchive.store.writer as writer_module

    url = str(tmp_path / "run.zarr")
    real = writer_module.write_consolidated
    calls = []

    def fail_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second commit's step 5
            raise OSError("the storage failed")
        real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_consolidated", fail_once)
    write_random(url, n_worlds=2, n_frames=60, shard_worlds=2)

    assert open_archive(url).sizes["time"] == 60
    assert consolidated_shapes(url)["qpos"] == (2, 60, 13)
    assert len(calls) == 3


# ----------------------------------------------------------------------------- verify
def test_verify_reports_a_consolidated_shape_larger_than_the_arrays_own(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2, n_frames=20, shard_worlds=2)
    edit_root(url, lambda root: root["consolidated_metadata"]["metadata"]["world"].update(
        shape=[5]))

    report = verify(url)

    assert any("The metadata of 'world' disagrees with itself" in p
               and "shape ((5,) in the copy, (2,) in its own)" in p
               for p in report.problems), report.problems


def test_verify_reports_a_consolidated_time_extent_ahead_of_n_frames(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2, n_frames=20, shard_worlds=2)
    zarr.open_array(f"{url}/n_frames", mode="r+")[:] = [10, 12]

    report = verify(url)

    assert any("gives 'time' 20 frames, more than the 12 committed" in p
               for p in report.problems), report.problems


def test_verify_reports_consolidated_codecs_that_differ_from_the_arrays_own(tmp_path):
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=2, n_frames=20, shard_worlds=2)
    edit_root(url, lambda root: root["consolidated_metadata"]["metadata"]["time"].update(
        codecs=[{"name": "bytes", "configuration": {"endian": "little"}}]))

    report = verify(url)

    assert any("(the consolidated metadata of 'time'): the pipeline ['bytes'] does not end in "
               "one crc32c stage" in p for p in report.problems), report.problems
    assert any("The metadata of 'time' disagrees with itself" in p and "differ in codecs "
               "(bytes in the copy, bytes, crc32c in its own)" in p
               for p in report.problems), report.problems


# ----------------------------------------------------------------------------- harnesses
@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.sweep) for s in (1, 2))])
def test_after_a_sigkill_plain_xarray_opens_without_warning_and_nothing_is_ahead(tmp_path, seed):
    config = KillConfig(backend="cpu", seed=seed, chunk_frames=1, max_wait_frames=25)

    result = kill_trial(str(tmp_path / "killed.zarr"), config)

    assert result.killed
    assert result.problems == []  # plain open, verify's consolidated checks, resume


@pytest.mark.subprocess
@pytest.mark.timeout(240)
def test_s3_readers_polling_a_committing_writer_see_no_damage_and_nothing_ahead(s3_server):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr"

    with RecorderPool(1) as writer:  # 2 reads a commit waited for, 6 in all; then it stops
        result = reader_trial(writer, url, first_steps=4, n_steps=120, max_opens=6, plain=True,
                              storage_options=s3_server.storage_options())

    assert result.writer == "ok"
    assert result.damaged == 0, result.errors[:3]
    assert result.opens == 6 and result.commits_seen >= 2  # 3 groups of reads: 2 states at least
    assert result.reads_mid_commit > 0
    assert result.frames_differing == 0
    assert result.plain_ahead == 0


# ----------------------------------------------------------------------------- S3 requests
@pytest.fixture(scope="module")
def s3_archive(s3_server):
    """64 worlds x 40 frames on S3, read (never changed) by the tests below."""
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr"
    written = write_random(url, n_worlds=64, n_frames=40, storage_options=s3_server.storage_options())
    return url, written


def s3_calls(caplog):
    """(operation, key) of every S3 call s3fs made, from its debug log."""
    found = []
    for record in caplog.records:
        match = re.match(r"CALL: (\w+) - .*'Key': '([^']*)'", record.getMessage())
        if match:
            found.append(match.groups())
    return found


def test_open_archive_on_s3_reads_the_copy_first_then_the_own_metadata_beside_the_coordinates(
        s3_server, s3_archive, caplog):
    url, _ = s3_archive
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = proxy.storage_options()
        open_archive(url, options)  # s3fs sets itself up
        proxy.reset_stats()
        caplog.set_level(logging.DEBUG, logger="s3fs")

        open_archive(url, options)
        requests = proxy.stats()["requests"]

    prefix = url.removeprefix(f"s3://{BUCKET}/")
    calls = [key for _, key in s3_calls(caplog)]
    metadata = [key for key in calls if key.endswith("zarr.json")]
    names = ["mocap_pos", "mocap_quat", "n_frames", "qpos", "time", "world"]  # copies.OWN_CHECKED
    assert calls[0] == f"{prefix}/zarr.json"  # the copy, before any array's own metadata
    assert sorted(metadata[1:]) == [f"{prefix}/{name}/zarr.json" for name in names]
    # one round after the root: the own zarr.json of state and of the numbers read at open,
    # and one request per coordinate chunk: n_frames, 2 each of time, sim_time and frame,
    # world, dof, 3 of labels
    assert requests == 1 + len(names) + 12


def test_open_archive_on_s3_asks_for_no_object_sizes(s3_server, s3_archive, caplog):
    url, _ = s3_archive
    open_archive(url, s3_server.storage_options())
    caplog.set_level(logging.DEBUG, logger="s3fs")

    open_archive(url, s3_server.storage_options())

    operations = {op for op, _ in s3_calls(caplog)}
    assert operations == {"get_object"}


def test_one_world_of_64_on_s3_moves_about_its_own_bytes(s3_server, s3_archive):
    url, written = s3_archive
    with FaultProxy(s3_server.endpoint_url) as proxy:
        ds = open_archive(url, proxy.storage_options())
        ds.qpos.isel(world=3).values  # warm-up
        proxy.reset_stats()

        values = ds.qpos.isel(world=33).values
        moved = proxy.stats()["bytes_out"]

    assert np.array_equal(values, written[33])
    assert moved < 3 * written[33].nbytes  # the shard is 64x


def test_open_archive_on_s3_reads_the_arrays_own_metadata_when_the_copy_lags(s3_server,
                                                                           monkeypatch):
    import flyarchive.store.writer as writer_module

    url = f"s3://{BUCKET}/{uuid.uuid4().hex}.zarr"
    real = writer_module.write_consolidated
    monkeypatch.setattr(writer_module, "write_consolidated",
                        lambda group, members, n_time, *attrs: real(group, members,
                                                                   min(n_time, 20), *attrs))
    written = write_random(url, n_worlds=2, n_frames=60, shard_worlds=2,
                           storage_options=s3_server.storage_options())  # copy stays at 20

    ds = open_archive(url, s3_server.storage_options())

    assert ds.sizes["time"] == 60
    assert np.array_equal(ds.qpos.values, written)


def test_plain_xarray_opens_an_imported_archive_without_warnings(tiny, tmp_path):
    from flyarchive.interop.flygym_npz import import_npz
    from flyarchive.testing import reference_frames

    frames = reference_frames(tiny, 1, 40)
    np.savez(tmp_path / "walk.npz", time=frames["time"], qpos=frames["qpos"][0],
             mocap_pos=frames["mocap_pos"][0], mocap_quat=frames["mocap_quat"][0],
             output_fps=np.asarray(25.0), playback_speed=np.asarray(0.2), world_id=np.asarray(0))
    url = str(tmp_path / "imported.zarr")
    import_npz(tmp_path / "walk.npz", url, tiny)  # its last step rewrites the root attributes

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(url)

    assert ds.attrs["npz_import"]["state"] == "complete"
    assert ds.sizes["time"] == 11
