"""Frames whose state is not finite: found in every state array, rendered black."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import flyarchive

SIZE = (32, 48)  # (height, width)


def test_finite_frames_marks_a_frame_with_nan_in_any_array() -> None:
    from flyarchive.schema import finite_frames

    qpos = np.zeros((2, 4, 3))
    mocap = np.zeros((2, 4, 1, 3))
    qpos[0, 1, 2] = np.nan
    mocap[1, 3, 0, 0] = np.inf

    actual = finite_frames(qpos, mocap, None, frame_dims=2)

    assert actual.tolist() == [[True, False, True, True], [True, True, True, False]]


def test_render_frames_blacks_a_frame_whose_mocap_pose_is_not_finite(tmp_path: Path) -> None:
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import tiny_model

    model = tiny_model()
    url = str(tmp_path / "nan.zarr")
    qpos = np.tile(model.qpos0, (1, 3, 1))
    mocap_pos = np.tile(model.body_pos[model.body_mocapid >= 0], (1, 3, 1, 1))
    mocap_quat = np.tile([1.0, 0.0, 0.0, 0.0], (1, 3, 1, 1))
    mocap_pos[0, 1, 0, 0] = np.nan
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(0.002, 25.0, 0.2), (0,))
    writer = ArchiveWriter.create(url, spec)
    writer.write(FrameBlock(np.arange(3) * 0.008, qpos, mocap_pos, mocap_quat))
    writer.close()

    frames = flyarchive.render_frames(url, model, "front", size=SIZE).values[0]

    assert (frames[1] == 0).all() and (frames[0] > 0).any() and (frames[2] > 0).any()
