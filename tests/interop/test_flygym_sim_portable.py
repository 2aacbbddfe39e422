"""The flygym drop-in keeps the world's spec (``sim.world.mjcf_root``) as the model's
portable form by default; a spec that cannot be kept leaves the MJB alone, with a warning.
The simulation here is a stand-in with flygym's attributes (``mj_model``, ``world``), so
no flygym is needed; tests/interop/test_flygym_sim.py does the same with flygym's own."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import mujoco
import pytest

from flyarchive.interop.flygym_sim import set_trajectory_recorder
from flyarchive.models import PORTABLE_MODEL_ATTR
from flyarchive.testing import TINY_XML, TWO_HINGES_XML, simulate

pytestmark = pytest.mark.timeout(120)


def _sim(xml: str) -> SimpleNamespace:
    """A CPU simulation as flygym's: the tiny model, and a world whose spec is ``xml``'s."""
    return SimpleNamespace(mj_model=mujoco.MjModel.from_xml_string(TINY_XML), recorder=None,
                           world=SimpleNamespace(mjcf_root=mujoco.MjSpec.from_string(xml)))


def _record(sim: SimpleNamespace, url: str, **options) -> dict:
    recorder = set_trajectory_recorder(sim, url, **options)
    with recorder:
        simulate(sim.mj_model, 1, 8, recorder.record_as_needed)
    return json.loads((Path(url) / "zarr.json").read_text())["attributes"]


def test_the_worlds_spec_is_kept_by_default(tmp_path):
    attrs = _record(_sim(TINY_XML), str(tmp_path / "run.zarr"))

    assert attrs[PORTABLE_MODEL_ATTR]["exact"] is False and "model" in attrs


def test_a_worlds_spec_of_another_model_leaves_the_mjb_alone_with_a_warning(tmp_path):
    sim = _sim(TWO_HINGES_XML.format(name="elbow"))

    with pytest.warns(RuntimeWarning, match=r"keeps only the compiled model \(MJB\).*cannot be "
                                             r"kept as its portable form.*model has nq=2"):
        attrs = _record(sim, str(tmp_path / "run.zarr"))

    assert PORTABLE_MODEL_ATTR not in attrs and "model" in attrs


def test_a_model_source_given_that_does_not_fit_is_an_error(tmp_path):
    from flyarchive.errors import LayoutMismatchError

    sim = _sim(TINY_XML)
    other = mujoco.MjSpec.from_string(TWO_HINGES_XML.format(name="elbow"))

    with pytest.raises(LayoutMismatchError, match="does not compile to the model being recorded"):
        set_trajectory_recorder(sim, str(tmp_path / "run.zarr"), model_source=other)

    assert not (tmp_path / "run.zarr").exists()


def test_model_source_none_keeps_the_mjb_only(tmp_path):
    attrs = _record(_sim(TINY_XML), str(tmp_path / "run.zarr"), model_source=None)

    assert PORTABLE_MODEL_ATTR not in attrs and "model" in attrs
