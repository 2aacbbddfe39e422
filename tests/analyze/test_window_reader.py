"""Streamed reads of a window's state (flyarchive.store.window_reader): the archive's
getters where the window is found in them, dask otherwise, the same values either way."""

from __future__ import annotations

import time

import numpy as np
import pytest

import flyarchive
from flyarchive.analyze.keypoints import KeypointRequest
from flyarchive.analyze.prepare import prepare
from flyarchive.store.window_reader import WindowReader, window_reader


def _rows(ds, name: str) -> np.ndarray:
    values = ds[name].values
    return values.reshape(-1, *values.shape[2:])


def test_a_window_is_read_through_the_getters_row_by_row_as_dask_reads_it(sites_archive):
    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None), worlds=[2, 0],
                       time=(0.02, 0.1))
    expected = _rows(prepared.ds, "qpos")

    reader = window_reader(prepared.ds, prepared.whole, ["qpos"])
    cuts = (0, 3, len(expected) // 2 + 1, len(expected))  # partial worlds, then a whole one
    pieces = [reader.read(r0, r1)["qpos"] for r0, r1 in zip(cuts[:-1], cuts[1:])]

    assert isinstance(reader, WindowReader)
    assert list(reader.worlds) == [2, 0] and reader.n_time == len(expected) // 2
    assert np.array_equal(np.concatenate(pieces), expected, equal_nan=True)


def test_frames_past_n_frames_read_as_nan_through_the_getters(uneven_archive):
    prepared = prepare(uneven_archive, KeypointRequest.of("*", None, None))
    reader = window_reader(prepared.ds, prepared.whole, ["qpos", "mocap_pos", "mocap_quat"])

    state = reader.read(0, 40)

    assert isinstance(reader, WindowReader)
    assert np.isnan(state["qpos"][12:20]).all() and np.isfinite(state["qpos"][:12]).all()
    assert np.isnan(state["mocap_quat"][12:20]).all()
    for name in ("qpos", "mocap_pos", "mocap_quat"):
        assert np.array_equal(state[name], _rows(prepared.ds, name), equal_nan=True)


def test_a_dataset_cut_before_it_was_given_is_read_through_dask(sites_archive):
    cut = flyarchive.open_archive(sites_archive).isel(world=[2, 1])
    prepared = prepare(cut, KeypointRequest.of("*", None, None))

    reader = window_reader(prepared.ds, prepared.whole, ["qpos"])

    assert not isinstance(reader, WindowReader)
    assert np.array_equal(reader.read(0, 40)["qpos"], _rows(cut, "qpos"), equal_nan=True)


def test_a_dataset_in_memory_is_read_as_it_is(sites_archive, sites_model):
    loaded = flyarchive.open_archive(sites_archive).load()
    prepared = prepare(loaded, KeypointRequest.of("*", None, None), model=sites_model)

    reader = window_reader(prepared.ds, prepared.whole, ["qpos"])

    assert not isinstance(reader, WindowReader)
    assert np.array_equal(reader.read(5, 47)["qpos"], _rows(loaded, "qpos")[5:47])



@pytest.mark.subprocess  # worker processes
def test_worker_processes_read_what_dask_reads_into_shared_memory(sites_archive, uneven_archive):
    from flyarchive.store.window_reader import ProcessWindowReader

    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None), worlds=[0, 1, 2],
                       time=(0.02, 0.1))
    expected = _rows(prepared.ds, "qpos")
    reader = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=2)
    cuts = (0, 3, len(expected) // 3 + 1, len(expected))  # partial worlds, then whole ones
    pieces = [reader.read(r0, r1)["qpos"] for r0, r1 in zip(cuts[:-1], cuts[1:])]

    uneven = prepare(uneven_archive, KeypointRequest.of("*", None, None))
    names = ["qpos", "mocap_pos", "mocap_quat"]
    state = window_reader(uneven.ds, uneven.whole, names, processes=2).read(0, 40)

    assert isinstance(reader, ProcessWindowReader)
    assert np.array_equal(np.concatenate(pieces), expected, equal_nan=True)
    assert np.isnan(state["qpos"][12:20]).all() and np.isfinite(state["qpos"][:12]).all()
    for name in names:
        assert np.array_equal(state[name], _rows(uneven.ds, name), equal_nan=True)


@pytest.mark.subprocess  # a fresh interpreter
def test_a_worker_opens_the_archive_without_xarray_or_dask_and_reads_the_same(uneven_archive):
    import json
    import subprocess
    import sys

    archive_id = flyarchive.open_archive(uneven_archive).attrs["archive_id"]
    probe = (
        "import json, sys\n"
        "from flyarchive.store.window_reader import _getter, _open\n"
        f"archive = _open({uneven_archive!r}, None, {archive_id!r})\n"
        "values = {n: _getter(archive, n)[0:3].tolist() for n in ('qpos', 'mocap_quat')}\n"
        "print(json.dumps({'values': values, 'loaded': sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] in ('xarray', 'dask', 'pandas'))}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    got = json.loads(done.stdout)
    opened = flyarchive.open_archive(uneven_archive)

    assert got["loaded"] == []
    for name, values in got["values"].items():
        assert np.array_equal(np.array(values, dtype=float), opened[name][0:3].values,
                              equal_nan=True)


@pytest.mark.subprocess  # worker processes
def test_a_missing_chunk_read_by_a_worker_process_is_the_same_corrupt_archive_error(
        sites_archive):
    from flyarchive.errors import CorruptArchiveError
    from flyarchive.testing import shard_file

    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None))
    threads = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=0)
    shard_file(sites_archive, "qpos", 0, 1).unlink()  # frames 5..9 of committed worlds

    with pytest.raises(CorruptArchiveError) as by_threads:
        threads.read(0, 60)
    with pytest.raises(CorruptArchiveError) as by_processes:
        window_reader(prepared.ds, prepared.whole, ["qpos"], processes=2).read(0, 60)

    assert "frames 5..9" in str(by_processes.value)
    assert str(by_processes.value) == str(by_threads.value)


