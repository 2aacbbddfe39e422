"""Queries at scale: a selection reads only the stored chunks it touches, frames past
n_frames are masked inside the read, a damaged chunk fails only the reads that touch it
(naming it), reads equal zarr's bit for bit (the damaged-chunk probes go through zarr's
fused codec pipeline), and dask names change whenever the data can. The shard reader
itself: test_shard_reader.py."""

import numpy as np
import pytest
import zarr

from flyarchive import open_archive
from flyarchive.errors import CorruptArchiveError
from flyarchive.testing.synthetic import write_random as synthetic


def bytes_read():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def bytes_read_by(read):
    """Bytes this process reads while ``read()`` runs: the least of three runs, as other
    threads (a test worker's channel, a Dask client's heartbeats) may read at the same time."""
    counts = []
    for _ in range(3):
        before = bytes_read()
        read()
        counts.append(bytes_read() - before)
    return min(counts)


def stored_bytes_of_world(url, world, shard_worlds=64):
    """Bytes of a world's inner chunks of qpos, from the shard indexes."""
    from pathlib import Path

    total = 0
    folder = Path(url) / "qpos" / "c" / str(world // shard_worlds)
    for shard in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = shard.read_bytes()
        index = np.frombuffer(data[-(16 * shard_worlds + 4):-4], "<u8").reshape(-1, 2)
        total += int(index[world % shard_worlds, 1])
    return total


def getter_of(data_array):
    """The array-like dask reads ``data_array`` through."""
    from flyarchive.store.dataset import CommittedFrames

    for layer in data_array.data.dask.layers.values():
        for task in layer.values():
            for arg in getattr(task, "args", ()):
                value = getattr(arg, "value", None)
                if isinstance(value, CommittedFrames):
                    return value
    raise AssertionError("no CommittedFrames in the graph")


# ----------------------------------------------------------------------------- narrowing
def test_one_world_of_a_64_world_shard_reads_about_its_own_bytes(tmp_path):
    url = str(tmp_path / "run.zarr")
    committed = np.full(64, 40)
    committed[7] = 25  # a partly committed world: the mask is on
    synthetic(url, committed=committed)
    ds = open_archive(url)
    ds.qpos.isel(world=2).values  # warm-up: imports, metadata
    own = stored_bytes_of_world(url, 33)

    read = bytes_read_by(lambda: ds.qpos.isel(world=33).values)

    assert read < 3 * own, (read, own)  # the whole shard is 64x


def test_a_time_window_of_one_world_reads_only_that_windows_chunks(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_frames=80)
    ds = open_archive(url)
    ds.qpos.isel(world=2, time=slice(0, 5)).values  # warm-up
    own = stored_bytes_of_world(url, 33)  # four chunks of 20 frames

    read = bytes_read_by(lambda: ds.qpos.isel(world=33, time=slice(41, 45)).values)

    assert read < own / 2, (read, own)


def test_dask_chunks_are_whole_shards_by_several_chunks_of_frames(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=8, n_frames=60, chunk_frames=10, shard_worlds=4)

    chunks = open_archive(url).qpos.chunks

    assert chunks[0] == (4, 4)
    assert chunks[1] == (60,)  # 60 frames x 4 worlds is far below the target size


# ----------------------------------------------------------------------------- the mask
def test_frames_past_n_frames_read_as_nan_and_frames_inside_are_bit_exact(tmp_path):
    url = str(tmp_path / "run.zarr")
    committed = np.array([40, 25, 0, 33])
    written = synthetic(url, n_worlds=4, committed=committed, shard_worlds=2)

    qpos = open_archive(url).qpos.values

    assert qpos.shape == (4, 40, 13)
    for w, n in enumerate(committed):
        assert np.array_equal(qpos[w, :n], written[w, :n])
        assert np.isnan(qpos[w, n:]).all()


def test_selections_of_a_partly_committed_archive_match_the_full_read(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=4, committed=np.array([40, 25, 0, 33]), shard_worlds=2)
    ds = open_archive(url)
    full = ds.qpos.values

    picked = {
        "one world": (ds.qpos.isel(world=1).values, full[1]),
        "one frame": (ds.qpos.isel(time=30).values, full[:, 30]),
        "worlds listed": (ds.qpos.isel(world=[3, 1]).values, full[[3, 1]]),
        "reversed frames": (ds.qpos.isel(time=slice(None, None, -1)).values, full[:, ::-1]),
        "one dof": (ds.qpos.isel(dof=4).values, full[:, :, 4]),
    }

    for name, (got, expected) in picked.items():
        assert np.array_equal(got, expected, equal_nan=True), name


def test_an_archive_whose_worlds_hold_every_frame_is_read_without_a_mask(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=4, shard_worlds=2)

    getter = getter_of(open_archive(url).qpos)

    assert getter.n_frames is None


# ----------------------------------------------------------------------------- errors
def flip_inner_chunk(url, world, shard_worlds):
    """Flip a bit in the middle of ``world``'s first inner chunk of qpos."""
    from pathlib import Path

    shard = Path(url) / "qpos" / "c" / str(world // shard_worlds) / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-(16 * shard_worlds + 4):-4]), "<u8").reshape(-1, 2)
    offset, size = (int(v) for v in index[world % shard_worlds])
    data[offset + size // 2] ^= 0x40
    shard.write_bytes(bytes(data))


def test_a_flipped_bit_fails_the_read_of_its_world_naming_world_frames_and_file(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=8, shard_worlds=8, world_ids=range(100, 108))
    flip_inner_chunk(url, 5, 8)
    ds = open_archive(url)

    with pytest.raises(CorruptArchiveError) as err:
        ds.qpos.isel(world=5).values

    assert "qpos [world 105 (index 5), frames 0..19] (file qpos/c/0/0/0)" in str(err.value)
    assert f"flyarchive verify {url}" in str(err.value)


def test_a_flipped_bit_in_one_world_leaves_the_other_worlds_of_its_shard_readable(tmp_path):
    url = str(tmp_path / "run.zarr")
    written = synthetic(url, n_worlds=8, shard_worlds=8)
    flip_inner_chunk(url, 5, 8)

    other = open_archive(url).qpos.isel(world=4).values

    assert np.array_equal(other, written[4])


# ----------------------------------------------------------------------------- pipeline, names
def test_reads_go_through_zarrs_fused_pipeline_bit_for_bit(tmp_path):
    url = str(tmp_path / "run.zarr")
    written = synthetic(url, n_worlds=8, shard_worlds=4)
    ds = open_archive(url)

    values = ds.qpos.values

    pipeline = getter_of(ds.qpos).arr.async_array.codec_pipeline
    assert type(pipeline).__name__ == "FusedCodecPipeline"
    assert np.array_equal(values, written)
    assert np.array_equal(values, zarr.open_array(f"{url}/qpos", mode="r")[:])  # default pipeline


def test_the_dask_name_is_the_same_for_the_same_data(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=2, shard_worlds=2)

    first, second = open_archive(url), open_archive(url)

    assert first.qpos.data.name == second.qpos.data.name


def test_the_dask_name_changes_when_the_archive_is_replaced_by_one_of_the_same_shape(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=2, shard_worlds=2, seed=0)
    before = open_archive(url).qpos.data.name

    synthetic(url, n_worlds=2, shard_worlds=2, seed=1, mode="w")

    assert open_archive(url).qpos.data.name != before


def test_the_dask_name_changes_when_a_world_commits_more_frames(tmp_path):
    url = str(tmp_path / "run.zarr")
    synthetic(url, n_worlds=2, shard_worlds=2, committed=np.array([40, 20]))
    before = open_archive(url).qpos.data.name

    zarr.open_array(f"{url}/n_frames", mode="r+")[1] = 40

    assert open_archive(url).qpos.data.name != before
