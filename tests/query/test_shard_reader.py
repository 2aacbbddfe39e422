"""The shard reader behind open_archive: it reads any box as zarr does (both codecs, on
every storage backend, unwritten chunks as the fill value), keeps the indexes of the shards
that can no longer change (a repeated query on S3: one request per shard, and one for the
archive's identity), and never serves a stale index after a writer appends frames."""

import uuid

import numpy as np
import pytest
import zarr

from flyarchive import open_archive
from flyarchive.store.opener import open_for_reading
from flyarchive.store.shards import ShardReader, settled_shards
from flyarchive.testing.fixtures import Location
from flyarchive.testing.synthetic import TIMING

BOXES = {
    "everything": (slice(0, 6), slice(0, 45), slice(0, 13)),
    "one world": (slice(4, 5), slice(0, 45), slice(0, 13)),
    "worlds across shards, part of the frames": (slice(1, 6), slice(7, 38), slice(0, 13)),
    "one frame": (slice(0, 6), slice(44, 45), slice(0, 13)),
    "one dof of one world": (slice(2, 3), slice(0, 45), slice(5, 6)),
    "empty": (slice(3, 3), slice(0, 45), slice(0, 13)),
}


def write_archive(url, qpos, *, codec="lossless", chunk_frames=10, shard_worlds=4,
                  storage_options=None, frames=None):
    """Write ``qpos`` (worlds, frames, 13) of the tiny model, committing ``frames`` frames
    at a time (default: one chunk), with ``codec``."""
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter
    from flyarchive.testing import tiny_model

    spec = ArchiveSpec(ModelLayout.from_model(tiny_model()), TIMING, tuple(range(len(qpos))),
                       chunk_frames=chunk_frames, shard_worlds=shard_worlds, codec=codec)
    with ArchiveWriter.create(url, spec, storage_options=storage_options) as writer:
        append_to(writer, qpos, 0, frames or chunk_frames)


def append_to(writer, qpos, t0, step):
    from flyarchive.store import FrameBlock

    n_worlds = len(qpos)
    for a in range(0, qpos.shape[1], step):
        part = qpos[:, a:a + step]
        frames = np.arange(t0 + a, t0 + a + part.shape[1])
        zeros = np.zeros((n_worlds, len(frames), 1, 3))
        writer.write(FrameBlock(TIMING.frame_times(frames), part, zeros,
                                np.tile([1.0, 0, 0, 0], (n_worlds, len(frames), 1, 1)),
                                frame=frames))


def append_frames(url, qpos, t0, storage_options=None):
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveWriter
    from flyarchive.testing import tiny_model

    layout = ModelLayout.from_model(tiny_model())
    with ArchiveWriter.append(url, layout, storage_options=storage_options) as writer:
        append_to(writer, qpos, t0, qpos.shape[1])


def shard_reader(url, storage_options=None, name="qpos"):
    arr = open_for_reading(url, storage_options, consolidated=False, attributes_only=True)[name]
    return arr, ShardReader(arr)


# ----------------------------------------------------------------------------- reading
@pytest.mark.parametrize("codec", ["lossless", "portable"])
def test_every_box_reads_as_zarr_reads_it(tmp_path, codec):
    url = str(tmp_path / "run.zarr")
    write_archive(url, np.random.default_rng(0).normal(size=(6, 45, 13)), codec=codec)
    arr, reader = shard_reader(url)

    got = {name: reader.read(box) for name, box in BOXES.items()}

    for name, box in BOXES.items():
        assert np.array_equal(got[name], arr[box]), name


@pytest.fixture(scope="module")
def s3_archive(s3_server):
    """8 worlds x 45 frames on S3 in commits of 15 (shards of 4 worlds x 10 frames: 4
    settled, the 5th still being written), read (never changed) by the tests below: its
    location and qpos."""
    location = Location(f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr",
                        s3_server.storage_options())
    qpos = np.random.default_rng(2).normal(size=(8, 45, 13))
    write_archive(location.url, qpos, storage_options=location.storage_options, frames=15)
    return location, qpos


@pytest.mark.parametrize("storage", ["memory", "local", "s3"])
def test_every_box_reads_as_zarr_reads_it_on_every_storage(storage, tmp_path, request):
    if storage == "s3":
        location, _ = request.getfixturevalue("s3_archive")
    else:
        location = Location(f"memory://{uuid.uuid4().hex}.zarr" if storage == "memory"
                            else str(tmp_path / "run.zarr"))
        write_archive(location.url, np.random.default_rng(1).normal(size=(6, 45, 13)))
    arr, reader = shard_reader(location.url, location.storage_options)

    got = {name: reader.read(box) for name, box in BOXES.items()}

    for name, box in BOXES.items():
        assert np.array_equal(got[name], arr[box]), name


def test_shards_and_inner_chunks_never_written_read_as_the_fill_value(tmp_path):
    arr = zarr.create_array(str(tmp_path / "plain.zarr"), shape=(8, 30, 3), dtype="float64",
                            chunks=(1, 10, 3), shards=(4, 10, 3), fill_value=np.nan)
    arr[1, 0:10] = 1.0  # one inner chunk of the first shard; the other shards are missing
    arr[5, 20:30] = 2.0
    reader = ShardReader(arr)

    got = reader.read((slice(0, 8), slice(0, 30), slice(0, 3)))

    expected = np.full((8, 30, 3), np.nan)
    expected[1, 0:10], expected[5, 20:30] = 1.0, 2.0
    assert np.array_equal(got, expected, equal_nan=True)


