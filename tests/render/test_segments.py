"""How a render plan splits its videos into segments (Dask tasks), a head segment included."""

from __future__ import annotations

import pytest

from flyarchive.query.selection import VideoJob
from flyarchive.render.options import RenderOptions
from flyarchive.render.plan import RenderPlan


def plan_of(*frames: tuple[int, int], segment_frames: int = 100) -> RenderPlan:
    jobs = tuple(VideoJob(world_id=w, world_index=w, start=a, stop=b)
                 for w, (a, b) in enumerate(frames))
    return RenderPlan(url="run.zarr", storage_options={}, cameras=("front",), out="out",
                      out_storage_options={}, fps=25.0,
                      options=RenderOptions(segment_frames=segment_frames), jobs=jobs)


def covered(segments) -> dict[int, list[int]]:
    """Per world, the frames of its segments in the order given."""
    out: dict[int, list[int]] = {}
    for job, k0, k1 in segments:
        out.setdefault(job.world_id, []).extend(range(k0, k1))
    return out


@pytest.mark.parametrize("head", [0, 1, 25, 250, 400])
def test_segments_cover_every_frame_once_in_order_with_or_without_a_head(head):
    plan = plan_of((10, 260), (0, 250), segment_frames=100)

    segments = list(plan.segments(2, head=head))

    assert covered(segments) == {0: list(range(10, 260)), 1: list(range(250))}
    assert all(0 < k1 - k0 <= 100 for _, k0, k1 in segments)


def test_a_head_is_the_first_jobs_first_frames_and_the_rest_split_among_the_workers():
    plan = plan_of((0, 250), (0, 250))

    job, k0, k1 = next(iter(plan.segments(2, head=25)))
    rest = list(plan.segments(2, head=25))[1:]

    assert (job.world_id, k0, k1) == (0, 0, 25)
    assert rest[0][1] == 25  # the first job goes on from the head's end
    assert max(k1 - k0 for _, k0, k1 in rest) == 60  # 475 frames / (4 tasks x 2 workers)


def test_a_head_longer_than_a_segment_is_cut_to_one():
    plan = plan_of((0, 250), segment_frames=40)

    _, k0, k1 = next(iter(plan.segments(2, head=100)))

    assert (k0, k1) == (0, 40)
