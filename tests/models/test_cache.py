"""The one cache of models loaded from MJB bytes in a process (flyarchive.models.cache):
each model loaded once per content, shared by the renderers (``model_from_bytes``) and the
analysis's blocks (``shipped_model``), whose bytes on a Dask worker are looked for only when
the model is not loaded yet."""

from __future__ import annotations

import hashlib

import pytest

from flyarchive.errors import ModelLoadError
from flyarchive.models import model_bytes, model_from_bytes
from flyarchive.models.cache import loaded_model
from flyarchive.models.shipping import ModelRef, shipped_model


def test_bytes_of_one_content_load_one_model(tiny):
    blob = model_bytes(tiny)

    first = model_from_bytes(blob)
    again = model_from_bytes(bytes(bytearray(blob)))  # another object, the same content

    assert again is first
    assert model_bytes(first) == blob


def test_the_analysis_and_the_renderers_share_the_model(tiny):
    blob = model_bytes(tiny)
    sha256 = hashlib.sha256(blob).hexdigest()

    shipped = shipped_model(sha256, blob)

    assert shipped is model_from_bytes(blob)


def test_a_scattered_models_bytes_are_not_looked_for_when_it_is_loaded(tiny):
    blob = model_bytes(tiny)
    sha256 = hashlib.sha256(blob).hexdigest()
    loaded = model_from_bytes(blob)
    ref = ModelRef(sha256, None, key=f"flyarchive-model-{sha256}")  # on no cluster: not found

    assert shipped_model(sha256, ref) is loaded


def test_bytes_that_are_not_an_mjb_are_refused_and_nothing_is_kept():
    reads = []

    def read() -> bytes:
        reads.append(1)
        return b"<mujoco/>"

    for _ in range(2):
        with pytest.raises(ModelLoadError, match=r"the model \(sha256 0{12}\.\.\.\) is not a "
                                                 r"compiled MuJoCo model"):
            loaded_model("0" * 64, read)

    assert len(reads) == 2  # asked again: a refusal is not kept