def test_the_shards_settled_are_those_below_the_smallest_commit_of_all_worlds():
    committed = np.array([250, 400, 320])

    settled = settled_shards(committed, 100)

    assert settled == 2  # frames 0..199; frames 200..299 of world 0 may still be written
    assert settled_shards(None, 100) == 0


# ----------------------------------------------------------------------------- the index cache
def requests_of(proxy, action):
    proxy.reset_stats()
    action()
    return proxy.stats()["requests"]


def test_a_repeated_query_reads_again_only_the_index_of_the_shard_still_being_written(
        s3_server, s3_archive):
    from flyarchive.testing.faultproxy import FaultProxy

    location, qpos = s3_archive
    with FaultProxy(s3_server.endpoint_url) as proxy:
        ds = open_archive(location.url, proxy.storage_options())

        first = requests_of(proxy, lambda: ds.qpos.isel(world=1).values)
        again = requests_of(proxy, lambda: ds.qpos.isel(world=1).values)
        other = requests_of(proxy, lambda: ds.qpos.isel(world=2).values)
        values = ds.qpos.isel(world=2).values

    # per shard: its index, then the world's inner chunk; then the archive's identity
    assert first == 5 + 5 + 1
    # the 4 settled shards: the chunk only; the 5th (5 of 10 frames): its index again
    assert again == 4 + 2 + 1
    assert other == 4 + 2 + 1  # same shards, another world: the indexes are kept too
    assert np.array_equal(values, qpos[2])


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_reads_after_frames_are_appended_see_no_stale_shard(storage, tmp_path, request):
    location = (request.getfixturevalue("s3_location") if storage == "s3"
                else Location(str(tmp_path / "run.zarr")))
    url, so = location.url, location.storage_options
    rng = np.random.default_rng(4)
    qpos = rng.normal(size=(4, 30, 13))
    qpos[:, 15:] = np.round(qpos[:, 15:], 1)  # compresses better: shard 1's layout changes
    write_archive(url, qpos[:, :15], storage_options=so, frames=15)  # shard 1 holds 5 frames
    before = open_archive(url, so)
    first = before.qpos.isel(world=2).values  # keeps the indexes of the settled shards
    index_then = shard_index(url, so)

    append_frames(url, qpos[:, 15:], 15, storage_options=so)
    again = before.qpos.isel(world=2).values
    after = open_archive(url, so).qpos.isel(world=2).values

    assert shard_index(url, so) != index_then  # the append rewrote shard 1: a new layout
    assert np.array_equal(first, qpos[2, :15])
    assert np.array_equal(again, qpos[2, :15])
    assert np.array_equal(after, qpos[2])


def shard_index(url, storage_options):
    """The stored bytes of the index of qpos's shard 1 (worlds 0..3, frames 10..19)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs.cat_file(f"{path}/qpos/c/0/1/0")[-(16 * 4 + 4):]


# ----------------------------------------------------------------------------- dask
def test_a_full_scan_runs_on_a_distributed_cluster_of_worker_processes(tmp_path, dask_client):
    url = str(tmp_path / "run.zarr")
    qpos = np.random.default_rng(5).normal(size=(6, 45, 13))
    write_archive(url, qpos)
    ds = open_archive(url)

    with dask_client.as_current():
        mean = ds.qpos.mean(("world", "time")).values  # the getter travels to the worker

    assert np.allclose(mean, qpos.mean(axis=(0, 1)), rtol=1e-12, atol=0)


def test_open_archive_reads_every_state_variable_through_a_shard_reader(tmp_path):
    from flyarchive.store.dataset import CommittedFrames

    url = str(tmp_path / "run.zarr")
    write_archive(url, np.random.default_rng(6).normal(size=(4, 20, 13)))
    ds = open_archive(url)

    getters = [value for name in ("qpos", "mocap_pos", "mocap_quat")
               for layer in ds[name].data.dask.layers.values() for task in layer.values()
               for arg in getattr(task, "args", ())
               if isinstance(value := getattr(arg, "value", None), CommittedFrames)]

    assert len(getters) >= 3
    assert all(isinstance(g.reader, ShardReader) for g in getters)


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_indexes_loaded_ahead_leave_a_first_read_only_its_chunks_to_fetch(storage, tmp_path,
                                                                           s3_server, s3_archive):
    from flyarchive.testing.faultproxy import FaultProxy

    location, qpos = s3_archive
    with FaultProxy(s3_server.endpoint_url) as proxy:
        url, options = location.url, proxy.storage_options()
        if storage == "local":  # the same archive copied to disk; the proxy counts nothing
            url, options = str(tmp_path / "run.zarr"), None
            write_archive(url, qpos, frames=15)
        arr = open_for_reading(url, options, consolidated=False, attributes_only=True)["qpos"]
        reader = ShardReader(arr, settled=(1, 4))
        proxy.reset_stats()
        kept = reader.load_indexes()
        ahead = proxy.stats()["requests"]
        first = requests_of(proxy, lambda: reader.read(BOXES["one world"]))
        values = reader.read(BOXES["one world"])

    assert kept == 8  # 2 shards of worlds x the 4 settled shards of frames
    if storage == "s3":
        assert ahead == 8  # one request per index, concurrently
        assert first == 4 + 2  # the 4 settled shards: the chunk only; the 5th: index, chunk
    assert np.array_equal(values, qpos[4:5])
