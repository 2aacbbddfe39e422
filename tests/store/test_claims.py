"""Writer claims: one writer per archive, held until close, taken over from crashed writers."""

import gc
import json
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from flyarchive import TrajectoryRecorder
from flyarchive.clock import Timing
from flyarchive.errors import (
    ArchiveExistsError,
    ArchiveInUseError,
    SchemaError,
    StorageError,
    WorldBlockConflictError,
)
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock, open_store
from flyarchive.store.claims import WRITER_KEY, _identity, _proc_stat, put_exclusive
from flyarchive.store.localstore import GuardedLocalStore
from flyarchive.testing import simulate
from flyarchive.testing.fixtures import record


def plant_claim(url, key=WRITER_KEY, **fields):
    """Write a claim as another writer would have left it."""
    record = {"writer": "planted", "kind": "archive", **_identity(), "time": 1.7e9, **fields}
    path = Path(url) / key
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(record))


@pytest.fixture
def archive(tiny, tmp_path):
    url = str(tmp_path / "run.zarr")
    record(tiny, url, n_steps=36)
    return url


@pytest.fixture
def layout(tiny):
    return ModelLayout.from_model(tiny)


@pytest.fixture
def sleeper():
    """Another live process on this host."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def created_without_frames(model, url):
    """An archive as its creator leaves it before ``n_frames``: arrays, no frame, no marker."""
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(model.opt.timestep, 25, 0.2), (0, 1),
                       chunk_frames=5)
    ArchiveWriter.create(str(url), spec).close()
    (url / "n_frames" / "zarr.json").unlink()


def shared_archive(model, url):
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(model.opt.timestep, 25, 0.2),
                       (0, 1, 2, 3), chunk_frames=5, shard_worlds=2, capacity_frames=40)
    ArchiveWriter.create(url, spec).close()


# ----------------------------------------------------------------------------- one writer
def test_a_second_writer_in_the_same_process_is_refused(archive, layout):
    first = ArchiveWriter.append(archive, layout)

    with pytest.raises(ArchiveInUseError, match=r"held by this process .*not closed.*takeover=True"):
        ArchiveWriter.append(archive, layout)

    assert not first.closed


def test_a_writer_in_another_live_process_is_named_with_its_pid(archive, layout, sleeper):
    plant_claim(archive, pid=sleeper.pid, started=_proc_stat(sleeper.pid)[1])

    with pytest.raises(ArchiveInUseError) as err:
        ArchiveWriter.append(archive, layout)

    assert f"process {sleeper.pid} on this host (still running) since 2023-11-14" in str(err.value)


def test_a_recorder_is_refused_while_another_process_holds_the_archive(archive, tiny, sleeper):
    plant_claim(archive, pid=sleeper.pid, started=_proc_stat(sleeper.pid)[1])
    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a")

    with pytest.raises(ArchiveInUseError, match=f"process {sleeper.pid}"):
        simulate(tiny, 2, 40, recorder.record_as_needed)


def test_a_claim_left_by_a_dead_process_on_this_host_is_taken_over(archive, layout):
    plant_claim(archive, pid=dead_pid())

    writer = ArchiveWriter.append(archive, layout)

    holder = json.loads((Path(archive) / WRITER_KEY).read_text())
    assert writer.n_frames == 10
    assert holder["pid"] == _identity()["pid"] and holder["writer"] != "planted"


def test_a_claim_from_another_host_is_refused_naming_it(archive, layout):
    plant_claim(archive, host="node-17", pid=4242)

    with pytest.raises(ArchiveInUseError, match=r"process 4242 on host 'node-17'.*takeover=True"):
        ArchiveWriter.append(archive, layout)


def test_takeover_takes_a_claim_from_another_host(archive, layout):
    plant_claim(archive, host="node-17", pid=4242)

    writer = ArchiveWriter.append(archive, layout, takeover=True)

    assert json.loads((Path(archive) / WRITER_KEY).read_text())["host"] != "node-17"
    assert writer.n_frames == 10


def test_takeover_never_takes_the_claim_of_a_writer_running_on_this_host(archive, layout, sleeper):
    plant_claim(archive, pid=sleeper.pid, started=_proc_stat(sleeper.pid)[1])
    before = (Path(archive) / WRITER_KEY).read_bytes()

    with pytest.raises(ArchiveInUseError) as err:
        ArchiveWriter.append(archive, layout, takeover=True)

    assert f"process {sleeper.pid} on this host (still running)" in str(err.value)
    assert "this one is running" in str(err.value) and f"kill {sleeper.pid}" in str(err.value)
    assert (Path(archive) / WRITER_KEY).read_bytes() == before


def test_set_world_var_takeover_is_refused_while_the_recorder_runs(archive, sleeper, cli):
    plant_claim(archive, pid=sleeper.pid, started=_proc_stat(sleeper.pid)[1])

    code, _, err = cli("set-world-var", archive, "speed=1,2", "--takeover")

    assert code == 2 and f"kill {sleeper.pid}" in err
    assert "speed" not in zarr.open_group(archive, mode="r")


def test_takeover_never_takes_a_block_whose_writer_runs_on_this_host(tiny, layout, tmp_path,
                                                                    sleeper):
    url = str(tmp_path / "shared.zarr")
    shared_archive(tiny, url)
    started = _proc_stat(sleeper.pid)[1]
    plant_claim(url, "claims/shard-000000.json", kind="block", start=0, stop=2,
                pid=sleeper.pid, started=started)

    with pytest.raises(WorldBlockConflictError,
                       match=f"process {sleeper.pid} on this host.*stop it first .kill {sleeper.pid}"):
        ArchiveWriter.append(url, layout, world_block=(0, 2), takeover=True)
    with pytest.raises(ArchiveInUseError, match=f"kill {sleeper.pid}"):
        ArchiveWriter.append(url, layout, takeover=True)

    assert sorted(p.name for p in (Path(url) / "claims").iterdir()) == [
        "shard-000000.json", "zarr.json"]


def test_takeover_stops_a_writer_of_this_process_and_takes_its_claim(archive, layout):
    first = ArchiveWriter.append(archive, layout)

    second = ArchiveWriter.append(archive, layout, takeover=True)

    assert second.n_frames == 10 and first.closed
    with pytest.raises(RuntimeError, match="is closed"):
        first.write(None)
    second.close()


# ----------------------------------------------------------------------------- release
def test_close_releases_the_claim(archive, layout):
    writer = ArchiveWriter.append(archive, layout)

    writer.close()

    assert not (Path(archive) / WRITER_KEY).exists()
    ArchiveWriter.append(archive, layout).close()


def test_a_dropped_writer_releases_its_claim(archive, layout):
    ArchiveWriter.append(archive, layout)
    gc.collect()

    second = ArchiveWriter.append(archive, layout)

    assert second.n_frames == 10


def test_a_closed_recorder_lets_the_next_one_append(archive, tiny):
    record(tiny, archive, n_steps=76, mode="a")

    record(tiny, archive, n_steps=116, mode="a")

    assert not (Path(archive) / WRITER_KEY).exists()


def test_a_closed_writer_takes_no_more_frames(archive, layout):
    writer = ArchiveWriter.append(archive, layout)
    writer.close()

    with pytest.raises(RuntimeError, match="is closed"):
        writer.write(None)


def test_a_writer_whose_commit_failed_is_taken_over_by_the_next_in_the_same_process(
        archive, layout, monkeypatch):
    first = ArchiveWriter.append(archive, layout)
    block = FrameBlock(np.array([1.0]), np.zeros((2, 1, 13)), np.zeros((2, 1, 1, 3)),
                       np.zeros((2, 1, 1, 4)))
    with monkeypatch.context() as patch:  # the disk is full: every write fails
        patch.setattr(GuardedLocalStore, "set", disk_full_async)
        patch.setattr(GuardedLocalStore, "set_sync", disk_full)
        with pytest.raises(StorageError, match="still holds its 10 committed frames"):
            first.write(block)

    second = ArchiveWriter.append(archive, layout)

    assert second.n_frames == 10
    assert first.closed
    with pytest.raises(RuntimeError, match="is closed"):
        first.write(block)


def disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


async def disk_full_async(*args, **kwargs):
    disk_full()


# ----------------------------------------------------------------------------- damaged claims
def test_a_malformed_writer_claim_is_a_schema_error(archive, layout):
    (Path(archive) / WRITER_KEY).write_text("{not json")

    with pytest.raises(SchemaError, match=r"writer claim 'claims/writer.json' .* is damaged"):
        ArchiveWriter.append(archive, layout)


def test_a_malformed_block_claim_is_a_schema_error(tiny, layout, tmp_path):
    url = str(tmp_path / "shared.zarr")
    shared_archive(tiny, url)
    (Path(url) / "claims" / "shard-000000.json").write_text('["a list"]')

    with pytest.raises(SchemaError, match=r"'claims/shard-000000.json' .* is damaged"):
        ArchiveWriter.append(url, layout, world_block=(0, 2))


# ----------------------------------------------------------------------------- whole vs blocks
def test_a_block_writer_is_refused_while_a_writer_holds_the_whole_archive(tiny, layout, tmp_path):
    url = str(tmp_path / "shared.zarr")
    shared_archive(tiny, url)
    whole = ArchiveWriter.append(url, layout)

    with pytest.raises(ArchiveInUseError, match="held by this process"):
        ArchiveWriter.append(url, layout, world_block=(0, 2))

    assert sorted(p.name for p in (Path(url) / "claims").iterdir()) == ["writer.json", "zarr.json"]
    whole.close()


def test_a_whole_archive_writer_is_refused_while_a_block_is_claimed(tiny, layout, tmp_path):
    url = str(tmp_path / "shared.zarr")
    shared_archive(tiny, url)
    block = ArchiveWriter.append(url, layout, world_block=(2, 4))

    with pytest.raises(WorldBlockConflictError, match=r"claimed by world_block writers .*\[2, 4\)"):
        ArchiveWriter.append(url, layout)

    assert not (Path(url) / WRITER_KEY).exists()
    block.close()


# ----------------------------------------------------------------------------- creation
def test_an_archive_another_live_process_is_creating_is_not_touched(tiny, tmp_path, sleeper):
    url = tmp_path / "creating.zarr"
    created_without_frames(tiny, url)  # its creator has not reached n_frames yet
    plant_claim(url, pid=sleeper.pid, started=_proc_stat(sleeper.pid)[1])
    before = sorted(p.relative_to(url) for p in url.rglob("*"))

    with pytest.raises(ArchiveInUseError, match=f"process {sleeper.pid}"):
        record(tiny, str(url), n_steps=36, mode="a")

    assert sorted(p.relative_to(url) for p in url.rglob("*")) == before


def test_an_interrupted_creation_whose_creator_died_is_created_anew(tiny, tmp_path):
    url = tmp_path / "interrupted.zarr"
    created_without_frames(tiny, url)
    plant_claim(url, pid=dead_pid())

    record(tiny, str(url), n_steps=36, mode="a")

    assert (url / "n_frames" / "zarr.json").exists()
    assert not (url / WRITER_KEY).exists()


def test_a_creation_that_fails_midway_leaves_nothing(tiny, tmp_path, monkeypatch):
    import flyarchive.store.writer

    def fail(group, spec):
        group.create_array("qpos", shape=(1,), dtype="f8")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(flyarchive.store.writer, "create_arrays", fail)
    url = tmp_path / "full-disk.zarr"
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2), (0,))

    with pytest.raises(StorageError, match="No space left on device"):
        ArchiveWriter.create(str(url), spec)

    assert not url.exists()


# ----------------------------------------------------------------------------- object stores
def test_a_claim_on_s3_is_a_conditional_put_that_keeps_the_first(s3_location, monkeypatch):
    store = open_store(s3_location.url, s3_location.storage_options)
    modes = []
    pipe = store.fs._pipe_file

    async def spy(path, data, **kwargs):
        modes.append(kwargs.get("mode"))
        return await pipe(path, data, **kwargs)

    monkeypatch.setattr(store.fs, "_pipe_file", spy)

    first = put_exclusive(store, WRITER_KEY, b'{"writer": "first"}')
    second = put_exclusive(store, WRITER_KEY, b'{"writer": "second"}')

    assert (first, second) == (True, False)
    assert modes == ["create", "create"]
    assert sync(store.get(WRITER_KEY, prototype=default_buffer_prototype())).to_bytes() == \
        b'{"writer": "first"}'


# ----------------------------------------------------------------------------- threads
def test_a_claim_of_this_process_not_yet_held_by_a_writer_is_not_taken(tiny, tmp_path):
    """A thread creating the archive has claimed it and not yet made its writer: another
    thread's recorder must not take the claim as a dead writer's (both wrote, spliced)."""
    from flyarchive.store.claims import claim_archive, read_claim, release

    url = str(tmp_path / "pending.zarr")
    store = open_store(url)
    writer = claim_archive(store, url)  # as the other thread's creation has, so far
    recorder = TrajectoryRecorder(url, tiny, mode="a")

    with pytest.raises(ArchiveInUseError, match="this process .*another writer, not closed yet"):
        simulate(tiny, 2, 3, recorder.record_as_needed)

    assert read_claim(store, WRITER_KEY).writer == writer
    release(store, [WRITER_KEY], writer)
    with TrajectoryRecorder(url, tiny, mode="a") as later:  # released: claimed by the next
        simulate(tiny, 2, 3, later.record_as_needed)
    assert later.n_frames > 0


@pytest.mark.parametrize("mode", ["a", "w"])
def test_two_threads_creating_one_archive_at_once_one_records_the_other_is_refused(
        tiny, tmp_path, mode):
    import threading

    from flyarchive.store.integrity import verify

    for trial in range(3):
        url = str(tmp_path / f"race{trial}.zarr")
        start = threading.Barrier(2)
        outcomes = []

        def run():
            datas = [None]
            try:
                start.wait()
                with TrajectoryRecorder(url, tiny, mode=mode, chunk_frames=2) as rec:
                    datas[0] = simulate(tiny, 2, 40, rec.record_as_needed)
                outcomes.append("recorded")
            except ArchiveInUseError:
                outcomes.append("in use")
            except Exception as err:  # noqa: BLE001 - the test reports what it was
                outcomes.append(repr(err))

        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

        assert sorted(outcomes) in (["in use", "recorded"], ["recorded", "recorded"]), outcomes
        assert verify(url).ok


# ----------------------------------------------------------------------------- foreign files
@pytest.mark.parametrize("mode", ["w", "a", "w-"])
def test_no_mode_replaces_a_folder_of_files_flyarchive_did_not_write(tiny, tmp_path, mode):
    folder = tmp_path / "thesis"
    (folder / "sub").mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work")
    (folder / "sub" / "data.csv").write_text("1,2")

    with pytest.raises(ArchiveExistsError, match="not a flyarchive archive .*replaces only its "
                                                 "own archives"):
        with TrajectoryRecorder(str(folder), tiny, mode=mode) as recorder:
            simulate(tiny, 1, 10, recorder.record_as_needed)

    assert (folder / "thesis.tex").read_text() == "years of work"
    assert (folder / "sub" / "data.csv").read_text() == "1,2"


def test_overwrite_replaces_an_archive_but_not_a_folder_of_other_files(tiny, tmp_path, cli):
    from flyarchive import export_npz

    archive = record(tiny, str(tmp_path / "run.zarr"), n_worlds=1, n_steps=10)
    export_npz(archive, str(tmp_path / "npz"))
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    model = str(tmp_path / "tiny.xml")
    mujoco.mj_saveLastXML(model, tiny)

    code, _, err = cli("import-npz", str(tmp_path / "npz"), "--to", str(folder), "--model", model,
                       "--overwrite")
    assert code == 2 and "not a flyarchive archive" in err
    assert (folder / "notes.txt").read_text() == "keep"
    code, _, err = cli("positions", archive, "--keypoints", "bodies", "--to", str(folder),
                       "--overwrite")
    assert code == 2 and "not a flyarchive archive" in err
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    code, _, err = cli("import-npz", str(tmp_path / "npz"), "--to", archive, "--model", model,
                       "--overwrite")
    assert code == 0, err  # an archive: replaced


def test_a_replacement_cut_short_after_the_root_went_is_replaced_or_resumed(tiny, tmp_path):
    """clear() deletes the root zarr.json first; a replacement killed after it left
    flyarchive's own arrays without a root, which every mode refused as not an archive."""
    import shutil

    url = tmp_path / "cut.zarr"
    record(tiny, str(url), n_steps=36)
    (url / "zarr.json").unlink()  # as the killed replacement left it: the root gone, then
    for name in ("qpos", "mocap_pos", "mocap_quat", "time", "sim_time", "frame", "n_frames"):
        shutil.rmtree(url / name)  # its arrays of frames

    record(tiny, str(url), n_steps=36, mode="w")

    assert (url / "n_frames" / "zarr.json").exists()
