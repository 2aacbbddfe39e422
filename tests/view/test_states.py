"""The viewer's states, read through the archive's getters without xarray or dask (by
worker processes into shared memory, or on the request's thread), are what
:func:`flyarchive.open_archive` reads: bit for bit, in the stored dtype, NaN past each
world's ``n_frames``, mocap poses, and the same damaged or missing chunk named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flyarchive.errors import CorruptArchiveError
from flyarchive.testing.fixtures import copy_archive, snapshot

WORLD_IDS = (10, 11, 12, 13)
N_FRAMES = np.array([12, 20, 3, 17])


@pytest.fixture(scope="module", params=["float64", "float32"])
def uneven(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, dict[str, np.ndarray], str]:
    """``(url, written, dtype)``: 4 tiny worlds of random states with mocap poses, committed to
    different frames (:data:`N_FRAMES`), two worlds per shard, stored as ``dtype``."""
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.models import model_bytes
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import tiny_model

    tiny = tiny_model()
    rng = np.random.default_rng(7)
    written = {"qpos": np.tile(tiny.qpos0, (4, 20, 1)) + rng.normal(0, 0.3, (4, 20, tiny.nq)),
               "mocap_pos": rng.normal(0, 0.5, (4, 20, 1, 3)),
               "mocap_quat": rng.normal(0, 1, (4, 20, 1, 4))}
    written["mocap_quat"] /= np.linalg.norm(written["mocap_quat"], axis=-1, keepdims=True)
    url = str(tmp_path_factory.mktemp("states") / "uneven.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(0.002, 25, 0.2), WORLD_IDS,
                       dtype=request.param, chunk_frames=5, shard_worlds=2,
                       model=model_bytes(tiny))
    with ArchiveWriter.create(url, spec) as writer:
        writer.write(FrameBlock(np.arange(20) * 0.008, written["qpos"], written["mocap_pos"],
                                written["mocap_quat"]), n_frames=N_FRAMES)
    return url, written, request.param


def dataset_states(url: str, index: int) -> dict[str, np.ndarray]:
    """World ``index``'s states as the viewer read them before (the lazy dataset)."""
    import flyarchive

    one = flyarchive.open_archive(url).isel(world=index)
    return {name: np.asarray(one[name].values) for name in ("qpos", "mocap_pos", "mocap_quat")}


#: How the viewer reads: two worker processes, or the request's own thread.
READS = pytest.mark.parametrize("processes", [pytest.param(2, marks=pytest.mark.subprocess), 0],
                                ids=["processes", "thread"])


@READS
def test_states_are_the_datasets_values_bit_for_bit(uneven, processes):
    from flyarchive.view.shown_archive import ViewedArchive

    url, _, stored = uneven
    viewed = ViewedArchive(url, processes=processes)

    actual = viewed.states([13, 10, 12, 11])

    assert viewed.processes == processes
    for states, index in zip(actual, [3, 0, 2, 1]):
        expected = dataset_states(url, index)
        assert sorted(states) == sorted(expected)
        for name, values in expected.items():
            assert states[name].dtype == np.dtype(stored) == values.dtype
            assert states[name].shape == values.shape
            assert states[name].tobytes() == values.tobytes(), (name, index)


@READS
def test_each_world_kept_is_its_own_array(uneven, processes):
    """A world kept in the cache holds its own memory, not a view of the whole read
    (which would keep every world read with it alive)."""
    from flyarchive.view.shown_archive import ViewedArchive

    viewed = ViewedArchive(uneven[0], processes=processes)

    actual = viewed.states([10, 11, 12])

    for states in actual:
        for values in states.values():
            assert values.base is None and values.flags.owndata


@READS
def test_states_hold_what_was_written_and_nan_past_each_worlds_frames(uneven, processes):
    from flyarchive.view.shown_archive import ViewedArchive

    url, written, stored = uneven
    viewed = ViewedArchive(url, processes=processes)

    actual = viewed.states(list(WORLD_IDS))

    for index, (states, n) in enumerate(zip(actual, N_FRAMES)):
        for name, values in written.items():
            expected = values[index, :n].astype(stored).astype(np.float64)
            np.testing.assert_array_equal(states[name][:n], expected)
            assert np.isnan(states[name][n:]).all() and states[name].shape[0] == 20


def test_states_come_from_the_cache_the_second_time(uneven, monkeypatch):
    from flyarchive.view.shown_archive import ViewedArchive

    viewed = ViewedArchive(uneven[0])
    first = viewed.states([11])[0]
    monkeypatch.setattr(viewed, "_getters", {})  # a read now would find no arrays

    second = viewed.states([11])[0]

    assert second["qpos"] is first["qpos"]


@READS
@pytest.mark.parametrize("damage, fragment", [
    ("flip", "file qpos/c/1/0/0"),
    ("delete", "qpos/c/1/0/0"),
])
def test_a_damaged_chunk_is_named_as_the_dataset_names_it(uneven, tmp_path, damage, fragment,
                                                          processes):
    from flyarchive.testing import flip_bits, shard_file
    from flyarchive.testing.holes import delete_object
    from flyarchive.view.shown_archive import ViewedArchive

    url = copy_archive(uneven[0], tmp_path / "damaged.zarr")
    if damage == "flip":
        flip_bits(shard_file(url, "qpos", 1, 0), at=0.25, mask=0x10)
    else:
        delete_object(url, "qpos/c/1/0/0")
    viewed = ViewedArchive(url, processes=processes)
    before = snapshot(url)

    with pytest.raises(CorruptArchiveError) as caught:
        viewed.states([12, 13])
    with pytest.raises(CorruptArchiveError) as by_dataset:
        for index in (2, 3):
            dataset_states(url, index)

    assert fragment in str(caught.value) and fragment in str(by_dataset.value)
    assert "flyarchive verify" in str(caught.value)
    assert viewed.states([10])[0]["qpos"].shape[0] == 20  # other shards still read
    assert 12 not in viewed._kept_states and 13 not in viewed._kept_states
    assert snapshot(url) == before  # nothing written


def test_states_read_the_same_on_every_storage(uneven, location):
    from flyarchive.view.shown_archive import ViewedArchive

    url = copy_archive(uneven[0], location.url, location.storage_options)
    expected = ViewedArchive(uneven[0]).states(list(WORLD_IDS))

    actual = ViewedArchive(url, location.storage_options).states(list(WORLD_IDS))

    for got, want in zip(actual, expected):
        assert all(got[name].tobytes() == want[name].tobytes() for name in want)
