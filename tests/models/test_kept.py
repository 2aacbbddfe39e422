"""Models kept by content: recorders keep the compiled model beside the archive as
``models/<sha256>.mjb`` (a zarr group, so zarr does not warn), the attributes hold only
its hash and size, and every read checks the bytes against the name."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import mujoco
import pytest
import xarray as xr
import zarr

from flyarchive import open_archive, verify
from flyarchive.models import model_bytes
from flyarchive.store import open_for_reading
from flyarchive.models.entries import model_entry
from flyarchive.models.kept import read_model, write_model
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import copy_archive, record


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny archive, recorded once: :func:`archive` copies it."""
    return record(tiny_model(), str(tmp_path_factory.mktemp("models") / "run.zarr"))


@pytest.fixture
def archive(recorded: str, tmp_path: Path) -> str:
    """This test's copy of the tiny archive (it may change it)."""
    return copy_archive(recorded, tmp_path / "run.zarr")


def test_a_recording_keeps_its_model_by_content(tiny, archive):
    blob = model_bytes(tiny)
    digest = hashlib.sha256(blob).hexdigest()

    stored = (Path(archive) / "models" / f"{digest}.mjb").read_bytes()

    assert stored == blob


def test_the_attributes_hold_only_the_models_hash_and_size(tiny, archive):
    blob = model_bytes(tiny)

    attrs = zarr.open_group(archive, mode="r").attrs["model"]

    assert attrs == {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob),
                     "mujoco": mujoco.__version__, "path": f"models/{attrs['sha256']}.mjb"}


def test_the_model_is_kept_on_every_storage(tiny, location):
    record(tiny, location.url, storage_options=location.storage_options)

    group = open_for_reading(location.url, location.storage_options, attributes_only=True)
    blob, _ = read_model(group, location.url)

    assert blob == model_bytes(tiny)


def test_store_model_false_keeps_no_model(tiny, tmp_path):
    url = record(tiny, str(tmp_path / "bare.zarr"), store_model=False)

    found = read_model(open_for_reading(url, attributes_only=True), url)

    assert (found, (Path(url) / "models").exists()) == (None, False)


def test_the_models_group_makes_zarr_raise_no_warning(archive):
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        members = sorted(name for name, _ in zarr.open_group(archive, mode="r").members())
        open_archive(archive)
        xr.open_zarr(archive, consolidated=False)
        report = verify(archive)

    assert "models" in members and report.ok


def test_writing_the_same_model_again_keeps_the_object(tiny, archive):
    blob = model_bytes(tiny)
    entry = model_entry(blob)
    path = Path(archive) / entry["path"]
    before = os.stat(path)

    write_model(zarr.open_group(archive, mode="r+"), blob, entry)

    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_damaged_object_under_the_models_name_is_replaced(tiny, archive):
    blob = model_bytes(tiny)
    entry = model_entry(blob)
    (Path(archive) / entry["path"]).write_bytes(b"damaged")

    write_model(zarr.open_group(archive, mode="r+"), blob, entry)

    assert (Path(archive) / entry["path"]).read_bytes() == blob


def test_verify_reports_a_model_whose_bytes_do_not_hash_to_its_name(archive):
    entry = zarr.open_group(archive, mode="r").attrs["model"]
    path = Path(archive) / entry["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # MuJoCo would load this silently
    path.write_bytes(bytes(data))

    report = verify(archive)

    assert not report.ok and any("does not hash to its name" in p for p in report.problems)


def test_replacing_an_archive_without_storing_a_model_removes_the_old_one(tiny, archive):
    record(tiny, archive, mode="w", store_model=False)

    group = zarr.open_group(archive, mode="r")

    assert ("model" in group.attrs, (Path(archive) / "models").exists()) == (False, False)


def test_appending_keeps_the_model_the_archive_was_created_with(archive):
    before = zarr.open_group(archive, mode="r").attrs["model"]
    other = tiny_model()
    other.geom_rgba[0] = (0.1, 0.2, 0.3, 1.0)  # the same layout and motion, other bytes

    record(other, archive, mode="a", n_steps=120)

    assert zarr.open_group(archive, mode="r").attrs["model"] == before
