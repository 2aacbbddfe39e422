"""The viewer's links to the rest of flyarchive: keypoint traces by forward kinematics
(:func:`flyarchive.positions`), and the render backend it picks."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import flyarchive
from flyarchive.errors import SelectionError
from flyarchive.testing import reference_frames, tiny_model
from flyarchive.testing.fixtures import record
from flyarchive.view import traces
from flyarchive.view.renders import best_backend


def test_keypoint_traces_are_the_bodies_of_the_recorded_states(tmp_path):
    model = tiny_model()
    url = record(model, str(tmp_path / "run.zarr"), n_worlds=3)
    ds = flyarchive.open_archive(url)
    expected = reference_frames(model, 3, 76)
    data = mujoco.MjData(model)
    hand = model.body("hand").id

    labels, values = traces.keypoint_values(ds, [1, 2], "hand", slice(2, 6), model=model)

    assert labels == ["hand/x", "hand/y", "hand/z"]
    assert values.shape == (2, 3, 4)  # (world, xyz, time)
    for i, w in enumerate([1, 2]):
        for j, k in enumerate(range(2, 6)):
            data.qpos[:] = expected["qpos"][w, k]
            data.mocap_pos[:] = expected["mocap_pos"][w, k]
            data.mocap_quat[:] = expected["mocap_quat"][w, k]
            mujoco.mj_kinematics(model, data)
            np.testing.assert_array_equal(values[i, :, j], data.xpos[hand])


def test_keypoint_traces_of_an_unknown_body_say_which_bodies_exist(tmp_path):
    model = tiny_model()
    ds = flyarchive.open_archive(record(model, str(tmp_path / "run.zarr")))

    with pytest.raises(SelectionError, match="hnd") as caught:
        traces.keypoint_values(ds, [0], "hnd", slice(None), model=model)

    assert "hand" in str(caught.value)


def test_the_render_backend_is_the_fastest_this_machine_has(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert best_backend() == "opengl"  # no mujoco-warp: OpenGL
