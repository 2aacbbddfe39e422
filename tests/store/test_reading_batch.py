"""The store's reading batch (:meth:`GuardedLocalStore.reading_batch`): chunk reads that
share each array's chunk folder refuse what the single reads refuse, read what they read,
and hold no descriptor past the batch."""

import os
import threading

import pytest
from zarr.abc.store import RangeByteRequest

from flyarchive.errors import UnsafeFileError
from flyarchive.store.localstore import GuardedLocalStore

pytestmark = pytest.mark.timeout(30)

META = '{"zarr_format": 3, "node_type": "group", "attributes": {}}'


@pytest.fixture
def root(tmp_path):
    """An archive-like folder: ``arr/c/0/0`` and ``arr/c/1/0`` hold 100 bytes each."""
    root = tmp_path / "a.zarr"
    for block in ("0", "1"):
        (root / "arr" / "c" / block).mkdir(parents=True)
        (root / "arr" / "c" / block / "0").write_bytes(bytes(range(100)))
    (root / "zarr.json").write_text(META)
    return root


def read(store, key, batch):
    if batch:
        with store.reading_batch():
            return store.get_sync(key, byte_range=RangeByteRequest(10, 20))
    return store.get_sync(key, byte_range=RangeByteRequest(10, 20))


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_range_read_gives_the_same_bytes(root, batch):
    store = GuardedLocalStore(root, read_only=True)
    assert read(store, "arr/c/1/0", batch).to_bytes() == bytes(range(10, 20))
    assert read(store, "arr/c/2/0", batch) is None  # never written


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_block_folder_linked_out_of_the_archive_is_refused(root, tmp_path, batch):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "0").write_bytes(b"x" * 100)
    (root / "arr" / "c" / "1" / "0").unlink()
    (root / "arr" / "c" / "1").rmdir()
    os.symlink(outside, root / "arr" / "c" / "1")
    store = GuardedLocalStore(root, read_only=True)
    with pytest.raises(UnsafeFileError, match=r"arr/c/1/0 leads out of the archive"):
        read(store, "arr/c/1/0", batch)


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_block_folder_linked_inside_the_archive_is_read(root, batch):
    os.rename(root / "arr" / "c" / "1", root / "arr" / "c" / "moved")
    os.symlink("moved", root / "arr" / "c" / "1")
    store = GuardedLocalStore(root, read_only=True)
    assert read(store, "arr/c/1/0", batch).to_bytes() == bytes(range(10, 20))


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_chunk_that_is_a_fifo_is_refused_without_blocking(root, batch):
    os.unlink(root / "arr" / "c" / "1" / "0")
    os.mkfifo(root / "arr" / "c" / "1" / "0")
    store = GuardedLocalStore(root, read_only=True)
    with pytest.raises(UnsafeFileError, match="FIFO"):
        read(store, "arr/c/1/0", batch)


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_chunk_linked_to_dev_zero_is_refused(root, batch):
    os.unlink(root / "arr" / "c" / "1" / "0")
    os.symlink("/dev/zero", root / "arr" / "c" / "1" / "0")
    store = GuardedLocalStore(root, read_only=True)
    with pytest.raises(UnsafeFileError, match="leads out of the archive"):
        read(store, "arr/c/1/0", batch)


def test_a_batch_holds_no_descriptor_after_it_ends_even_when_a_read_fails(root):
    store = GuardedLocalStore(root, read_only=True)
    os.mkfifo(root / "arr" / "c" / "0" / "fifo")
    before = open_fds()
    with store.reading_batch():
        store.get_sync("arr/c/0/0", byte_range=RangeByteRequest(0, 5))
        assert open_fds() == before + 1  # the array's chunk folder, for the batch
    assert open_fds() == before
    with pytest.raises(UnsafeFileError), store.reading_batch():
        store.get_sync("arr/c/0/0", byte_range=RangeByteRequest(0, 5))
        store.get_sync("arr/c/0/fifo", byte_range=RangeByteRequest(0, 5))
    assert open_fds() == before


def test_a_batch_belongs_to_its_thread(root):
    """Another thread's reads, while one thread's batch lasts, take their own ways (and
    see a folder replaced meanwhile)."""
    store = GuardedLocalStore(root, read_only=True)
    got = {}
    with store.reading_batch():
        store.get_sync("arr/c/0/0", byte_range=RangeByteRequest(0, 5))
        thread = threading.Thread(target=lambda: got.update(
            batch=getattr(store._batches, "now", None),
            read=store.get_sync("arr/c/1/0", byte_range=RangeByteRequest(0, 3)).to_bytes()))
        thread.start()
        thread.join()
    assert got == {"batch": None, "read": bytes(range(3))}