@pytest.mark.subprocess  # worker processes
def test_worker_processes_that_died_idle_are_replaced_and_the_read_goes_on(sites_archive):
    from flyarchive.store.window_reader import _POOL

    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None))
    expected = _rows(prepared.ds, "qpos")
    reader = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=2)
    killed = list(_POOL.live)
    for worker in killed:
        worker.kill()
        worker.wait()

    first, second = (reader.read(0, len(expected))["qpos"] for _ in range(2))
    # A dead worker is replaced when its thread is handed a job: that thread may be
    # handed one only at a later read, and the read may end (another worker answering
    # the job it handed back) while the replacement is still starting.
    deadline = time.monotonic() + 30
    while set(killed) & _POOL.live and time.monotonic() < deadline:
        assert np.array_equal(reader.read(0, len(expected))["qpos"], expected, equal_nan=True)
        time.sleep(0.05)

    assert np.array_equal(first, expected, equal_nan=True)
    assert np.array_equal(second, expected, equal_nan=True)
    with _POOL.lock:
        assert not set(killed) & _POOL.live
        assert len(_POOL.live) == _POOL.size >= 2
        assert all(worker.poll() is None for worker in _POOL.live)


@pytest.mark.subprocess  # worker processes
def test_a_worker_process_that_dies_on_a_job_fails_that_read_only(monkeypatch):
    from flyarchive.store import window_reader

    # Workers that die on their first job (exit status 3), as a crash in a decoder would.
    monkeypatch.setattr(window_reader, "_WORKER", "import sys; sys.stdin.readline(); sys.exit(3)")
    pool = window_reader._Pool()
    pool.grow(1)

    with pytest.raises(RuntimeError, match=r"worker process stopped \(exit status 3\) while"):
        pool.run([{"job": 1}])
    with pytest.raises(RuntimeError, match="exit status 3"):  # its replacement, as crafted
        pool.run([{"job": 2}])

    assert pool.size == 1 and len(pool.live) == 1 and len(pool.pids) == 3
    for worker in pool.live:
        worker.kill()


#: A worker that answers every job, as a sound one does.
_ANSWERS = "import sys\nfor line in sys.stdin:\n    print('{}', flush=True)"


def _run_within(pool, jobs, seconds: float = 30.0) -> BaseException | None:
    """``pool.run(jobs)`` on a thread of its own: what it raised (None: nothing); the
    test fails if it is still waiting after ``seconds``."""
    import threading

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            pool.run(jobs)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"pool.run still waits after {seconds} s"
    return outcome[0]


