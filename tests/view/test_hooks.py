"""The viewer's links to optional parts: keypoint traces through ``flyarchive.positions``
where this flyarchive has it, and the render backend it picks."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import flyarchive
from flyarchive.errors import SelectionError
from flyarchive.view import traces
from flyarchive.view.renders import best_backend


@pytest.fixture
def ds():
    return xr.Dataset(coords={"world": [3, 5, 7], "time": np.arange(6) * 0.008})


def test_keypoint_traces_come_from_flyarchive_positions(monkeypatch, ds):
    asked = {}

    def positions(source, bodies=None, *, model=None):
        asked.update(worlds=source.world.values.tolist(), times=source.time.size, bodies=bodies,
                     model=model)
        values = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 1, 3)
        return xr.DataArray(values, dims=("world", "time", "keypoint", "xyz"))

    monkeypatch.setattr(flyarchive, "positions", positions, raising=False)

    labels, values = traces.keypoint_values(ds, [5, 7], "torso", slice(1, 5), model="m")

    assert traces.keypoints_available()
    assert asked == {"worlds": [5, 7], "times": 4, "bodies": ["torso"], "model": "m"}
    assert labels == ["torso/x", "torso/y", "torso/z"]
    assert values.shape == (2, 3, 4) and values[1, 2, 3] == 23.0  # (world, xyz, time)


def test_without_flyarchive_positions_keypoint_traces_say_so(monkeypatch, ds):
    monkeypatch.delattr(flyarchive, "positions", raising=False)  # loaded or not: gone
    monkeypatch.setattr(flyarchive, "_LAZY",
                        {k: v for k, v in flyarchive._LAZY.items() if k != "positions"})

    with pytest.raises(SelectionError, match="need flyarchive.positions"):
        traces.keypoint_values(ds, [3], "torso", slice(None), model=None)
    assert not traces.keypoints_available()


def test_the_render_backend_is_the_fastest_this_machine_has(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert best_backend() in ("cpu", "opengl")  # no mujoco-warp: OpenGL
