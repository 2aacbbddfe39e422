"""Text world variables (a genotype per world): stored as zarr strings, read back by
``open_archive``, the header and plain xarray, and selected by ``where=`` and
``--where-world-var``; non-finite numbers are kept and compared as xarray does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from flyarchive import add_world_vars, open_archive, select_frames, verify
from flyarchive.store.dataset import open_header
from flyarchive.query.conditions import where_from_conditions
from flyarchive.testing.fixtures import record


@pytest.fixture
def archive(tiny, tmp_path: Path) -> str:
    """3 tiny worlds with ids 4, 5, 6."""
    return record(tiny, str(tmp_path / "run.zarr"), n_worlds=3, n_steps=12, world_ids=[4, 5, 6])


def test_a_text_variable_is_added_and_read_back(archive):
    add_world_vars(archive, {"genotype": ["wt", "mutA", "wt"]})

    ds = open_archive(archive)

    assert ds.genotype.dims == ("world",)
    assert ds.genotype.values.tolist() == ["wt", "mutA", "wt"]
    assert open_header(archive).genotype.values.tolist() == ["wt", "mutA", "wt"]
    assert xr.open_zarr(archive, consolidated=False).genotype.values.tolist() == ["wt", "mutA", "wt"]
    assert verify(archive).ok


def test_text_that_is_not_ascii_or_empty_is_kept(archive):
    add_world_vars(archive, {"label": np.array(["é ü", "", "日本"], dtype=object)})

    assert open_archive(archive).label.values.tolist() == ["é ü", "", "日本"]


def test_a_text_variable_given_when_recording_is_stored(tiny, tmp_path):
    url = record(tiny, str(tmp_path / "run.zarr"), n_steps=8,
                 world_vars={"genotype": np.array(["wt", "mutB"])})

    assert open_archive(url).genotype.values.tolist() == ["wt", "mutB"]
    assert verify(url).ok


def test_a_text_variable_is_replaced_by_other_text(archive):
    add_world_vars(archive, {"genotype": ["wt", "mutA", "wt"]})

    add_world_vars(archive, {"genotype": ["a much longer text", "b", "c"]}, overwrite=True)

    assert open_archive(archive).genotype.values.tolist() == ["a much longer text", "b", "c"]


def test_a_text_variable_selects_worlds_in_python(archive):
    add_world_vars(archive, {"genotype": ["wt", "mutA", "wt"]})
    ds = open_archive(archive)

    jobs = select_frames(ds, where=ds.genotype == "wt")

    assert [j.world_id for j in jobs] == [4, 6]


@pytest.mark.parametrize(("condition", "expected"), [
    ("genotype=='wt'", [True, False, True]),
    ('genotype!="wt"', [False, True, False]),
    ("genotype=mutA", [False, True, False]),
])
def test_a_text_variable_selects_worlds_on_the_command_line(archive, condition, expected):
    add_world_vars(archive, {"genotype": ["wt", "mutA", "wt"]})

    mask = where_from_conditions(open_archive(archive), [condition])

    assert mask.values.tolist() == expected


def test_non_finite_values_are_kept_and_compare_as_in_xarray(archive):
    add_world_vars(archive, {"reward": [np.nan, np.inf, 0.25]})
    ds = open_archive(archive)

    greater = where_from_conditions(ds, ["reward>0.5"]).values.tolist()
    other = where_from_conditions(ds, ["reward!=0.25"]).values.tolist()

    np.testing.assert_array_equal(ds.reward.values, [np.nan, np.inf, 0.25])
    assert greater == (ds.reward > 0.5).values.tolist() == [False, True, False]
    assert other == (ds.reward != 0.25).values.tolist() == [True, True, False]