@pytest.mark.subprocess  # worker processes
@pytest.mark.parametrize("answer", [
    "sys.stdout.write('{\"par'); sys.stdout.flush()",  # dies half-way through its answer
    "print('not json', flush=True); sys.stdin.readline()",  # answers garbage, lives on
], ids=["half-an-answer", "garbage"])
def test_a_worker_that_dies_mid_answer_or_answers_garbage_fails_that_read_only(monkeypatch,
                                                                               answer):
    from flyarchive.store import window_reader

    monkeypatch.setattr(window_reader, "_WORKER", f"import sys; sys.stdin.readline(); {answer}")
    pool = window_reader._Pool()
    pool.grow(1)
    [first] = pool.live

    failed = _run_within(pool, [{"job": 1}])

    assert isinstance(failed, RuntimeError) and "while it read" in str(failed), failed
    assert first.poll() is not None and first not in pool.live
    assert pool.size == 1 and len(pool.live) == 1  # replaced
    for worker in pool.live:
        worker.kill()


@pytest.mark.subprocess  # worker processes
def test_a_pool_that_cannot_replace_its_last_worker_fails_reads_instead_of_waiting(monkeypatch):
    import subprocess
    import types

    from flyarchive.store import window_reader

    monkeypatch.setattr(window_reader, "_WORKER", _ANSWERS)
    pool = window_reader._Pool()
    pool.grow(1)
    assert _run_within(pool, [{"job": 1}]) is None
    [worker] = pool.live

    def no_process(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    # No process can be started from now on (in this module only).
    monkeypatch.setattr(window_reader, "subprocess",
                        types.SimpleNamespace(Popen=no_process, PIPE=subprocess.PIPE))
    worker.kill()
    worker.wait()

    failed = _run_within(pool, [{"job": 2}, {"job": 3}])
    later = _run_within(pool, [{"job": 4}])

    for err in (failed, later):
        assert isinstance(err, RuntimeError), err
        assert "none could be started" in str(err) and "Resource temporarily" in str(err)
        assert "processes=0" in str(err)
    assert pool.size == 0 and not pool.live


@pytest.mark.subprocess  # worker processes
def test_worker_processes_refuse_an_archive_replaced_since_it_was_opened(sites_archive,
                                                                           sites_model):
    from flyarchive.errors import ArchiveReplacedError
    from flyarchive.testing.fixtures import record

    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None))
    reader = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=2)
    record(sites_model, sites_archive, n_worlds=3, chunk_frames=5, mode="w")

    with pytest.raises(ArchiveReplacedError, match="was replaced after it was opened"):
        reader.read(0, 40)


def test_load_indexes_keeps_every_settled_shards_index(sites_archive):
    from flyarchive.store.dataset import committed_getter
    from flyarchive.store.window_reader import load_indexes

    whole = flyarchive.open_archive(sites_archive)
    getter = committed_getter(whole["qpos"])
    assert getter.reader._indexes == {}  # nothing read yet

    load_indexes({"qpos": getter})

    shards = -(-whole.sizes["world"] // getter.arr.shards[0]) * \
        -(-whole.sizes["time"] // getter.arr.shards[1])
    assert len(getter.reader._indexes) == shards


@pytest.mark.subprocess  # worker processes
def test_worker_processes_asked_to_read_indexes_ahead_read_the_same(sites_archive):
    from flyarchive.store.window_reader import ProcessWindowReader

    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None))
    threads = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=0)
    ahead = ProcessWindowReader(threads, prepared.whole.attrs["archive_id"], 2, indexes=True)
    rows = len(_rows(prepared.ds, "qpos"))

    job = ahead.job("block", {"qpos": (0, (prepared.ds.sizes["dof"],), np.dtype("f8"))}, [])
    assert job["indexes"] is True
    for _ in range(2):  # the second time, from the indexes the workers kept
        assert np.array_equal(ahead.read(0, rows)["qpos"], threads.read(0, rows)["qpos"],
                              equal_nan=True)


@pytest.mark.subprocess  # worker processes
def test_worker_processes_leave_ctrl_c_to_their_caller(sites_archive):
    """Ctrl-C in a terminal reaches every process of the group: the workers neither die
    nor print a traceback; the caller handles it (and they end when it does)."""
    import os
    import signal

    from flyarchive.store.window_reader import _POOL

    prepared = prepare(sites_archive, KeypointRequest.of("*", None, None))
    reader = window_reader(prepared.ds, prepared.whole, ["qpos"], processes=2)
    rows = len(_rows(prepared.ds, "qpos"))
    first = reader.read(0, rows)["qpos"]
    workers = list(_POOL.live)

    for worker in workers:
        os.kill(worker.pid, signal.SIGINT)
    time.sleep(0.5)

    assert all(worker.poll() is None for worker in workers)
    assert np.array_equal(reader.read(0, rows)["qpos"], first, equal_nan=True)


