"""The opener (flyarchive.store.opener): open_for_reading opens an archive read-only with
its metadata checked, refuses an archive replaced since the caller opened it, and every
reader gets its group from it; open_for_writing gives writers a writable group."""

from __future__ import annotations

import numpy as np
import pytest

from flyarchive.errors import ArchiveNotFoundError, ArchiveReplacedError
from flyarchive.store.opener import open_for_reading, open_for_writing
from flyarchive.testing.synthetic import write_random


@pytest.fixture
def archive(tmp_path) -> str:
    url = str(tmp_path / "run.zarr")
    write_random(url, n_worlds=4, n_frames=10, chunk_frames=5, shard_worlds=2)
    return url


def test_an_archive_opens_read_only_with_its_attributes(archive):
    group = open_for_reading(archive)

    assert group.store.read_only
    assert group.attrs["archive_id"] and "qpos" in group


def test_the_archive_the_caller_opened_opens_again(archive):
    expected = open_for_reading(archive).attrs["archive_id"]

    actual = open_for_reading(archive, archive_id=expected).attrs["archive_id"]

    assert actual == expected


def test_an_archive_replaced_since_it_was_opened_is_refused(archive):
    opened = open_for_reading(archive).attrs["archive_id"]
    write_random(archive, n_worlds=4, n_frames=10, chunk_frames=5, shard_worlds=2, mode="w",
                 seed=1)

    with pytest.raises(ArchiveReplacedError) as err:
        open_for_reading(archive, archive_id=opened)

    assert f"it was {opened!r}" in str(err.value)
    assert f"open_archive({archive!r}) again" in str(err.value)


def test_a_relative_path_opens_as_the_user_wrote_it(archive, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(archive).parent)

    group = open_for_reading("run.zarr", attributes_only=True)

    assert "n_frames" in group


def test_no_archive_is_named_with_the_url_asked(tmp_path):
    missing = str(tmp_path / "nothing.zarr")

    with pytest.raises(ArchiveNotFoundError, match="nothing.zarr"):
        open_for_reading(missing)


def test_a_writer_gets_a_writable_group_of_the_same_archive(archive):
    group = open_for_writing(archive)

    assert not group.store.read_only
    assert group.attrs["archive_id"] == open_for_reading(archive).attrs["archive_id"]


def test_the_dataset_the_header_the_state_reader_and_verify_open_through_the_opener(archive, monkeypatch):
    import flyarchive
    from flyarchive.store import opener
    from flyarchive.store.dataset import open_header
    from flyarchive.store.reader import StateReader

    opened = []
    original = opener._open_group

    def counted(url, *args, **kwargs):
        opened.append(url)
        return original(url, *args, **kwargs)

    monkeypatch.setattr(opener, "_open_group", counted)
    qpos = flyarchive.open_archive(archive).qpos.values
    header = open_header(archive)
    states = StateReader(archive).read_boxes([(0, 1, 0, 10)])["qpos"]
    verified = flyarchive.verify(archive)

    assert opened and set(opened) == {archive}
    assert header.sizes["world"] == 4 and verified.ok
    assert np.array_equal(states, qpos[0])


def test_an_s3_endpoint_that_takes_connections_but_never_answers_fails_the_open_in_time(
        monkeypatch):
    """A server that accepts and never answers: s3fs and botocore would retry it for many
    minutes; the open gives up after OPEN_TIMEOUT_S with what to check."""
    import socket
    import threading
    import time

    from flyarchive import open_archive
    from flyarchive.errors import StorageError
    from flyarchive.store import opener
    from flyarchive.testing.s3 import s3_storage_options

    pytest.importorskip("s3fs")
    held = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        def accept() -> None:
            while True:
                try:
                    held.append(server.accept()[0])  # kept open, never answered
                except OSError:
                    return

        threading.Thread(target=accept, daemon=True).start()
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setattr(opener, "OPEN_TIMEOUT_S", 2.0)
        start = time.monotonic()

        with pytest.raises(StorageError, match=r"did not answer within 2 s while the archive was "
                                               r"opened"):
            open_archive("s3://lab/run.zarr", s3_storage_options(endpoint))

        assert time.monotonic() - start < 30
    for connection in held:
        connection.close()
