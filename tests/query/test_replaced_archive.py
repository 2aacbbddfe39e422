"""A dataset opened with open_archive reads only the archive it opened: once the archive is
replaced (written again with mode="w") or deleted, the next read raises an ArchiveReplacedError (a StorageError) that
says so and to call open_archive again; it never returns the new archive's data or a mix
of both (the shard reader's kept indexes would point into the new shards)."""

import shutil
import threading
import uuid

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.errors import ArchiveReplacedError
from flyarchive.testing.fixtures import Location
from flyarchive.testing.synthetic import TIMING

SHAPE = (8, 40, 13)  # 2 shards of 4 worlds x 4 shards of 10 frames, every one settled


def write(url, qpos, *, mode="w-", storage_options=None):
    """An archive of ``qpos`` (worlds, frames, 13) of the tiny model, chunks of 10 frames,
    shards of 4 worlds; ``mode="w"`` replaces what is at ``url``."""
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import tiny_model

    n_worlds, n_frames = qpos.shape[:2]
    spec = ArchiveSpec(ModelLayout.from_model(tiny_model()), TIMING, tuple(range(n_worlds)),
                       chunk_frames=10, shard_worlds=4)
    frames = np.arange(n_frames)
    with ArchiveWriter.create(url, spec, mode=mode, storage_options=storage_options) as writer:
        writer.write(FrameBlock(TIMING.frame_times(frames), qpos, np.zeros((*qpos.shape[:2], 1, 3)),
                                np.tile([1.0, 0, 0, 0], (*qpos.shape[:2], 1, 1)), frame=frames))


def data(seed):
    return np.random.default_rng(seed).normal(size=SHAPE)


@pytest.fixture(scope="module", params=["local", "s3"])
def replaced(request, tmp_path_factory):
    """An archive opened twice, once with world 1 read (it keeps the indexes of its four
    shards), then replaced: its location and the two datasets. The tests only read it."""
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        place = Location(f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr",
                         server.storage_options())
    else:
        place = Location(str(tmp_path_factory.mktemp("replaced") / "run.zarr"))
    write(place.url, data(0), storage_options=place.storage_options)
    one_world, whole = (open_archive(place.url, place.storage_options) for _ in range(2))
    one_world.qpos.isel(world=1).values
    write(place.url, data(1), mode="w", storage_options=place.storage_options)
    return place, one_world, whole


def test_one_world_read_after_the_archive_is_replaced_raises_and_says_to_reopen(replaced):
    place, ds, _ = replaced

    with pytest.raises(ArchiveReplacedError) as err:
        ds.qpos.isel(world=1).values

    message = str(err.value)
    assert f"archive at {place.url!r} was replaced after it was opened" in message
    assert f"open_archive({place.url!r}) again" in message


def test_full_read_after_the_archive_is_replaced_raises(replaced):
    _, _, ds = replaced

    with pytest.raises(ArchiveReplacedError) as err:
        ds.qpos.values  # whole shards: no kept index, the new archive's bytes

    assert "was replaced after it was opened" in str(err.value)


def test_a_read_after_the_archive_is_deleted_raises(tmp_path):
    url = str(tmp_path / "run.zarr")
    write(url, data(0))
    ds = open_archive(url)
    ds.qpos.isel(world=1).values

    shutil.rmtree(url)
    with pytest.raises(ArchiveReplacedError) as err:
        ds.qpos.isel(world=1).values

    assert "root zarr.json is gone" in str(err.value)


def test_the_archive_opened_again_after_a_replacement_reads_the_new_data(tmp_path):
    url = str(tmp_path / "run.zarr")
    write(url, data(0))
    open_archive(url).qpos.isel(world=1).values
    write(url, data(1), mode="w")

    values = open_archive(url).qpos.isel(world=1).values

    assert np.array_equal(values, data(1)[1])


def outcome(ds, worlds, expected):
    """What a read of ``worlds`` gives: "opened archive" (``expected``), "replaced" (the
    error), or what else it gave."""
    try:
        values = ds.qpos.isel(world=worlds).values
    except ArchiveReplacedError as err:
        return "replaced" if "was replaced after it was opened" in str(err) else repr(err)
    except Exception as err:  # noqa: BLE001 - reported by the assertion
        return repr(err)
    return "opened archive" if np.array_equal(values, expected) else "other values"


def test_reads_racing_a_replacement_give_the_opened_archive_or_the_error(tmp_path, run_sweeps):
    url = str(tmp_path / "run.zarr")
    written = [data(0), data(1)]
    write(url, written[0])
    rounds = []

    for attempt in range(4 if run_sweeps else 2):  # archive 0 replaced by 1, then 1 by 0...
        there, worlds = written[attempt % 2], slice(attempt, attempt + 5)
        ds = open_archive(url)
        ds.qpos.isel(world=worlds).values  # keeps the indexes
        replacer = threading.Thread(target=write, args=(url, written[1 - attempt % 2]),
                                    kwargs={"mode": "w"})
        replacer.start()
        outcomes = []
        while replacer.is_alive():
            outcomes.append(outcome(ds, worlds, there[worlds]))
        replacer.join()
        outcomes.append(outcome(ds, worlds, there[worlds]))
        rounds.append(outcomes)

    others = {o for outcomes in rounds for o in outcomes} - {"opened archive", "replaced"}
    assert not others, others
    assert [outcomes[-1] for outcomes in rounds] == ["replaced"] * len(rounds)


def test_an_archive_without_an_archive_id_reads_and_its_replacement_is_noticed(tmp_path):
    import json
    from pathlib import Path

    url = str(tmp_path / "run.zarr")
    write(url, data(0))
    root = Path(url) / "zarr.json"
    meta = json.loads(root.read_text())
    del meta["attributes"]["archive_id"]  # as written before the attribute existed
    root.write_text(json.dumps(meta, indent=2))
    ds = open_archive(url)

    first = ds.qpos.isel(world=1).values
    write(url, data(1), mode="w")
    with pytest.raises(ArchiveReplacedError) as err:
        ds.qpos.isel(world=1).values

    assert np.array_equal(first, data(0)[1])
    assert "its archive_id is now '" in str(err.value)
