"""flyarchive.positions on the CPU: bit-exact with a live MjData (bodies, sites, mocap),
points and orientations as defined, masks, windows, chunks, model checks, S3."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import flyarchive
from flyarchive.analyze import skeleton as skeleton_module
from flyarchive.analyze.cpu_positions import CpuKinematics
from flyarchive.analyze.keypoints import KeypointRequest, resolve
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import requires_flygym


def live_poses(model, ds, world, frame):
    """A live MjData at frame ``frame`` of ``world`` (index) of the loaded archive ``ds``,
    after mj_kinematics."""
    data = mujoco.MjData(model)
    data.qpos[:] = ds.qpos.values[world, frame]
    if model.nmocap:
        data.mocap_pos[:] = ds.mocap_pos.values[world, frame]
        data.mocap_quat[:] = ds.mocap_quat.values[world, frame]
    mujoco.mj_kinematics(model, data)
    return data


def test_body_positions_equal_a_live_mjdata_bit_for_bit_mocap_bodies_included(sites_archive,
                                                                              sites_model):
    ds = flyarchive.open_archive(sites_archive).load()

    actual = flyarchive.positions(sites_archive).values

    for w in range(3):
        for k in (0, 7, 19):
            expected = live_poses(sites_model, ds, w, k).xpos[1:]
            assert np.array_equal(actual[w, k], expected), (w, k)


def test_sites_equal_a_live_mjdata_bit_for_bit(sites_archive, sites_model):
    ds = flyarchive.open_archive(sites_archive).load()
    names = ["fly/c_back", "fly/lf_claw", "target_tip"]

    actual = flyarchive.positions(sites_archive, sites=names).values

    for k in (0, 11, 19):
        expected = live_poses(sites_model, ds, 1, k).site_xpos
        assert np.array_equal(actual[1, k], expected), k


def test_a_point_is_where_mujoco_puts_a_site_at_its_offset(sites_archive, sites_model):
    ds = flyarchive.open_archive(sites_archive).load()

    claw = flyarchive.positions(sites_archive, points={"claw": ("fly/lf_tarsus5", (0.1, 0, -0.2))})
    site = flyarchive.positions(sites_archive, sites="fly/lf_claw")

    assert np.array_equal(claw.values, site.values)
    data = live_poses(sites_model, ds, 2, 5)
    body = sites_model.body("fly/lf_tarsus5").id
    expected = data.xpos[body] + data.xmat[body].reshape(3, 3) @ [0.1, 0, -0.2]
    assert np.allclose(claw.values[2, 5, 0], expected, rtol=0, atol=1e-12)


def test_orientations_are_body_quaternions_turned_by_site_quaternions(sites_archive, sites_model):
    ds = flyarchive.open_archive(sites_archive).load()

    got = flyarchive.positions(sites_archive, ["fly/lf_femur", "target"],
                               sites=["fly/c_back", "target_tip"],
                               points={"p": ("fly/lf_femur", (0.1, 0.0, 0.0))}, orientations=True)

    data = live_poses(sites_model, ds, 0, 13)
    quat = got.orientation.values[0, 13]
    assert np.array_equal(quat[0], data.xquat[sites_model.body("fly/lf_femur").id])
    assert np.array_equal(quat[1], data.xquat[sites_model.body("target").id])
    for k, site in ((2, "fly/c_back"), (3, "target_tip")):
        expected = np.empty(4)
        mujoco.mju_mat2Quat(expected, data.site_xmat[sites_model.site(site).id])
        assert np.allclose(quat[k] * np.sign(quat[k] @ expected), expected, atol=1e-12)
    assert np.array_equal(quat[4], quat[0])  # a point turns with its body
    assert list(got.position.keypoint_kind.values) == ["body", "body", "site", "site", "point"]


def test_frames_past_n_frames_are_nan_and_the_others_are_computed(uneven_archive, tiny):
    got = flyarchive.positions(uneven_archive, "hand").values

    assert np.isnan(got[0, 12:]).all()
    assert np.isfinite(got[0, :12]).all() and np.isfinite(got[1]).all()


def test_chunks_follow_the_archives_chunks(uneven_archive):
    qpos = flyarchive.open_archive(uneven_archive).qpos

    got = flyarchive.positions(uneven_archive)

    assert got.chunks[:2] == qpos.chunks[:2]


def test_a_window_of_worlds_and_time_is_cut_from_the_archive(sites_archive):
    full = flyarchive.positions(sites_archive, "target")

    got = flyarchive.positions(sites_archive, "target", worlds=[2, 0], time=(0.04, 0.08))

    assert got.world.values.tolist() == [2, 0]
    assert np.allclose(got.time.values, [0.04, 0.048, 0.056, 0.064, 0.072, 0.08])
    assert np.array_equal(got.values, full.sel(world=[2, 0], time=got.time).values)


def test_a_dataset_from_open_archive_finds_its_kept_model(sites_archive):
    ds = flyarchive.open_archive(sites_archive).isel(world=[1])

    got = flyarchive.positions(ds, "target")

    assert got.attrs["source"] == sites_archive
    assert np.array_equal(got.values, flyarchive.positions(sites_archive, "target").values[1:2])


def test_a_given_model_is_used_when_it_fits(sites_model, tmp_path):
    url = record(sites_model, str(tmp_path / "nomodel.zarr"), store_model=False)

    got = flyarchive.positions(url, model=sites_model)

    assert got.shape == (2, 20, sites_model.nbody - 1, 3)


def test_selectors_pick_keypoints_by_leg_and_segment(sites_archive):
    got = flyarchive.positions(sites_archive, leg="lf", segment=["tarsus5", "claw"])
    both = flyarchive.positions(sites_archive, ["*"], sites=["fly/lf_claw"], leg="lf")

    assert got.keypoint.values.tolist() == ["fly/lf_tarsus5"]
    assert both.keypoint.values.tolist() == ["fly/lf_femur", "fly/lf_tarsus5", "fly/lf_claw"]
    assert flyarchive.select_keypoints(both, segment="claw").keypoint.values.tolist() == \
        ["fly/lf_claw"]


def test_tarsus_tips_are_the_far_ends_of_the_tarsus_geoms(sites_archive, sites_model):
    got = flyarchive.positions(sites_archive, points={"tip": ("fly/lf_tarsus5", "tip")})
    claw = flyarchive.positions(sites_archive, sites="fly/lf_claw")

    # the capsule from (0,0,0) to (0.1,0,-0.2) of radius 0.01: its box corner lies beyond
    assert np.allclose(got.values, claw.values, atol=0.03)
    assert flyarchive.tarsus_tips("fly", ["lf"]) == {"fly/lf_tip": ("fly/lf_tarsus5", "tip")}


def test_without_a_skeleton_the_original_model_gives_the_same_positions(
        sites_archive, sites_model, monkeypatch):
    kp = resolve(sites_model, KeypointRequest.of(None, sites=["fly/c_back", "target_tip"]))
    ds = flyarchive.open_archive(sites_archive).load()
    qpos, mp, mq = (ds[n].values[0] for n in ("qpos", "mocap_pos", "mocap_quat"))
    reduced = CpuKinematics(sites_model, kp, True).frames(qpos, mp, mq)
    monkeypatch.setattr(skeleton_module, "skeleton", lambda model, keypoints: None)

    engine = CpuKinematics(sites_model, kp, True)
    actual = engine.frames(qpos, mp, mq)

    assert engine.model is sites_model
    assert np.array_equal(actual, reduced)


def test_positions_of_an_archive_on_each_storage(location, sites_model):
    url = record(sites_model, location.url, storage_options=location.storage_options)

    got = flyarchive.positions(url, "target", storage_options=location.storage_options)

    ds = flyarchive.open_archive(url, location.storage_options).load()
    assert np.array_equal(got.values[1, 4, 0], live_poses(sites_model, ds, 1, 4).xpos[-1])


@pytest.mark.slow  # NeuroMechFly's world is built with flygym (seconds)
@requires_flygym
def test_neuromechfly_bodies_and_tarsus_tips_equal_a_live_mjdata_bit_for_bit(tmp_path):
    from flyarchive.interop import nmf
    from flyarchive.testing.fixtures import write_states

    world = nmf.build_world()
    model = world.model
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, world.neutral_key)
    qpos = data.qpos + np.random.default_rng(1).normal(0, 0.2, (2, 6, model.nq))
    url = write_states(str(tmp_path / "nmf.zarr"), model, qpos)

    got = flyarchive.positions(url, "*", points=flyarchive.tarsus_tips(), model=model).values

    for w, k in ((0, 0), (1, 5)):
        data.qpos[:] = qpos[w, k]
        mujoco.mj_kinematics(model, data)
        assert np.array_equal(got[w, k, :49], data.xpos[1:])  # 49 bodies and the world
        tip = model.body("nmf/rh_tarsus5").id
        assert np.allclose(got[w, k, 54], data.xpos[tip], atol=0.2)  # within the segment


def test_positions_compute_on_a_cluster_of_worker_processes(sites_archive, dask_client):
    lazy = flyarchive.positions(sites_archive, sites="target_tip", orientations=True)
    graph = dict(lazy.position.data.__dask_graph__())
    expected = lazy.compute(scheduler="synchronous")

    actual = dask_client.compute(lazy).result()

    models = [key for key in graph if str(key).startswith("flyarchive-model-")]
    assert len(models) == 1  # the model's bytes: one object, fetched once per worker
    assert np.array_equal(actual.position.values, expected.position.values)
    assert np.array_equal(actual.orientation.values, expected.orientation.values)
