"""What a user meets first: open_archive's dataset has the coordinates xarray.open_zarr
gives (sim_time and frame along time, as the README says), and every public function that
takes an archive's location takes a pathlib.Path as well as a string."""

from pathlib import Path

import numpy as np
import pytest

import flyarchive
from flyarchive.store.dataset import open_header
from flyarchive.testing.fixtures import record


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    from flyarchive.testing import tiny_model

    return Path(record(tiny_model(), str(tmp_path_factory.mktemp("face") / "run.zarr")))


def test_sim_time_and_frame_are_coordinates_along_time_as_xarray_reads_them(archive):
    import xarray as xr

    expected = xr.open_zarr(archive)
    ds = flyarchive.open_archive(str(archive))
    header = open_header(str(archive))

    assert sorted(ds.coords) == sorted(expected.coords)
    assert {"sim_time", "frame"} <= set(ds.coords) and set(ds.data_vars) == set(expected.data_vars)
    assert sorted(header.coords) == sorted(ds.coords)
    assert ds.qpos.attrs == expected.qpos.attrs  # the CF 'coordinates' attribute is decoded
    assert ds.qpos.isel(world=0).sim_time.dims == ("time",)
    np.testing.assert_array_equal(ds.frame.values, expected.frame.values)


def _uses(archive, tmp_path, function):
    from flyarchive.plot import plot_traces
    from flyarchive.store.integrity import verify
    from flyarchive.testing import simulate, tiny_model

    if function == "TrajectoryRecorder":
        model = tiny_model()
        with flyarchive.TrajectoryRecorder(tmp_path / "new.zarr", model) as recorder:
            simulate(model, 1, 8, recorder.record_as_needed)
        return flyarchive.open_archive(tmp_path / "new.zarr").sizes["world"] == 1
    calls = {
        "open_archive": lambda: flyarchive.open_archive(archive).qpos.shape == (2, 20, 13),
        "open_header": lambda: open_header(archive).sizes["time"] == 20,
        "verify": lambda: verify(archive).ok,
        "export_npz": lambda: len(flyarchive.export_npz(archive, tmp_path / "npz").files) == 2,
        "read_trajectories": lambda: len(flyarchive.read_trajectories(archive)) == 2,
        "plot_traces": lambda: plot_traces(archive, 0, tmp_path / "p.png").exists(),
        "render_videos": lambda: len(flyarchive.render_videos(
            archive, tiny_model(), "front", tmp_path / "videos", worlds=[0], time=(0, 0.016),
            options=flyarchive.RenderOptions(size=(48, 64)), n_workers=0).videos) == 1,
    }
    return calls[function]()


@pytest.mark.parametrize("function", ["TrajectoryRecorder", "open_archive", "open_header",
                                      "verify", "export_npz", "read_trajectories", "plot_traces",
                                      "render_videos"])
def test_a_pathlib_path_is_taken_wherever_a_url_is(archive, tmp_path, function):
    if function == "read_trajectories":
        pytest.importorskip("flygym")

    assert _uses(archive, tmp_path, function)
