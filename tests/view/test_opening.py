"""The viewer opens in two steps: the archive's header before it serves, the model after
(the first page does not wait for it); states are read without the lazy dataset."""

from __future__ import annotations

from flyarchive.testing.view import view_archive


def test_the_viewer_reads_only_the_header_before_serving(tmp_path):
    from flyarchive.view.app import Viewer

    url = view_archive(str(tmp_path / "run.zarr"))

    viewer = Viewer(url, out=tmp_path / "videos", backend="opengl")

    assert viewer.viewed._ds is None and viewer.model is None  # neither loaded yet
    assert viewer.info()["worlds"] == 4 and "model" not in viewer.info()
    assert list(viewer.viewed.columns) == ["world", "n_frames", "distance", "success"]


def test_the_model_and_the_states_load_when_first_asked_for_without_the_dataset(tmp_path):
    from flyarchive.view.app import Viewer

    url = view_archive(str(tmp_path / "run.zarr"))
    viewer = Viewer(url, out=tmp_path / "videos", backend="opengl")

    model = viewer.model_info()
    states = viewer.viewed.states([2])

    assert model["model"] is True and model["cameras"]
    assert viewer.info()["model"] is True
    assert states[0]["qpos"].shape[0] == 51
    assert viewer.viewed._ds is None  # read through the getters: no xarray, no dask


def test_only_a_process_that_is_the_viewer_freezes_what_it_loaded_out_of_full_gc_passes(tmp_path):
    import gc
    import threading

    from flyarchive.view.app import Viewer

    def warm_up(viewer, **freeze):
        viewer.warm_up(0, **freeze)
        for thread in threading.enumerate():
            if thread.name == "flyarchive-view-warm-up":
                thread.join(60)

    viewer = Viewer(view_archive(str(tmp_path / "run.zarr")), out=tmp_path / "videos",
                    backend="opengl")
    before = gc.get_freeze_count()
    try:
        warm_up(viewer)  # a viewer started from a user's program (start()): nothing frozen
        embedded = gc.get_freeze_count()
        warm_up(viewer, freeze=True)  # `flyarchive view`
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()

    assert viewer.model is not None
    assert embedded == before
    assert frozen > before


def test_the_vendored_libraries_stay_in_the_browsers_cache_and_the_pages_files_do_not(tmp_path):
    import urllib.request
    from urllib.parse import urlsplit

    from flyarchive.testing.view import serving

    url = view_archive(str(tmp_path / "run.zarr"))
    with serving(url, out=tmp_path / "videos", backend="opengl") as (served, _):
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(served.url))
        headers = {"X-Flyarchive-Token": served.token}

        def cache_control(path: str) -> str:
            request = urllib.request.Request(origin + path, headers=headers)
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.headers["Cache-Control"]

        assert cache_control("/static/vendor/three.module.min.js") == "private, max-age=3600"
        assert cache_control("/static/app.js") == "no-cache"
