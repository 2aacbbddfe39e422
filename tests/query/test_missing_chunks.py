"""Frames at or past a world's n_frames are not data: their shards and inner chunks may be
missing, and reads of them stay legal (masked as NaN), without a request more than a
sound read makes. Inside n_frames missing is damage: tests/bad_input/test_missing_chunks.py."""

import uuid

import numpy as np
import pytest
import zarr

from flyarchive import open_archive
from flyarchive.store import StateReader
from flyarchive.store.shards import NeverWritten, ShardReader
from flyarchive.testing.fixtures import Location
from flyarchive.testing.holes import delete_object, empty_inner_chunks
from flyarchive.testing.synthetic import write_random

# 4 worlds x 40 frames, shards of 2 worlds x 10 frames; worlds 2 and 3 commit 15 and 10
COMMITTED = np.array([40, 40, 15, 10])


def ragged(location):
    """The archive with the stored objects past n_frames removed, as a writer that never
    wrote them leaves it: whole shards (worlds 2-3, frames 20..39) and world 3's inner
    chunk of frames 10..19 (its shard holds world 2's committed frames 10..14)."""
    url, so = location.url, location.storage_options
    written = write_random(url, n_worlds=4, n_frames=40, chunk_frames=10, shard_worlds=2,
                           committed=COMMITTED, storage_options=so)
    for t in (2, 3):
        for name, tail in (("qpos", "/0"), ("mocap_pos", "/0/0"), ("mocap_quat", "/0/0")):
            delete_object(url, f"{name}/c/1/{t}{tail}", so)
    empty_inner_chunks(url, "qpos/c/1/1/0", [1], so)
    return written


@pytest.fixture(scope="module")
def s3_ragged(s3_server):
    """:func:`ragged` on S3, read (never changed) by the tests below: its location and data."""
    location = Location(f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr",
                        s3_server.storage_options())
    return location, ragged(location)


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_missing_chunks_past_n_frames_read_as_masked_frames(storage, tmp_path, request):
    if storage == "s3":
        location, written = request.getfixturevalue("s3_ragged")
    else:
        location = Location(str(tmp_path / "run.zarr"))
        written = ragged(location)
    ds = open_archive(location.url, location.storage_options)

    qpos = ds.qpos.values

    committed = np.arange(40)[None, :] < COMMITTED[:, None]
    assert np.array_equal(qpos[committed], written[committed])
    assert np.isnan(qpos[~committed]).all()
    assert np.isnan(ds.mocap_quat.isel(world=3).values[10:]).all()


def test_a_read_past_n_frames_makes_no_request_more_than_a_sound_read(s3_server, s3_ragged):
    from flyarchive.testing.faultproxy import FaultProxy

    location, _ = s3_ragged
    with FaultProxy(s3_server.endpoint_url) as proxy:
        ds = open_archive(location.url, proxy.storage_options())
        proxy.reset_stats()
        ds.qpos.isel(world=3).values

        requests = proxy.stats()["requests"]

    # frames 0..9: the shard's index and world 3's chunk; 10..19: the index (world 3's entry
    # is empty); 20..29 and 30..39: a request for the index each (no shard); the identity
    assert requests == 2 + 1 + 2 + 1


def test_the_render_state_reader_reads_committed_frames_beside_missing_ones(tmp_path):
    location = Location(str(tmp_path / "run.zarr"))
    written = ragged(location)
    reader = StateReader(location.url)

    qpos = reader.read_boxes([(2, 3, 0, 15), (3, 4, 0, 10)], dtype=np.float64)["qpos"]

    assert np.array_equal(qpos, np.concatenate([written[2, :15], written[3, :10]]))


def test_the_shard_reader_lists_the_inner_chunks_it_found_empty(tmp_path):
    arr = zarr.create_array(str(tmp_path / "plain.zarr"), shape=(4, 20, 3), dtype="float64",
                            chunks=(1, 10, 3), shards=(2, 10, 3), fill_value=np.nan)
    arr[0:2, 0:10] = 1.0  # shard (0, 0) whole
    arr[2, 0:10] = 2.0  # shard (1, 0): world 3's inner chunk never written
    empty = []

    ShardReader(arr).read((slice(1, 4), slice(5, 20), slice(0, 3)), never_written=empty)

    assert sorted(empty, key=lambda e: e.region) == [
        NeverWritten(((1, 2), (10, 20), (0, 3)), "c/0/1/0", True),
        NeverWritten(((2, 3), (10, 20), (0, 3)), "c/1/1/0", True),
        NeverWritten(((3, 4), (0, 10), (0, 3)), "c/1/0/0", False),
        NeverWritten(((3, 4), (10, 20), (0, 3)), "c/1/1/0", True),
    ]
