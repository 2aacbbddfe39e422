"""Bad input to the recorders: each case is refused with a clear error, records nothing of
the call, and leaves what was committed as it was (issue 10, items 1, 5, 7 and 12)."""

import warnings
from pathlib import Path

import mujoco
import numpy as np
import pytest

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.errors import LayoutMismatchError, RecordingError
from flyarchive.testing import reference_frames, simulate, slider_model
from flyarchive.testing.fixtures import snapshot
from flyarchive.testing.markers import requires_warp


def worlds_at(model, n_worlds, n_steps, *, seed=0):
    """``n_worlds`` MjData stepped ``n_steps`` times as :func:`simulate` steps them."""
    return simulate(model, n_worlds, n_steps, lambda datas: None, seed=seed)


def stepped(model, datas, n_steps):
    for _ in range(n_steps):
        for data in datas:
            mujoco.mj_step(model, data)
    return datas


@pytest.fixture
def three_world_recording(tiny, tmp_path):
    """A recorder with 3 worlds, 5 frames committed and 2 buffered (chunk_frames=5)."""
    url = str(tmp_path / "three.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)
    datas = simulate(tiny, 3, 24, recorder.record_as_needed)  # frames at steps 0..24: 7
    yield url, recorder, datas
    recorder.close()


# ----------------------------------------------------------------------------- item 1
def test_fewer_mjdata_than_worlds_mid_run_is_refused_and_buffers_nothing(tiny, three_world_recording):
    url, recorder, datas = three_world_recording
    stepped(tiny, datas, 4)  # a frame is due
    before = snapshot(url)

    with pytest.raises(RecordingError, match="The recorder .* has 3 worlds; 2 MjData were passed"):
        recorder.record_as_needed(datas[:2])

    assert snapshot(url) == before
    assert recorder.n_frames == 7


def test_more_mjdata_than_worlds_mid_run_is_refused(tiny, three_world_recording):
    url, recorder, datas = three_world_recording
    extra = stepped(tiny, [mujoco.MjData(tiny)], 28)
    before = snapshot(url)

    with pytest.raises(RecordingError, match="has 3 worlds; 4 MjData were passed"):
        recorder.record_as_needed([*stepped(tiny, datas, 4), *extra])

    assert snapshot(url) == before
    assert recorder.n_frames == 7


def test_an_empty_list_of_mjdata_is_refused_and_creates_nothing(tiny, tmp_path):
    url = str(tmp_path / "empty.zarr")
    recorder = TrajectoryRecorder(url, tiny)

    with pytest.raises(RecordingError, match="No MjData were passed"):
        recorder.record_as_needed([])

    assert not Path(url).exists()


def test_a_refused_call_leaves_no_stale_rows_in_the_committed_worlds(tiny, tmp_path):
    url = str(tmp_path / "stale.zarr")
    expected = reference_frames(tiny, 3, 40)
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=3)

    def on_step(datas):
        if round(datas[0].time / tiny.opt.timestep) == 20:  # a frame is due: offer 2 of 3
            with pytest.raises(RecordingError, match="has 3 worlds; 2 MjData were passed"):
                recorder.record_as_needed(datas[:2])
        recorder.record_as_needed(datas)

    with recorder:
        simulate(tiny, 3, 40, on_step)

    ds = open_archive(url)
    assert ds.n_frames.values.tolist() == [11, 11, 11]
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])


def test_mjdata_at_different_times_are_refused(tiny, tmp_path):
    url = str(tmp_path / "times.zarr")
    recorder = TrajectoryRecorder(url, tiny)
    datas = worlds_at(tiny, 2, 8)
    stepped(tiny, datas[:1], 1)

    with pytest.raises(RecordingError, match=r"different simulation times \(world 0: t=0.018.*"
                                             r"world 1: t=0.016"):
        recorder.record_as_needed(datas)

    assert not Path(url).exists()


def test_mjdata_at_different_times_mid_run_leave_the_archive_as_it_was(tiny, three_world_recording):
    url, recorder, datas = three_world_recording
    stepped(tiny, datas[1:], 4)
    before = snapshot(url)

    with pytest.raises(RecordingError, match="different simulation times"):
        recorder.record_as_needed(datas)

    assert snapshot(url) == before
    assert recorder.n_frames == 7


# ----------------------------------------------------------------------------- item 7
def test_mjdata_of_another_model_is_refused_naming_both_sides(tiny, tmp_path):
    url = str(tmp_path / "other-model.zarr")
    recorder = TrajectoryRecorder(url, tiny)
    other = mujoco.MjData(slider_model())

    with pytest.raises(LayoutMismatchError, match=r"MjData 1 has nq=1, nmocap=0.*model with "
                                                  r"nq=13, nmocap=1"):
        recorder.record_as_needed([mujoco.MjData(tiny), other])

    assert not Path(url).exists()


