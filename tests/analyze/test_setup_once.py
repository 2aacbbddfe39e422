"""Set-up paid once per process: the model kept beside an archive is read and loaded once,
and a mujoco-warp engine (device model, data, pinned slots) serves every later call with
the same model, keypoints, device and batch size; the least recently used goes when other
engines are asked for."""

from __future__ import annotations

import numpy as np
import pytest

import flyarchive
from flyarchive.analyze.warp_stream import StreamStats, load_positions
from flyarchive.testing.markers import WARP_BACKEND, requires_warp


def test_the_model_kept_beside_an_archive_is_read_once_per_process(sites_archive, monkeypatch):
    from flyarchive.analyze import model as analysis
    from flyarchive.models import kept

    analysis._KEPT.clear()
    reads = []
    real = kept.kept_model
    monkeypatch.setattr(kept, "kept_model", lambda *a, **k: reads.append(a) or real(*a, **k))

    first = flyarchive.positions(sites_archive, "*").compute()
    second = flyarchive.positions(sites_archive, "*").compute()

    assert len(reads) == 1
    assert np.array_equal(first.values, second.values)
    assert first.attrs["model_sha256"] == second.attrs["model_sha256"]


def test_a_kept_model_is_read_again_when_the_archive_names_another(sites_archive, tiny,
                                                                   tmp_path, monkeypatch):
    from flyarchive.analyze import model as analysis
    from flyarchive.models import kept
    from flyarchive.testing.fixtures import record

    analysis._KEPT.clear()
    other = record(tiny, str(tmp_path / "tiny.zarr"), n_worlds=1)
    reads = []
    real = kept.kept_model
    monkeypatch.setattr(kept, "kept_model", lambda *a, **k: reads.append(a[0]) or real(*a, **k))

    sites = flyarchive.positions(sites_archive, "*")
    tiny_positions = flyarchive.positions(other, "*")

    assert reads == [sites_archive, other]
    assert sites.attrs["model_sha256"] != tiny_positions.attrs["model_sha256"]


@requires_warp
@pytest.mark.slow
def test_a_second_load_of_the_same_window_builds_nothing_and_gives_the_same_values(sites_archive):
    from flyarchive.analyze.warp_positions import clear_engines

    clear_engines()
    first, again = StreamStats(), StreamStats()

    values = load_positions(sites_archive, "*", backend=WARP_BACKEND, stats=first)
    repeated = load_positions(sites_archive, "*", backend=WARP_BACKEND, stats=again)

    assert (first.engine, again.engine) == ("built", "kept")
    assert np.array_equal(values.values, repeated.values)
    assert again.call_seconds >= again.seconds + again.setup_seconds


@requires_warp
@pytest.mark.slow
def test_engines_are_kept_per_keypoints_and_the_least_recently_used_goes(sites_archive):
    from flyarchive.analyze import warp_positions

    warp_positions.clear_engines()
    asks = [["fly/c_thorax"], ["target"], ["fly/lf_tarsus5"], ["fly/c_thorax"], ["fly/lf_tarsus5"]]

    engines = []
    for bodies in asks:
        stats = StreamStats()
        load_positions(sites_archive, bodies, backend=WARP_BACKEND, stats=stats)
        engines.append(stats.engine)

    assert warp_positions.ENGINES_KEPT == 2
    assert engines == ["built", "built", "built", "built", "kept"]
    assert len(warp_positions._ENGINES) == 2


@requires_warp
@pytest.mark.slow
def test_lazy_positions_use_one_engine_per_process_sized_to_their_largest_block(sites_archive):
    from flyarchive.analyze import warp_positions

    warp_positions.clear_engines()
    lazy = flyarchive.positions(sites_archive, "*", backend=WARP_BACKEND)
    largest = max(lazy.chunks[0]) * max(lazy.chunks[1])

    first = lazy.compute(scheduler="threads")
    engines = warp_positions._ENGINES
    engine = engines.peek(next(engines.keys()))
    second = flyarchive.positions(sites_archive, "*", backend=WARP_BACKEND).compute()

    assert len(engines) == 1
    assert engine.batch == largest
    assert engines.peek(next(engines.keys())) is engine
    assert np.array_equal(first.values, second.values)
