"""Per-world variables added after recording (``add_world_vars``): visible in xarray as
``(world,)`` variables, on every storage, committed atomically."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from flyarchive import add_world_vars, open_archive, verify
from flyarchive.testing.fixtures import record


@pytest.fixture
def archive(tiny, tmp_path: Path) -> str:
    """3 tiny worlds with ids 4, 5, 6."""
    return record(tiny, str(tmp_path / "run.zarr"), n_worlds=3, n_steps=12, world_ids=[4, 5, 6])


def test_added_variables_are_world_variables_of_their_dtype(archive):
    add_world_vars(archive, {"success": [True, False, True], "seed": np.array([7, 8, 9]),
                             "reward": np.array([0.5, np.nan, 2.0], dtype=np.float32)})

    ds = open_archive(archive)

    assert [(ds[n].dims, str(ds[n].dtype)) for n in ("success", "seed", "reward")] == [
        (("world",), "bool"), (("world",), "int64"), (("world",), "float32")]
    np.testing.assert_array_equal(ds.reward.values, [0.5, np.nan, 2.0])


def test_world_variables_are_added_on_every_storage(tiny, location):
    record(tiny, location.url, storage_options=location.storage_options, n_steps=12)

    add_world_vars(location.url, {"success": [1, 0]}, storage_options=location.storage_options)

    ds = open_archive(location.url, location.storage_options)
    assert ds.success.values.tolist() == [1, 0]


def test_plain_xarray_reads_an_added_variable(archive):
    add_world_vars(archive, {"success": [1, 0, 1]})

    ds = xr.open_zarr(archive, consolidated=False)

    assert ds.success.values.tolist() == [1, 0, 1]


def test_a_data_array_is_aligned_by_world_id(archive):
    values = xr.DataArray([60, 40, 50], dims="world", coords={"world": [6, 4, 5]})

    add_world_vars(archive, {"score": values})

    assert open_archive(archive).score.values.tolist() == [40, 50, 60]


def test_overwrite_replaces_a_variable_keeping_its_dtype(archive):
    add_world_vars(archive, {"seed": np.array([1, 2, 3])})

    add_world_vars(archive, {"seed": [4.0, 5.0, 6.0]}, overwrite=True)

    ds = open_archive(archive)
    assert (ds.seed.values.tolist(), str(ds.seed.dtype)) == ([4, 5, 6], "int64")


def test_a_data_arrays_units_and_description_are_kept_and_replaced(archive):
    zarr.consolidate_metadata(archive, zarr_format=3)
    speed = xr.DataArray([1.0, 2.0, 3.0], dims="world",
                         attrs={"units": "m/s", "description": "top speed", "other": 1})

    add_world_vars(archive, {"speed": speed})
    first = open_archive(archive).speed.attrs
    add_world_vars(archive, {"speed": speed.copy(data=[4.0, 5.0, 6.0]).assign_attrs(
        units="mm/s")}, overwrite=True)
    second = open_archive(archive).speed.load()
    add_world_vars(archive, {"speed": [7.0, 8.0, 9.0]}, overwrite=True)  # no attrs: kept

    assert (first["units"], first["description"], "other" in first) == ("m/s", "top speed", False)
    assert (second.attrs["units"], second.values.tolist()) == ("mm/s", [4.0, 5.0, 6.0])
    consolidated = zarr.open_group(archive, mode="r", use_consolidated=True)["speed"]
    assert consolidated.attrs["units"] == "mm/s"
    assert open_archive(archive).speed.attrs["units"] == "mm/s"
    assert xr.open_zarr(archive).speed.attrs["units"] == "mm/s"
    assert verify(archive).ok


def test_a_units_attribute_that_is_not_text_is_refused_and_nothing_written(archive):
    from flyarchive.errors import SchemaError

    bad = xr.DataArray([1.0, 2.0, 3.0], dims="world", attrs={"units": 3})

    with pytest.raises(SchemaError, match=r"attribute units=3; a world variable keeps units and "
                                          r"description as text"):
        add_world_vars(archive, {"fine": [1, 2, 3], "bad": bad})

    assert "fine" not in open_archive(archive) and "bad" not in open_archive(archive)


def test_a_variable_given_when_recording_can_be_replaced(tiny, tmp_path):
    url = record(tiny, str(tmp_path / "r.zarr"), n_steps=12, world_vars={"seed": [1, 2]})

    add_world_vars(url, {"seed": [3, 4]}, overwrite=True)

    assert (open_archive(url).seed.values.tolist(), verify(url).ok) == ([3, 4], True)


def test_the_consolidated_copy_of_the_metadata_names_an_added_variable(archive):
    zarr.consolidate_metadata(archive, zarr_format=3)

    add_world_vars(archive, {"success": [1, 0, 1]})

    group = zarr.open_group(archive, mode="r", use_consolidated=True)
    assert group["success"][:].tolist() == [1, 0, 1]
    assert "success" in group.metadata.consolidated_metadata.metadata


@pytest.mark.slow  # readers race a writer for seconds
def test_readers_see_a_variable_whole_or_not_at_all(archive):
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:  # a reader opening the archive again and again
        while not stop.is_set():
            group = zarr.open_group(archive, mode="r")
            for name in [n for n in group.array_keys() if n.startswith("v")]:
                values = group[name][:].tolist()
                if values != [int(name[1:])] * 3 and values != [-int(name[1:])] * 3:
                    seen.append(f"{name}: {values}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for k in range(1, 16):  # new variables, and replacements of each
            add_world_vars(archive, {f"v{k}": [k] * 3})
            add_world_vars(archive, {f"v{k}": [-k] * 3}, overwrite=True)
    finally:
        stop.set()
        reader.join()

    assert seen == []