def test_mjdata_of_another_model_mid_run_is_refused_and_commits_nothing(tiny, three_world_recording):
    url, recorder, datas = three_world_recording
    others = stepped(slider_model(), [mujoco.MjData(slider_model()) for _ in range(3)], 6)  # t=0.06
    before = snapshot(url)

    with pytest.raises(LayoutMismatchError, match="nq=1.*nq=13"):
        recorder.record_as_needed(others)

    assert snapshot(url) == before
    assert recorder.n_frames == 7


# ----------------------------------------------------------------------------- item 5
def test_a_simulation_restarted_at_t0_is_refused_by_the_same_recorder(tiny, three_world_recording):
    url, recorder, _ = three_world_recording
    restarted = worlds_at(tiny, 3, 0, seed=10)
    before = snapshot(url)

    with pytest.raises(RecordingError, match=r"went back in time: it is at t=0.0 s after "
                                             r"t=0.048.*restarted.*new archive.*mode='w'"):
        recorder.record_as_needed(restarted)

    assert snapshot(url) == before
    assert recorder.n_frames == 7


def test_appending_another_run_that_restarted_at_t0_is_refused(tiny, archive):
    before = snapshot(archive)
    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a")

    with pytest.raises(RecordingError, match=r"restarted before the last committed frame.*"
                                             r"another run.*Nothing was appended"):
        simulate(tiny, 2, 200, recorder.record_as_needed, seed=7)
    recorder.close()

    assert snapshot(archive) == before


def test_a_rerun_that_skips_the_last_committed_frame_is_refused(tiny, archive):
    before = snapshot(archive)
    recorder = TrajectoryRecorder(archive, tiny, chunk_frames=5, mode="a")
    datas = worlds_at(tiny, 2, 0)

    recorder.record_as_needed(datas)  # t=0: a rerun; the last committed frame is at t=0.152
    with pytest.raises(RecordingError, match="without having been recorded at that frame"):
        recorder.record_as_needed(stepped(tiny, datas, 80))
    recorder.close()

    assert snapshot(archive) == before


