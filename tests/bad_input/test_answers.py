"""Bad input to the answers flyarchive gives back: ``.npz`` files whose schedule fields
(written by ``export_npz`` beside flygym's) are damaged, appends (``mode="a"``) with
another codec or dtype than stored, and claims left by crashed writers (``--takeover``).
Each case fails with a clear error and leaves what was committed as it was."""

from __future__ import annotations

import numpy as np
import pytest

from flyarchive.errors import NpzFormatError
from flyarchive.interop.flygym_npz import import_npz
from flyarchive.testing.fixtures import snapshot


# ----------------------------------------------------------------------------- npz schedules
@pytest.mark.parametrize(("fields", "fragment"), [
    ({"scheduled_time": None}, "scheduled_time and frame must come together"),
    ({"frame": np.array([1.5, 2.5])}, r"frame \(n,\) whole numbers with n=2"),
    ({"scheduled_time": np.array([0.0, np.nan])}, "must be finite and strictly increasing"),
    ({"scheduled_time": np.array([0.1, 0.0])}, "must be finite and strictly increasing"),
    ({"frame": np.array([-2, 1])}, "at least -1"),
])
def test_a_file_with_a_damaged_schedule_is_refused_and_imports_nothing(tiny, tmp_path, fields,
                                                                     fragment):
    arrays = {"time": np.array([0.002, 0.008]), "qpos": np.zeros((2, tiny.nq)),
              "output_fps": np.asarray(25), "playback_speed": np.asarray(0.2),
              "world_id": np.asarray(0), "scheduled_time": np.array([0.0, 0.008]),
              "frame": np.array([0, 1])}
    for key, value in fields.items():
        if value is None:
            arrays.pop("frame")
        else:
            arrays[key] = value
    np.savez(tmp_path / "w.npz", **arrays)

    before = snapshot(tmp_path)

    with pytest.raises(NpzFormatError, match=fragment):
        import_npz(tmp_path / "w.npz", str(tmp_path / "run.zarr"), tiny)

    assert snapshot(tmp_path) == before
