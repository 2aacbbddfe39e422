"""Fixtures of the analysis tests: a model with sites, and small archives of it and of the
tiny model (one with worlds of unequal length)."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest

from flyarchive.testing.fixtures import record

#: Free, hinge, ball and slide joints, a mocap body, and sites (one turned) in moving bodies.
SITES_XML = """
<mujoco>
  <option timestep="0.002"/>
  <worldbody>
    <geom type="plane" size="2 2 0.1"/>
    <body name="fly/c_thorax" pos="0 0 0.5" quat="0.9 0.1 0.3 0.2">
      <freejoint/>
      <geom type="box" size="0.2 0.1 0.05"/>
      <site name="fly/c_back" pos="-0.1 0.02 0.05" quat="0.7 0.1 0.7 0.1"/>
      <body name="fly/lf_femur" pos="0.1 0.1 0" quat="0.96 0 0.28 0">
        <joint name="hip" type="hinge" axis="0 1 0.3" pos="0.01 0 0" ref="0.2"/>
        <geom type="capsule" fromto="0 0 0 0.15 0 -0.05" size="0.02"/>
        <body name="fly/lf_tarsus5" pos="0.15 0 -0.05">
          <joint name="knee" type="ball"/>
          <joint name="slide" type="slide" axis="0 0 1"/>
          <geom type="capsule" fromto="0 0 0 0.1 0 -0.2" size="0.01"/>
          <site name="fly/lf_claw" pos="0.1 0 -0.2"/>
        </body>
      </body>
    </body>
    <body name="target" mocap="true" pos="0.5 0.5 0.3" quat="0.8 0 0.6 0">
      <geom type="sphere" size="0.05" contype="0" conaffinity="0"/>
      <site name="target_tip" pos="0.05 0 0" quat="0 1 0 0"/>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.fixture
def sites_model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(SITES_XML)


@pytest.fixture
def sites_archive(sites_model: mujoco.MjModel, tmp_path: Path) -> str:
    """3 worlds of the sites model, 20 frames each (chunks of 5), its model kept."""
    return record(sites_model, str(tmp_path / "sites.zarr"), n_worlds=3, chunk_frames=5)


@pytest.fixture
def uneven_archive(tiny: mujoco.MjModel, tmp_path: Path) -> str:
    """2 tiny worlds of random states, world 0 with 12 committed frames, world 1 with 20."""
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.models import model_bytes
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock

    url = str(tmp_path / "uneven.zarr")
    rng = np.random.default_rng(3)
    qpos = np.tile(tiny.qpos0, (2, 20, 1)) + rng.normal(0, 0.3, (2, 20, tiny.nq))
    mocap_pos = rng.normal(0, 0.5, (2, 20, 1, 3))
    mocap_quat = rng.normal(0, 1, (2, 20, 1, 4))
    mocap_quat /= np.linalg.norm(mocap_quat, axis=-1, keepdims=True)
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(0.002, 25, 0.2), (0, 1),
                       chunk_frames=5, shard_worlds=1, model=model_bytes(tiny))
    with ArchiveWriter.create(url, spec) as writer:
        writer.write(FrameBlock(np.arange(20) * 0.008, qpos, mocap_pos, mocap_quat),
                     n_frames=np.array([12, 20]))
    return url


@pytest.fixture
def bulky_archive(tmp_path: Path) -> tuple[str, bytes]:
    """An archive (2 worlds, 20 frames) of the sites model with a height field of 300 x 300
    samples that no geom uses: an MJB of 371 kB beside a graph of a few kB. A model no other
    test has (its timestep is drawn), so no Dask worker has it loaded yet. Its URL and MJB
    bytes."""
    from flyarchive.models import model_bytes

    timestep = 0.002 + int(np.random.default_rng().integers(1, 10**6)) * 1e-12
    xml = SITES_XML.replace(
        '<option timestep="0.002"/>',
        f'<option timestep="{timestep!r}"/>\n  '
        '<asset><hfield name="bulk" nrow="300" ncol="300" size="1 1 0.1 0.1"/></asset>')
    model = mujoco.MjModel.from_xml_string(xml)
    return record(model, str(tmp_path / "bulky.zarr")), model_bytes(model)