# ----------------------------------------------------------------------------- item 12
def test_recording_after_reset_is_refused_and_keeps_the_frames(tiny, tmp_path):
    url = str(tmp_path / "reset.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)
    simulate(tiny, 1, 24, recorder.record_as_needed)
    recorder.reset()
    before = snapshot(url)

    with pytest.raises(RecordingError, match=r"reset after 7 frames.*another URL, or mode='w'"):
        recorder.record_as_needed(worlds_at(tiny, 1, 0))

    assert snapshot(url) == before
    assert open_archive(url).n_frames.values.tolist() == [7]


# ----------------------------------------------------------------------------- Warp recorder
@pytest.fixture(scope="module")
def warp_tiny():
    """The tiny model on Warp's CPU device."""
    import mujoco_warp as mjw
    import warp as wp

    from flyarchive.testing import tiny_model

    wp.config.quiet = True
    model = tiny_model()
    with wp.ScopedDevice("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # mujoco-warp's notices about the model
        return model, mjw.put_model(model)


def warp_data(model, nworld, seed=0):
    import mujoco_warp as mjw
    import warp as wp

    with wp.ScopedDevice("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        d = mjw.make_data(model, nworld=nworld)
        rng = np.random.default_rng(seed)
        d.qvel.assign(rng.normal(0.0, 1.0, (nworld, model.nv)).astype(np.float32))
    return d


def warp_steps(warp_tiny, d, recorder, n_steps, *, first=True):
    """Step ``d`` and call the recorder after each step (and before the first)."""
    import mujoco_warp as mjw
    import warp as wp

    with wp.ScopedDevice("cpu"):
        if first:
            recorder.record_as_needed(d)
        for _ in range(n_steps):
            mjw.step(warp_tiny[1], d)
            recorder.record_as_needed(d)


def warp_recorder(model, url, nworld=2, **kwargs):
    from flyarchive.recorders import WarpTrajectoryRecorder

    return WarpTrajectoryRecorder(url, model, nworld, chunk_frames=4, **kwargs)


@requires_warp
def test_a_warp_data_with_another_number_of_worlds_is_refused(warp_tiny, tmp_path):
    url = str(tmp_path / "warp-worlds.zarr")
    recorder = warp_recorder(warp_tiny[0], url, nworld=3)

    with pytest.raises(RecordingError, match=r"has 3 worlds \(nworld\); the Data passed has 2"):
        recorder.record_as_needed(warp_data(warp_tiny[0], 2))

    assert not Path(url).exists()


@requires_warp
def test_a_warp_data_of_another_model_is_refused_naming_both_sides(warp_tiny, tmp_path):
    url = str(tmp_path / "warp-model.zarr")
    recorder = warp_recorder(warp_tiny[0], url)
    slider = slider_model()

    with pytest.raises(LayoutMismatchError, match=r"mjw_data.qpos is \(\(2, 1\), 'float32'\); .*"
                                                  r"expects shape \(2, 13\)"):
        recorder.record_as_needed(warp_data(slider, 2))

    assert not Path(url).exists()


@requires_warp
def test_a_warp_simulation_reset_without_the_recorder_keeps_only_the_first_run(warp_tiny, tmp_path):
    import mujoco_warp as mjw

    url = str(tmp_path / "warp-restart.zarr")
    recorder = warp_recorder(warp_tiny[0], url)
    d = warp_data(warp_tiny[0], 2)
    warp_steps(warp_tiny, d, recorder, 16)  # frames 0..4 at steps 0..16; 0..3 committed
    mjw.reset_data(warp_tiny[1], d)  # t = 0 again, unknown to the recorder

    warp_steps(warp_tiny, d, recorder, 8)
    with pytest.raises(RecordingError, match=r"went back in time: frame 5 was taken at t=0.006.*"
                                             r"after a frame at t=0.03.*5 committed frames"):
        recorder.close()

    assert open_archive(url).n_frames.values.tolist() == [5, 5]


@requires_warp
def test_appending_another_warp_run_from_step_0_is_refused(warp_tiny, tmp_path):
    url = str(tmp_path / "warp-rerun.zarr")
    with warp_recorder(warp_tiny[0], url) as first:
        warp_steps(warp_tiny, warp_data(warp_tiny[0], 2, seed=0), first, 16)
    before = snapshot(url)
    recorder = warp_recorder(warp_tiny[0], url, mode="a")

    with pytest.raises(RecordingError, match=r"state differs from the committed one in world\(s\) "
                                             r"\[0, 1\].*another run"):
        warp_steps(warp_tiny, warp_data(warp_tiny[0], 2, seed=1), recorder, 40)
    recorder.close()

    assert snapshot(url) == before


# ----------------------------------------------------------------------------- new-user sweep
TWO_HINGES = ('<mujoco><worldbody><body><joint name="a" type="hinge"/>'
              '<joint name="b" type="hinge"/><geom size=".1" mass="1"/></body></worldbody></mujoco>')


@pytest.mark.parametrize("other, difference", [
    (TWO_HINGES.replace('name="b"', 'name="c"'), "qpos label at index 1: recorder 'b', model 'c'"),
    (TWO_HINGES.replace('name="b" type="hinge"', 'name="b" type="slide"'),
     "joint type at index 1: recorder 'hinge', model 'slide'"),
])
def test_mjdata_of_another_model_of_the_same_size_is_refused_mid_run(tmp_path, other, difference):
    model, again = (mujoco.MjModel.from_xml_string(TWO_HINGES) for _ in range(2))
    other = mujoco.MjModel.from_xml_string(other)
    url = str(tmp_path / "same-size.zarr")
    recorder = TrajectoryRecorder(url, model, chunk_frames=1, output_fps=25, playback_speed=1)
    mine, loaded_again, theirs = mujoco.MjData(model), mujoco.MjData(again), mujoco.MjData(other)
    for _ in range(21):  # frames 0 and 1 (20 steps of 2 ms apart), the second committed
        for model_, data in ((model, mine), (again, loaded_again), (other, theirs)):
            mujoco.mj_step(model_, data)
        recorder.record_as_needed([mine, loaded_again])  # the model loaded again: accepted
    before = snapshot(url)
    for _ in range(20):
        mujoco.mj_step(model, mine)
        mujoco.mj_step(other, theirs)

    with pytest.raises(LayoutMismatchError, match=f"MjData 1 is of another model .*{difference}"):
        recorder.record_as_needed([mine, theirs])

    assert snapshot(url) == before
    recorder.close()
    assert open_archive(url).sizes["time"] == 2


@pytest.mark.parametrize("given, said", [
    (None, "it was given NoneType"), (np.zeros(13), "it was given ndarray"),
    ([np.zeros(13)], "item 0 is ndarray"), ("sim.data", "it was given str"),
])
def test_what_is_not_mjdata_is_refused_naming_what_it_is(tiny, tmp_path, given, said):
    url = str(tmp_path / "not-data.zarr")
    recorder = TrajectoryRecorder(url, tiny)

    with pytest.raises(RecordingError, match=f"records mujoco.MjData .*; {said}"):
        recorder.record_as_needed(given)

    assert not Path(url).exists()


@pytest.mark.parametrize("url, said", [("", "is empty"), ("  ", "is empty"),
                                       (None, "must be a path or URL .* got NoneType")])
def test_an_empty_or_missing_location_is_refused_and_the_current_folder_kept(
        tiny, tmp_path, monkeypatch, url, said):
    from flyarchive.errors import OptionsError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "thesis.tex").write_text("years of work")

    for mode in ("w", "w-", "a"):
        with pytest.raises(OptionsError, match=f"An archive's location {said}"):
            TrajectoryRecorder(url, tiny, mode=mode)
    with pytest.raises(OptionsError, match=f"An archive's location {said}"):
        open_archive(url)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]
