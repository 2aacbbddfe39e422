"""The gait panels' answers (issue 34): each leg's stance intervals as the gait functions
find them, the thorax's path as the states hold it (thinned past 1,000 frames), kept
positions read instead of computed, a world shown again answered from the cache, and a
large answer sent compressed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flyarchive
from flyarchive.testing.markers import requires_view

pytestmark = requires_view


@pytest.fixture(scope="module")
def walker_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    from flyarchive.testing.view import walker_view_archive

    return walker_view_archive(str(tmp_path_factory.mktemp("view-gait") / "walker.zarr"),
                               n_worlds=16)


def viewer_of(url: str, tmp_path: Path) -> Any:
    from flyarchive.view.app import Viewer

    return Viewer(url, out=tmp_path / "videos", backend="opengl")


def test_the_stances_are_the_gait_functions_stances_and_the_path_the_thorax(walker_url, tmp_path):
    viewer = viewer_of(walker_url, tmp_path)
    epochs = flyarchive.gait_epochs(walker_url, worlds=[1, 3])
    summary = flyarchive.gait_summary(walker_url, worlds=[1, 3])
    qpos = [s["qpos"] for s in viewer.viewed.states([3, 1])]

    answer = viewer.gait({"worlds": "3,1"})

    assert [w["world"] for w in answer["worlds"]] == [3, 1]  # in the order asked
    assert answer["legs"] == ["lf", "lm", "lh", "rf", "rm", "rh"]
    assert answer["units"]["time"] == "s" and answer["units"]["path"] == "mm"
    assert answer["units"]["step_frequency"] == "Hz"
    for got, states in zip(answer["worlds"], qpos):
        world = got["world"]
        for leg, stances in zip(answer["legs"], got["stance"]):
            rows = epochs[(epochs.world == world) & (epochs.leg == leg) & (epochs.phase == "stance")]
            np.testing.assert_allclose(stances, rows[["start_time", "stop_time"]].to_numpy(),
                                       rtol=0, atol=1e-9)  # sent to the nanosecond
        np.testing.assert_allclose(got["path"]["x"], states[:, 0], rtol=0, atol=1e-6)  # nm
        np.testing.assert_allclose(got["path"]["y"], states[:, 1], rtol=0, atol=1e-6)
        expected = summary.sel(world=world)
        assert got["measures"]["step_frequency"] == pytest.approx(
            [float(expected[f"step_frequency_{leg}"]) for leg in answer["legs"]])
        assert got["measures"]["distance"] == pytest.approx(float(expected.distance))


def test_a_long_path_is_thinned_to_1000_points_keeping_its_ends(tmp_path):
    from flyarchive.testing.walker import walker_archive

    url = walker_archive(str(tmp_path / "long.zarr"), frames=1500)
    viewer = viewer_of(url, tmp_path)
    states = viewer.viewed.states([0])[0]["qpos"]

    path = viewer.gait({"worlds": "0"})["worlds"][0]["path"]

    assert len(path["t"]) == 1000
    assert path["t"][0] == 0.0 and path["t"][-1] == pytest.approx(1499 * 0.008)
    frames = np.round(np.asarray(path["t"]) / 0.008).astype(int)
    np.testing.assert_allclose(path["x"], states[frames, 0], rtol=0, atol=1e-6)


def test_a_world_shown_again_is_answered_without_computing_it_again(walker_url, tmp_path,
                                                                    monkeypatch):
    from flyarchive.view import gait_panels as gait

    viewer = viewer_of(walker_url, tmp_path)
    asked: list[list[int]] = []
    compute = gait.world_gaits
    monkeypatch.setattr(gait, "world_gaits", lambda source, worlds, *a, **k: (
        asked.append(list(worlds)), compute(source, worlds, *a, **k))[1])

    first = viewer.gait({"worlds": "0,2"})
    again = viewer.gait({"worlds": "2,0,1"})
    windowed = viewer.gait({"worlds": "0", "start": "0.1"})

    assert asked == [[0, 2], [1], [0]]  # only what was not shown before, per window
    assert again["worlds"][1] == first["worlds"][0]
    assert windowed["window"][0] == pytest.approx(0.104)


def test_gait_positions_kept_on_the_command_line_are_read_not_computed(walker_url, tmp_path,
                                                                        monkeypatch, cli):
    from flyarchive.testing.fixtures import copy_archive

    url = copy_archive(walker_url, tmp_path / "kept.zarr")
    code, _, err = cli("positions", url, "--keypoints", "gait", "--quiet")
    assert code == 0, err
    viewer = viewer_of(url, tmp_path)
    expected = flyarchive.gait_epochs(walker_url, worlds=[2])

    def no_kinematics(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("positions were computed, not read")

    monkeypatch.setattr("flyarchive.analyze.lazy.lazy_positions", no_kinematics)
    answer = viewer.gait({"worlds": "2"})

    stance = expected[(expected.leg == "lf") & (expected.phase == "stance")]
    np.testing.assert_allclose(answer["worlds"][0]["stance"][0],
                               stance[["start_time", "stop_time"]].to_numpy(), rtol=0, atol=1e-9)


def test_a_large_gait_answer_travels_compressed(walker_url, tmp_path):
    import gzip
    import json

    from flyarchive.testing.view import ask, origin, serving

    worlds = ",".join(map(str, range(16)))
    with serving(walker_url, out=tmp_path / "videos", backend="opengl") as (served, _):
        url = f"{origin(served)}/api/gait?worlds={worlds}"
        plain = ask(url, headers={"X-Flyarchive-Token": served.token})
        packed = ask(url, headers={"X-Flyarchive-Token": served.token, "Accept-Encoding": "gzip"})

    assert plain[0] == packed[0] == 200
    assert len(plain[2]) > 32 << 10 and "Content-Encoding" not in plain[1]
    assert packed[1]["Content-Encoding"] == "gzip" and len(packed[2]) < len(plain[2]) / 3
    assert json.loads(gzip.decompress(packed[2])) == json.loads(plain[2])


def test_the_table_and_scatter_units_are_the_stored_ones_never_guessed_from_a_name(tiny, tmp_path):
    import xarray as xr

    from flyarchive.testing.fixtures import record

    url = record(tiny, str(tmp_path / "run.zarr"), n_worlds=3, n_steps=12)
    flyarchive.add_world_vars(url, {
        "distance": [1.0, 2.0, 3.0],  # the user's own, not a gait measure
        "reach": xr.DataArray([0.1, 0.2, 0.3], dims="world", attrs={"units": "m"})})
    viewer = viewer_of(url, tmp_path)

    info = viewer.info()
    scatter = viewer.scatter({"x": "distance", "y": "reach"})

    assert info["column_units"] == {"reach": "m"}
    assert scatter["units"] == {"reach": "m"} and scatter["worlds"] == [0, 1, 2]
