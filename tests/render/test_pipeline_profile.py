"""flyarchive.PipelineProfile: the Warp pipeline's stage times and counts, per block and per
thread, and nothing kept at module level."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import flyarchive
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import requires_warp

SIZE = (32, 48)  # (height, width)


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """2 tiny worlds, 6 frames each."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("tiny") / "run.zarr"), n_steps=20,
                  chunk_frames=8)


def render_warp_cpu(url: str, out: Path, worlds: list[int], time: tuple[float, float]) -> None:
    from flyarchive.testing import tiny_model

    options = flyarchive.RenderOptions(size=SIZE, backend="warp-cpu", batch_worlds=4)
    flyarchive.render_videos(url, tiny_model(), "front", str(out), worlds=worlds, time=time,
                             options=options, n_workers=0)


@requires_warp
def test_a_profile_of_a_warp_cpu_render_has_every_stage(tiny_archive: str, tmp_path: Path) -> None:
    from flyarchive.render.diagnostics import COUNTS, STAGES

    with flyarchive.PipelineProfile() as profile:
        render_warp_cpu(tiny_archive, tmp_path / "v", worlds=[0, 1], time=(0.0, 0.04))

    results = profile.results
    assert sorted(results) == sorted(STAGES + COUNTS)
    assert all(value >= 0 for value in results.values())
    assert (results["frames"], results["videos"]) == (12, 2)  # 2 worlds x 6 frames
    assert results["encode_s"] > 0 and results["batches"] == 3  # 12 states, 4 per batch


@requires_warp
def test_a_render_outside_the_block_adds_nothing(tiny_archive: str, tmp_path: Path) -> None:
    with flyarchive.PipelineProfile() as profile:
        pass
    render_warp_cpu(tiny_archive, tmp_path / "v", worlds=[0], time=(0.0, 0.04))

    assert set(profile.results.values()) == {0.0}


@requires_warp
def test_two_concurrent_renders_do_not_mix_their_profiles(tiny_archive: str,
                                                          tmp_path: Path) -> None:
    jobs = {"one": ([0], (0.0, 0.016)), "two": ([0, 1], (0.0, 0.04))}  # 3 and 12 states
    results: dict[str, list[dict[str, float]]] = {name: [] for name in jobs}
    errors: list[BaseException] = []

    def render(name: str, k: int) -> None:
        try:
            with flyarchive.PipelineProfile() as profile:
                render_warp_cpu(tiny_archive, tmp_path / f"{name}{k}", *jobs[name])
            results[name].append(profile.results)
        except BaseException as err:
            errors.append(err)

    for k in range(3):
        threads = [threading.Thread(target=render, args=(name, k)) for name in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert errors == []
    assert [(r["frames"], r["videos"]) for r in results["one"]] == [(3, 1)] * 3
    assert [(r["frames"], r["videos"]) for r in results["two"]] == [(12, 2)] * 3


def test_nested_profiles_see_their_own_blocks() -> None:
    from flyarchive.render.diagnostics import StageTimer

    with flyarchive.PipelineProfile() as outer:
        StageTimer().add("frames", 2)
        with flyarchive.PipelineProfile() as inner:
            StageTimer().add("frames", 3)

    assert (outer.results["frames"], inner.results["frames"]) == (5, 3)


def test_the_warp_pipeline_keeps_no_module_level_stats() -> None:
    import flyarchive.render.warp_pipeline as pipeline

    assert not hasattr(pipeline, "STATS")
