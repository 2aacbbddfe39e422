import pytest

from flyarchive.clock import FrameClock, Timing


def count_frames(timing: Timing, n_steps: int) -> int:
    clock = FrameClock(timing)
    return sum(clock.is_due(step) for step in range(n_steps))


def test_no_drift_when_interval_is_not_whole_steps():
    # flygym 2.1.1 records 5883 frames here; the schedule says 6000 per 10 s.
    timing = Timing(timestep=1e-4, output_fps=60, playback_speed=0.1)

    assert count_frames(timing, 100_000) == 6000


def test_whole_step_interval_records_every_nth_step():
    timing = Timing(timestep=0.002, output_fps=25, playback_speed=0.2)
    clock = FrameClock(timing)

    due = [step for step in range(20) if clock.is_due(step)]

    assert due == [0, 4, 8, 12, 16]


def test_frame_is_recorded_at_first_step_at_or_after_schedule():
    timing = Timing(timestep=1e-4, output_fps=60, playback_speed=0.1)

    steps = [timing.frame_step(k) for k in range(4)]

    assert steps == [0, 17, 34, 50]
    for k, step in enumerate(steps):
        assert step * timing.timestep >= k * timing.interval - 1e-12
        assert (step - 1) * timing.timestep < k * timing.interval


def test_resumed_clock_continues_the_schedule():
    timing = Timing(timestep=1e-4, output_fps=60, playback_speed=0.1)
    clock = FrameClock(timing, next_frame=3)

    due = [step for step in range(120) if clock.is_due(step)]

    assert due == [50, 67, 84, 100, 117]


def test_clock_from_float_time_tolerates_accumulated_rounding():
    timing = Timing(timestep=1e-4, output_fps=60, playback_speed=0.1)
    clock = FrameClock(timing)
    time, frames = 0.0, 0
    for _ in range(100_000):
        frames += clock.is_due_at(time)
        time += 1e-4

    assert frames == 6000


def test_frame_interval_below_timestep_is_refused():
    with pytest.raises(ValueError, match="Lower output_fps or raise playback_speed"):
        Timing(timestep=0.01, output_fps=60, playback_speed=0.1)


def test_non_positive_timing_is_refused():
    with pytest.raises(ValueError, match="output_fps must be a positive finite number"):
        Timing(timestep=0.01, output_fps=0, playback_speed=0.1)
