"""The 3D view's data: poses by forward kinematics equal a live MjData's, and the scene
lists the geoms MuJoCo draws."""

from __future__ import annotations

import mujoco
import numpy as np

from flyarchive.testing import simulate, tiny_model
from flyarchive.view.geom_poses import Poser, scene, visible_geoms


def test_poses_are_the_geoms_of_a_live_simulation():
    model = tiny_model()
    live: list[mujoco.MjData] = []
    simulate(model, 1, 40, lambda datas: None)
    data = simulate(model, 1, 40, lambda datas: None)[0]
    live.append(data)
    states = {"qpos": data.qpos[None].copy(), "mocap_pos": data.mocap_pos[None].copy(),
              "mocap_quat": data.mocap_quat[None].copy()}
    poser = Poser(model)

    poses = poser.poses(states, [0])

    mujoco.mj_kinematics(model, data)
    geoms = visible_geoms(model)
    np.testing.assert_allclose(poses[0, :-1, :3], data.geom_xpos[geoms], atol=1e-6)
    np.testing.assert_allclose(poses[0, :-1, 3:], data.geom_xmat[geoms], atol=1e-6)
    np.testing.assert_allclose(poses[0, -1, :3], data.xpos[poser.root_body], atol=1e-6)


def test_frames_without_data_have_no_pose():
    model = tiny_model()
    states = {"qpos": np.full((2, model.nq), np.nan)}

    poses = Poser(model).poses(states, [1])

    assert np.isnan(poses).all()


def test_the_scene_holds_every_visible_geom_and_each_mesh_once():
    model = mujoco.MjModel.from_xml_string("""
    <mujoco><asset><mesh name="tet" vertex="0 0 0 1 0 0 0 1 0 0 0 1"/></asset>
    <worldbody>
      <geom type="mesh" mesh="tet"/><geom type="mesh" mesh="tet" pos="2 0 0" rgba="1 0 0 1"/>
      <geom type="sphere" size="0.1" group="3"/><geom type="box" size="1 2 3" rgba="0 0 1 0"/>
      <geom type="capsule" size="0.1 0.5"/>
    </worldbody></mujoco>""")

    description, blob = scene(model, visible_geoms(model))

    assert [g["type"] for g in description["geoms"]] == ["mesh", "mesh", "capsule"]
    assert description["geoms"][1]["rgba"] == [1.0, 0.0, 0.0, 1.0]
    (mesh,) = description["meshes"]
    vertices = np.frombuffer(blob, np.float32, mesh["vertices"] * 3).reshape(-1, 3)
    faces = np.frombuffer(blob, np.uint32, mesh["faces"] * 3, offset=vertices.nbytes)
    np.testing.assert_allclose(vertices, model.mesh_vert[:mesh["vertices"]], atol=1e-6)
    assert len(blob) == vertices.nbytes + faces.nbytes and faces.max() < mesh["vertices"]