# ----------------------------------------------------------------------------- one interface
@pytest.fixture(scope="module")
def five(tmp_path_factory):
    """``(url, written)``: 5 tiny worlds of random states with mocap poses, every frame of
    20 committed, two worlds per shard and 5 frames per chunk (boxes cross both)."""
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.models import model_bytes
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import tiny_model

    tiny = tiny_model()
    rng = np.random.default_rng(11)
    written = {"qpos": np.tile(tiny.qpos0, (5, 20, 1)) + rng.normal(0, 0.3, (5, 20, tiny.nq)),
               "mocap_pos": rng.normal(0, 0.5, (5, 20, 1, 3)),
               "mocap_quat": rng.normal(0, 1, (5, 20, 1, 4))}
    url = str(tmp_path_factory.mktemp("five") / "five.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(0.002, 25, 0.2), tuple(range(5)),
                       dtype="float64", chunk_frames=5, shard_worlds=2, model=model_bytes(tiny))
    with ArchiveWriter.create(url, spec) as writer:
        writer.write(FrameBlock(np.arange(20) * 0.008, written["qpos"], written["mocap_pos"],
                                written["mocap_quat"]), n_frames=np.full(5, 20))
    return url, written


NAMES = ["qpos", "mocap_pos", "mocap_quat"]
BOXES = {"whole": [(0, 5, 0, 20)],
         "scattered": [(1, 4, 2, 17), (4, 5, 0, 1), (0, 1, 19, 20), (3, 5, 6, 7)],
         "none": []}


def family(url: str, worlds: list[int] | None = None, time=None) -> dict[str, object]:
    """Every reader of the family over one window (the whole archive by default)."""
    from flyarchive.store.reader import StateReader
    from flyarchive.store.window_reader import DaskWindowReader

    whole = flyarchive.open_archive(url)
    ds = whole if worlds is None else whole.isel(world=worlds, time=time or slice(None))
    readers = {"threads": window_reader(ds, whole, NAMES, processes=0),
               "processes": window_reader(ds, whole, NAMES, processes=2),
               "dask": DaskWindowReader(ds, NAMES)}
    if worlds is None:
        readers["renders' StateReader"] = StateReader(url)
    return readers


def expected_rows(written, boxes, worlds=range(5), start=0):
    worlds = list(worlds)
    return {name: np.concatenate(
        [written[name][[worlds[w] for w in range(w0, w1)], start + t0:start + t1]
         .reshape(-1, *written[name].shape[2:]) for w0, w1, t0, t1 in boxes])
        if boxes else np.empty((0, *written[name].shape[2:])) for name in NAMES}


@pytest.mark.subprocess  # worker processes
@pytest.mark.parametrize("boxes", BOXES.values(), ids=BOXES.keys())
def test_every_reader_of_the_family_reads_the_same_boxes(five, boxes):
    url, written = five
    want = expected_rows(written, boxes)

    for kind, reader in family(url).items():
        got = reader.read_boxes(boxes)
        for name in NAMES:
            assert got[name].shape == want[name].shape, (kind, name)
            assert got[name].tobytes() == want[name].tobytes(), (kind, name)


@pytest.mark.subprocess  # worker processes
def test_every_reader_of_the_family_reads_rows_as_the_boxes_of_those_rows(five):
    from flyarchive.store.reader import row_boxes

    url, written = five
    rows = row_boxes(3, 61, 20)
    want = expected_rows(written, rows)

    assert rows == [(0, 1, 3, 20), (1, 3, 0, 20), (3, 4, 0, 1)]
    for kind, reader in family(url).items():
        got = reader.read(3, 61)
        assert all(np.array_equal(got[n], want[n]) for n in NAMES), kind


@pytest.mark.subprocess  # worker processes
def test_window_readers_read_boxes_of_their_window_of_worlds_out_of_order(five):
    url, written = five
    worlds, frames = [4, 1, 2], slice(3, 15)
    boxes = [(0, 3, 0, 12), (1, 2, 5, 9), (2, 3, 11, 12)]
    want = expected_rows(written, boxes, worlds, start=3)

    readers = family(url, worlds, frames)

    assert set(readers) == {"threads", "processes", "dask"}
    for kind, reader in readers.items():
        got = reader.read_boxes(boxes)
        assert all(np.array_equal(got[n], want[n]) for n in NAMES), kind
